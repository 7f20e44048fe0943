// The hand-written backward walk of pathkernel's own networks against
// autograd through the same pass, for every layer kind they have.
#include <gtest/gtest.h>

#include "pathkernel/segment.h"

namespace pathkernel {
namespace {

struct Case {
  std::string spec;
  std::vector<int64_t> shape;
  OutputMap map;
};

// ReLU, Tanh and GELU MLPs (one on an image, so a Flatten comes first), and
// CNNs with max-pool and padding, under both output maps.
const std::vector<Case> kCases = {
    {"mlp:7", {5}, OutputMap::LogSoftmax},
    {"mlp:6,4:tanh", {5}, OutputMap::Logits},
    {"mlp:5:gelu", {1, 3, 3}, OutputMap::LogSoftmax},
    {"cnn:2,3", {1, 8, 8}, OutputMap::LogSoftmax},
    {"cnn:3", {2, 6, 6}, OutputMap::Logits},
};

TEST(Segment, HandSignalsMatchAutogradThroughThePass) {
  for (const Case& c : kCases) {
    NetworkOptions o;
    o.spec = ModelSpec::parse(c.spec);
    o.input_shape = c.shape;
    o.num_classes = 3;
    o.output = c.map;
    o.seed = 4;
    Network net = engine_network(o);
    torch::manual_seed(8);
    const torch::Tensor w = flatten_parameters(net), dw = 0.4 * torch::randn_like(w);
    SegmentEvaluator ev(net);
    ev.set_segment(w, dw);
    ASSERT_TRUE(ev.hand_backward()) << c.spec;
    const int64_t R = 7, K = 4;
    std::vector<int64_t> xs{R};
    xs.insert(xs.end(), c.shape.begin(), c.shape.end());
    const torch::Tensor x = torch::randn(xs, torch::kFloat64), t = torch::rand({R}, torch::kFloat64);
    // Any cotangents, one set of R per k (not only the unit vectors).
    const torch::Tensor cot = torch::randn({K, R, 3}, torch::kFloat64);
    const SegmentPass tracked = ev.forward(x, t, true), untracked = ev.forward(x, t, false);
    for (bool of_logits : {false, true}) {
      const std::vector<torch::Tensor> got = ev.hand_signals(untracked, cot, of_logits);
      ASSERT_EQ(got.size(), ev.param_layers().size()) << c.spec;
      for (int64_t k = 0; k < K; ++k) {
        const std::vector<torch::Tensor> expect = ev.signals(tracked, cot[k], of_logits);
        for (size_t l = 0; l < got.size(); ++l) {
          ASSERT_EQ(got[l][k].sizes(), expect[l].sizes()) << c.spec << " layer " << l;
          const double scale = std::max(1.0, expect[l].abs().max().item<double>());
          EXPECT_LE((got[l][k] - expect[l]).abs().max().item<double>(), 1e-13 * scale)
              << c.spec << "/" << output_map_name(c.map) << (of_logits ? " of logits" : " of outputs") << ", layer "
              << l << ", k " << k;
        }
      }
    }
  }
}

}  // namespace
}  // namespace pathkernel
