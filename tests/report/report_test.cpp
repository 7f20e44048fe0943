// Tests of the report's computations: the per-step terms against the
// decomposition and a slow autograd reference, the DPK angle, the HTML page,
// evaluate's table and leave-one-out scatter, and the errors of a bad
// explain output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "../test_util.h"
#include "pathkernel/evaluate.h"
#include "pathkernel/explanation.h"
#include "pathkernel/files.h"
#include "pathkernel/model.h"
#include "pathkernel/npy.h"
#include "pathkernel/report.h"
#include "pathkernel/trainer.h"

namespace pathkernel {
namespace {

DecompositionOptions quiet(const std::string& rule = "gauss") {
  DecompositionOptions o;
  o.quadrature.spec = QuadratureSpec::parse(rule);
  o.progress = false;
  return o;
}

TEST(Report, PerStepTermsSumToTheContributions) {
  for (const std::string optimizer : {"gd", "sgd", "momentum"}) {
    testing::TempDir dir(optimizer);
    train_run(testing::small_run(dir / "R", optimizer, 9, 4));
    PathReader reader(dir / "R");
    const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 4);
    const int64_t M = reader.decoded_dataset().x_train.size(0);
    const StepTrace t = trace_steps(reader, x, torch::arange(M), quiet());
    const Decomposition& d = t.decomposition;
    ASSERT_EQ(t.per_step.sizes().vec(), (std::vector<int64_t>{4, 9, M, d.fN.size(1)})) << optimizer;
    const double scale = d.contributions.abs().max().item<double>() + 1e-300;
    EXPECT_LT((t.per_step.sum(1) - d.contributions).abs().max().item<double>(), 1e-12 * std::max(1.0, scale))
        << optimizer;
    EXPECT_LT((t.step_sum.sum(1) - d.contributions.sum(1)).abs().max().item<double>(), 1e-12) << optimizer;
    EXPECT_TRUE((t.step_abs + 1e-15 >= t.step_sum.abs()).all().item<bool>()) << optimizer;
    EXPECT_DOUBLE_EQ(t.certificate_gap.max().item<double>(), d.certificate_max_gap) << optimizer;
    EXPECT_NEAR(t.evaluations.sum().item<double>() * 4, static_cast<double>(d.evaluations), 1e-6) << optimizer;
    // The same decomposition without observing the steps gives the same numbers.
    const Decomposition plain = decompose(reader, x, quiet());
    EXPECT_LT((plain.contributions - d.contributions).abs().max().item<double>(), 1e-15 * std::max(1.0, scale))
        << optimizer;
  }
}

TEST(Report, TrackedSubsetKeepsOnlyItsColumns) {
  testing::TempDir dir;
  train_run(testing::small_run(dir / "R", "sgd", 8, 4));
  PathReader reader(dir / "R");
  const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 3);
  const torch::Tensor tracked = torch::tensor({7, 0, 33}, torch::kInt64);
  const StepTrace t = trace_steps(reader, x, tracked, quiet());
  const torch::Tensor want = t.decomposition.contributions.index_select(1, tracked);
  EXPECT_LT((t.per_step.sum(1) - want).abs().max().item<double>(), 1e-13);
  EXPECT_CONTAINS(testing::error_message([&] { trace_steps(reader, x, torch::tensor({60}), quiet()); }),
                  "tracked training indices must be in [0, 60)");
}

// The slow reference: with the one-node rule J̄_s(x) = J(w_s, x), so for sgd
// C_{i,s}(x)_k = −(η_s / |B_s|) ∇f_k(w_s, x) · ∇ℓ_i(w_s), by autograd.
TEST(Report, PerStepTermsMatchAutogradOnTheDpkRule) {
  testing::TempDir dir;
  train_run(testing::small_run(dir / "R", "sgd", 6, 3));
  PathReader reader(dir / "R");
  const Manifest& m = reader.manifest();
  const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 2);
  const int64_t M = reader.decoded_dataset().x_train.size(0), K = m.num_classes;
  const StepTrace t = trace_steps(reader, x, torch::arange(M), quiet("dpk"));
  Network net = build_network(m.network_options());
  const OutputMap map = net->options().output;
  double worst = 0;
  reader.forward([&](const PathStep& st) {
    const int64_t b = st.batch.size(0);
    torch::Tensor want = torch::zeros({2, M, K}, torch::kFloat64);
    for (int64_t j = 0; j < b; ++j) {
      const int64_t i = st.batch[j].item<int64_t>();
      const torch::Tensor g = testing::flat_grad(net, st.w, reader.decoded_dataset().x_train.narrow(0, i, 1), [&](auto out) {
        return training_loss(out, reader.decoded_dataset().y_train.narrow(0, i, 1), map);
      });
      for (int64_t n = 0; n < 2; ++n) {
        for (int64_t k = 0; k < K; ++k) {
          const torch::Tensor jk =
              testing::flat_grad(net, st.w, x.narrow(0, n, 1), [&](auto out) { return out.select(1, k).sum(); });
          want[n][i][k].add_(-st.lr / static_cast<double>(b) * jk.dot(g).item<double>());
        }
      }
    }
    worst = std::max(worst, (t.per_step.select(1, st.step) - want).abs().max().item<double>());
  });
  EXPECT_LT(worst, 1e-13);
  // The DPK against itself: no angle.
  EXPECT_LT(t.dpk_angle.abs().max().item<double>(), 1e-4);
}

TEST(Report, DpkAngleIsAnAngle) {
  testing::TempDir dir;
  train_run(testing::small_run(dir / "R", "gd", 6, 3));
  PathReader reader(dir / "R");
  const StepTrace t = trace_steps(reader, reader.decoded_dataset().x_test.narrow(0, 0, 5), torch::arange(0), quiet());
  EXPECT_TRUE((t.dpk_angle >= 0).all().item<bool>());
  EXPECT_TRUE((t.dpk_angle <= 180).all().item<bool>());
  EXPECT_GT(t.dpk_angle.max().item<double>(), 1e-6);  // the EPK integrates along the step; the DPK does not
}

TEST(Report, PngDataUriIsAPng) {
  const std::string uri = png_data_uri(torch::rand({1, 4, 5}, torch::kFloat64));
  EXPECT_EQ(uri.rfind("data:image/png;base64,iVBORw0KGgo", 0), 0u) << uri;
  EXPECT_CONTAINS(testing::error_message([] { png_data_uri(torch::rand({2, 4, 5})); }), "C = 1 or 3");
}

TEST(Report, HtmlIsSelfContained) {
  testing::TempDir dir;
  train_run(testing::small_run(dir / "R", "sgd", 6, 3));
  PathReader reader(dir / "R");
  ReportOptions o;
  o.test_points = 3;
  o.gram_points = 6;
  o.progress = false;
  const nlohmann::ordered_json data = report_data(reader, o);
  EXPECT_EQ(data["kernel_machine"]["test_index"].size(), 3u);
  EXPECT_LT(data["kernel_machine"]["max_rel_error"].get<double>(), 1e-10);
  EXPECT_EQ(data["gram"]["values"].size(), 6u);
  EXPECT_FALSE(data.contains("maps"));  // gaussians3 is 100-D
  std::string html = report_html(data);
  EXPECT_CONTAINS(html, "<script type=\"application/json\" id=\"pk-data\">");
  EXPECT_CONTAINS(html, report_plotting_library());
  EXPECT_CONTAINS(html, "Plotly");
  // Nothing is fetched: no external scripts, styles or images outside the
  // inlined library (whose code holds links it never fetches, e.g. its logo's).
  EXPECT_GT(html.size(), 1000000u);  // the plotting library is inline
  const size_t lib = html.find("<script>/* " + report_plotting_library());
  ASSERT_NE(lib, std::string::npos);
  html.erase(lib, html.find("</script>", lib) - lib);
  for (const char* fetch : {"<script src", "<link", "src=\"http", "href=\"http", "url(http"}) {
    EXPECT_EQ(html.find(fetch), std::string::npos) << fetch;
  }
}

/// An explain output of inputs given in a file (explain --inputs), split by
/// layer (--by-layer): the report traces those inputs and gives each listed
/// training point its split over the parameter tensors.
TEST(Report, ShowsInputsFromAFileAndTheirLayers) {
  testing::TempDir dir;
  train_run(testing::small_run(dir / "R", "sgd", 6, 3));
  PathReader reader(dir / "R");
  ExplainOptions eo;
  eo.decomposition.progress = false;
  eo.by_layer = true;
  eo.top = 3;
  write_npy(dir / "x.npy", torch::randn({2, 100}, torch::kFloat64));
  const Explanation e = explain_inputs(reader, read_explain_inputs(reader, dir / "x.npy", ""), dir / "E", eo);
  ReportOptions o;
  o.test_points = 5;
  o.gram_points = 0;
  o.progress = false;
  o.explain_dir = dir / "E";
  const nlohmann::ordered_json data = report_data(reader, o);
  ASSERT_EQ(data["points"].size(), 2u);
  const auto& p = data["points"][1];
  EXPECT_EQ(p["source"], "input");
  EXPECT_EQ(p["test_index"], 1);
  EXPECT_TRUE(p["label"].is_null());
  // The network traced is the network at the file's inputs.
  EXPECT_NEAR(data["kernel_machine"]["network"][1][0].get<double>(), e.decomposition.fN[1][0].item<double>(),
              1e-3 * std::abs(e.decomposition.fN[1][0].item<double>()));
  ASSERT_EQ(data["layer_tensors"].size(), reader.manifest().parameters.size());
  EXPECT_EQ(data["layer_tensors"][0], reader.manifest().parameters[0].name);
  ASSERT_EQ(p["proponents"][0]["layers"].size(), reader.manifest().parameters.size());
  double sum = 0;
  for (const auto& v : p["proponents"][0]["layers"]) sum += v.get<double>();
  const double value = p["proponents"][0]["value"].get<double>();
  EXPECT_NEAR(sum, value, 1e-3 * std::abs(value));
}

/// With both outputs, each explained point's exact contributions beside its
/// metagradient over every training point, for the output differentiated.
TEST(Report, ShowsTheMetagradientBesideTheExactContributions) {
  testing::TempDir dir;
  train_run(testing::small_run(dir / "R", "sgd", 6, 3));
  PathReader reader(dir / "R");
  ExplainOptions eo;
  eo.decomposition.progress = false;
  eo.images = false;
  const torch::Tensor idx = torch::tensor(std::vector<int64_t>{2, 5}, torch::kLong);
  const Explanation exact = explain(reader, idx, dir / "E", eo);
  const MetagradientExplanation mg = explain_metagradient(reader, idx.narrow(0, 1, 1), dir / "MG", eo,
                                                          MetagradientOutputs::Predicted);
  ReportOptions o;
  o.test_points = 2;
  o.gram_points = 0;
  o.progress = false;
  o.explain_dir = dir / "E";
  o.metagradient_dir = dir / "MG";
  const nlohmann::ordered_json data = report_data(reader, o);
  ASSERT_EQ(data["views"].size(), 1u);  // the one point both explain
  const auto& v = data["views"][0];
  EXPECT_EQ(v["test_index"], 5);
  const int64_t k = mg.document.points[0].output;
  EXPECT_EQ(v["output"], k);
  ASSERT_EQ(v["epk"].size(), 60u);
  // The page's numbers are rounded to 4 significant digits.
  for (int64_t i : {0, 17, 59}) {
    const double c = exact.decomposition.contributions[1][i][k].item<double>();
    const double g = mg.metagradient.values[0][i][k].item<double>();
    EXPECT_NEAR(v["epk"][i].get<double>(), c, 1e-3 * std::abs(c)) << i;
    EXPECT_NEAR(v["metagradient"][i].get<double>(), g, 1e-3 * std::abs(g)) << i;
    EXPECT_GT(std::abs(g), 1e-8) << i;
  }
  EXPECT_GE(v["spearman"].get<double>(), -1.0);
  EXPECT_LE(v["spearman"].get<double>(), 1.0);
  // Without the metagradient there is nothing to show.
  o.metagradient_dir.clear();
  EXPECT_TRUE(report_data(reader, o)["views"].empty());
}

/// A number as the page keeps it: four significant digits.
double four_digits(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return std::strtod(buf, nullptr);
}

/// With evaluate's output, the page holds its table and, per test point,
/// every method's leave-one-out scores beside the actual changes, as
/// evaluate.json has them (read here on its own); without it, nothing.
TEST(Report, ShowsTheEvaluationAsEvaluateWroteIt) {
  testing::TempDir dir;
  train_run(testing::small_run(dir / "R", "sgd", 6, 3));
  PathReader reader(dir / "R");
  EvaluateOptions eo;
  eo.methods = {"epk", "grad-dot", "random"};
  eo.metrics = {"loo", "lds"};
  eo.loo_extremes = 2;
  eo.loo_random = 5;
  eo.lds_subsets = 4;
  eo.progress = false;
  eo.retrain.workers = 1;
  evaluate(reader, torch::tensor(std::vector<int64_t>{1, 4, 9}, torch::kLong), dir / "EV", eo);
  const nlohmann::json want = nlohmann::json::parse(read_file(dir / "EV/evaluate.json"));
  ReportOptions o;
  o.test_points = 2;
  o.gram_points = 0;
  o.progress = false;
  o.evaluate_dir = dir / "EV";
  const nlohmann::json data = nlohmann::json::parse(report_data(reader, o).dump());
  ASSERT_TRUE(data.contains("evaluation"));
  const nlohmann::json& ev = data["evaluation"];
  EXPECT_EQ(ev["methods"], want["methods"]);
  EXPECT_EQ(ev["columns"], want["columns"]);
  EXPECT_EQ(ev["table"], want["table"]);
  EXPECT_TRUE(ev["table"]["epk"].contains("lds"));
  std::set<int64_t> random;
  for (const auto& i : want["loo"]["random"]) random.insert(i.get<int64_t>());
  ASSERT_EQ(random.size(), 5u);
  const nlohmann::json& page = ev["loo"]["per_test"];
  ASSERT_EQ(page.size(), 3u);
  int64_t checked = 0;
  for (size_t t = 0; t < 3; ++t) {
    const nlohmann::json& w = want["loo"]["per_test"][t];
    const nlohmann::json& p = page[t];
    EXPECT_EQ(p["test_index"], w["test_index"]);
    EXPECT_EQ(p["output"], w["output"]);
    EXPECT_EQ(p["removed"], w["sample"].size());
    ASSERT_EQ(p["index"], w["sample"]);  // 9 or fewer points: all drawn, in evaluate's order
    ASSERT_GE(w["sample"].size(), 5u);
    for (size_t r = 0; r < w["sample"].size(); ++r) {
      EXPECT_EQ(p["random"][r].get<bool>(), random.count(w["sample"][r].get<int64_t>()) > 0) << r;
      EXPECT_EQ(p["effect"][r].get<double>(), four_digits(w["effect"][r].get<double>())) << t << " " << r;
      for (const std::string meth : {"epk", "grad-dot", "random"}) {
        EXPECT_EQ(p["scores"][meth][r].get<double>(), four_digits(w["scores"][meth][r].get<double>()))
            << meth << " " << t << " " << r;
        ++checked;
      }
    }
    for (const std::string meth : {"epk", "grad-dot", "random"}) {
      EXPECT_EQ(p["spearman"][meth], w["spearman"][meth]) << meth;
      EXPECT_EQ(p["pearson"][meth], w["pearson"][meth]) << meth;
    }
  }
  EXPECT_GE(checked, 3 * 5 * 3);

  // Capped: the first 2 test points, 3 removed points each, evenly spaced in
  // the actual change (its smallest, middle and largest).
  o.evaluate_tests = 2;
  o.evaluate_points = 3;
  const nlohmann::json capped = nlohmann::json::parse(report_data(reader, o).dump())["evaluation"]["loo"];
  EXPECT_EQ(capped["tests"], 3);
  ASSERT_EQ(capped["per_test"].size(), 2u);
  for (size_t t = 0; t < 2; ++t) {
    const nlohmann::json& w = want["loo"]["per_test"][t];
    const nlohmann::json& p = capped["per_test"][t];
    std::vector<double> all;
    for (const auto& v : w["effect"]) all.push_back(four_digits(v.get<double>()));
    std::sort(all.begin(), all.end());
    const size_t n = all.size();
    ASSERT_EQ(p["effect"].size(), 3u);
    ASSERT_EQ(p["index"].size(), 3u);
    std::vector<double> drawn = p["effect"];
    std::sort(drawn.begin(), drawn.end());
    EXPECT_EQ(drawn, (std::vector<double>{all[0], all[(n - 1) / 2 + ((n - 1) % 2 ? 1 : 0)], all[n - 1]}));
    EXPECT_EQ(p["removed"], n);
    for (size_t q = 0; q < 3; ++q) {  // each drawn point keeps its own scores
      const auto at = std::find(w["sample"].begin(), w["sample"].end(), p["index"][q]);
      ASSERT_NE(at, w["sample"].end());
      const size_t r = static_cast<size_t>(at - w["sample"].begin());
      EXPECT_EQ(p["effect"][q].get<double>(), four_digits(w["effect"][r].get<double>()));
      EXPECT_EQ(p["scores"]["epk"][q].get<double>(), four_digits(w["scores"]["epk"][r].get<double>()));
    }
  }

  // Without an evaluate output there is no section at all.
  o.evaluate_dir.clear();
  EXPECT_FALSE(report_data(reader, o).contains("evaluation"));
}

TEST(Report, TwoDimensionalDataGetsTheMaps) {
  testing::TempDir dir;
  RunOptions r = testing::small_run(dir / "R", "gd", 5, 5);
  r.data.spec = "toy2d";
  train_run(r);
  PathReader reader(dir / "R");
  ReportOptions o;
  o.test_points = 2;
  o.gram_points = 0;
  o.grid = 4;
  o.gp_train = 12;
  o.progress = false;
  const nlohmann::ordered_json data = report_data(reader, o);
  ASSERT_TRUE(data.contains("maps"));
  EXPECT_EQ(data["maps"]["kernel_value"].size(), 4u);
  EXPECT_EQ(data["maps"]["prob_std"][0].size(), 4u);
}

TEST(Report, BadExplainOutputGetsAClearError) {
  testing::TempDir dir;
  train_run(testing::small_run(dir / "R", "sgd", 4, 2));
  PathReader reader(dir / "R");
  ReportOptions o;
  o.progress = false;
  o.explain_dir = dir / "nowhere";
  EXPECT_CONTAINS(testing::error_message([&] { report_data(reader, o); }), "explain directory '" + o.explain_dir +
                                                                               "' does not exist");
  std::filesystem::create_directories(dir / "E");
  o.explain_dir = dir / "E";
  EXPECT_CONTAINS(testing::error_message([&] { report_data(reader, o); }), "has no explain.json");
  dir.write("E/explain.json", "{ not json");
  EXPECT_CONTAINS(testing::error_message([&] { report_data(reader, o); }), "is not valid JSON");
  dir.write("E/explain.json", R"({"points": [{"test_index": 0, "predicted": 1, "proponents": [], "opponents": []}]})");
  EXPECT_CONTAINS(testing::error_message([&] { report_data(reader, o); }), "has no contributions.npy");
  write_npy(dir / "E/contributions.npy", torch::zeros({1, 5, 3}, torch::kFloat64));
  EXPECT_CONTAINS(testing::error_message([&] { report_data(reader, o); }), "expected [1, 60, 3]");
  write_npy(dir / "E/contributions.npy", torch::zeros({1, 60, 3}, torch::kFloat64));
  dir.write("E/explain.json",
            R"({"points": [{"test_index": 99, "predicted": 1, "proponents": [], "opponents": []}]})");
  EXPECT_CONTAINS(testing::error_message([&] { report_data(reader, o); }), "explains test point 99, but the run has 30");
}

}  // namespace
}  // namespace pathkernel
