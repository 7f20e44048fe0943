// The generic route's training side for BatchNorm in training mode
// (src/engine/autograd_route.cpp): per-example total derivatives through the
// batch statistics, against autograd of each example's own loss.
#include <gtest/gtest.h>

#include "pathkernel/batch_statistics.h"
#include "pathkernel/features.h"
#include "pathkernel/loss.h"
#include "pathkernel/segment.h"
#include "../model/torchscript_util.h"

namespace pathkernel {
namespace {

using testing::TempDir;
using namespace testing::script;

/// Tiny modules with BatchNorm in training mode on [1, 4, 4] images, 3 classes.
const char* kBatchNormModules =
    "torch.manual_seed(1)\n"
    "class Conv(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.conv = nn.Conv2d(1, 3, 3, padding=1, bias=False)\n"
    "        self.bn = nn.BatchNorm2d(3)\n"
    "        self.head = nn.Linear(48, 3)\n"
    "    def forward(self, x):\n"
    "        return self.head(torch.flatten(F.relu(self.bn(self.conv(x))), 1))\n"
    "class Dense(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.fc = nn.Linear(16, 5)\n"
    "        self.bn = nn.BatchNorm1d(5)\n"
    "        self.head = nn.Linear(5, 3)\n"
    "    def forward(self, x):\n"
    "        return self.head(torch.tanh(self.bn(self.fc(torch.flatten(x, 1)))))\n"
    "torch.jit.script(Conv()).save(DIR + '/conv_bn.pt')\n"
    "torch.jit.script(Dense()).save(DIR + '/dense_bn.pt')\n";

Network module_network(const std::string& path, OutputMap output) {
  NetworkOptions o;
  o.spec = ModelSpec::parse("torchscript:" + path);
  o.input_shape = {1, 4, 4};
  o.num_classes = 3;
  o.output = output;
  return build_network(o);
}

/// Per example i, d ℓ_i / dw by autograd of ℓ_i alone through one
/// training-mode forward pass of the whole batch: [B, P].
torch::Tensor reference_total_derivatives(Network& ref, const torch::Tensor& x, const torch::Tensor& y) {
  const OutputMap map = ref->options().output;
  const std::vector<torch::Tensor> params = ref->parameters();
  torch::Tensor out = torch::zeros({x.size(0), parameter_count(ref)}, torch::kFloat64);
  for (int64_t i = 0; i < x.size(0); ++i) {
    const torch::Tensor f = ref->forward(x);  // a fresh batch pass for each example
    const torch::Tensor loss_i = example_losses(f, y, map, ref->options().loss)[i];
    std::vector<torch::Tensor> g = torch::autograd::grad({loss_i}, params);
    std::vector<torch::Tensor> flat;
    for (auto& t : g) flat.push_back(t.reshape({-1}));
    out[i] = torch::cat(flat);
  }
  return out;
}

TEST(BatchNormTraining, PerExampleTotalDerivativesMatchAutogradAndSumToTheBatchGradient) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  python(dir, "DIR = '" + dir.path() + "'\n" + kBatchNormModules);
  for (const std::string name : {"conv_bn", "dense_bn"}) {
    for (const OutputMap map : {OutputMap::LogSoftmax, OutputMap::Logits}) {
      SCOPED_TRACE(name);
      const std::string path = dir.path() + "/" + name + ".pt";
      Network net = module_network(path, map), ref = module_network(path, map);
      torch::manual_seed(2);
      const torch::Tensor w = flatten_parameters(net).to(torch::kFloat64) +
                              0.1 * torch::randn({parameter_count(net)}, torch::kFloat64);
      set_flat_parameters(ref, w);
      const torch::Tensor x = torch::randn({7, 1, 4, 4}, torch::kFloat64);
      const torch::Tensor y = torch::randint(0, 3, {7}, torch::kLong);
      SegmentEvaluator ev(net, ModuleRoute::Auto);
      ASSERT_EQ(ev.path_route().name(), "generic");
      ASSERT_TRUE(ev.path_route().couples_batch());
      ev.set_segment(w, torch::zeros_like(w));
      const torch::Tensor mu = flatten_buffers(net);
      const TrainSignals t = train_signals(ev, x, y, map, net->options().loss, {});
      const torch::Tensor g = t.signals.at(0);
      EXPECT_TRUE(torch::equal(flatten_buffers(net), mu)) << "the batch pass left the running statistics moved";
      EXPECT_FALSE(net->batch_norm_training()) << "the test side must be left in eval mode";

      const torch::Tensor expected = reference_total_derivatives(ref, x, y);
      EXPECT_LT((g - expected).abs().max().item<double>(), 1e-13);
      for (auto& p : ref->parameters()) p.mutable_grad() = torch::Tensor();
      training_loss(ref->forward(x), y, map, ref->options().loss).backward();
      std::vector<torch::Tensor> grads;
      for (auto& p : ref->parameters()) grads.push_back(p.grad().reshape({-1}));
      const torch::Tensor batch_gradient = torch::cat(grads);
      EXPECT_LT((g.sum(0) / 7.0 - batch_gradient).abs().max().item<double>(), 1e-14);
    }
  }
}

}  // namespace
}  // namespace pathkernel
