// The metagradient: how each training point's loss weight moves a trained
// network's outputs when the whole training run responds (docs/math.md §13).
//
// Training with per-point loss weights c (the batch loss (1/|B_s|)
// Σ_{i∈B_s} c_i ℓ_i, loss.h) makes every weight vector of the path a function
// of c. The metagradient of test input x is
//
//   MG_i(x) = d f(w_N, x) / d c_i                       [K] per training point i
//
// at the run's own weights (1 when it has none). It is computed by the
// adjoint of the training run: λ_N = ∂f(w_N, x)/∂w, carried backwards
// through every step's update (weights and optimizer state) by one
// Hessian-vector product of the batch loss per step and adjoint (double
// backward through LibTorch's autograd), while each step adds
//   λ_{s+1} · ∂(w_{s+1}, state_{s+1})/∂c_i   for the points i of its batch.
// Where the exact decomposition (decomposition.h) holds the path fixed and
// splits what the prediction is made of, the metagradient lets the path move:
// it is the first-order answer to "what if this point counted more, less, or
// not at all", which retraining answers exactly.
//
// Optimizers: gd, sgd, momentum, nesterov (weight decay and dampening
// included), adam and adamw (the second moment's dependence on the gradients
// is carried exactly). Runs recorded from a training loop are supported when
// they clipped no gradient (a clip factor depends on the gradient's norm in a
// way the run does not record).
//
// Memory: one adjoint (weights and optimizer state, float64) per test point
// and output, and one checkpoint segment of the path (PathReader::reverse).
#pragma once

#include <cstdint>
#include <string>

#include <torch/torch.h>

#include "pathkernel/path.h"

namespace pathkernel {

struct MetagradientOptions {
  /// The output differentiated for each test point, int64 [n] (one adjoint
  /// per point), or undefined for every output (K adjoints per point).
  torch::Tensor outputs;
  bool progress = true;  ///< progress bar on stderr
};

/// Shapes: n test points, M training points, K outputs.
struct Metagradient {
  /// [n, M, K]: d f_k(w_N, x)/d c_i. With MetagradientOptions::outputs, the
  /// columns not differentiated are NaN.
  torch::Tensor values;
  torch::Tensor outputs;  ///< int64 [n]: the output differentiated per point; undefined: all of them
  torch::Tensor fN;       ///< [n, K] f(w_N, x), by the float64 network
  int64_t steps = 0;
  int64_t adjoints = 0;   ///< adjoints carried: n with outputs, else n·K
  int64_t hessian_vector_products = 0;  ///< adjoints × steps
  double seconds = 0;
};

/// Why the metagradient of run `m` cannot be computed ("" when it can).
std::string metagradient_unsupported(const Manifest& m);

/// The metagradient of the run's final outputs on test inputs x [n, *input_shape]
/// with respect to every training point's loss weight. Throws Error when
/// metagradient_unsupported() says why, or on bad options.
Metagradient metagradient(PathReader& reader, const torch::Tensor& x, const MetagradientOptions& options);

}  // namespace pathkernel
