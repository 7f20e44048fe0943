// explain_inputs(): inputs given in a file are explained exactly like the
// run's test points, and their explain directory reads back.
#include <gtest/gtest.h>

#include <filesystem>

#include "../test_util.h"
#include "pathkernel/explanation.h"
#include "pathkernel/files.h"
#include "pathkernel/npy.h"

namespace pathkernel {
namespace {

// The run's own test inputs, saved to a file, give the contributions of
// explaining them by index, bit for bit (the files too), on both walks.
TEST(ExplainInputs, TheRunsTestInputsGiveTheSameContributionsBitForBit) {
  for (const std::string opt : {"sgd", "adam"}) {
    testing::TempDir dir(opt);
    RunOptions r = testing::small_run(dir / "run", opt, 6, 3);
    train_run(r);
    PathReader reader(r.out);
    ExplainOptions options;
    options.decomposition.progress = false;
    options.top = 3;
    const torch::Tensor idx = torch::tensor({7, 2, 11}, torch::kLong);
    const Explanation by_index = explain(reader, idx, dir / "by_index", options);
    write_npy(dir / "x.npy", reader.decoded_dataset().x_test.index_select(0, idx));
    write_npy(dir / "y.npy", reader.decoded_dataset().y_test.index_select(0, idx));
    const ExplainInputs in = read_explain_inputs(reader, dir / "x.npy", dir / "y.npy");
    const Explanation by_file = explain_inputs(reader, in, dir / "by_file", options);
    SCOPED_TRACE(opt);
    EXPECT_TRUE(torch::equal(by_file.decomposition.contributions, by_index.decomposition.contributions));
    EXPECT_EQ(read_file(dir / "by_file/contributions.npy"), read_file(dir / "by_index/contributions.npy"));
    ASSERT_EQ(by_file.document.points.size(), 3u);
    for (size_t n = 0; n < 3; ++n) {
      const ExplainedPoint &a = by_file.document.points[n], &b = by_index.document.points[n];
      EXPECT_EQ(a.test_index, static_cast<int64_t>(n));  // the row of the file
      EXPECT_EQ(a.label.str(), b.label.str());
      EXPECT_EQ(a.f_final, b.f_final);
      EXPECT_EQ(a.rounding, b.rounding);
      EXPECT_EQ(a.proponents[0].index, b.proponents[0].index);
    }
    // The directory carries the inputs and reads back.
    const ExplainDirectory back = read_explain_directory(dir / "by_file", reader.manifest());
    ASSERT_TRUE(back.document.inputs.has_value());
    EXPECT_EQ(back.document.inputs->source, dir / "x.npy");
    EXPECT_TRUE(torch::equal(back.inputs, in.x));
    EXPECT_TRUE(torch::equal(back.labels, in.labels));
    EXPECT_EQ(explain_json(back.document).dump(2), explain_json(by_file.document).dump(2));
  }
}

// A model on integer codes (an embedding first) takes token ids: the run's
// own test tokens, as int32 ids in a file, give the contributions of
// explaining them by index bit for bit; float inputs are refused.
TEST(ExplainInputs, TokenIdsForAnEmbedding) {
  testing::TempDir dir("tokens");
  const std::string data = dir / "data";
  std::filesystem::create_directories(data);
  torch::manual_seed(2);
  write_npy(data + "/train_x.npy", torch::randint(0, 10, {24, 4}, torch::kLong));
  write_npy(data + "/train_y.npy", torch::randint(0, 3, {24}, torch::kLong));
  write_npy(data + "/test_x.npy", torch::randint(0, 10, {5, 4}, torch::kLong));
  write_npy(data + "/test_y.npy", torch::randint(0, 3, {5}, torch::kLong));
  RunOptions r = testing::small_run(dir / "run", "sgd", 4, 2);
  r.data.spec = "npy:" + data;
  r.data.train_size = -1;
  r.data.test_size = -1;
  r.model = "layers:embed(10,3),flatten,linear(5),relu";
  r.train.batch = 8;
  train_run(r);
  PathReader reader(r.out);
  ExplainOptions options;
  options.decomposition.progress = false;
  const torch::Tensor idx = torch::tensor({4, 1}, torch::kLong);
  const Explanation by_index = explain(reader, idx, dir / "by_index", options);
  write_npy(dir / "ids.npy", reader.decoded_dataset().x_test.index_select(0, idx).to(torch::kInt));
  const Explanation by_file =
      explain_inputs(reader, read_explain_inputs(reader, dir / "ids.npy", ""), dir / "by_file", options);
  EXPECT_EQ(read_file(dir / "by_file/contributions.npy"), read_file(dir / "by_index/contributions.npy"));
  write_npy(dir / "floats.npy", torch::zeros({2, 4}, torch::kFloat64));
  EXPECT_CONTAINS(testing::error_message([&] { read_explain_inputs(reader, dir / "floats.npy", ""); }),
                  "expected integer codes (int64 or int32) such as token ids");
}

// Without labels a point's label is null, and its row may lie past the
// run's test points.
TEST(ExplainInputs, UnlabelledInputsReadBack) {
  testing::TempDir dir("unlabelled");
  RunOptions r = testing::small_run(dir / "run", "sgd", 4, 2);
  train_run(r);
  PathReader reader(r.out);
  ExplainOptions options;
  options.decomposition.progress = false;
  const int64_t n = reader.manifest().num_test + 2;
  write_npy(dir / "x.npy", torch::randn({n, 100}, torch::kFloat64));
  const ExplainInputs in = read_explain_inputs(reader, dir / "x.npy", "");
  const Explanation e = explain_inputs(reader, in, dir / "ex", options);
  const Decomposition& d = e.decomposition;
  EXPECT_LE((d.prediction() - d.fN).abs().max().item<double>(), 1e-12 * std::max(1.0, d.fN.abs().max().item<double>()));
  const ExplainDirectory back = read_explain_directory(dir / "ex", reader.manifest());
  ASSERT_EQ(back.document.points.size(), static_cast<size_t>(n));
  EXPECT_FALSE(back.document.points.back().labelled);
  EXPECT_EQ(back.document.points.back().test_index, n - 1);
  EXPECT_FALSE(back.labels.defined());
  EXPECT_CONTAINS(read_file(dir / "ex/explain.json"), "\"label\": null");
  EXPECT_FALSE(std::filesystem::exists(dir / "ex/labels.npy"));
}

}  // namespace
}  // namespace pathkernel
