// Attribution methods: scores of every training point for one chosen output
// of each test prediction, by name, so that evaluate.h can compare them with
// retraining. Shapes: n test inputs, M training points, P parameters; every
// method returns float64 scores [n, M], signed like the contribution C_i: a
// positive score says point i pushed the output up, so removing it should
// lower the output by about that much.
//
//   epk        the exact contribution C_i(x) of the decomposition
//              (decomposition.h), certified quadrature
//   dpk        the same decomposition with one node per step, J(w_s, x) in
//              place of J̄_s(x): for gd and sgd exactly TracIn at every step,
//              −Σ_{s: i∈B_s} (η_s/|B_s|) ∇f(w_s, x)·∇ℓ_i(w_s); for optimizers
//              with a buffer its optimizer-aware form
//   tracin-cp  TracIn on the stored checkpoints c_0 < … < c_L = N only,
//              learning-rate weighted: −Σ_k (Σ_{c_k ≤ s < c_{k+1}} η_s / M)
//              ∇f(w_{c_k}, x)·∇ℓ_i(w_{c_k}) (each point's expected weight
//              η_s/M per step)
//   grad-dot   the gradient similarity at the final weights:
//              −(Σ_s η_s / M) ∇f(w_N, x)·∇ℓ_i(w_N)
//   metagradient  c_i d f(w_N, x)/d c_i (metagradient.h): the first-order
//              change of the output when point i's loss weight c_i goes to 0,
//              the whole run retrained; c_i = 1 unless the run has loss weights
//   random     seeded standard normal scores, a baseline
//
// ℓ_i is the training loss of point i with the labels the run was trained
// on; f is the network output chosen per test input.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pathkernel/features.h"
#include "pathkernel/path.h"

namespace pathkernel {

struct AttributionOptions {
  QuadratureOptions quadrature;  ///< epk's quadrature (dpk always uses one node)
  uint64_t seed = 0;             ///< random's seed
  int64_t train_chunk = 1024;    ///< training rows per contraction
  bool progress = true;          ///< progress bars on stderr
  /// epk and dpk save the decomposition's progress in PROGRESS_DIR/<method>
  /// (as explain does) and continue from it when rerun with the same
  /// arguments; "" saves nothing.
  std::string progress_dir;
  double checkpoint_seconds = 60;
};

/// The method names, in the order above.
std::vector<std::string> attribution_method_names();

/// Throws Error naming `name` and listing the methods when it is not one.
void check_attribution_method(const std::string& name);

/// Scores [n, M] of `method` for output `output[j]` (int64 [n], each in
/// [0, K)) of test inputs x [n, *input_shape].
torch::Tensor attribution_scores(PathReader& reader, const std::string& method, const torch::Tensor& x,
                                 const torch::Tensor& output, const AttributionOptions& options);

}  // namespace pathkernel
