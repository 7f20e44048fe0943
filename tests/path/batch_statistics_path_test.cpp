// A run of a module with BatchNorm in training mode: its checkpoints store
// the running statistics, replay reproduces them bit for bit, and each
// step's move is the batch's statistics (src/path/path_reader.cpp,
// run_writer.cpp).
#include <gtest/gtest.h>

#include "pathkernel/batch_statistics.h"
#include "../model/torchscript_util.h"

namespace pathkernel {
namespace {

using testing::TempDir;
using namespace testing::script;

/// Trains Linear(16, 5) -> BatchNorm1d(5) -> tanh -> Linear(5, 3) with sgd
/// (batch 10, 6 steps, checkpoints every 3); the run is DIR/run.
void train_dense_bn(const TempDir& dir, double momentum = 0.1) {
  python(dir, "torch.manual_seed(5)\n"
              "m = nn.Sequential(nn.Flatten(), nn.Linear(16, 5), nn.BatchNorm1d(5, momentum=" +
                  std::to_string(momentum) + "), nn.Tanh(), nn.Linear(5, 3))\n"
              "torch.jit.script(m).save('" + dir.path() + "/dense_bn.pt')\n");
  SmallImageTraining how;
  how.data_seed = 6;
  train_small_image_run(dir, "torchscript:" + dir.path() + "/dense_bn.pt", how);
}

TEST(BatchNormPath, ReplaysTheRunningStatisticsBitForBit) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  train_dense_bn(dir);
  PathReader reader(dir.path() + "/run");
  ASSERT_FALSE(reader.manifest().checkpoints.back().module_buffers.file.empty());
  const ReplayReport r = reader.check();
  EXPECT_EQ(r.mismatches, 0);
  EXPECT_TRUE(r.bitwise_equal);
  EXPECT_FALSE(torch::equal(reader.checkpoint_buffers(0), reader.checkpoint_buffers(2)));
  // Each step hands out μ_s and μ_{s+1}, and the next step starts where it ended.
  torch::Tensor previous;
  reader.forward([&](const PathStep& st) {
    ASSERT_TRUE(st.buffers.defined() && st.buffers_next.defined());
    if (previous.defined()) EXPECT_TRUE(torch::equal(previous, st.buffers)) << "step " << st.step;
    previous = st.buffers_next;
  });
  EXPECT_TRUE(torch::equal(previous, reader.checkpoint_buffers(2)));
}

TEST(BatchNormPath, EachStepMovesTheRunningStatisticsByTheBatchsStatistics) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  train_dense_bn(dir, 0.25);
  PathReader reader(dir.path() + "/run");
  const std::vector<ParamInfo> layout = parameter_layout(reader.network());
  ASSERT_EQ(layout[0].shape, (std::vector<int64_t>{5, 16}));  // the Linear before the BatchNorm
  const torch::Tensor& x = reader.decoded_dataset().x_train;
  for (int64_t s = 0; s < reader.steps(); ++s) {
    const torch::Tensor w = reader.weights(s), mu = reader.buffers(s), next = reader.buffers(s + 1);
    const torch::Tensor weight = w.narrow(0, layout[0].offset, 80).view({5, 16});
    const torch::Tensor bias = w.narrow(0, layout[1].offset, 5);
    // The BatchNorm's input on the step's batch, its mean and unbiased variance.
    const torch::Tensor a = torch::addmm(bias, x.index_select(0, reader.batch(s)).flatten(1), weight.t());
    const torch::Tensor mean = a.mean(0), var = a.var(0, /*unbiased=*/true);
    EXPECT_LT((next.narrow(0, 0, 5) - (0.75 * mu.narrow(0, 0, 5) + 0.25 * mean)).abs().max().item<double>(), 1e-15)
        << "running mean, step " << s;
    EXPECT_LT((next.narrow(0, 5, 5) - (0.75 * mu.narrow(0, 5, 5) + 0.25 * var)).abs().max().item<double>(), 1e-15)
        << "running variance, step " << s;
    EXPECT_EQ(next[10].item<double>(), static_cast<double>(s + 1)) << "batches tracked";
  }
}

}  // namespace
}  // namespace pathkernel
