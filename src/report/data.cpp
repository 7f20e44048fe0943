// What the report shows, gathered as JSON: read from the run directory and
// the explain output, and computed where no command writes it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "pathkernel/dataset.h"
#include "pathkernel/decomposition.h"
#include "pathkernel/error.h"
#include "pathkernel/evaluate_result.h"
#include "pathkernel/explain_directory.h"
#include "pathkernel/files.h"
#include "pathkernel/gp.h"
#include "pathkernel/gram.h"
#include "pathkernel/grid.h"
#include "pathkernel/metrics_csv.h"
#include "pathkernel/npy.h"
#include "pathkernel/report.h"
#include "pathkernel/statistics.h"

namespace pathkernel {

namespace {

using json = nlohmann::ordered_json;

/// Four significant digits: the page plots, it does not recompute.
double short_double(double v) {
  if (!std::isfinite(v)) return v;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return std::strtod(buf, nullptr);
}

/// A tensor as nested JSON arrays of short doubles (integers stay integers).
json to_json(const torch::Tensor& t) {
  if (t.dim() == 0) {
    if (t.is_floating_point()) return short_double(t.item<double>());
    return t.item<int64_t>();
  }
  json a = json::array();
  for (int64_t i = 0; i < t.size(0); ++i) a.push_back(to_json(t[i]));
  return a;
}

/// Finite values for JSON (NaN and ±inf have no JSON spelling): null.
json finite(double v) { return std::isfinite(v) ? json(short_double(v)) : json(nullptr); }

/// metrics.csv's rows, as columns.
json training_curves(const std::string& run_dir, const std::string& file) {
  json step = json::array(), lr = json::array(), loss = json::array(), acc = json::array();
  for (const MetricsRow& row : read_metrics_csv((std::filesystem::path(run_dir) / file).string())) {
    step.push_back(row.step);
    lr.push_back(finite(row.lr));
    loss.push_back(finite(row.loss));
    acc.push_back(finite(row.batch_accuracy));
  }
  return {{"step", step}, {"lr", lr}, {"loss", loss}, {"batch_accuracy", acc}};
}

bool is_image(const Manifest& m) { return m.input_shape.size() == 3; }

/// A training or test input for the page: a PNG data URI for images, else
/// the feature values (first 64).
json input_view(const Manifest& m, const torch::Tensor& x) {
  if (is_image(m)) return {{"png", png_data_uri(x)}};
  const torch::Tensor flat = x.reshape({-1}).to(torch::kFloat64);
  return {{"features", to_json(flat.narrow(0, 0, std::min<int64_t>(64, flat.size(0))))},
          {"dimensions", flat.size(0)}};
}

/// A number of evaluate's for the page (four significant digits), or null for NaN.
json short_number(double v) { return std::isnan(v) ? json(nullptr) : json(short_double(v)); }

/// The rows of leave-one-out entry e shown on the page: all of them, or, past
/// `max_points`, that many evenly spaced in the actual change (so its
/// smallest and largest are kept), in evaluate's order.
std::vector<size_t> shown_rows(const LooTestPoint& e, int64_t max_points) {
  const size_t count = e.sample.size();
  std::vector<size_t> pick(count);
  for (size_t r = 0; r < count; ++r) pick[r] = r;
  if (count <= static_cast<size_t>(max_points)) return pick;
  // Sorted by the actual change (a null one last), then evenly spaced.
  auto key = [&](size_t r) { return std::isnan(e.effect[r]) ? std::numeric_limits<double>::infinity() : e.effect[r]; };
  std::stable_sort(pick.begin(), pick.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  std::vector<size_t> spaced;
  for (int64_t q = 0; q < max_points; ++q) {
    spaced.push_back(pick[static_cast<size_t>(std::llround(static_cast<double>(q) * static_cast<double>(count - 1) /
                                                           static_cast<double>(max_points - 1)))]);
  }
  std::sort(spaced.begin(), spaced.end());  // evaluate's order
  return spaced;
}

/// One test point's leave-one-out scatter: each method's scores beside the
/// actual changes, on the rows shown.
json loo_scatter(const LooTestPoint& e, const std::vector<std::string>& methods, const std::set<int64_t>& random,
                 int64_t max_points) {
  const std::vector<size_t> pick = shown_rows(e, max_points);
  json index = json::array(), is_random = json::array(), effect = json::array(), scores = json::object();
  for (size_t r : pick) {
    index.push_back(e.sample[r]);
    is_random.push_back(random.count(e.sample[r]) > 0);
    effect.push_back(short_number(e.effect[r]));
  }
  json spearman = json::object(), pearson = json::object();
  for (size_t i = 0; i < methods.size(); ++i) {
    json s = json::array();
    for (size_t r : pick) s.push_back(short_number(e.scores[i][r]));
    scores[methods[i]] = s;
    spearman[methods[i]] = e.statistics[i].spearman;
    pearson[methods[i]] = e.statistics[i].pearson;
  }
  return {{"test_index", e.test_index},
          {"output", e.output},
          {"removed", e.sample.size()},
          {"index", index},
          {"random", is_random},
          {"effect", effect},
          {"scores", scores},
          {"spearman", spearman},
          {"pearson", pearson}};
}

/// evaluate's output for the page: its methods x metrics table and, for its
/// first `max_tests` test points, each method's leave-one-out scores beside
/// the actual changes. A test point with more than `max_points` removed
/// points shows `max_points` of them (shown_rows); its correlations,
/// evaluate's, are over all of them.
json evaluation_view(const std::string& dir, const Manifest& m, int64_t max_tests, int64_t max_points) {
  const EvaluateResult ev = read_evaluation(dir, m);
  json out = {{"dir", dir},
              {"methods", ev.methods},
              {"columns", ev.columns},
              {"table", table_json(ev)},
              {"test_points", ev.test_indices.size()},
              {"output", ev.output},
              {"retrain", retrain_json(ev.retrain)}};
  if (!ev.loo) return out;
  const LooResult& loo = *ev.loo;
  const std::set<int64_t> random(loo.random.begin(), loo.random.end());
  json tests = json::array();
  const size_t shown_tests = std::min(loo.per_test.size(), static_cast<size_t>(max_tests));
  for (size_t t = 0; t < shown_tests; ++t) tests.push_back(loo_scatter(loo.per_test[t], ev.methods, random, max_points));
  out["loo"] = {{"selection_method", loo.selection_method},
                {"extremes", loo.extremes},
                {"random", random.size()},
                {"max_points", max_points},
                {"tests", loo.per_test.size()},
                {"per_test", tests}};
  return out;
}


void check_report_options(const ReportOptions& options) {
  PK_CHECK(options.test_points >= 1, "the report needs at least one test point (got " << options.test_points << ")");
  PK_CHECK(options.evaluate_tests >= 1 && options.evaluate_points >= 2,
           "the report's leave-one-out scatter needs at least 1 test point and 2 removed points per test point (got "
               << options.evaluate_tests << " and " << options.evaluate_points << ")");
  PK_CHECK(options.tracked >= 1, "the report needs at least one tracked proponent or opponent per side (got "
                                      << options.tracked << ")");
}

/// The run's summary line for the page.
json run_summary(const Manifest& m) {
  return {{"data", m.data.spec},     {"model", m.model_spec},       {"optimizer", m.optimizer.name},
          {"lr", m.optimizer.lr},    {"batch", m.batch_size},       {"steps", m.steps},
          {"parameters", m.parameter_count}, {"train", m.num_train}, {"test", m.num_test},
          {"classes", m.num_classes}, {"status", m.status},         {"results", m.summary}};
}

/// The test points traced: the explained ones (ex, when given), then more
/// (class-balanced) up to options.test_points.
std::vector<int64_t> traced_test_points(const ExplainDirectory* ex, const Dataset& data, const Manifest& m,
                                        const ReportOptions& options) {
  std::vector<int64_t> test_idx;
  std::set<int64_t> seen;
  if (ex) {
    for (int64_t i = 0; i < ex->test_index.size(0); ++i) {
      if (seen.insert(ex->test_index[i].item<int64_t>()).second) test_idx.push_back(ex->test_index[i].item<int64_t>());
    }
  }
  const torch::Tensor more = balanced_subset(data.y_test, std::min<int64_t>(options.test_points, m.num_test), 0);
  for (int64_t i = 0; i < more.size(0) && static_cast<int64_t>(test_idx.size()) < options.test_points; ++i) {
    if (seen.insert(more[i].item<int64_t>()).second) test_idx.push_back(more[i].item<int64_t>());
  }
  return test_idx;
}

/// The points the report traces: the run's test points (index into x_test),
/// or an explain directory's own inputs (explain --inputs; index its rows).
struct TracedPoints {
  std::vector<int64_t> index;
  torch::Tensor x;       ///< [n, ...] their inputs
  torch::Tensor labels;  ///< their labels, in order; undefined: none
  bool own_inputs = false;
};

TracedPoints traced_points(const ExplainDirectory* ex, const Dataset& data, const Manifest& m,
                           const ReportOptions& options) {
  TracedPoints t;
  if (ex && ex->document.inputs) {
    t.own_inputs = true;
    for (int64_t i = 0; i < ex->inputs.size(0); ++i) t.index.push_back(i);
    t.x = ex->inputs.to(input_dtype(data));
    t.labels = ex->labels;
    return t;
  }
  t.index = traced_test_points(ex, data, m, options);
  const torch::Tensor idx = torch::tensor(t.index, torch::kInt64);
  t.x = test_inputs(data, idx);
  t.labels = data.y_test.index_select(0, idx);
  return t;
}

/// The proponents and opponents shown, whose per-step terms are kept, and
/// each one's slot among them.
struct Tracked {
  std::vector<int64_t> index;
  std::map<int64_t, int64_t> slot;
};

Tracked tracked_points(const ExplainDirectory* ex, int64_t per_side) {
  Tracked tracked;
  if (!ex) return tracked;
  for (const ExplainedPoint& p : ex->document.points) {
    for (const std::vector<RankedPoint>* side : {&p.proponents, &p.opponents}) {
      int64_t shown = 0;
      for (const RankedPoint& t : *side) {
        if (shown++ == per_side) break;
        if (tracked.slot.emplace(t.index, static_cast<int64_t>(tracked.index.size())).second) {
          tracked.index.push_back(t.index);
        }
      }
    }
  }
  return tracked;
}

/// The kernel machine against the network, the per-step certificate and
/// evaluations, the contribution mass and the DPK angle, into out.
void add_trace(json& out, const StepTrace& tr, const TracedPoints& traced, const ReportOptions& options) {
  const std::vector<int64_t>& test_idx = traced.index;
  const torch::Tensor tidx = torch::tensor(test_idx, torch::kInt64);
  const Decomposition& d = tr.decomposition;
  const torch::Tensor pred = d.prediction();
  const torch::Tensor diff = (pred - d.fN).abs();
  const torch::Tensor rel = relative_error(pred, d.fN);
  out["kernel_machine"] = {{"test_index", test_idx},
                           {"label", traced.labels.defined() ? to_json(traced.labels)
                                                             : json(std::vector<std::nullptr_t>(test_idx.size()))},
                           {"network", to_json(d.fN)},
                           {"kernel", to_json(pred)},
                           {"max_abs_error", diff.max().item<double>()},
                           {"max_rel_error", rel.max().item<double>()},
                           {"quadrature", options.quadrature.spec.str()},
                           {"seconds", short_double(d.seconds)}};
  out["steps"] = {{"certificate_gap", to_json(tr.certificate_gap)},
                  {"evaluations", to_json(tr.evaluations)},
                  {"certificate_max_gap", d.certificate_max_gap},
                  {"mean_evaluations", short_double(tr.evaluations.mean().item<double>())}};
  // Contribution mass over steps, for the predicted class of each test point.
  const torch::Tensor predicted = d.fN.argmax(1);
  json mass = json::array();
  for (int64_t n = 0; n < tidx.size(0); ++n) {
    const int64_t k = predicted[n].item<int64_t>();
    mass.push_back({{"test_index", test_idx[n]}, {"predicted", k},
                    {"abs", to_json(tr.step_abs[n].select(1, k))}, {"sum", to_json(tr.step_sum[n].select(1, k))}});
  }
  out["mass"] = mass;
  out["dpk_angle"] = {{"test_index", test_idx}, {"degrees", to_json(tr.dpk_angle)}};
}

/// Each explained point: its input, classes, proponents and opponents with their curves.
json explained_points(const ExplainDirectory& ex, const StepTrace& tr, const TracedPoints& traced,
                      const Tracked& tracked, const Dataset& data, const Manifest& m, int64_t per_side) {
  const std::vector<int64_t>& test_idx = traced.index;
  json points = json::array();
  for (size_t e = 0; e < ex.document.points.size(); ++e) {
    const ExplainedPoint& p = ex.document.points[e];
    const int64_t ti = p.test_index;
    const int64_t n = static_cast<int64_t>(std::find(test_idx.begin(), test_idx.end(), ti) - test_idx.begin());
    const int64_t k = p.predicted;
    json pj = {{"test_index", ti},
               {"source", traced.own_inputs ? "input" : "test"},
               {"label", !p.labelled          ? json(nullptr)
                        : p.label.is_class() ? json(p.label.class_index)
                        : traced.own_inputs  ? json(p.label.str())
                                             : json(data.y_test[ti].item<int64_t>())},
               {"predicted", k},
               {"completeness_error", p.completeness_error},
               {"input", input_view(m, traced.x[n])}};
    const std::pair<const char*, const std::vector<RankedPoint>*> sides[] = {{"proponents", &p.proponents},
                                                                            {"opponents", &p.opponents}};
    for (const auto& [side, ranked] : sides) {
      json list = json::array();
      int64_t shown = 0;
      for (const RankedPoint& t : *ranked) {
        if (shown++ == per_side) break;
        const int64_t i = t.index;
        const torch::Tensor curve = tr.per_step[n].select(1, tracked.slot.at(i)).select(1, k);  // [N]
        list.push_back({{"index", i},
                        {"label", data.y_train[i].item<int64_t>()},
                        {"value", t.value},
                        {"total", ex.contributions[static_cast<int64_t>(e)][i][k].item<double>()},
                        {"per_step", to_json(curve)},
                        {"input", input_view(m, train_input(data, i))}});
        if (!t.layers.empty()) list.back()["layers"] = to_json(torch::tensor(t.layers, torch::kFloat64));
      }
      pj[side] = list;
    }
    points.push_back(pj);
  }
  return points;
}

/// The exact contribution beside the metagradient, for points both outputs explain.
json contribution_views(const ExplainDirectory& ex, const ExplainDirectory& mg, const Dataset& data) {
  json views = json::array();
  for (size_t e = 0; e < ex.document.points.size(); ++e) {
    const int64_t ti = ex.document.points[e].test_index;
    for (size_t g = 0; g < mg.document.points.size(); ++g) {
      if (mg.document.points[g].test_index != ti) continue;
      const int64_t k = mg.document.points[g].output;
      const torch::Tensor a = ex.contributions[static_cast<int64_t>(e)].select(1, k).contiguous();
      const torch::Tensor b = mg.contributions[static_cast<int64_t>(g)].select(1, k).contiguous();
      if (torch::isnan(b).any().item<bool>()) continue;  // that output was not differentiated
      const std::vector<double> va(a.data_ptr<double>(), a.data_ptr<double>() + a.numel());
      const std::vector<double> vb(b.data_ptr<double>(), b.data_ptr<double>() + b.numel());
      views.push_back({{"test_index", ti},
                       {"output", k},
                       {"label", to_json(data.y_train)},
                       {"epk", to_json(a)},
                       {"metagradient", to_json(b)},
                       {"spearman", spearman(va, vb)},
                       {"pearson", pearson(va, vb)}});
      break;
    }
  }
  return views;
}

/// The EPK Gram matrix between class-balanced training points, sorted by class.
json gram_view(PathReader& reader, const ReportOptions& options) {
  const Manifest& m = reader.manifest();
  const Dataset& data = reader.held_dataset();  // the chosen training rows decoded (train_inputs)
  torch::Tensor g_idx = balanced_subset(data.y_train, std::min<int64_t>(options.gram_points, m.num_train), 0);
  g_idx = g_idx.index_select(0, torch::argsort(data.y_train.index_select(0, g_idx) * m.num_train + g_idx));
  const torch::Tensor xs = reader.train_inputs(g_idx);
  GramOptions go;
  go.kernel = GramSpec::parse("epk");
  go.quadrature = options.quadrature;
  go.trace = true;
  go.progress = options.progress;
  const torch::Tensor g = gram(reader, xs, false, xs, false, go) / static_cast<double>(m.num_classes);
  return {{"kernel", "epk"},
          {"index", to_json(g_idx)},
          {"label", to_json(data.y_train.index_select(0, g_idx))},
          {"values", to_json(g)}};
}

/// 2-D data: the mean EPK value against the training points and the GP's
/// probability std on a grid (fig5's maps).
json maps_view(PathReader& reader, const ReportOptions& options) {
  const Manifest& m = reader.manifest();
  const Dataset& data = reader.decoded_dataset();
  const int64_t G = options.grid;
  const torch::Tensor X = data.x_train.to(torch::kFloat64);
  // The training inputs' bounding box, widened by 0.5 on each side.
  const Grid2D grid = grid_2d(GridBounds::around(X, 0.0, 0.5), G);
  const torch::Tensor sub = balanced_subset(data.y_train, std::min<int64_t>(options.gp_train, m.num_train), 0);
  const torch::Tensor xs = data.x_train.index_select(0, sub);
  GramOptions go;
  go.kernel = GramSpec::parse("epk");
  go.quadrature = options.quadrature;
  go.progress = options.progress;
  const KernelMatrices km = kernel_matrices(reader, xs, grid.points, true, go, true);
  GpOptions gpo;
  gpo.samples = 200;
  const GpPosterior gp = gp_posterior(km.train, km.cross, km.self, reader.outputs(m.steps, xs), gpo);
  return {{"x", to_json(grid.x)},
          {"y", to_json(grid.y)},
          {"kernel_value", to_json(km.cross.mean(1).reshape({G, G}))},
          {"prob_std", to_json(gp.prob_std.mean(1).reshape({G, G}))},
          {"gp_jitter", gp.jitter},
          {"train_x", to_json(X.select(1, 0))},
          {"train_y", to_json(X.select(1, 1))},
          {"train_label", to_json(data.y_train)}};
}

}  // namespace

nlohmann::ordered_json report_data(PathReader& reader, const ReportOptions& options) {
  check_report_options(options);
  const Manifest& m = reader.manifest();
  PK_CHECK(m.sequence_length == 0,
           "report: run '" << reader.dir() << "' trains on sequences (outputs [n, " << m.sequence_length << ", "
                           << m.num_classes << "]), which report does not take yet (its views are of one label a "
                              "point); verify and explain decompose it, and explain.json lists each point's "
                              "proponents and opponents with their text");
  const Dataset& data = reader.held_dataset();  // training rows read as shown (train_input)
  json out;
  out["title"] = "pathkernel report: " + reader.dir();
  out["run"] = reader.dir();
  out["plotting"] = report_plotting_library();
  out["manifest"] = m.to_json();
  out["summary"] = run_summary(m);
  out["training"] = training_curves(reader.dir(), m.metrics);

  std::optional<ExplainDirectory> ex;
  if (!options.explain_dir.empty()) ex = read_explain_directory(options.explain_dir, m);
  // evaluate's table and its leave-one-out scatter, when given (read before
  // the decomposition, so a bad directory fails at once).
  json evaluation;
  if (!options.evaluate_dir.empty()) {
    evaluation = evaluation_view(options.evaluate_dir, m, options.evaluate_tests, options.evaluate_points);
  }
  const ExplainDirectory* explained = ex ? &*ex : nullptr;
  const TracedPoints traced = traced_points(explained, data, m, options);
  const Tracked tracked = tracked_points(explained, options.tracked);
  DecompositionOptions dopt;
  dopt.quadrature = options.quadrature;
  dopt.progress = options.progress;
  const StepTrace tr = trace_steps(reader, traced.x, torch::tensor(tracked.index, torch::kInt64), dopt);
  add_trace(out, tr, traced, options);
  out["points"] = ex ? explained_points(*ex, tr, traced, tracked, data, m, options.tracked) : json::array();
  if (ex && ex->document.layers) {  // explain --by-layer: the parameter tensors each split is over
    json names = json::array();
    for (const ExplainLayerTensor& t : ex->document.layers->tensors) names.push_back(t.name);
    out["layer_tensors"] = names;
  }
  json views = json::array();
  if (ex && !ex->document.inputs && !options.metagradient_dir.empty()) {  // the same test points in both
    views = contribution_views(*ex, read_explain_directory(options.metagradient_dir, m), data);
  }
  out["views"] = views;
  if (!evaluation.is_null()) out["evaluation"] = evaluation;
  if (options.gram_points > 0) out["gram"] = gram_view(reader, options);
  const bool two_d = m.input_shape.size() == 1 && m.input_shape[0] == 2;
  if (two_d && options.grid > 0) out["maps"] = maps_view(reader, options);
  return out;
}

}  // namespace pathkernel
