// Explaining test predictions: the exact split of chosen test points'
// outputs into per-training-point contributions, written as an explain
// directory and read back. This header owns the explain directory's format:
//
//   contributions.npy  float64 [n, M, K]: C_i(x) of every training point i
//   kernel.npy         float64 [n, M, K, K] (gd and sgd, when written):
//                      Σ_{s: i∈B_s} K_s(x, x_i)
//   explain.json       {run, method ("exact"), quadrature, steps, certificate_max_gap,
//                      contributions: {file, shape}, kernel: {file, shape,
//                      single_kernel, weight} or null, points: [{test_index,
//                      label, predicted, f_final, f_initial,
//                      contributions_sum, regularization, rounding,
//                      completeness_error, proponents, opponents}]}
//   explain_<i>.png    image data: test point i beside its top proponents
//                      and opponents
//   .progress/         saved accumulators while running (DirectoryCheckpoint)
//
// The metagradient (explain_metagradient) writes the same files:
// contributions.npy holds d f(w_N, x)/d c_i [n, M, K] (NaN in the outputs
// not differentiated), and explain.json says "method": "metagradient", which
// outputs were differentiated, and per point the same fields as above that
// do not belong to the decomposition (no regularization, rounding or
// completeness error).
//
// n test points, M training points, K outputs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pathkernel/decomposition.h"
#include "pathkernel/metagradient.h"
#include "pathkernel/path.h"

namespace pathkernel {

/// Whether to write kernel.npy.
enum class KernelOutput { Auto, On, Off };
/// "auto", "on" or "off"; throws Error listing them otherwise.
KernelOutput parse_kernel_output(const std::string& name);

struct ExplainOptions {
  DecompositionOptions decomposition;  ///< quadrature, chunks, progress (its `kernel` is set by explain())
  KernelOutput kernel = KernelOutput::Auto;  ///< Auto: for gd and sgd, when it takes at most kernel_max_bytes
  double kernel_max_bytes = 2.0 * (1 << 30);
  int64_t top = 10;                 ///< proponents and opponents listed per point
  double checkpoint_seconds = 60;   ///< spacing of the saved progress (0: after every step)
  bool images = true;               ///< image data: write explain_<i>.png
  /// Called with a note for the user as it arises (the kernel output's size,
  /// resuming from saved progress); unset: not called.
  std::function<void(const std::string&)> on_note;
};

struct Explanation {
  std::string dir;                     ///< the explain directory written
  torch::Tensor test_index;            ///< int64 [n]
  Decomposition decomposition;         ///< of the test points, in order
  bool kernel = false;                 ///< kernel.npy was written
  std::string kernel_note;             ///< why an Auto kernel was not written ("" otherwise)
  std::string progress_note;           ///< what became of saved progress ("" when there was none)
  nlohmann::ordered_json json;         ///< explain.json as written
  std::vector<std::string> images;     ///< PNG files written, relative to dir
  Metagradient metagradient;           ///< explain_metagradient's result (empty for explain())
};

/// Which outputs explain_metagradient differentiates.
enum class MetagradientOutputs { Predicted, All };
/// "predicted" or "all"; throws Error listing them otherwise.
MetagradientOutputs parse_metagradient_outputs(const std::string& name);

/// The metagradient of test points `test_index` (metagradient.h), written as
/// an explain directory `out` (see the top of this header). With Predicted,
/// each point's predicted class only: one adjoint per point instead of K.
Explanation explain_metagradient(PathReader& reader, const torch::Tensor& test_index, const std::string& out,
                                 const ExplainOptions& options, MetagradientOutputs outputs);

/// Whether the run is one kernel machine (paper Thm. 3.7): log-softmax output
/// with the NLL loss (so u_i = −e_{y_i}), a constant learning rate and equal
/// batches, so that C_i(x) = (η/|B|) kernel[x, i, :, y_i].
bool is_single_kernel_machine(const Manifest& m);

/// Decomposes test points `test_index` (int64 [n], checked) of the run and
/// writes the explain directory `out`, continuing from saved progress made
/// with the same arguments. Throws Error on bad input.
Explanation explain(PathReader& reader, const torch::Tensor& test_index, const std::string& out,
                    const ExplainOptions& options);

/// explain() in its parts, for a caller that decomposes the test points
/// itself (several processes share them: distributed_jobs.h). explain() is
/// check_explain_indices, explain_decomposition_options, decompose() with a
/// DirectoryCheckpoint of explain_progress_arguments, then write_explanation.
///
/// Throws Error unless test_index is a non-empty int64 [n] list of the run's
/// test points and options.top >= 1.
void check_explain_indices(PathReader& reader, const torch::Tensor& test_index, const ExplainOptions& options);
/// The decomposition options of explaining n test points, with `kernel`
/// decided; `kernel_note` receives why an Auto kernel is not written ("" otherwise).
DecompositionOptions explain_decomposition_options(const Manifest& m, int64_t n, const ExplainOptions& options,
                                                   std::string* kernel_note);
/// Everything the accumulators of decomposing test_index with `dopt` depend
/// on: a saved progress made with other arguments is not reused.
nlohmann::ordered_json explain_progress_arguments(PathReader& reader, const torch::Tensor& test_index,
                                                  const DecompositionOptions& dopt);
/// Writes the explain directory `out` of d, the decomposition of test_index
/// (kernel.npy when dopt.kernel; the PNG grids of image data when
/// options.images), and fills e (dir, test_index, decomposition, kernel,
/// json, images).
void write_explanation(PathReader& reader, const torch::Tensor& test_index, const std::string& out,
                       const DecompositionOptions& dopt, const ExplainOptions& options, Decomposition d,
                       Explanation& e);

/// An explain directory read back and checked against the run it explains.
struct ExplainOutput {
  nlohmann::json points = nlohmann::json::array();  ///< explain.json's points
  torch::Tensor test_index;                         ///< int64 [n]
  torch::Tensor contributions;                      ///< [n, M, K]
};

/// Reads DIR/explain.json and DIR/contributions.npy. Throws Error naming the
/// file when one is missing, malformed, or does not fit the run `m`.
ExplainOutput read_explain_output(const std::string& dir, const Manifest& m);

}  // namespace pathkernel
