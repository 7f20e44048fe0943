// Explaining test predictions: the explain directory, written and read back.
#include "pathkernel/explanation.h"

#include <algorithm>
#include <filesystem>

#include "pathkernel/context.h"
#include "pathkernel/decomposition_checkpoint.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/json_number.h"
#include "pathkernel/image.h"
#include "pathkernel/npy.h"

namespace pathkernel {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

std::vector<double> values_of(const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

/// Point i's label: its class, or its regression target [K].
ojson label_of(const torch::Tensor& labels, int64_t i) {
  if (is_regression_target(labels)) return values_of(labels[i].to(torch::kFloat64));
  return labels[i].item<int64_t>();
}

/// The k training points with the largest (or smallest) contributions c [M].
ojson extremes(const torch::Tensor& c, const torch::Tensor& labels, int64_t k, bool largest) {
  auto [values, index] = c.topk(std::min<int64_t>(k, c.size(0)), 0, largest);
  ojson out = ojson::array();
  for (int64_t j = 0; j < index.size(0); ++j) {
    int64_t i = index[j].item<int64_t>();
    out.push_back({{"index", i}, {"label", label_of(labels, i)}, {"value", values[j].item<double>()}});
  }
  return out;
}

/// Image data: each test image (blue) beside its top eight proponents (green,
/// top row) and opponents (red, bottom row). Returns the files written.
std::vector<std::string> write_images(PathReader& reader, const torch::Tensor& test_index, const ojson& points,
                                      const std::string& out) {
  std::vector<std::string> pngs;
  const torch::Tensor& x_train = reader.dataset().x_train;
  const torch::Tensor& x_test = reader.dataset().x_test;
  for (int64_t n = 0; n < test_index.size(0); ++n) {
    std::vector<std::vector<GridTile>> rows(2);
    rows[0].push_back({x_test[test_index[n].item<int64_t>()], Rgb{40, 90, 220}});
    rows[1].push_back({torch::Tensor(), std::nullopt});
    const char* sides[] = {"proponents", "opponents"};
    const Rgb colours[] = {Rgb{30, 160, 60}, Rgb{210, 40, 40}};
    for (int side = 0; side < 2; ++side) {
      int shown = 0;
      for (const auto& e : points[n][sides[side]]) {
        if (shown++ == 8) break;
        rows[side].push_back({x_train[json_number<int64_t>(e["index"], "a training index")], colours[side]});
      }
    }
    const std::string name = "explain_" + std::to_string(test_index[n].item<int64_t>()) + ".png";
    write_png_grid((fs::path(out) / name).string(), rows);
    pngs.push_back(name);
  }
  return pngs;
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
  const torch::Tensor& x_test = reader.dataset().x_test;
  PK_CHECK(test_index.dim() == 1 && test_index.numel() > 0 && test_index.scalar_type() == torch::kLong,
           "explain: test indices must be a non-empty int64 list (got " << test_index.sizes() << " "
                                                                        << test_index.scalar_type() << ")");
  PK_CHECK(test_index.min().item<int64_t>() >= 0 && test_index.max().item<int64_t>() < x_test.size(0),
           "explain: test indices must lie in [0, " << x_test.size(0) << ")");
  PK_CHECK(options.top >= 1, "explain: the number of proponents and opponents listed must be >= 1 (got "
                                 << options.top << ")");
}

DecompositionOptions explain_decomposition_options(const Manifest& m, int64_t n, const ExplainOptions& options,
                                                   std::string* kernel_note) {
  DecompositionOptions dopt = options.decomposition;
  // The summed kernel is the ensemble form of gd and sgd runs.
  const bool kernel_form = !m.optimizer.traits().has_buffer;
  const double kernel_bytes = 8.0 * static_cast<double>(n) * static_cast<double>(m.num_train) *
                              static_cast<double>(m.num_classes * m.num_classes);
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
  return ojson{{"manifest_crc32", reader.manifest_crc32()},
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
}

Explanation explain(PathReader& reader, const torch::Tensor& test_index, const std::string& out,
                    const ExplainOptions& options) {
  check_explain_indices(reader, test_index, options);
  Explanation e;
  const DecompositionOptions dopt =
      explain_decomposition_options(reader.manifest(), test_index.size(0), options, &e.kernel_note);
  if (options.on_note && !e.kernel_note.empty()) options.on_note(e.kernel_note);
  DirectoryCheckpoint progress((fs::path(out) / ".progress").string(),
                               explain_progress_arguments(reader, test_index, dopt), options.checkpoint_seconds);
  progress.resume_point();
  e.progress_note = progress.message();
  if (options.on_note && !e.progress_note.empty()) options.on_note(e.progress_note);
  Decomposition d = decompose(reader, reader.dataset().x_test.index_select(0, test_index), dopt, &progress);
  write_explanation(reader, test_index, out, dopt, options, std::move(d), e);
  progress.finish();
  return e;
}

void write_explanation(PathReader& reader, const torch::Tensor& test_index, const std::string& out,
                       const DecompositionOptions& dopt, const ExplainOptions& options, Decomposition decomposition,
                       Explanation& e) {
  const Manifest& m = reader.manifest();
  e.dir = out;
  e.test_index = test_index;
  e.decomposition = std::move(decomposition);
  const Decomposition& d = e.decomposition;
  e.kernel = dopt.kernel;

  fs::create_directories(out);
  write_npy((fs::path(out) / "contributions.npy").string(), d.contributions);
  if (e.kernel) write_npy((fs::path(out) / "kernel.npy").string(), d.kernel);
  const bool single = is_single_kernel_machine(m);
  const double batch = static_cast<double>(m.batch_size == 0 ? m.num_train : m.batch_size);
  const torch::Tensor& y_train = reader.dataset().y_train;
  const torch::Tensor gap = d.completeness_gap();
  ojson points = ojson::array();
  for (int64_t n = 0; n < test_index.size(0); ++n) {
    const int64_t predicted = d.fN[n].argmax().item<int64_t>();
    const torch::Tensor c = d.contributions[n].select(1, predicted);  // [M]
    points.push_back({{"test_index", test_index[n].item<int64_t>()},
                      {"label", label_of(reader.dataset().y_test, test_index[n].item<int64_t>())},
                      {"predicted", predicted},
                      {"f_final", values_of(d.fN[n])},
                      {"f_initial", values_of(d.f0[n])},
                      {"contributions_sum", values_of(d.contributions[n].sum(0))},
                      {"regularization", values_of(d.regularization[n])},
                      {"rounding", values_of(d.rounding[n])},
                      {"completeness_error", gap[n].abs().max().item<double>()},
                      {"proponents", extremes(c, y_train, options.top, true)},
                      {"opponents", extremes(c, y_train, options.top, false)}});
  }
  const int64_t n = test_index.size(0), M = d.contributions.size(1), K = d.contributions.size(2);
  e.json = ojson{{"run", reader.dir()},
                 {"method", "exact"},
                 {"quadrature", dopt.quadrature.spec.str()},
                 {"steps", d.steps},
                 {"certificate_max_gap", d.certificate_max_gap},
                 {"loss", m.loss},
                 // mse's loss derivative 2(f − t)/K moves with f along training, so the
                 // contributions are a sum of per-step kernel machines, never one machine
                 // with fixed coefficients.
                 {"form", m.loss == "mse" ? "ensemble (mse: the loss derivative changes along training)"
                                          : single ? "kernel machine" : "ensemble"},
                 {"recorded", m.recorded},
                 {"updates_explained", d.residuals.first_step < 0},
                 {"contributions", {{"file", "contributions.npy"}, {"shape", {n, M, K}}}},
                 {"kernel", e.kernel ? ojson{{"file", "kernel.npy"},
                                             {"shape", {n, M, m.num_classes, m.num_classes}},
                                             {"single_kernel", single},
                                             {"weight", single ? ojson(m.optimizer.lr / batch) : ojson(nullptr)}}
                                     : ojson(nullptr)},
                 {"points", points}};
  const std::string unexplained = unexplained_update_message(d.residuals);
  if (!unexplained.empty()) e.json["warning"] = unexplained;
  write_file_atomic((fs::path(out) / "explain.json").string(), e.json.dump(2) + "\n");
  if (options.images && m.input_shape.size() == 3) e.images = write_images(reader, test_index, points, out);
}

MetagradientOutputs parse_metagradient_outputs(const std::string& name) {
  if (name == "predicted") return MetagradientOutputs::Predicted;
  if (name == "all") return MetagradientOutputs::All;
  PK_THROW("metagradient outputs '" << name << "' is not one of predicted, all");
}

Explanation explain_metagradient(PathReader& reader, const torch::Tensor& test_index, const std::string& out,
                                 const ExplainOptions& options, MetagradientOutputs which) {
  check_explain_indices(reader, test_index, options);
  const Manifest& m = reader.manifest();
  const torch::Tensor x = reader.dataset().x_test.index_select(0, test_index);
  MetagradientOptions mopt;
  mopt.progress = options.decomposition.progress;
  if (which == MetagradientOutputs::Predicted) mopt.outputs = reader.outputs(m.steps, x).argmax(1);
  Explanation e;
  e.dir = out;
  e.test_index = test_index;
  e.metagradient = metagradient(reader, x, mopt);
  const Metagradient& g = e.metagradient;
  fs::create_directories(out);
  write_npy((fs::path(out) / "contributions.npy").string(), g.values);
  const torch::Tensor& y_train = reader.dataset().y_train;
  ojson points = ojson::array();
  for (int64_t n = 0; n < test_index.size(0); ++n) {
    const int64_t predicted = g.fN[n].argmax().item<int64_t>();
    const int64_t shown = g.outputs.defined() ? g.outputs[n].item<int64_t>() : predicted;
    const torch::Tensor c = g.values[n].select(1, shown);  // [M]
    points.push_back({{"test_index", test_index[n].item<int64_t>()},
                      {"label", label_of(reader.dataset().y_test, test_index[n].item<int64_t>())},
                      {"predicted", predicted},
                      {"output", shown},
                      {"f_final", values_of(g.fN[n])},
                      {"metagradient_sum", values_of(g.values[n].sum(0))},
                      {"proponents", extremes(c, y_train, options.top, true)},
                      {"opponents", extremes(c, y_train, options.top, false)}});
  }
  const int64_t n = test_index.size(0), M = g.values.size(1), K = g.values.size(2);
  e.json = ojson{{"run", reader.dir()},
                 {"method", "metagradient"},
                 {"meaning", "d f(w_N, x) / d c_i: how the trained network's output moves per unit of training "
                             "point i's loss weight, the whole run retrained (first order)"},
                 {"outputs", g.outputs.defined() ? "predicted" : "all"},
                 {"steps", g.steps},
                 {"adjoints", g.adjoints},
                 {"hessian_vector_products", g.hessian_vector_products},
                 {"seconds", g.seconds},
                 {"loss", m.loss},
                 {"recorded", m.recorded},
                 {"loss_weights", m.loss_weights.file.empty() ? ojson(nullptr) : ojson(m.loss_weights.file)},
                 {"contributions", {{"file", "contributions.npy"}, {"shape", {n, M, K}},
                                    {"not_differentiated", g.outputs.defined() ? "NaN" : "none"}}},
                 {"kernel", nullptr},
                 {"points", points}};
  write_file_atomic((fs::path(out) / "explain.json").string(), e.json.dump(2) + "\n");
  if (options.images && m.input_shape.size() == 3) e.images = write_images(reader, test_index, points, out);
  return e;
}

ExplainOutput read_explain_output(const std::string& dir, const Manifest& m) {
  using json = nlohmann::json;
  ExplainOutput e;
  PK_CHECK(fs::is_directory(dir), "explain directory '" << dir
                                                        << "' does not exist: expected the directory explain() writes "
                                                        << "('pathkernel explain')");
  const std::string jpath = (fs::path(dir) / "explain.json").string();
  PK_CHECK(fs::exists(jpath),
           "explain directory '" << dir << "' has no explain.json: was it written by 'pathkernel explain'?");
  json j;
  try {
    j = json::parse(read_file(jpath));
  } catch (const json::exception& ex) {
    PK_THROW("'" << jpath << "' is not valid JSON (" << ex.what() << "): was it written by 'pathkernel explain'?");
  }
  PK_CHECK(j.is_object() && j.contains("points") && j["points"].is_array() && !j["points"].empty(),
           "'" << jpath << "' has no \"points\" list: expected the output of 'pathkernel explain'");
  const std::string cpath = (fs::path(dir) / "contributions.npy").string();
  PK_CHECK(fs::exists(cpath), "explain directory '" << dir << "' has no contributions.npy");
  e.contributions = read_npy(cpath).to(torch::kFloat64);
  const int64_t count = static_cast<int64_t>(j["points"].size());
  PK_CHECK(e.contributions.dim() == 3 && e.contributions.size(0) == count && e.contributions.size(1) == m.num_train &&
               e.contributions.size(2) == m.num_classes,
           "'" << cpath << "' has shape " << e.contributions.sizes() << "; expected [" << count << ", " << m.num_train
               << ", " << m.num_classes << "] (explained points, training points, classes): was it explained from "
               << "this run?");
  std::vector<int64_t> idx;
  for (const auto& p : j["points"]) {
    PK_CHECK(p.is_object() && p.contains("test_index") && p.contains("proponents") && p.contains("opponents") &&
                 p.contains("predicted"),
             "'" << jpath << "' has a point without test_index, predicted, proponents or opponents: " << p.dump());
    const int64_t i = json_number<int64_t>(p["test_index"], "'" + jpath + "': a point's test_index");
    PK_CHECK(i >= 0 && i < m.num_test, "'" << jpath << "' explains test point " << i << ", but the run has "
                                            << m.num_test << " test points");
    for (const char* side : {"proponents", "opponents"}) {
      for (const auto& t : p[side]) {
        PK_CHECK(t.is_object() && t.contains("index"),
                 "'" << jpath << "' lists an entry without an index among the " << side << ": " << t.dump());
        const int64_t ti = json_number<int64_t>(t["index"], "'" + jpath + "': an index among the " + side);
        PK_CHECK(ti >= 0 && ti < m.num_train, "'" << jpath << "' lists training point " << ti << " among the "
                                                  << side << "; the run has " << m.num_train << " training points");
      }
    }
    idx.push_back(i);
  }
  e.points = j["points"];
  e.test_index = torch::tensor(idx, torch::kInt64);
  return e;
}

}  // namespace pathkernel
