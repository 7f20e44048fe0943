// Tests of explain() and the explain directory (explain_directory.h): a round trip, the
// single-kernel condition, and bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "../test_util.h"
#include "pathkernel/explanation.h"
#include "pathkernel/files.h"
#include "pathkernel/npy.h"

namespace pathkernel {
namespace {

// What explain() writes, read_explain_directory() reads back; the contributions
// are the decomposition's and sum, with f(w_0), R and E, to f(w_N).
TEST(Explanation, WritesWhatTheReaderReadsBack) {
  testing::TempDir dir("explain");
  RunOptions r = testing::small_run(dir / "run", "sgd", 6, 3);
  train_run(r);
  PathReader reader(r.out);
  ExplainOptions options;
  options.decomposition.progress = false;
  options.top = 4;
  std::vector<std::string> notes;
  options.on_note = [&](const std::string& n) { notes.push_back(n); };
  const torch::Tensor idx = torch::tensor({5, 2}, torch::kLong);
  const Explanation e = explain(reader, idx, dir / "ex", options);
  EXPECT_TRUE(e.kernel);  // sgd, small: the automatic choice writes it
  EXPECT_TRUE(notes.empty());
  EXPECT_FALSE(std::filesystem::exists(dir / "ex/.progress"));

  const ExplainDirectory back = read_explain_directory(dir / "ex", reader.manifest());
  EXPECT_TRUE(torch::equal(back.test_index, idx));
  EXPECT_TRUE(torch::equal(back.contributions, e.decomposition.contributions));
  ASSERT_EQ(back.document.points.size(), 2u);
  // The file is what the document spells, and the document read back spells it again.
  EXPECT_EQ(read_file(dir / "ex/explain.json"), explain_json(e.document).dump(2) + "\n");
  EXPECT_EQ(explain_json(back.document).dump(2), explain_json(e.document).dump(2));
  ASSERT_TRUE(back.document.kernel.has_value());
  EXPECT_EQ(back.document.kernel->shape, (std::vector<int64_t>{2, 60, 3, 3}));
  EXPECT_EQ(read_npy(dir / "ex/kernel.npy").sizes(), (std::vector<int64_t>{2, 60, 3, 3}));
  for (size_t n = 0; n < 2; ++n) {
    const ExplainedPoint& p = back.document.points[n];
    ASSERT_EQ(p.proponents.size(), 4u);
    // The listed proponents are the largest contributions to the predicted class, in order.
    const torch::Tensor c = back.contributions[static_cast<int64_t>(n)].select(1, p.predicted);
    const torch::Tensor best = std::get<0>(c.topk(4));
    for (int j = 0; j < 4; ++j) EXPECT_EQ(p.proponents[j].value, best[j].item<double>());
    for (size_t k = 0; k < 3; ++k) {
      const double total = p.f_initial[k] + p.contributions_sum[k] + p.regularization[k] + p.rounding[k];
      EXPECT_NEAR(total, p.f_final[k], 1e-12 * std::max(1.0, std::abs(total)));
    }
  }
  // An automatic kernel over the limit is not written, and the note says so.
  options.kernel_max_bytes = 1;
  const Explanation small = explain(reader, idx, dir / "ex2", options);
  EXPECT_FALSE(small.kernel);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_CONTAINS(notes[0], "kernel.npy would take");
  EXPECT_FALSE(std::filesystem::exists(dir / "ex2/kernel.npy"));
}

TEST(Explanation, SingleKernelMachineNeedsLogSoftmaxAConstantRateAndEqualBatches) {
  struct Case {
    std::string output, schedule;
    int64_t batch, train;
    bool single;
  };
  for (const Case& c : std::vector<Case>{{"logsoftmax", "constant", 0, 60, true},
                                         {"logsoftmax", "constant", 20, 60, true},
                                         {"logsoftmax", "constant", 16, 60, false},
                                         {"logsoftmax", "cosine", 20, 60, false},
                                         {"logits", "constant", 20, 60, false}}) {
    Manifest m;
    m.output = c.output;
    m.schedule = c.schedule;
    m.batch_size = c.batch;
    m.num_train = c.train;
    EXPECT_EQ(is_single_kernel_machine(m), c.single) << c.output << " " << c.schedule << " batch " << c.batch;
  }
}

TEST(Explanation, BadInputGetsAClearError) {
  testing::TempDir dir("explain_bad");
  RunOptions r = testing::small_run(dir / "run", "sgd", 3, 3);
  train_run(r);
  PathReader reader(r.out);
  ExplainOptions options;
  options.decomposition.progress = false;
  EXPECT_CONTAINS(testing::error_message([&] { explain(reader, torch::tensor({30}, torch::kLong), dir / "x", options); }),
                  "test indices must lie in [0, 30)");
  EXPECT_CONTAINS(testing::error_message([&] { parse_kernel_output("maybe"); }), "not one of auto, on, off");
  EXPECT_CONTAINS(testing::error_message([&] { read_explain_directory(dir / "none", reader.manifest()); }),
                  "does not exist");
  std::filesystem::create_directories(dir / "empty");
  EXPECT_CONTAINS(testing::error_message([&] { read_explain_directory(dir / "empty", reader.manifest()); }),
                  "has no explain.json");

  // A real output, then hand edits of one point: each is refused by name.
  // Before json_number, an index of 1e300 was undefined behaviour (a float's
  // static_cast to int64), not an error.
  ExplainOptions write = options;
  write.top = 2;
  explain(reader, torch::tensor({4, 1}, torch::kLong), dir / "good", write);
  const nlohmann::json good = nlohmann::json::parse(read_file(dir / "good/explain.json"));
  EXPECT_NO_THROW(read_explain_directory(dir / "good", reader.manifest()));
  struct Edit {
    std::string name, message;
    std::function<void(nlohmann::json&)> apply;
  };
  for (const Edit& c : std::vector<Edit>{
           {"test_index huge", "a point's test_index must be a whole number, got 1e+300",
            [](nlohmann::json& p) { p["test_index"] = 1e300; }},
           {"test_index fraction", "a point's test_index must be a whole number, got 2.5",
            [](nlohmann::json& p) { p["test_index"] = 2.5; }},
           {"test_index text", "a point's test_index must be a number, got \"2\"",
            [](nlohmann::json& p) { p["test_index"] = "2"; }},
           {"test_index out of range", "explains test point 30, but the run has 30 test points",
            [](nlohmann::json& p) { p["test_index"] = 30; }},
           {"no test_index", "a point without test_index", [](nlohmann::json& p) { p.erase("test_index"); }},
           {"proponent huge", "an index among the proponents must be a whole number, got 1e+300",
            [](nlohmann::json& p) { p["proponents"][0]["index"] = 1e300; }},
           {"opponent negative", "lists training point -1 among the opponents",
            [](nlohmann::json& p) { p["opponents"][1]["index"] = -1; }},
           {"proponent without index", "an entry without an index among the proponents",
            [](nlohmann::json& p) { p["proponents"][0].erase("index"); }}}) {
    const std::filesystem::path edited = dir / ("edited " + c.name);
    std::filesystem::copy(dir / "good", edited);
    nlohmann::json j = good;
    c.apply(j["points"][1]);
    write_file_atomic(edited / "explain.json", j.dump());
    EXPECT_CONTAINS(testing::error_message([&] { read_explain_directory(edited, reader.manifest()); }), c.message)
        << c.name;
  }
}

}  // namespace
}  // namespace pathkernel
