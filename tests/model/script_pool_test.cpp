// A TorchScript module's max-pools by pathkernel's own loops against
// LibTorch's: which calls are taken by hand, and the same forward values and
// gradients, bit for bit, on their own and inside a user's module.
#include <gtest/gtest.h>

#include <limits>
#include <tuple>

#include <torch/script.h>

#include "pathkernel/script_graph.h"
#include "pathkernel/script_pool.h"
#include "torchscript_util.h"

namespace pathkernel {
namespace {

using pathkernel::testing::TempDir;
using namespace pathkernel::testing::script;

/// Integers after a ReLU (windows tie often, at 0 most), with a NaN and
/// infinities among them; the rows of a [N, C, H, W] input.
torch::Tensor tied(std::vector<int64_t> shape, torch::ScalarType dtype) {
  torch::manual_seed(5);
  torch::Tensor x = torch::relu(torch::randint(-2, 3, shape, torch::kLong)).to(dtype);
  torch::Tensor flat = x.view({-1});
  flat[1] = std::numeric_limits<double>::quiet_NaN();
  flat[17] = -std::numeric_limits<double>::infinity();
  flat[40] = std::numeric_limits<double>::infinity();
  return x;
}

TEST(ScriptPool, TakesSquareNonOverlappingUnpaddedWindowsOfContiguousFloats) {
  const torch::Tensor x = torch::zeros({2, 3, 8, 8}, torch::kFloat32);
  EXPECT_EQ(hand_pool_window(x, {2}, {}, {0}, {1}, false), 2);
  EXPECT_EQ(hand_pool_window(x, {2, 2}, {2, 2}, {0, 0}, {1, 1}, false), 2);
  EXPECT_EQ(hand_pool_window(x.to(torch::kFloat64), {3, 3}, {3}, {0}, {1}, false), 3);
  EXPECT_EQ(hand_pool_window(x, {2}, {1}, {0}, {1}, false), 0);         // overlapping
  EXPECT_EQ(hand_pool_window(x, {2, 3}, {}, {0}, {1}, false), 0);       // not square
  EXPECT_EQ(hand_pool_window(x, {2}, {}, {1}, {1}, false), 0);          // padded
  EXPECT_EQ(hand_pool_window(x, {2}, {}, {0}, {2}, false), 0);          // dilated
  EXPECT_EQ(hand_pool_window(x, {2}, {}, {0}, {1}, true), 0);           // ceil_mode
  EXPECT_EQ(hand_pool_window(x[0], {2}, {}, {0}, {1}, false), 0);       // unbatched
  EXPECT_EQ(hand_pool_window(x.transpose(2, 3), {2}, {}, {0}, {1}, false), 0);
  EXPECT_EQ(hand_pool_window(x.to(torch::kLong), {2}, {}, {0}, {1}, false), 0);
  EXPECT_EQ(hand_pool_window(x, {9}, {}, {0}, {1}, false), 0);          // larger than the plane
}

/// Forward values, the input's gradient, and the gradient of that gradient
/// (create_graph), against at::max_pool2d's, bit for bit.
TEST(ScriptPool, ValuesAndGradientsAreLibTorchsBitForBit) {
  using Args = std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>>;
  for (torch::ScalarType dtype : {torch::kFloat32, torch::kFloat64}) {
    for (const auto& [kernel, stride, padding] :
         {Args{{2}, {}, {0}}, Args{{3, 3}, {3, 3}, {0, 0}}, Args{{2}, {1}, {0}}, Args{{3}, {2}, {1}}}) {
      const torch::Tensor x = tied({2, 3, 7, 9}, dtype);
      const torch::Tensor a = x.clone().requires_grad_(true), b = x.clone().requires_grad_(true);
      const torch::Tensor got = script_max_pool2d(a, kernel, stride, padding, {1}, false);
      const torch::Tensor want = at::max_pool2d(b, kernel, stride, padding, {1}, false);
      const std::string label = std::string(c10::toString(dtype)) + ", window " + std::to_string(kernel[0]) +
                                (stride.empty() ? "" : ", stride " + std::to_string(stride[0]));
      ASSERT_TRUE(torch::allclose(got, want, 0, 0, /*equal_nan=*/true)) << label;
      const torch::Tensor g = torch::randn_like(got).requires_grad_(true);
      const torch::Tensor ga = torch::autograd::grad({got}, {a}, {g}, true, true)[0];
      const torch::Tensor gb = torch::autograd::grad({want}, {b}, {g}, true, true)[0];
      EXPECT_TRUE(torch::equal(ga, gb)) << label;
      const torch::Tensor v = torch::randn_like(ga);
      EXPECT_TRUE(torch::equal(torch::autograd::grad({ga}, {g}, {v})[0], torch::autograd::grad({gb}, {g}, {v})[0]))
          << label;
    }
  }
}

/// A user's module with nn.MaxPool2d after an in-place ReLU and an
/// overlapping F.max_pool2d: the network pathkernel loads runs both through
/// pathkernel::max_pool2d (the first by hand, the second by LibTorch), and
/// gives the module's own outputs and parameter gradients, bit for bit, in
/// float32 and float64.
TEST(ScriptPool, ModulesPoolsGiveTheModulesOwnOutputsAndGradients) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  const std::string path = dir.path() + "/pooled.pt";
  python(dir, "class M(nn.Module):\n"
              "    def __init__(self):\n"
              "        super().__init__()\n"
              "        self.conv = nn.Conv2d(1, 4, 3, padding=1)\n"
              "        self.block = nn.Sequential(nn.ReLU(inplace=True), nn.MaxPool2d(2))\n"
              "        self.out = nn.Linear(4 * 3 * 3, 3)\n"
              "    def forward(self, x):\n"
              "        h = F.max_pool2d(self.block(self.conv(x)), 2, 1)\n"
              "        return self.out(torch.flatten(h, 1))\n"
              "torch.manual_seed(0)\n"
              "torch.jit.script(M()).save('" + path + "')\n");
  torch::jit::Module reference = torch::jit::load(path);
  EXPECT_EQ(hand_pools(*inlined_forward(reference)), 2);
  for (torch::ScalarType dtype : {torch::kFloat32, torch::kFloat64}) {
    NetworkOptions o;
    o.spec = ModelSpec::parse("torchscript:" + path);
    o.input_shape = {1, 8, 8};
    o.num_classes = 3;
    o.dtype = dtype;
    o.output = OutputMap::Logits;  // the module's own outputs
    Network net = build_network(o);
    torch::jit::Module own = torch::jit::load(path);
    own.to(dtype);
    // The module takes the network's parameters (build_network draws its own).
    const std::vector<torch::Tensor> ours = net->parameters();
    std::vector<torch::Tensor> theirs;
    for (const auto& p : own.parameters()) theirs.push_back(p);
    ASSERT_EQ(ours.size(), theirs.size());
    for (size_t i = 0; i < ours.size(); ++i) theirs[i].set_data(ours[i].detach().clone());
    const torch::Tensor x = torch::relu(torch::randint(-2, 3, {5, 1, 8, 8}, torch::kLong)).to(dtype);
    const torch::Tensor y = net->forward(x);
    const torch::Tensor want = own.forward({x}).toTensor();
    ASSERT_TRUE(torch::equal(y, want)) << c10::toString(dtype);
    y.square().sum().backward();
    want.square().sum().backward();
    for (size_t i = 0; i < ours.size(); ++i) EXPECT_TRUE(torch::equal(ours[i].grad(), theirs[i].grad())) << i;
  }
}

}  // namespace
}  // namespace pathkernel
