// Explaining test predictions: explain() and explain_metagradient() compute
// and fill the explain directory's records (explain_directory.h).
#include "pathkernel/explanation.h"

#include <algorithm>
#include <filesystem>

#include "pathkernel/context.h"
#include "pathkernel/decomposition_checkpoint.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/input_file.h"
#include "pathkernel/npy.h"
#include "pathkernel/sequence.h"

namespace pathkernel {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

std::vector<double> values_of(const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

/// The points explained: the run's test points by index, or the rows of
/// inputs given in a file.
struct PointSource {
  torch::Tensor index;                   ///< int64 [n]: test indices, or the inputs' rows
  torch::Tensor labels;                  ///< the points' labels, in order; undefined: none
  const ExplainInputs* inputs = nullptr; ///< the file's inputs, or null for test points
  int64_t position = -1;                 ///< a sequence model: the position decomposed (labels are its tokens)
};

/// The points explained; a sequence model's labels are their tokens at the position decomposed.
PointSource point_source(PathReader& reader, const torch::Tensor& index, const torch::Tensor& labels,
                         const ExplainInputs* inputs, const DecompositionOptions& dopt) {
  const int64_t T = reader.manifest().sequence_length;
  if (T == 0) return {index, labels, inputs, -1};
  const int64_t position = resolve_position(dopt.position, T);
  return {index, labels.defined() ? labels_at_position(labels, position) : labels, inputs, position};
}

/// Each ranked training sequence's text (sequence.h), when the data name their codes.
void add_text(std::vector<RankedPoint>& side, const Dataset& data) {
  for (RankedPoint& r : side) r.text = sequence_text(train_input(data, r.index), data.vocabulary);
}

/// Each ranked training point's contribution split over the parameter tensors.
void add_layers(std::vector<RankedPoint>& side, const torch::Tensor& layers) {  // layers [M, L]
  for (RankedPoint& r : side) r.layers = values_of(layers[r.index]);
}

/// Point n of decomposition d, with its sides ranked by the contributions to
/// its predicted class.
ExplainedPoint exact_point(PathReader& reader, const Decomposition& d, const torch::Tensor& gap, int64_t n,
                           const PointSource& src, int64_t top) {
  const torch::Tensor& y_train = reader.held_dataset().y_train;
  ExplainedPoint p;
  p.predicted = d.fN[n].argmax().item<int64_t>();
  p.output = p.predicted;
  const torch::Tensor c = d.contributions[n].select(1, p.predicted);  // [M]
  p.test_index = src.index[n].item<int64_t>();
  p.labelled = src.labels.defined();
  if (p.labelled) p.label = label_at(src.labels, n);
  p.f_final = values_of(d.fN[n]);
  p.f_initial = values_of(d.f0[n]);
  p.contributions_sum = values_of(d.contributions[n].sum(0));
  p.regularization = values_of(d.regularization[n]);
  p.rounding = values_of(d.rounding[n]);
  if (d.statistics.defined()) p.statistics = values_of(d.statistics[n]);
  p.completeness_error = gap[n].abs().max().item<double>();
  p.proponents = ranked_points(c, y_train, top, true);
  p.opponents = ranked_points(c, y_train, top, false);
  add_text(p.proponents, reader.held_dataset());
  add_text(p.opponents, reader.held_dataset());
  if (reader.manifest().sequence_length > 0) {
    p.position = src.position;
    const torch::Tensor x = src.inputs ? src.inputs->x[p.test_index] : test_input(reader.held_dataset(), p.test_index);
    p.text = sequence_text(x, reader.held_dataset().vocabulary);
  }
  if (d.layer_contributions.defined()) {
    const torch::Tensor layers = d.layer_contributions[n].select(1, p.predicted);  // [M, L]
    add_layers(p.proponents, layers);
    add_layers(p.opponents, layers);
  }
  return p;
}

/// Point n of metagradient g, test point test_index, its sides ranked by the
/// output differentiated (the predicted class when all were).
ExplainedPoint metagradient_point(PathReader& reader, const Metagradient& g, int64_t n, int64_t test_index,
                                  int64_t top) {
  const torch::Tensor& y_train = reader.held_dataset().y_train;
  ExplainedPoint p;
  p.predicted = g.fN[n].argmax().item<int64_t>();
  p.output = g.outputs.defined() ? g.outputs[n].item<int64_t>() : p.predicted;
  const torch::Tensor c = g.values[n].select(1, p.output);  // [M]
  p.test_index = test_index;
  p.label = label_at(reader.held_dataset().y_test, test_index);
  p.f_final = values_of(g.fN[n]);
  p.metagradient_sum = values_of(g.values[n].sum(0));
  p.proponents = ranked_points(c, y_train, top, true);
  p.opponents = ranked_points(c, y_train, top, false);
  return p;
}

/// mse's loss derivative 2(f − t)/K moves with f along training, so the
/// contributions are a sum of per-step kernel machines, never one machine
/// with fixed coefficients.
std::string explanation_form(const Manifest& m) {
  return m.loss == "mse" ? "ensemble (mse: the loss derivative changes along training)"
                         : is_single_kernel_machine(m) ? "kernel machine" : "ensemble";
}

/// explain.json's entries for layer_contributions.npy and the inputs, when written.
void add_optional_entries(const Manifest& m, const PointSource& src, const Decomposition& d, ExplainDocument& doc) {
  if (d.layer_contributions.defined()) {
    ExplainLayerFile layers;
    layers.shape = d.layer_contributions.sizes().vec();
    for (const ParamInfo& p : m.parameters) layers.tensors.push_back({p.name, p.shape});
    doc.layers = std::move(layers);
  }
  if (src.inputs) doc.inputs = ExplainInputsEntry{src.inputs->file, src.inputs->x.sizes().vec(), src.inputs->labels_file};
}

/// explain.json of decomposition d of the points src (its points, then the rest).
ExplainDocument exact_document(PathReader& reader, const PointSource& src, const DecompositionOptions& dopt,
                               const ExplainOptions& options, const Decomposition& d) {
  const Manifest& m = reader.manifest();
  const torch::Tensor gap = d.completeness_gap();
  ExplainDocument doc;
  for (int64_t n = 0; n < src.index.size(0); ++n) doc.points.push_back(exact_point(reader, d, gap, n, src, options.top));
  const int64_t n = src.index.size(0), M = d.contributions.size(1), K = d.contributions.size(2);
  const bool single = is_single_kernel_machine(m);
  const double batch = static_cast<double>(m.batch_size == 0 ? m.num_train : m.batch_size);
  doc.run = reader.dir();
  doc.method = ExplainMethod::Exact;
  doc.quadrature = dopt.quadrature.spec.str();
  doc.steps = d.steps;
  doc.certificate_max_gap = d.certificate_max_gap;
  doc.loss = m.loss;
  doc.form = explanation_form(m);
  doc.recorded = m.recorded;
  doc.updates_explained = d.residuals.explained();
  doc.contributions_shape = {n, M, K};
  if (dopt.kernel) {
    doc.kernel = ExplainKernelFile{{n, M, m.num_classes, m.num_classes}, single, std::nullopt};
    if (single) doc.kernel->weight = m.optimizer.lr / batch;
  }
  doc.warning = unexplained_update_message(d.residuals);
  doc.note = rounding_branch_message(d.residuals);
  add_optional_entries(m, src, d, doc);
  return doc;
}

/// Writes the explain directory `out` of d, the decomposition of the points
/// src, and fills e (write_explanation's work, for either kind of point).
void write_points(PathReader& reader, const PointSource& src, const std::string& out, const DecompositionOptions& dopt,
                  const ExplainOptions& options, Decomposition decomposition, Explanation& e) {
  e.dir = out;
  e.test_index = src.index;
  e.decomposition = std::move(decomposition);
  e.kernel = dopt.kernel;
  const Decomposition& d = e.decomposition;
  e.document = exact_document(reader, src, dopt, options, d);
  if (src.inputs) {  // the inputs explained travel with their explanation (explain.json last)
    fs::create_directories(out);
    write_npy((fs::path(out) / "inputs.npy").string(), src.inputs->x);
    if (src.labels.defined()) write_npy((fs::path(out) / "labels.npy").string(), src.labels);
  }
  write_explain_directory(out, e.document, d.contributions, e.kernel ? d.kernel : torch::Tensor(),
                          d.layer_contributions);
  if (options.images && reader.manifest().input_shape.size() == 3) {
    e.images = write_explain_images(out, reader.held_dataset(), e.document.points,
                                    src.inputs ? src.inputs->x : torch::Tensor());
  }
}

}  // namespace

KernelOutput parse_kernel_output(const std::string& name) {
  if (name == "auto") return KernelOutput::Auto;
  if (name == "on") return KernelOutput::On;
  if (name == "off") return KernelOutput::Off;
  PK_THROW("kernel output '" << name << "' is not one of auto, on, off");
}

bool is_single_kernel_machine(const Manifest& m) {
  const bool even_batches = m.batch_size == 0 || m.num_train % m.batch_size == 0;
  return m.output == "logsoftmax" && m.loss == "cross_entropy" && m.schedule == "constant" && !m.recorded &&
         even_batches;
}

void check_explain_indices(PathReader& reader, const torch::Tensor& test_index, const ExplainOptions& options) {
  const int64_t tests = reader.test_count();
  PK_CHECK(test_index.dim() == 1 && test_index.numel() > 0 && test_index.scalar_type() == torch::kLong,
           "explain: test indices must be a non-empty int64 list (got " << test_index.sizes() << " "
                                                                        << test_index.scalar_type() << ")");
  PK_CHECK(test_index.min().item<int64_t>() >= 0 && test_index.max().item<int64_t>() < tests,
           "explain: test indices must lie in [0, " << tests << ")");
  PK_CHECK(options.top >= 1, "explain: the number of proponents and opponents listed must be >= 1 (got "
                                 << options.top << ")");
}

DecompositionOptions explain_decomposition_options(const Manifest& m, int64_t n, const ExplainOptions& options,
                                                   std::string* kernel_note) {
  DecompositionOptions dopt = options.decomposition;
  if (dopt.position != -1 || m.sequence_length > 0) resolve_position(dopt.position, m.sequence_length, "--position");
  // The summed kernel is the ensemble form of gd and sgd runs; not of a
  // module with BatchNorm in training mode (its checkpoints store the running
  // statistics), whose training points' Jacobians depend on their batch.
  const bool kernel_form = !m.optimizer.traits().has_buffer && !m.stores_module_buffers();
  const double kernel_bytes = 8.0 * static_cast<double>(n) * static_cast<double>(m.num_train) *
                              static_cast<double>(m.num_classes * m.num_classes);
  dopt.by_layer = options.by_layer;
  dopt.kernel = options.kernel == KernelOutput::On ||
                (options.kernel == KernelOutput::Auto && kernel_form && kernel_bytes <= options.kernel_max_bytes);
  if (kernel_note) kernel_note->clear();
  if (options.kernel == KernelOutput::Auto && kernel_form && !dopt.kernel && kernel_note) {
    char note[160];
    std::snprintf(note, sizeof note, "kernel.npy would take %.1f GiB, more than the automatic limit of %.1f GiB; not written",
                  kernel_bytes / (1 << 30), options.kernel_max_bytes / (1 << 30));
    *kernel_note = note;
  }
  return dopt;
}

ojson explain_progress_arguments(PathReader& reader, const torch::Tensor& test_index,
                                 const DecompositionOptions& dopt) {
  ojson j{{"manifest_crc32", reader.manifest_crc32()},
           {"test_indices", std::vector<int64_t>(test_index.data_ptr<int64_t>(),
                                                 test_index.data_ptr<int64_t>() + test_index.numel())},
           {"quadrature", dopt.quadrature.spec.str()},
           {"tol", dopt.quadrature.tol},
           {"run_tol", dopt.quadrature.run_tol},
           {"gauss_nodes", dopt.quadrature.gauss_nodes},
           {"kernel", dopt.kernel},
           {"point_block", dopt.point_block},
           {"memory_doubles", dopt.memory_doubles},
           {"threads", current_threads()}};
  const int64_t T = reader.manifest().sequence_length;
  if (T > 0) j["position"] = resolve_position(dopt.position, T);  // a sequence model's outputs decomposed
  return j;
}

Explanation explain(PathReader& reader, const torch::Tensor& test_index, const std::string& out,
                    const ExplainOptions& options) {
  check_explain_indices(reader, test_index, options);
  Explanation e;
  const DecompositionOptions dopt =
      explain_decomposition_options(reader.manifest(), test_index.size(0), options, &e.kernel_note);
  if (options.on_note && !e.kernel_note.empty()) options.on_note(e.kernel_note);
  const torch::Tensor x = reader.test_inputs(test_index);
  if (options.by_layer) {  // the contributions by layer are not saved with the progress
    write_explanation(reader, test_index, out, dopt, options, decompose(reader, x, dopt), e);
    return e;
  }
  DirectoryCheckpoint progress((fs::path(out) / ".progress").string(),
                               explain_progress_arguments(reader, test_index, dopt), options.checkpoint_seconds);
  progress.resume_point();
  e.progress_note = progress.message();
  if (options.on_note && !e.progress_note.empty()) options.on_note(e.progress_note);
  Decomposition d = decompose(reader, x, dopt, &progress);
  write_explanation(reader, test_index, out, dopt, options, std::move(d), e);
  progress.finish();
  return e;
}

ExplainInputs read_explain_inputs(PathReader& reader, const std::string& file, const std::string& labels_file) {
  ExplainInputs in;
  in.file = file;
  in.labels_file = labels_file;
  in.x = read_inputs(file, reader.held_dataset());
  if (!labels_file.empty()) in.labels = read_input_labels(labels_file, reader.held_dataset(), in.x.size(0));
  return in;
}

Explanation explain_inputs(PathReader& reader, const ExplainInputs& inputs, const std::string& out,
                           const ExplainOptions& options) {
  PK_CHECK(inputs.x.defined() && inputs.x.dim() >= 2 && inputs.x.size(0) >= 1,
           "explain: the inputs must be [n, ...] with n >= 1 (read them with read_explain_inputs)");
  PK_CHECK(options.top >= 1, "explain: the number of proponents and opponents listed must be >= 1 (got "
                                 << options.top << ")");
  Explanation e;
  const DecompositionOptions dopt =
      explain_decomposition_options(reader.manifest(), inputs.x.size(0), options, &e.kernel_note);
  if (options.on_note && !e.kernel_note.empty()) options.on_note(e.kernel_note);
  const PointSource src = point_source(reader, torch::arange(inputs.x.size(0), torch::kLong), inputs.labels,
                                      &inputs, dopt);
  write_points(reader, src, out, dopt, options, decompose(reader, inputs.x, dopt), e);
  return e;
}

void write_explanation(PathReader& reader, const torch::Tensor& test_index, const std::string& out,
                       const DecompositionOptions& dopt, const ExplainOptions& options, Decomposition decomposition,
                       Explanation& e) {
  const PointSource src =
      point_source(reader, test_index, reader.held_dataset().y_test.index_select(0, test_index), nullptr, dopt);
  write_points(reader, src, out, dopt, options, std::move(decomposition), e);
}

MetagradientOutputs parse_metagradient_outputs(const std::string& name) {
  if (name == "predicted") return MetagradientOutputs::Predicted;
  if (name == "all") return MetagradientOutputs::All;
  PK_THROW("metagradient outputs '" << name << "' is not one of predicted, all");
}

MetagradientExplanation explain_metagradient(PathReader& reader, const torch::Tensor& test_index,
                                             const std::string& out, const ExplainOptions& options,
                                             MetagradientOutputs which) {
  check_explain_indices(reader, test_index, options);
  const Manifest& m = reader.manifest();
  PK_CHECK(m.sequence_length == 0, "explain --method metagradient: run '"
                                       << reader.dir() << "' is a sequence model's, which the metagradient does "
                                       << "not take yet; use --method exact");
  const torch::Tensor x = reader.test_inputs(test_index);
  MetagradientOptions mopt;
  mopt.progress = options.decomposition.progress;
  if (which == MetagradientOutputs::Predicted) mopt.outputs = reader.outputs(m.steps, x).argmax(1);
  MetagradientExplanation e;
  e.dir = out;
  e.test_index = test_index;
  e.metagradient = metagradient(reader, x, mopt);
  const Metagradient& g = e.metagradient;
  ExplainDocument& doc = e.document;
  for (int64_t n = 0; n < test_index.size(0); ++n) {
    doc.points.push_back(metagradient_point(reader, g, n, test_index[n].item<int64_t>(), options.top));
  }
  doc.run = reader.dir();
  doc.method = ExplainMethod::Metagradient;
  doc.outputs_predicted = g.outputs.defined();
  doc.steps = g.steps;
  doc.adjoints = g.adjoints;
  doc.hessian_vector_products = g.hessian_vector_products;
  doc.seconds = g.seconds;
  doc.loss = m.loss;
  doc.recorded = m.recorded;
  if (!m.loss_weights.file.empty()) doc.loss_weights = m.loss_weights.file;
  doc.contributions_shape = {test_index.size(0), g.values.size(1), g.values.size(2)};
  write_explain_directory(out, doc, g.values);
  if (options.images && m.input_shape.size() == 3) e.images = write_explain_images(out, reader.held_dataset(), doc.points);
  return e;
}

void record_check(MetagradientExplanation& e, const MetagradientCheck& c, double h) {
  e.document.check = check_entry(c, h);
  write_explain_json(e.dir, e.document);
}

}  // namespace pathkernel
