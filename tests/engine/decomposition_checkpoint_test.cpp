// A forward walk's saved progress inside a block of steps (step_blocks):
// the totals and the block's own sums so far, which hold only the training
// rows the block's batches share with other blocks (the rest are in the
// totals already); resumed from it, the walk ends with the
// bits of an uninterrupted one. A reverse walk's saved progress inside a
// later chunk of test points, with the chunk's accumulator Ã: the same.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "pathkernel/decomposition.h"
#include "pathkernel/decomposition_checkpoint.h"
#include "pathkernel/files.h"
#include "pathkernel/npy.h"

namespace pathkernel {
namespace {

namespace fs = std::filesystem;

struct Stop {};

/// A DirectoryCheckpoint that saves after every step and stops the walk
/// (throws Stop) right after its `stop`-th save.
class StoppingCheckpoint : public DirectoryCheckpoint {
 public:
  StoppingCheckpoint(const std::string& dir, int stop) : DirectoryCheckpoint(dir, {{"test", 1}}, 0), stop_(stop) {}
  void save(const DecompositionProgress& p) override {
    DirectoryCheckpoint::save(p);
    if (++saves_ == stop_) throw Stop();
  }

 private:
  int stop_;
  int saves_ = 0;
};

TEST(DecompositionCheckpoint, AForwardWalkResumedInsideABlockOfStepsEndsWithTheSameBits) {
  for (const std::string opt : {"gd", "sgd"}) {
    testing::TempDir dir(opt);
    // sgd: 120 training points, batches of 16, blocks of 3 steps: a block
    // touches at most 48 rows, and the totals take those of the points no
    // other block touches while the block's sums take the rest.
    RunOptions r = testing::small_run(dir / "run", opt, 12, 3);
    r.train.optimizer.weight_decay = 1e-2;
    if (opt == "sgd") r.data.train_size = 120;
    train_run(r);
    PathReader reader(r.out);
    const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 3);
    DecompositionOptions options;
    options.progress = false;
    options.kernel = true;
    const Decomposition whole = decompose(reader, x, options);

    // Stopped after step 5 (the 5th save), in the middle of the block [3, 6).
    const std::string progress = dir / "progress";
    {
      StoppingCheckpoint stopping(progress, 5);
      EXPECT_THROW(decompose(reader, x, options, &stopping), Stop) << opt;
    }
    const nlohmann::json state = nlohmann::json::parse(read_file(progress + "/state.json"));
    ASSERT_EQ(state["steps_done"], 5) << opt;
    ASSERT_TRUE(state["files"].contains("block_contributions")) << opt << ": " << state.dump();
    const torch::Tensor block = read_npy(progress + "/" + state["files"]["block_contributions"]["file"].get<std::string>());
    const int64_t M = reader.decoded_dataset().x_train.size(0);
    // gd's every step holds every training point; sgd's block holds the rows
    // of its batches that other blocks touch too, fewer than the 48 it touches.
    if (opt == "gd") EXPECT_EQ(block.size(1), M);
    else EXPECT_LT(block.size(1), 48) << "the block's sums hold only the rows that other blocks share";
    EXPECT_GT(block.abs().max().item<double>(), 0) << opt;

    DirectoryCheckpoint again(progress, {{"test", 1}}, 1e9);
    ASSERT_NE(again.resume_point(), nullptr) << again.message();
    const Decomposition resumed = decompose(reader, x, options, &again);
    EXPECT_TRUE(torch::equal(whole.contributions, resumed.contributions)) << opt;
    EXPECT_TRUE(torch::equal(whole.kernel, resumed.kernel)) << opt;
    EXPECT_TRUE(torch::equal(whole.regularization, resumed.regularization)) << opt;
    EXPECT_TRUE(torch::equal(whole.rounding, resumed.rounding)) << opt;
    EXPECT_TRUE(torch::equal(whole.gap_abs, resumed.gap_abs)) << opt;
    EXPECT_EQ(whole.evaluations, resumed.evaluations) << opt;
    EXPECT_EQ(whole.kinks, resumed.kinks) << opt;
    EXPECT_EQ(whole.kinks_by_site, resumed.kinks_by_site) << opt;

    // Resumed without the block's sums (a state that lost them), the walk misses steps 3 and 4.
    DecompositionProgress lost = *again.resume_point();
    lost.block = Decomposition();
    const std::string damaged = dir / "damaged";
    DirectoryCheckpoint(damaged, {{"test", 1}}, 0).save(lost);
    DirectoryCheckpoint partial(damaged, {{"test", 1}}, 1e9);
    EXPECT_FALSE(torch::equal(whole.contributions, decompose(reader, x, options, &partial).contributions)) << opt;
  }
}

TEST(DecompositionCheckpoint, AReverseWalkResumedInsideALaterChunkEndsWithTheSameBits) {
  for (const std::string opt : {"momentum", "adam", "rmsprop"}) {
    testing::TempDir dir(opt);
    RunOptions r = testing::small_run(dir / "run", opt, 12, 4);
    train_run(r);
    PathReader reader(r.out);
    const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 3);
    DecompositionOptions options;
    options.progress = false;
    options.memory_doubles = 1;  // one test point per chunk: three walks of the path
    const Decomposition whole = decompose(reader, x, options);

    // A chunk saves after each of its steps 11 .. 1: the 15th save is the
    // second chunk's (test point 1) 4th step.
    const std::string progress = dir / "progress";
    {
      StoppingCheckpoint stopping(progress, 15);
      EXPECT_THROW(decompose(reader, x, options, &stopping), Stop) << opt;
    }
    const nlohmann::json state = nlohmann::json::parse(read_file(progress + "/state.json"));
    ASSERT_EQ(state["chunk"], 1) << opt;
    ASSERT_EQ(state["chunk_start"], 1) << opt;
    ASSERT_EQ(state["steps_done"], 4) << opt;
    ASSERT_TRUE(state["files"].contains("acc")) << opt << ": " << state.dump();
    ASSERT_FALSE(state["files"].contains("block_contributions")) << opt << ": " << state.dump();

    DirectoryCheckpoint again(progress, {{"test", 1}}, 1e9);
    ASSERT_NE(again.resume_point(), nullptr) << again.message();
    const Decomposition resumed = decompose(reader, x, options, &again);
    EXPECT_TRUE(torch::equal(whole.contributions, resumed.contributions)) << opt;
    EXPECT_TRUE(torch::equal(whole.regularization, resumed.regularization)) << opt;
    EXPECT_TRUE(torch::equal(whole.rounding, resumed.rounding)) << opt;
    EXPECT_TRUE(torch::equal(whole.gap_abs, resumed.gap_abs)) << opt;
    EXPECT_EQ(whole.evaluations, resumed.evaluations) << opt;
    EXPECT_EQ(whole.kinks, resumed.kinks) << opt;
    EXPECT_EQ(whole.kinks_by_site, resumed.kinks_by_site) << opt;
    EXPECT_EQ(whole.residuals.worst_step, resumed.residuals.worst_step) << opt;
    EXPECT_EQ(whole.residuals.max_ratio, resumed.residuals.max_ratio) << opt;

    // Resumed with the accumulator of another chunk size, the walk refuses.
    DecompositionProgress other = *again.resume_point();
    other.acc = torch::zeros({2, other.acc.size(1), other.acc.size(2)}, torch::kFloat64);
    const std::string damaged = dir / "damaged";
    DirectoryCheckpoint(damaged, {{"test", 1}}, 0).save(other);
    DirectoryCheckpoint wrong(damaged, {{"test", 1}}, 1e9);
    const std::string message = testing::error_message([&] { decompose(reader, x, options, &wrong); });
    EXPECT_NE(message.find("no accumulator of shape [1, 3, "), std::string::npos) << opt << ": " << message;
  }
}

}  // namespace
}  // namespace pathkernel
