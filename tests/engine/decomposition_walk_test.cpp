// The decomposition's walks (src/engine/decomposition_walk.cpp): a step's
// update residual in one pass against its tensor expressions; BatchNorm in
// training mode, completeness with the running-statistics term S, and S
// against an explicit loop over the steps.
#include <gtest/gtest.h>

#include "pathkernel/batch_statistics.h"
#include "pathkernel/decomposition.h"
#include "../../src/engine/decomposition_walk.h"
#include "../model/torchscript_util.h"

namespace pathkernel {
namespace {

using testing::TempDir;
using namespace testing::script;

/// The residual and its checks as tensor expressions, for comparison bit for bit.
void expect_residual_as_tensors(const Manifest& m, const PathStep& st, const torch::Tensor& g, double lambda) {
  using namespace decomposition_walk;
  const torch::Tensor e = st.delta + st.lr * (g + lambda * st.w);
  const UpdateResidual r = update_residual(m, st, g, lambda);
  EXPECT_TRUE(torch::equal(r.e, e)) << "max difference " << (r.e - e).abs().max().item<double>();
  EXPECT_EQ(r.max_abs, e.abs().max().item<double>());
  EXPECT_EQ(r.bound, kRoundingSlack * run_epsilon(m) *
                         ((st.w.abs().max() + (st.w + st.delta).abs().max()).item<double>()));
  EXPECT_EQ(r.bound, update_bound(m, st));
}

TEST(UpdateResidual, OnePassGivesTheTensorExpressionsBits) {
  torch::manual_seed(11);
  Manifest m;
  m.dtype = "float32";
  PathStep st;
  st.w = torch::randn({1000}, torch::kFloat64);
  st.lr = 0.1;
  const torch::Tensor g = torch::randn({1000}, torch::kFloat64) * 3;
  st.delta = -st.lr * g + 1e-8 * torch::randn({1000}, torch::kFloat64);  // training's rounding, magnified
  for (double lambda : {0.0, 5e-4}) expect_residual_as_tensors(m, st, g, lambda);
  // Strided tensors take the tensor expressions.
  PathStep strided = st;
  strided.w = torch::randn({2000}, torch::kFloat64).slice(0, 0, 2000, 2);
  expect_residual_as_tensors(m, strided, g, 5e-4);
}

TEST(UpdateResidual, KeepsANotANumber) {
  Manifest m;
  m.dtype = "float64";
  PathStep st;
  st.w = torch::ones({5}, torch::kFloat64);
  st.delta = torch::zeros({5}, torch::kFloat64);
  st.lr = 0.5;
  torch::Tensor g = torch::ones({5}, torch::kFloat64);
  g[1] = std::numeric_limits<double>::quiet_NaN();
  const decomposition_walk::UpdateResidual r = decomposition_walk::update_residual(m, st, g, 0.0);
  EXPECT_TRUE(std::isnan(r.max_abs));
  EXPECT_TRUE(std::isnan(decomposition_walk::max_abs(r.e)));
  EXPECT_EQ(r.bound, decomposition_walk::update_bound(m, st));
}

/// A residual CNN with BatchNorm2d after each convolution, in training mode,
/// on [1, 4, 4] images of 3 classes (a tiny scripts/measure_batchnorm.sh).
std::string save_residual_bn(const TempDir& dir) {
  python(dir, "torch.manual_seed(3)\n"
              "class M(nn.Module):\n"
              "    def __init__(self):\n"
              "        super().__init__()\n"
              "        self.stem = nn.Conv2d(1, 2, 3, padding=1, bias=False)\n"
              "        self.bn0 = nn.BatchNorm2d(2)\n"
              "        self.conv = nn.Conv2d(2, 2, 3, padding=1, bias=False)\n"
              "        self.bn1 = nn.BatchNorm2d(2)\n"
              "        self.head = nn.Linear(32, 3)\n"
              "    def forward(self, x):\n"
              "        h = F.relu(self.bn0(self.stem(x)))\n"
              "        h = F.relu(h + self.bn1(self.conv(h)))\n"
              "        return self.head(torch.flatten(h, 1))\n"
              "torch.jit.script(M()).save('" + dir.path() + "/res_bn.pt')\n");
  return dir.path() + "/res_bn.pt";
}

/// Trains `module` with `optimizer` (batch 10, 6 steps, checkpoints every 3)
/// on 30 training and 6 test images, written as npy:DIR/data.
void train_bn_run(const TempDir& dir, const std::string& module, const std::string& optimizer) {
  SmallImageTraining how;
  how.optimizer = optimizer;
  if (optimizer == "adamw") {
    how.lr = 0.02;
    how.weight_decay = 0.01;
  }
  train_small_image_run(dir, "torchscript:" + module, how);
}

TEST(BatchNormTraining, CompletenessHoldsWithTheRunningStatisticsTerm) {
  REQUIRE_PYTHON_TORCH();
  for (const std::string optimizer : {"sgd", "momentum", "adamw"}) {
    SCOPED_TRACE(optimizer);
    TempDir dir;
    train_bn_run(dir, save_residual_bn(dir), optimizer);
    PathReader reader(dir.path() + "/run");
    DecompositionOptions o;
    o.progress = false;
    const Decomposition d = decompose(reader, reader.decoded_dataset().x_test, o);
    ASSERT_TRUE(d.statistics.defined());
    const DecompositionSummary s = summarize(d);
    EXPECT_LE(s.max_rel_error, 1e-12);
    // S is a real part of the identity: leaving it out breaks completeness.
    EXPECT_GT(s.max_abs_statistics, 1e-6);
    const torch::Tensor without = d.f0 + d.contributions.sum(1) + d.regularization + d.rounding;
    EXPECT_GT((without - d.fN).abs().max().item<double>(), 1e-6);
    // f(w_N) is the eval-mode output with the final running statistics.
    EXPECT_LT((reader.outputs(reader.steps(), reader.decoded_dataset().x_test) - d.fN).abs().max().item<double>(), 1e-15);
  }
}

TEST(BatchNormTraining, StatisticsTermMatchesAnExplicitLoopOverSteps) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  train_bn_run(dir, save_residual_bn(dir), "sgd");
  PathReader reader(dir.path() + "/run");
  const torch::Tensor x = reader.decoded_dataset().x_test;
  DecompositionOptions o;
  o.progress = false;
  const Decomposition d = decompose(reader, x, o);
  Network net = build_network(reader.manifest().network_options());
  net->set_batch_norm_training(false);
  auto g = [&](const torch::Tensor& w, const torch::Tensor& mu) {
    torch::NoGradGuard guard;
    set_flat_parameters(net, w);
    set_flat_buffers(net, mu);
    return net->forward(x);
  };
  torch::Tensor explicit_sum = torch::zeros_like(d.statistics);
  for (int64_t s = 0; s < reader.steps(); ++s) {
    const torch::Tensor w1 = reader.weights(s + 1);
    explicit_sum += g(w1, reader.buffers(s + 1)) - g(w1, reader.buffers(s));
  }
  EXPECT_LT((explicit_sum - d.statistics).abs().max().item<double>(), 1e-14);
  // Over part of the path, the part's jumps.
  o.first_step = 2;
  o.end_step = 5;
  const Decomposition part = decompose(reader, x, o);
  torch::Tensor part_sum = torch::zeros_like(d.statistics);
  for (int64_t s = 2; s < 5; ++s) {
    const torch::Tensor w1 = reader.weights(s + 1);
    part_sum += g(w1, reader.buffers(s + 1)) - g(w1, reader.buffers(s));
  }
  EXPECT_LT((part_sum - part.statistics).abs().max().item<double>(), 1e-14);
}

TEST(BatchNormTraining, RefusesTheKernel) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  train_bn_run(dir, save_residual_bn(dir), "sgd");
  PathReader reader(dir.path() + "/run");
  DecompositionOptions o;
  o.progress = false;
  o.kernel = true;
  try {
    decompose(reader, reader.decoded_dataset().x_test, o);
    FAIL() << "the kernel was computed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("BatchNorm"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pathkernel
