// A module's running statistics as one vector, the modes of its BatchNorm
// modules, and what is refused (src/model/batch_statistics.cpp, model.cpp).
#include "pathkernel/batch_statistics.h"

#include <gtest/gtest.h>

#include "pathkernel/error.h"
#include "torchscript_util.h"

namespace pathkernel {
namespace {

using testing::TempDir;
using namespace testing::script;

/// Saves a tiny module with BatchNorm2d in training mode as DIR/bn.pt;
/// `extra` is passed to nn.BatchNorm2d. Its own class's name contains
/// "BatchNorm", which must not make it one.
std::string save_bn_module(const TempDir& dir, const std::string& extra = "") {
  python(dir, "torch.manual_seed(0)\n"
              "class BatchNormResidualNet(nn.Module):\n"
              "    def __init__(self):\n"
              "        super().__init__()\n"
              "        self.conv = nn.Conv2d(1, 3, 3, padding=1, bias=False)\n"
              "        self.bn = nn.BatchNorm2d(3" + extra + ")\n"
              "        self.head = nn.Linear(48, 3)\n"
              "    def forward(self, x):\n"
              "        return self.head(torch.flatten(F.relu(self.bn(self.conv(x))), 1))\n"
              "torch.jit.script(BatchNormResidualNet()).save('" + dir.path() + "/bn.pt')\n");
  return dir.path() + "/bn.pt";
}

Network bn_network(const std::string& path) {
  NetworkOptions o;
  o.spec = ModelSpec::parse("torchscript:" + path);
  o.input_shape = {1, 4, 4};
  o.num_classes = 3;
  return build_network(o);
}

TEST(BatchStatistics, BuffersRoundTripAndOnlyTrainingModeMovesThem) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  Network net = bn_network(save_bn_module(dir));
  ASSERT_TRUE(net->batch_statistics());
  ASSERT_TRUE(net->batch_norm_training());
  const torch::Tensor mu0 = flatten_buffers(net);
  ASSERT_EQ(mu0.numel(), 3 + 3 + 1);  // running mean, running variance, batches tracked
  const torch::Tensor x = torch::randn({5, 1, 4, 4}, torch::kFloat64);
  torch::NoGradGuard guard;
  {
    const RunningStatistics eval_mode(net);
    EXPECT_FALSE(net->batch_norm_training());
    net->forward(x);
  }
  EXPECT_TRUE(net->batch_norm_training());
  EXPECT_TRUE(torch::equal(flatten_buffers(net), mu0)) << "eval mode moved the running statistics";
  {
    const BatchStatistics train_mode(net);
    net->forward(x);
    EXPECT_FALSE(torch::equal(flatten_buffers(net), mu0));
  }
  EXPECT_TRUE(torch::equal(flatten_buffers(net), mu0)) << "BatchStatistics did not put the buffers back";
  net->forward(x);  // training mode: moves them, like a step
  const torch::Tensor mu1 = flatten_buffers(net);
  EXPECT_EQ(mu1[6].item<double>(), 1.0);  // one batch tracked
  set_flat_buffers(net, mu0);
  EXPECT_TRUE(torch::equal(flatten_buffers(net), mu0));
  EXPECT_THROW(set_flat_buffers(net, torch::zeros({3}, torch::kFloat64)), Error);
}

TEST(BatchStatistics, RefusesBatchNormWithoutRunningStatistics) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  const std::string path = save_bn_module(dir, ", track_running_stats=False");
  try {
    bn_network(path);
    FAIL() << "track_running_stats=False was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("track_running_stats=False"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'bn'"), std::string::npos) << e.what();
  }
}

TEST(BatchStatistics, EvalModeBatchNormIsNoBatchStatistics) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  python(dir, "m = nn.Sequential(nn.Flatten(), nn.Linear(16, 4), nn.BatchNorm1d(4), nn.Linear(4, 3)).eval()\n"
              "torch.jit.script(m).save('" + dir.path() + "/eval.pt')\n");
  Network net = bn_network(dir.path() + "/eval.pt");
  EXPECT_FALSE(net->batch_statistics());
}

}  // namespace
}  // namespace pathkernel
