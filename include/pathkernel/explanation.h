// Explaining test predictions: the exact split of chosen test points'
// outputs into per-training-point contributions (explain), or the
// metagradient of each output in each training point's loss weight
// (explain_metagradient), each written as an explain directory
// (explain_directory.h, which owns the files' format and reads them back).
//
// n test points, M training points, K outputs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pathkernel/decomposition.h"
#include "pathkernel/explain_directory.h"
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
  /// Also write layer_contributions.npy, C_i(x) split over the parameter
  /// tensors (layer_split.h; exact method only). Progress is then not saved.
  bool by_layer = false;
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
  ExplainDocument document;            ///< explain.json as written
  std::vector<std::string> images;     ///< PNG files written, relative to dir
};

/// Inputs given in a file (explain --inputs) instead of the run's test points.
struct ExplainInputs {
  std::string file;         ///< the inputs' .npy file (read_inputs, input_file.h)
  std::string labels_file;  ///< their labels' file ("" when none)
  torch::Tensor x;          ///< [n, *input_shape], as read_inputs() returns them
  torch::Tensor labels;     ///< as read_input_labels() returns them; undefined without
};

/// Reads `file` (and `labels_file`, unless "") for the run: input_file.h's checks.
ExplainInputs read_explain_inputs(PathReader& reader, const std::string& file, const std::string& labels_file);

/// What explain_metagradient() computed and wrote.
struct MetagradientExplanation {
  std::string dir;                     ///< the explain directory written
  torch::Tensor test_index;            ///< int64 [n]
  Metagradient metagradient;           ///< d f(w_N, x)/d c_i and its counters (metagradient.h)
  ExplainDocument document;            ///< explain.json as written
  std::vector<std::string> images;     ///< PNG files written, relative to dir
};

/// Which outputs explain_metagradient differentiates.
enum class MetagradientOutputs { Predicted, All };
/// "predicted" or "all"; throws Error listing them otherwise.
MetagradientOutputs parse_metagradient_outputs(const std::string& name);

/// The metagradient of test points `test_index` (metagradient.h), written as
/// an explain directory `out` (explain_directory.h). With Predicted, each
/// point's predicted class only: one adjoint per point instead of K.
MetagradientExplanation explain_metagradient(PathReader& reader, const torch::Tensor& test_index, const std::string& out,
                                 const ExplainOptions& options, MetagradientOutputs outputs);

/// Records check c (made with step h) of e's metagradient in e.document and
/// rewrites e.dir/explain.json with it.
void record_check(MetagradientExplanation& e, const MetagradientCheck& c, double h);

/// Whether the run is one kernel machine (paper Thm. 3.7): log-softmax output
/// with the NLL loss (so u_i = −e_{y_i}), a constant learning rate and equal
/// batches, so that C_i(x) = (η/|B|) kernel[x, i, :, y_i].
bool is_single_kernel_machine(const Manifest& m);

/// Decomposes test points `test_index` (int64 [n], checked) of the run and
/// writes the explain directory `out`, continuing from saved progress made
/// with the same arguments. Throws Error on bad input.
Explanation explain(PathReader& reader, const torch::Tensor& test_index, const std::string& out,
                    const ExplainOptions& options);

/// explain() of inputs given in a file: decomposed like test points (the
/// same numbers, bit for bit, as explaining the same test points by index),
/// written with a copy of the inputs (and labels) in `out`; point n's
/// test_index is its row. Progress is not saved.
Explanation explain_inputs(PathReader& reader, const ExplainInputs& inputs, const std::string& out,
                           const ExplainOptions& options);

/// explain() in its parts, for a caller that decomposes the test points
/// itself (several processes share them: across_ranks.h). explain() is
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
/// document, images).
void write_explanation(PathReader& reader, const torch::Tensor& test_index, const std::string& out,
                       const DecompositionOptions& dopt, const ExplainOptions& options, Decomposition d,
                       Explanation& e);

}  // namespace pathkernel
