// Tests of spec parsing, network construction and the flat parameter vector.
#include <gtest/gtest.h>

#include <cmath>

#include "pathkernel/error.h"
#include "pathkernel/loss.h"
#include "pathkernel/model.h"

namespace pathkernel {
namespace {

struct GoodSpec {
  std::string text, kind, activation, canonical;
  std::vector<int64_t> widths;
};

TEST(ModelSpec, ParsesValidSpecs) {
  const std::vector<GoodSpec> cases = {
      {"mlp:128", "mlp", "relu", "mlp:128", {128}},
      {"mlp:256,128:tanh", "mlp", "tanh", "mlp:256,128:tanh", {256, 128}},
      {"mlp:4,5,6:gelu", "mlp", "gelu", "mlp:4,5,6:gelu", {4, 5, 6}},
      {"mlp:16:relu", "mlp", "relu", "mlp:16", {16}},
      {"cnn:8,16", "cnn", "relu", "cnn:8,16", {8, 16}},
  };
  for (const auto& c : cases) {
    ModelSpec m = ModelSpec::parse(c.text);
    EXPECT_EQ(m.kind, c.kind) << c.text;
    EXPECT_EQ(m.activation, c.activation) << c.text;
    EXPECT_EQ(m.widths, c.widths) << c.text;
    EXPECT_EQ(m.str(), c.canonical) << c.text;
  }
}

TEST(ModelSpec, RejectsBadSpecsWithAClearMessage) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "expected mlp:H1"},
      {"mlp", "expected mlp:H1"},
      {"rnn:8", "unknown model kind 'rnn'"},
      {"mlp:", "width '' is not a positive integer"},
      {"mlp:8,", "width '' is not a positive integer"},
      {"mlp:0", "must be in [1,"},
      {"mlp:-3", "width '-3'"},
      {"mlp:abc", "width 'abc'"},
      {"mlp:8:sigmoid", "unknown activation 'sigmoid'"},
      {"cnn:8:tanh", "cnn blocks use relu"},
      {"mlp:8:relu:x", "expected mlp:H1"},
      {"mlp:99999999999999999999", "out of range"},
  };
  for (const auto& [spec, message] : cases) {
    try {
      ModelSpec::parse(spec);
      ADD_FAILURE() << "no error for '" << spec << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos)
          << "spec '" << spec << "' gave: " << e.what();
    }
  }
}

NetworkOptions options(const std::string& spec, std::vector<int64_t> shape, int64_t k) {
  NetworkOptions o;
  o.spec = ModelSpec::parse(spec);
  o.input_shape = std::move(shape);
  o.num_classes = k;
  o.seed = 3;
  return o;
}

TEST(Network, OutputShapesAndLogSoftmaxRowsSumToOne) {
  struct Case { std::string spec; std::vector<int64_t> shape; };
  for (const Case& c : std::vector<Case>{{"mlp:7", {5}}, {"mlp:7,3:tanh", {1, 6, 6}}, {"mlp:4:gelu", {5}},
                                         {"cnn:2,3", {1, 8, 8}}, {"cnn:4", {3, 5, 7}}}) {
    Network net = build_network(options(c.spec, c.shape, 4));
    std::vector<int64_t> in{6};
    in.insert(in.end(), c.shape.begin(), c.shape.end());
    torch::Tensor out = net->forward(torch::randn(in, torch::kFloat64));
    ASSERT_EQ(out.sizes(), (std::vector<int64_t>{6, 4})) << c.spec;
    EXPECT_EQ(out.scalar_type(), torch::kFloat64) << c.spec;
    EXPECT_LT((out.exp().sum(1) - 1).abs().max().item<double>(), 1e-12) << c.spec;
  }
}

TEST(Network, ParameterCountsMatchTheArchitecture) {
  Network mlp = build_network(options("mlp:7,3", {5}, 4));
  EXPECT_EQ(parameter_count(mlp), (5 * 7 + 7) + (7 * 3 + 3) + (3 * 4 + 4));
  Network cnn = build_network(options("cnn:2,3", {1, 8, 8}, 4));
  // conv 1->2 (3x3), conv 2->3 (3x3), 8x8 -> 4x4 -> 2x2, linear 3*2*2 -> 4.
  EXPECT_EQ(parameter_count(cnn), (2 * 9 + 2) + (3 * 2 * 9 + 3) + (12 * 4 + 4));
  std::vector<ParamInfo> layout = parameter_layout(cnn);
  ASSERT_EQ(layout.size(), 6u);
  EXPECT_EQ(layout[0].name, "conv1.weight");
  EXPECT_EQ(layout[5].name, "out.bias");
  EXPECT_EQ(layout[5].offset + layout[5].numel, parameter_count(cnn));
}

TEST(Network, CnnNeedsImagesAndRoom) {
  EXPECT_THROW(build_network(options("cnn:4", {10}, 3)), Error);
  EXPECT_THROW(build_network(options("cnn:4,4,4", {1, 4, 4}, 3)), Error);
}

TEST(Network, ZeroLastLayerGivesAConstantOutput) {
  NetworkOptions o = options("mlp:5", {3}, 3);
  o.zero_last_layer = true;
  Network net = build_network(o);
  torch::Tensor out = net->forward(torch::randn({10, 3}, torch::kFloat64));
  EXPECT_LT((out - std::log(1.0 / 3)).abs().max().item<double>(), 1e-15);
}

TEST(Network, LogitsOutputIsNotNormalised) {
  NetworkOptions o = options("mlp:5", {3}, 3);
  o.output = OutputMap::Logits;
  Network net = build_network(o);
  torch::Tensor out = net->forward(torch::randn({10, 3}, torch::kFloat64));
  EXPECT_GT((out.exp().sum(1) - 1).abs().max().item<double>(), 1e-6);
}

TEST(Network, SeedDeterminesInitialisation) {
  Network a = build_network(options("mlp:5", {3}, 3));
  Network b = build_network(options("mlp:5", {3}, 3));
  NetworkOptions oc = options("mlp:5", {3}, 3);
  oc.seed = 4;
  Network c = build_network(oc);
  EXPECT_TRUE(torch::equal(flatten_parameters(a), flatten_parameters(b)));
  EXPECT_FALSE(torch::equal(flatten_parameters(a), flatten_parameters(c)));
}

TEST(Network, FlatParametersRoundTripBitForBit) {
  Network net = build_network(options("cnn:2", {1, 4, 4}, 3));
  int64_t p = parameter_count(net);
  torch::Tensor flat = torch::randn({p}, torch::kFloat64);
  set_flat_parameters(net, flat);
  EXPECT_TRUE(torch::equal(flatten_parameters(net), flat));
  // The flat order is named_parameters order, each tensor row-major.
  auto params = net->named_parameters();
  EXPECT_TRUE(torch::equal(params["conv1.weight"].reshape(-1), flat.narrow(0, 0, 18)));
  EXPECT_THROW(set_flat_parameters(net, torch::zeros({p + 1}, torch::kFloat64)), Error);
}

TEST(Network, TrainingLossIsCrossEntropyForBothOutputMaps) {
  torch::Tensor z = torch::randn({4, 3}, torch::kFloat64);
  torch::Tensor y = torch::tensor({0, 2, 1, 2}, torch::kLong);
  // Reference: -mean log softmax(z)[y], written out.
  double ref = 0;
  for (int i = 0; i < 4; ++i) {
    double lse = std::log(z[i].exp().sum().item<double>());
    ref -= z[i][y[i].item<int64_t>()].item<double>() - lse;
  }
  ref /= 4;
  EXPECT_NEAR(training_loss(z, y, OutputMap::Logits).item<double>(), ref, 1e-14);
  EXPECT_NEAR(training_loss(torch::log_softmax(z, 1), y, OutputMap::LogSoftmax).item<double>(), ref, 1e-14);
}

TEST(OutputMap, ParsesNames) {
  EXPECT_EQ(parse_output_map("logits"), OutputMap::Logits);
  EXPECT_EQ(parse_output_map("logsoftmax"), OutputMap::LogSoftmax);
  EXPECT_THROW(parse_output_map("softmax"), Error);
}

}  // namespace
}  // namespace pathkernel
