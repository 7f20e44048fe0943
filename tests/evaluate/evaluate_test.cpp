// evaluate() end to end on a small run: every metric's entries, one
// leave-one-out effect recomputed from a retraining, the mislabel run, the
// CLI, and bad options.
#include "pathkernel/evaluate.h"

#include <filesystem>
#include <functional>

#include "evaluate_util.h"
#include "pathkernel/files.h"
#include "pathkernel/model.h"

using namespace pathkernel;
using namespace pathkernel::testing;
using json = nlohmann::json;

namespace {

EvaluateOptions small_options() {
  EvaluateOptions o;
  o.metrics = {"loo", "lds", "brittleness", "mislabel"};
  o.loo_extremes = 2;
  o.loo_random = 4;
  o.lds_subsets = 6;
  o.brittleness_grid = {2, 8};
  o.mislabel_fraction = 0.2;
  o.mislabel_candidates = 8;
  o.progress = false;
  o.retrain.workers = 2;
  return o;
}

}  // namespace

TEST(Evaluate, EveryMetricOnASmallRun) {
  TempDir dir;
  SmallData(30).write(dir / "data");
  cli_train(dir / "data", dir / "run", "--model mlp:6 --seed 3 --steps 25 --optimizer sgd --batch 8 --lr 0.1");
  PathReader reader(dir / "run");
  const torch::Tensor test = torch::tensor({0, 4, 8});
  const EvaluateResult e = evaluate(reader, test, dir / "eval", small_options());
  const json j = json::parse(read_file(dir / "eval/evaluate.json"));
  EXPECT_FALSE(std::filesystem::exists(dir / "eval/.work"));
  EXPECT_EQ(j["retrain"]["baseline_reproduces_run"], true);  // trained on one thread, like each retraining
  for (const std::string method : {"epk", "dpk", "tracin-cp", "grad-dot", "random"}) {
    SCOPED_TRACE(method);
    EXPECT_EQ(read_npy(dir / ("eval/scores_" + method + ".npy")).sizes(), (std::vector<int64_t>{3, 30}));
    for (const std::string& column : e.columns) {
      const json& v = j["table"][method][column];
      if (v.is_null()) continue;
      if (column == "brittleness_median_k") {
        EXPECT_TRUE(v == 2 || v == 8);
      } else {
        EXPECT_GE(v.get<double>(), column.rfind("loo", 0) == 0 || column == "lds" ? -1.0 : 0.0) << column;
        EXPECT_LE(v.get<double>(), 1.0) << column;
      }
    }
    EXPECT_TRUE(j["table"][method].contains("mislabel_auc"));
  }
  // Leave-one-out: the sample of each test point holds its epk extremes and
  // the shared random points, and its effects are f_base − f_{−i}.
  const json& first = j["loo"]["per_test"][0];
  const torch::Tensor epk = read_npy(dir / "eval/scores_epk.npy");
  const int64_t top = epk[0].argmax().item<int64_t>();
  const std::vector<int64_t> sample = first["sample"];
  const auto at = std::find(sample.begin(), sample.end(), top);
  ASSERT_NE(at, sample.end());
  const Retrainer retrainer(reader);
  Network net = build_network(reader.manifest().network_options());
  set_flat_parameters(net, retrainer.final_weights(removal_job(30, torch::tensor({top})), RemovalScaling::Reduced));
  const int64_t k = first["output"];
  const double without = net->forward(reader.decoded_dataset().x_test.narrow(0, 0, 1))[0][k].item<double>();
  const double base = j["loo"]["base"][0];
  EXPECT_EQ(first["effect"][at - sample.begin()].get<double>(), base - without);
  EXPECT_EQ(j["loo"]["random"].size(), 4u);
  EXPECT_EQ(j["lds"]["per_test"]["epk"].size(), 3u);
  EXPECT_EQ(j["mislabel"]["flipped"], 6);
  EXPECT_EQ(j["mislabel"]["self_attribution"]["epk"].size(), 8u);
  // The exact contribution of the flipped point to its own flipped label is positive.
  EXPECT_GT(j["mislabel"]["self_attribution"]["epk"][0].get<double>(), 0.0);
}

TEST(Evaluate, CommandLinePrintsTheTableAndJson) {
  TempDir dir;
  SmallData(30).write(dir / "data");
  cli_train(dir / "data", dir / "run", "--model mlp:6 --seed 3 --steps 25 --optimizer sgd --batch 8 --lr 0.1");
  const std::string bin = pathkernel::testing::binary_path();
  const CommandOutput text = run_shell(bin + " evaluate " + (dir / "run") +
                                       " --quiet --test 2 --methods epk,random --metrics loo,lds --loo-extremes 2 "
                                       "--loo-random 3 --lds-subsets 4");
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_CONTAINS(text.out, "loo_spearman");
  EXPECT_CONTAINS(text.out, "wrote " + (dir / "run/evaluate") + "/evaluate.json");
  const CommandOutput js = run_shell(bin + " evaluate " + (dir / "run") +
                                     " --quiet --json --test-index 1 --methods grad-dot --metrics lds "
                                     "--lds-subsets 4 --out " + (dir / "e2"));
  ASSERT_EQ(js.status, 0) << js.out;
  const json j = json::parse(js.out.substr(js.out.find('{')));
  EXPECT_TRUE(j["table"]["grad-dot"].contains("lds"));
  const CommandOutput bad = run_shell(bin + " evaluate " + (dir / "run") + " --quiet --methods epk,shapley");
  EXPECT_NE(bad.status, 0);
  EXPECT_CONTAINS(bad.out, "unknown attribution method 'shapley'");
}

TEST(Evaluate, BadOptionsAreRefusedWithTheValue) {
  EvaluateOptions o;
  o.metrics = {"loo", "auc"};
  EXPECT_CONTAINS(error_message([&] { o.validate(100, 3); }),
                  "unknown metric 'auc': expected one of loo, lds, brittleness, mislabel");
  o = EvaluateOptions();
  o.lds_fraction = 1.5;
  EXPECT_CONTAINS(error_message([&] { o.validate(100, 3); }), "fraction must be in (0, 1) (got 1.5)");
  o = EvaluateOptions();
  o.metrics = {"brittleness"};
  o.brittleness_grid = {10, 5};
  EXPECT_CONTAINS(error_message([&] { o.validate(100, 3); }), "(got 5 at position 1)");
  o = EvaluateOptions();
  o.loo_extremes = 30;
  EXPECT_CONTAINS(error_message([&] { o.validate(50, 3); }), "sample of 70 points exceeds the 50 training points");
  o = EvaluateOptions();
  o.mislabel_fraction = 0.01;
  EXPECT_CONTAINS(error_message([&] { o.validate(100, 3); }), "1 flipped labels");
}

// After one step of gd, removing point i with the others' weights kept moves
// w_1 by η g_i / M. The effect on f is −J(w_1) η g_i / M to first order, and
// C_i = −J̄_0 η g_i / M; the two differ by O(η) relative (the Jacobian's
// change along the step, and the move's second order): with η = 0.02 they
// agree in rank and to a few percent in value. (This is what makes the metric's sign and wiring checkable; over
// many steps the path's response takes them apart, docs/attribution-quality.md.)
TEST(Evaluate, OneStepLeaveOneOutEffectsAreTheExactContributions) {
  TempDir dir;
  SmallData(30).write(dir / "data");
  cli_train(dir / "data", dir / "run", "--model mlp:6 --seed 3 --steps 1 --optimizer gd --lr 0.02");
  PathReader reader(dir / "run");
  EvaluateOptions o;
  o.methods = {"epk", "random"};
  o.metrics = {"loo"};
  o.loo_extremes = 3;
  o.loo_random = 8;
  o.progress = false;
  o.retrain.scaling = RemovalScaling::Kept;
  const EvaluateResult e = evaluate(reader, torch::tensor({0, 1, 2, 3}), dir / "eval", o);
  EXPECT_GT(e.value("epk", "loo_spearman"), 0.99);
  EXPECT_GT(e.value("epk", "loo_pearson"), 0.99);
  EXPECT_LT(std::abs(e.value("random", "loo_pearson")), 0.9);
  ASSERT_TRUE(e.loo.has_value());
  for (const LooTestPoint& t : e.loo->per_test) {
    for (size_t k = 0; k < t.effect.size(); ++k) {
      const double effect = t.effect[k], score = t.scores[0][k];  // epk, the first method
      EXPECT_NEAR(effect, score, 0.05 * std::abs(score) + 1e-9);
    }
  }
}

// read_evaluation gives back what evaluate() wrote, and refuses a file that
// does not fit the run, naming the file and the entry.
TEST(Evaluate, ReadEvaluationGivesBackWhatEvaluateWroteAndRefusesBadFiles) {
  TempDir dir;
  SmallData(30).write(dir / "data");
  cli_train(dir / "data", dir / "run", "--model mlp:6 --seed 3 --steps 5 --optimizer sgd --batch 8 --lr 0.1");
  PathReader reader(dir / "run");
  EvaluateOptions o;
  o.methods = {"grad-dot", "random"};
  o.metrics = {"loo"};
  o.loo_extremes = 1;
  o.loo_random = 3;
  o.progress = false;
  o.retrain.workers = 1;
  const EvaluateResult e = evaluate(reader, torch::tensor({2, 5}), dir / "eval", o);
  const Manifest& m = reader.manifest();
  const EvaluateResult back = read_evaluation(dir / "eval", m);
  // The file is what the result spells, and the result read back spells it again.
  EXPECT_EQ(read_file(dir / "eval/evaluate.json"), evaluate_json(e).dump(2) + "\n");
  EXPECT_EQ(evaluate_json(back).dump(2), evaluate_json(e).dump(2));
  EXPECT_EQ(back.columns, e.columns);
  ASSERT_TRUE(back.loo.has_value());
  ASSERT_EQ(back.loo->per_test.size(), 2u);

  EXPECT_CONTAINS(error_message([&] { read_evaluation(dir / "nowhere", m); }),
                  "evaluate directory '" + (dir / "nowhere") + "' does not exist");
  std::filesystem::create_directories(dir / "bad");
  EXPECT_CONTAINS(error_message([&] { read_evaluation(dir / "bad", m); }), "has no evaluate.json");
  dir.write("bad/evaluate.json", "{ not json");
  EXPECT_CONTAINS(error_message([&] { read_evaluation(dir / "bad", m); }), "is not valid JSON");
  const std::string file = dir / "bad/evaluate.json";
  auto write_changed = [&](const std::function<void(json&)>& change) {
    json j = json::parse(read_file(dir / "eval/evaluate.json"));
    change(j);
    write_file_atomic(file, j.dump());
  };
  auto refused = [&](const std::function<void(json&)>& change) {
    write_changed(change);
    return error_message([&] { read_evaluation(dir / "bad", m); });
  };
  write_changed([](json&) {});
  EXPECT_NO_THROW(read_evaluation(dir / "bad", m));  // unchanged, it reads
  EXPECT_CONTAINS(refused([](json& j) { j["table"].erase("random"); }),
                  "lists method 'random' but its table has no row for it");
  EXPECT_CONTAINS(refused([](json& j) { j["loo"]["per_test"][1]["test_index"] = 9; }),
                  "leave-one-out entry 1 has test_index 9; the run has 9 test points");
  EXPECT_CONTAINS(refused([](json& j) { j["loo"]["per_test"][0]["sample"][0] = 30; }),
                  "leave-one-out entry 0 removes training point 30; the run has 30 training points");
  EXPECT_CONTAINS(refused([](json& j) { j["loo"]["per_test"][0]["effect"].erase(0); }),
                  "numbers in \"effect\", one per removed point (got ");
  EXPECT_CONTAINS(refused([](json& j) { j["loo"]["per_test"][1]["scores"]["grad-dot"] = "x"; }),
                  "scores of method 'grad-dot', one per removed point (got a string)");
  EXPECT_CONTAINS(refused([](json& j) { j["loo"]["per_test"][0]["output"] = 3; }),
                  "leave-one-out entry 0 has output 3; the run has 3 outputs");
}
