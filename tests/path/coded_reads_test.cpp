// What the commands read of splits held as codes: the rows they need,
// decoded a batch or a chunk at a time, never a whole split at once
// (PathReader::whole_split_decoded). Fashion-MNIST's inputs are bytes, so
// the reader holds both splits as codes.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>

#include "../test_util.h"
#include "pathkernel/attribution_methods.h"
#include "pathkernel/compare.h"
#include "pathkernel/decomposition.h"
#include "pathkernel/evaluate.h"
#include "pathkernel/gram_file.h"
#include "pathkernel/metagradient.h"
#include "pathkernel/npy_array.h"
#include "pathkernel/path.h"
#include "pathkernel/run.h"

namespace pathkernel::testing {
namespace {

/// An SGD run on 40 Fashion-MNIST training points (batches of 16), trained
/// once for the suite; each test opens a reader of its own.
class CodedReads : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("coded_reads");
    RunOptions r = small_run_of(*dir_ / "run", "sgd", "fashion-mnist", "mlp:6", 8, 4, 3);
    train_run(r);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::unique_ptr<PathReader> open() {
    auto reader = std::make_unique<PathReader>(*dir_ / "run");
    EXPECT_FALSE(reader->held_dataset().x_train.defined()) << "the training split is not held as codes";
    EXPECT_FALSE(reader->held_dataset().x_test.defined()) << "the test split is not held as codes";
    return reader;
  }
  static TempDir* dir_;
};

TempDir* CodedReads::dir_ = nullptr;

TEST_F(CodedReads, TheFlagSaysWhenTheWholeSplitIsDecoded) {
  auto reader = open();
  EXPECT_FALSE(reader->whole_split_decoded());
  reader->train_inputs(torch::tensor({3, 39}, torch::kLong));
  reader->train_rows(2, 5);
  reader->test_inputs(torch::tensor({1, 0}, torch::kLong));
  EXPECT_FALSE(reader->whole_split_decoded());
  const PathReader twin = reader->twin();
  EXPECT_EQ(twin.decoded_dataset().x_train.size(0), 40);
  EXPECT_EQ(twin.decoded_dataset().x_test.size(0), reader->test_count());
  EXPECT_TRUE(reader->whole_split_decoded()) << "a twin shares the decoded split";
}

TEST_F(CodedReads, AFullBatchDecodesTheTrainingSplitOnceForTheReaderAndItsTwins) {
  auto reader = open();
  const torch::Tensor all = reader->train_inputs(torch::Tensor());
  EXPECT_TRUE(reader->whole_split_decoded());
  const PathReader twin = reader->twin();
  EXPECT_EQ(twin.train_inputs(torch::Tensor()).data_ptr(), all.data_ptr());
  EXPECT_EQ(twin.decoded_dataset().x_train.data_ptr(), all.data_ptr()) << "decoded twice";
  EXPECT_TRUE(same_bits(reader->decoded_dataset().x_test, reader->test_inputs(torch::Tensor())));
}

TEST_F(CodedReads, TheDecompositionReadsItsBatches) {
  auto reader = open();
  DecompositionOptions options;
  options.progress = false;
  const Decomposition d = decompose(*reader, reader->test_inputs(torch::Tensor()), options);
  EXPECT_LE(summarize(d).max_rel_error, 1e-12);
  EXPECT_FALSE(reader->whole_split_decoded());
}

TEST_F(CodedReads, AGramMatrixReadsItsRowsAndColumns) {
  auto reader = open();
  GramOptions options;
  options.kernel = GramSpec::parse("epk");
  options.progress = false;
  const torch::Tensor rows = torch::tensor({0, 7, 39}, torch::kLong);
  const GramFile g = gram_between(*reader, "train", rows, "train", torch::tensor({5, 7}, torch::kLong), options);
  EXPECT_EQ(g.matrix.size(0), 3);
  const GramFile t = gram_between(*reader, "test", torch::tensor({2, 0}, torch::kLong), "train", rows, options);
  EXPECT_EQ(t.matrix.size(0), 2);
  EXPECT_FALSE(reader->whole_split_decoded());
}

TEST_F(CodedReads, TheMetagradientReadsItsBatches) {
  auto reader = open();
  MetagradientOptions options;
  options.progress = false;
  const Metagradient mg = metagradient(*reader, reader->test_inputs(torch::Tensor()), options);
  EXPECT_EQ(mg.values.size(1), 40);
  EXPECT_FALSE(reader->whole_split_decoded());
}

TEST_F(CodedReads, AttributionMethodsReadTheirChunks) {
  AttributionOptions options;
  options.progress = false;
  options.train_chunk = 7;  // several chunks
  for (const std::string method : {"grad-dot", "tracin-cp", "epk"}) {
    auto reader = open();
    const torch::Tensor x = reader->test_inputs(torch::Tensor());
    const torch::Tensor scores = attribution_scores(*reader, method, x, torch::zeros({x.size(0)}, torch::kLong), options);
    EXPECT_EQ(scores.size(1), 40) << method;
    EXPECT_FALSE(reader->whole_split_decoded()) << method;
  }
}

TEST_F(CodedReads, TheComparisonReadsTheTrainingPointsItFits) {
  auto reader = open();
  CompareOptions options;
  options.kernels = CompareOptions::parse_kernel_list("epk,ntk");
  options.decomposition.progress = false;
  const Comparison c =
      compare_kernel_methods(*reader, torch::arange(0, 30, torch::kLong), torch::arange(0, 3, torch::kLong), options);
  EXPECT_FALSE(c.rows.empty());
  EXPECT_FALSE(reader->whole_split_decoded());
}

TEST_F(CodedReads, TheMislabelRunIsWrittenFromTheCodesAsHeld) {
  auto reader = open();
  TempDir out("evaluate");
  EvaluateOptions o;
  o.methods = {"grad-dot"};
  o.metrics = {"mislabel"};
  o.mislabel_fraction = 0.2;
  o.mislabel_candidates = 8;
  o.progress = false;
  o.retrain.workers = 1;
  const std::string data = out / "eval/.work/mislabel-data";
  bool trained = false;
  o.on_note = [&](const std::string& line) {  // called as the flipped run starts training
    if (line.rfind("mislabel: training", 0) != 0) return;
    trained = true;
    EXPECT_FALSE(std::filesystem::exists(data + "/train_x.npy"));
    EXPECT_FALSE(std::filesystem::exists(data + "/test_x.npy"));
    const PathReader other(*dir_ / "run");  // not a twin: decodes on its own
    EXPECT_TRUE(same_bits(read_npy_array(data, "train_x"), other.decoded_dataset().x_train));
    EXPECT_TRUE(same_bits(read_npy_array(data, "test_x"), other.decoded_dataset().x_test));
  };
  evaluate(*reader, torch::tensor({0, 1}, torch::kLong), out / "eval", o);
  EXPECT_TRUE(trained);
  EXPECT_FALSE(reader->whole_split_decoded());
}

TEST_F(CodedReads, TrainingRowsAreDecodedFromTheirCodes) {
  auto reader = open();
  EXPECT_TRUE(same_bits(reader->train_rows(3, 5), reader->train_inputs(torch::arange(3, 8, torch::kLong))));
  EXPECT_EQ(reader->train_rows(39, 0).size(0), 0);
  EXPECT_CONTAINS(error_message([&] { reader->train_rows(38, 3); }),
                  "training rows 38 .. 40: expected rows in [0, 40)");
  EXPECT_FALSE(reader->whole_split_decoded());
}

TEST(HeldReads, TrainingRowsOfADecodedSplitAreAViewOfIt) {
  TempDir dir("held_reads");
  RunOptions r = small_run(dir / "run", "sgd", 3, 2);
  train_run(r);
  const PathReader reader(r.out);
  const torch::Tensor& x = reader.held_dataset().x_train;
  ASSERT_TRUE(x.defined());
  const torch::Tensor rows = reader.train_rows(4, 6);
  EXPECT_TRUE(same_bits(rows, x.narrow(0, 4, 6)));
  EXPECT_EQ(rows.data_ptr(), x[4].data_ptr()) << "a copy where a view would do";
  EXPECT_TRUE(same_bits(reader.test_inputs(torch::tensor({1}, torch::kLong)),
                        reader.held_dataset().x_test.narrow(0, 1, 1)));
}

}  // namespace
}  // namespace pathkernel::testing
