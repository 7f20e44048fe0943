// Tests of the "layers:" model spec: each malformed list is refused with its
// reason; a list of linear layers is pathkernel's own MLP (same initial
// weights, same outputs); and a residual CNN written as a list trains,
// replays bit for bit and decomposes exactly on the structured route. Every
// layer of the grammar is also checked rule by rule against the generic
// route and autograd in script_graph_test.cpp.
#include <gtest/gtest.h>

#include <string>

#include "pathkernel/decomposition.h"
#include "pathkernel/layer_spec.h"
#include "pathkernel/npy.h"
#include "pathkernel/path.h"
#include "pathkernel/run.h"
#include "pathkernel/segment.h"
#include "../test_util.h"
#include "torchscript_util.h"

namespace {

using namespace pathkernel;
using pathkernel::testing::error_message;
using pathkernel::testing::TempDir;
using pathkernel::testing::script::expect_both_routes_exact;
using pathkernel::testing::script::train_small_image_run;

NetworkOptions options_for(const std::string& spec, std::vector<int64_t> shape, bool integer_inputs = false) {
  NetworkOptions o;
  o.spec = ModelSpec::parse(spec);
  o.input_shape = std::move(shape);
  o.num_classes = 3;
  o.integer_inputs = integer_inputs;
  return o;
}

TEST(LayerSpec, RefusesABadListWithTheReason) {
  struct Bad {
    std::string spec;
    std::vector<int64_t> shape;
    bool integer_inputs;
    std::string message;
  };
  const std::vector<Bad> cases{
      {"layers:", {4}, false, "no layers"},
      {"layers:linear(8", {4}, false, "opens '(' without closing it"},
      {"layers:linear(8),,relu", {4}, false, "expected a layer name at character 11 of the layer list"},
      {"layers:relu)", {4}, false, "unexpected ')'"},
      {"layers:frob", {4}, false, "unknown layer 'frob'"},
      {"layers:res(relu,frob(2))", {4}, false, "unknown layer 'frob'"},
      {"layers:linear(x)", {4}, false, "width 'x' is not an integer >= 1"},
      {"layers:linear(0)", {4}, false, "width 0 must be >= 1"},
      {"layers:linear()", {4}, false, "'linear' takes 1 argument (got 0)"},
      {"layers:relu(2)", {4}, false, "'relu(2)' takes 0 arguments (got 1)"},
      {"layers:linear(8),conv(4,3)", {4}, false, "needs [C,H,W] inputs, but receives [8]"},
      {"layers:conv(4,3,pad=1)", {1, 4, 4}, false, "unknown argument 'pad'"},
      {"layers:conv(4,3,1)", {1, 4, 4}, false, "argument '1' should be KEY=VALUE"},
      {"layers:conv(4,3,groups=3)", {2, 5, 5}, false, "groups 3 must divide its input channels (2)"},
      {"layers:conv(4,5)", {1, 3, 3}, false, "its kernel reaches 5 pixels"},
      {"layers:maxpool(9)", {1, 4, 4}, false, "window 9 is larger than its [1, 4, 4] input"},
      {"layers:res(linear(3))", {5}, false, "maps [5] to [3], but a residual block must keep the shape"},
      {"layers:linear(4),embed(5,2)", {4}, false, "embed must be the first layer"},
      {"layers:linear(4)", {4}, true, "the first layer must be embed(VOCAB,DIM)"},
      {"layers:embed(5,2)", {4}, false, "the data's inputs are not integer codes"},
      {"layers:leakyrelu(abc)", {4}, false, "slope 'abc' is not a number"},
      {"layers:dropout", {4}, false, "'dropout' takes 1 argument (got 0)"},
      {"layers:dropout(x)", {4}, false, "probability 'x' is not a number"},
      {"layers:dropout(1)", {4}, false, "probability 1 must be in [0, 1)"},
      {"layers:dropout(-0.5)", {4}, false, "probability -0.5 must be in [0, 1)"},
  };
  for (const Bad& b : cases) {
    const std::string e = error_message([&] { build_network(options_for(b.spec, b.shape, b.integer_inputs)); });
    EXPECT_CONTAINS(e, b.message) << b.spec;
    EXPECT_CONTAINS(e, "layers") << b.spec;
  }
}

/// "layers:flatten,linear(16),relu" is "mlp:16": the same initial weights,
/// drawn in the same order from the same seed, and the same outputs.
TEST(LayerSpec, ALinearListIsTheMlp) {
  const NetworkOptions lo = options_for("layers:flatten,linear(16),relu", {1, 4, 4});
  EXPECT_EQ(lo.spec.str(), "layers:flatten,linear(16),relu");
  EXPECT_TRUE(lo.spec.is_module());
  EXPECT_FALSE(lo.spec.is_torchscript());
  Network list = build_network(lo);
  Network mlp = build_network(options_for("mlp:16", {1, 4, 4}));
  ASSERT_TRUE(list->is_script());
  EXPECT_TRUE(torch::equal(flatten_parameters(list), flatten_parameters(mlp)));
  std::vector<std::string> names;
  for (const ParamInfo& p : parameter_layout(list)) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"linear1_weight", "linear1_bias", "out_weight", "out_bias"}));
  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({5, 1, 4, 4}, torch::kFloat64);
  torch::NoGradGuard guard;
  const torch::Tensor a = list->forward(x), b = mlp->forward(x);
  EXPECT_LE((a - b).abs().max().item<double>(), 1e-13 * b.abs().max().item<double>());

  // zero_last_layer zeroes the list's final layer as it does the MLP's.
  NetworkOptions zero = lo;
  zero.zero_last_layer = true;
  Network z = build_network(zero);
  for (const auto& p : z->named_parameters()) {
    EXPECT_EQ(p.value().abs().max().item<double>() == 0.0, p.key().rfind("out_", 0) == 0) << p.key();
  }
}

/// A residual CNN with average pooling written as a list: trained with SGD,
/// replayed bit for bit, decomposed exactly on the structured route, and the
/// same contributions on the generic route.
TEST(LayerSpec, AResidualListTrainsReplaysAndDecomposesExactly) {
  TempDir dir;
  const std::string model = "layers:conv(3,3,padding=1),relu,res(conv(3,3,padding=1),relu),avgpool(2)";
  const RunResult result = train_small_image_run(dir, model);
  EXPECT_EQ(result.manifest.model_spec, model);
  PathReader reader(dir.path() + "/run");
  EXPECT_EQ(reader.check().mismatches, 0);
  expect_both_routes_exact(reader, reader.decoded_dataset().x_test.narrow(0, 0, 4));
}

}  // namespace
