// The paper's Algorithm 1 (Bell et al. 2023), implemented directly as the
// baseline pathkernel is measured against: at every step it materialises
// every training point's Jacobian J(w_s, x_i) [M, K, P] with autograd, one
// sample and one output at a time, averages the test points' Jacobians over
// a left Riemann sum of T nodes, and contracts them in the weight space.
// float64 throughout; GD and SGD runs (Δw_s = −η_s G_s) only.
#pragma once

#include <torch/torch.h>

#include "pathkernel/path.h"

namespace pathkernel::bench {

struct Algorithm1Result {
  torch::Tensor f0;             ///< [n, K] f(w_0, x)
  torch::Tensor contributions;  ///< [n, M, K]
  double seconds = 0;

  /// f(w_0, x) + Σ_i C_i(x): Algorithm 1's prediction, [n, K].
  torch::Tensor prediction() const { return f0 + contributions.sum(1); }
};

/// Runs Algorithm 1 with T Riemann nodes on the run of `reader` for test
/// inputs x [n, ...].
Algorithm1Result algorithm1(PathReader& reader, const torch::Tensor& x, int T);

}  // namespace pathkernel::bench
