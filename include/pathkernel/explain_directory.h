// The explain directory: what `pathkernel explain` writes (by either method,
// explanation.h), as typed records, written and read back here alone.
//
//   contributions.npy  float64 [n, M, K]: C_i(x) of every training point i
//                      (exact), or d f(w_N, x)/d c_i (metagradient; NaN in
//                      the outputs not differentiated)
//   kernel.npy         float64 [n, M, K, K] (exact, gd and sgd, when written):
//                      Σ_{s: i∈B_s} K_s(x, x_i)
//   explain.json       ExplainDocument, as explain_json() spells it:
//                      exact:        {run, method "exact", quadrature, steps,
//                                    certificate_max_gap, loss, form, recorded,
//                                    updates_explained, contributions: {file,
//                                    shape}, kernel: {file, shape,
//                                    single_kernel, weight} or null, points,
//                                    warning (only when some updates are not
//                                    explained), note (only when some steps
//                                    are the run's rounding branches,
//                                    StepResiduals)}
//                      metagradient: {run, method "metagradient", meaning,
//                                    outputs, steps, adjoints,
//                                    hessian_vector_products, seconds, loss,
//                                    recorded, loss_weights, contributions:
//                                    {file, shape, not_differentiated}, kernel
//                                    null, points, check (with --check)}
//                      points: [{test_index, label, predicted, (metagradient:
//                      output,) f_final, exact: f_initial, contributions_sum,
//                      regularization, rounding, completeness_error;
//                      metagradient: metagradient_sum; proponents, opponents:
//                      [{index, label, value}]}]
//   explain_<i>.png    image data: test point i beside its top proponents
//                      and opponents (explain_input_<i>.png: row i of --inputs)
//   layer_contributions.npy  float64 [n, M, K, L] (exact, --by-layer): C_i(x)
//                      split over the L parameter tensors (layer_split.h);
//                      explain.json then has "layer_contributions": {file,
//                      shape, tensors: [{name, shape}]} and each proponent
//                      and opponent its split, "layers" [L]
//   inputs.npy         (exact, --inputs) a copy of the inputs explained, and
//                      labels.npy of their labels when given; explain.json
//                      then has "inputs": {file, source, shape, labels,
//                      labels_source}, and a point's test_index is its row
//                      of the inputs (its label null without labels)
//
// n test points, M training points, K outputs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pathkernel/dataset.h"
#include "pathkernel/manifest.h"
#include "pathkernel/metagradient_check.h"
#include "pathkernel/path.h"

namespace pathkernel {

/// A point's label: its class, its regression target [K], or a sequence's
/// next tokens [T].
struct Label {
  int64_t class_index = 0;      ///< the class, when target and tokens are empty
  std::vector<double> target;   ///< a regression target [K]; else empty
  std::vector<int64_t> tokens;  ///< a sequence's tokens [T]; else empty
  bool is_class() const { return target.empty() && tokens.empty(); }
  /// As explain.json spells it: "3", "[0.5,-1.0]" or "[17,4,9]".
  std::string str() const;
};

/// Point i's label in `labels` (int64 classes [n], float targets [n, K], or
/// a sequence's integer tokens [n, T]).
Label label_at(const torch::Tensor& labels, int64_t i);

/// A training point listed among a test point's proponents or opponents.
struct RankedPoint {
  int64_t index = 0;  ///< into the training set
  Label label;
  double value = 0;   ///< its contribution (or metagradient) to the ranked output
  /// With --by-layer: value split over the parameter tensors [L]; else empty.
  std::vector<double> layers;
  /// A sequence data set with a vocabulary: the training sequence's text
  /// (sequence_text of its inputs); else empty.
  std::string text;
};

/// The `k` training points of largest (largest = true) or smallest
/// contributions c [M] with their labels, in that order.
std::vector<RankedPoint> ranked_points(const torch::Tensor& c, const torch::Tensor& labels, int64_t k,
                                       bool largest);

/// One explained test point. K outputs.
struct ExplainedPoint {
  int64_t test_index = 0;  ///< the run's test point, or with --inputs the row of the inputs
  Label label;
  bool labelled = true;    ///< false: inputs given without labels (label null)
  int64_t predicted = 0;  ///< argmax of f_final
  std::string text;       ///< a sequence's text, as RankedPoint::text; else empty
  int64_t position = -1;  ///< a sequence model: the position decomposed; else −1
  /// The output whose contributions rank the sides: the predicted class
  /// (exact), or the output differentiated (metagradient).
  int64_t output = 0;
  std::vector<double> f_final;  ///< f(w_N, x) [K]
  // Exact only (empty, and 0, for the metagradient):
  std::vector<double> f_initial;          ///< f(w_0, x) [K]
  std::vector<double> contributions_sum;  ///< Σ_i C_i(x) [K]
  std::vector<double> regularization;     ///< R(x) [K]
  std::vector<double> rounding;           ///< E(x) [K]
  /// S(x) [K], BatchNorm's running-statistics term (docs/math.md §15);
  /// empty for a network without BatchNorm in training mode.
  std::vector<double> statistics;
  double completeness_error = 0;          ///< max_k |f_final − (f_initial + Σ C + R + E (+ S))|
  // Metagradient only (empty for exact):
  std::vector<double> metagradient_sum;   ///< Σ_i d f/d c_i [K] (NaN where not differentiated)
  std::vector<RankedPoint> proponents;    ///< largest first
  std::vector<RankedPoint> opponents;     ///< smallest first
};

enum class ExplainMethod { Exact, Metagradient };

/// explain.json's "kernel" entry: kernel.npy, written for gd and sgd runs.
struct ExplainKernelFile {
  std::vector<int64_t> shape;    ///< [n, M, K, K]
  bool single_kernel = false;    ///< one kernel machine (is_single_kernel_machine)
  std::optional<double> weight;  ///< η/|B| when single_kernel
};

/// One parameter tensor of explain.json's "layer_contributions".
struct ExplainLayerTensor {
  std::string name;
  std::vector<int64_t> shape;
};

/// explain.json's "layer_contributions" entry (--by-layer).
struct ExplainLayerFile {
  std::vector<int64_t> shape;               ///< [n, M, K, L]
  std::vector<ExplainLayerTensor> tensors;  ///< the L parameter tensors, in order
};

/// explain.json's "inputs" entry (--inputs): inputs given in a file.
struct ExplainInputsEntry {
  std::string source;         ///< the file given
  std::vector<int64_t> shape; ///< [n, *input_shape]
  std::string labels_source;  ///< the labels file given ("" when none)
};

/// explain.json, typed. Fields marked exact or metagradient belong to that
/// method's file only.
struct ExplainDocument {
  std::string run;                         ///< the run directory explained
  ExplainMethod method = ExplainMethod::Exact;
  int64_t steps = 0;
  std::string loss;                        ///< the manifest's loss name
  bool recorded = false;                   ///< the run is a recorded loop
  std::vector<int64_t> contributions_shape;  ///< [n, M, K]
  std::vector<ExplainedPoint> points;      ///< in the order of contributions.npy

  // Exact:
  std::string quadrature;                  ///< the quadrature spec
  double certificate_max_gap = 0;
  std::string form;                        ///< "kernel machine", "ensemble", or mse's ensemble
  bool updates_explained = true;           ///< every update the run took is described
  std::optional<ExplainKernelFile> kernel; ///< kernel.npy, when written
  std::string warning;                     ///< updates the run does not describe ("" when none)
  std::string note;                        ///< steps that are the run's rounding branches ("" when none)
  std::optional<ExplainLayerFile> layers;  ///< layer_contributions.npy, when written
  std::optional<ExplainInputsEntry> inputs;  ///< inputs.npy: the points are its rows, not test points

  // Metagradient:
  bool outputs_predicted = true;           ///< "predicted" (one output per point) or "all"
  int64_t adjoints = 0;
  int64_t hessian_vector_products = 0;
  double seconds = 0;
  std::optional<std::string> loss_weights; ///< the run's loss-weights file, when it has one
  std::optional<MetagradientCheckEntry> check;  ///< the check against retraining, when run
};

/// explain.json's text content, ordered as written (what --json prints).
nlohmann::ordered_json explain_json(const ExplainDocument& doc);

/// Writes DIR/explain.json of doc atomically.
void write_explain_json(const std::string& dir, const ExplainDocument& doc);

/// Writes the explain directory `dir`: contributions.npy, kernel.npy when
/// `kernel` is defined, layer_contributions.npy when `layers` is, then
/// explain.json.
void write_explain_directory(const std::string& dir, const ExplainDocument& doc, const torch::Tensor& contributions,
                             const torch::Tensor& kernel = {}, const torch::Tensor& layers = {});

/// Image data: each test image (blue) beside its top eight proponents (green,
/// top row) and opponents (red, bottom row), as DIR/explain_<i>.png. With
/// `inputs` (the points' own inputs, in order: --inputs) those are the test
/// images, as DIR/explain_input_<i>.png. Returns the files written, relative
/// to dir.
std::vector<std::string> write_explain_images(const std::string& dir, const Dataset& data,
                                              const std::vector<ExplainedPoint>& points,
                                              const torch::Tensor& inputs = {});

/// An explain directory read back and checked against the run it explains.
/// kernel.npy is described by document.kernel and not read.
struct ExplainDirectory {
  ExplainDocument document;
  torch::Tensor test_index;     ///< int64 [n]
  torch::Tensor contributions;  ///< [n, M, K]
  /// With document.inputs: DIR/inputs.npy, the points' inputs [n, ...]
  /// (and DIR/labels.npy, when written); undefined otherwise.
  torch::Tensor inputs, labels;
};

/// Reads DIR/explain.json and DIR/contributions.npy. Throws Error naming the
/// file when one is missing, malformed, or does not fit the run `m`.
ExplainDirectory read_explain_directory(const std::string& dir, const Manifest& m);

}  // namespace pathkernel
