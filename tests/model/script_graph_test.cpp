// Tests of the structured route for TorchScript modules: every layer rule
// (Linear on rows and on tokens, Conv2d with stride, padding, dilation and
// groups, LayerNorm, Embedding with a padding row, a parameter added to a
// tensor) against the generic route and against per-example autograd, for
// both output maps; the fallback to the generic route, with its reason; and
// a trained module decomposed exactly by both routes.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "pathkernel/decomposition.h"
#include "pathkernel/features.h"
#include "pathkernel/npy.h"
#include "pathkernel/path.h"
#include "pathkernel/run.h"
#include "pathkernel/script_graph.h"
#include "../test_util.h"
#include "torchscript_util.h"

namespace {

using namespace pathkernel;
using pathkernel::testing::TempDir;
using namespace pathkernel::testing::script;

/// A module to test: its Python class body, its per-example input shape,
/// whether its inputs are token ids, and its classes.
struct Case {
  std::string name;
  std::string body;  ///< class M(nn.Module) ... (saved with torch.jit.script)
  std::vector<int64_t> input_shape;
  bool tokens = false;
  int64_t classes = 3;
  bool smooth = true;  ///< no kinks: certified Gauss must agree across routes
  std::string spec;    ///< instead of a Python body: a "layers:" spec (layer_spec.h)
};

std::vector<Case> cases() {
  std::vector<Case> c;
  // Conv2d: stride 2, padding 1, groups 2; a rectangular kernel with
  // dilation and no bias; adaptive average pooling; smooth activations.
  c.push_back({"conv", "class M(nn.Module):\n"
                       "    def __init__(self):\n"
                       "        super().__init__()\n"
                       "        self.c1 = nn.Conv2d(2, 4, 3, stride=2, padding=1, groups=2)\n"
                       "        self.c2 = nn.Conv2d(4, 4, (2, 3), padding=(1, 0), dilation=(2, 1), bias=False)\n"
                       "        self.pool = nn.AdaptiveAvgPool2d(2)\n"
                       "        self.fc = nn.Linear(16, 3)\n"
                       "    def forward(self, x):\n"
                       "        h = F.silu(self.c1(x))\n"
                       "        z = self.c2(h)\n"
                       "        h = torch.sigmoid(z) + F.softplus(z.neg())\n"
                       "        return self.fc(torch.flatten(self.pool(torch.tanh(h)), 1))\n",
               {2, 9, 9}});
  // Token ids: an embedding with a padding row, a learned position added,
  // LayerNorm, a Linear over the tokens, GELU, a Linear without bias.
  c.push_back({"tokens", "class M(nn.Module):\n"
                         "    def __init__(self):\n"
                         "        super().__init__()\n"
                         "        self.embed = nn.Embedding(7, 6, padding_idx=0)\n"
                         "        self.position = nn.Parameter(0.3 * torch.randn(3, 6))\n"
                         "        self.norm = nn.LayerNorm(6)\n"
                         "        self.mix = nn.Linear(6, 8)\n"
                         "        self.out = nn.Linear(8, 4, bias=False)\n"
                         "    def forward(self, tokens):\n"
                         "        h = self.embed(tokens) + self.position\n"
                         "        h = F.gelu(self.mix(self.norm(h)))\n"
                         "        return self.out(h.mean(1))\n",
               {3}, true, 4});
  // Piecewise linear: ReLU, an in-place ReLU, leaky ReLU, a residual
  // addition, average and max pooling.
  c.push_back({"relu", "class M(nn.Module):\n"
                       "    def __init__(self):\n"
                       "        super().__init__()\n"
                       "        self.conv = nn.Conv2d(1, 3, 3, padding=1)\n"
                       "        self.fc1 = nn.Linear(12, 6)\n"
                       "        self.fc2 = nn.Linear(6, 6)\n"
                       "        self.act = nn.ReLU(inplace=True)\n"
                       "        self.out = nn.Linear(6, 3)\n"
                       "    def forward(self, x):\n"
                       "        h = F.avg_pool2d(F.relu(self.conv(x)), 2)\n"
                       "        h = F.max_pool2d(h, 1)\n"
                       "        h = self.act(self.fc1(torch.flatten(h, 1)))\n"
                       "        h = h + F.leaky_relu(self.fc2(h), 0.1)\n"
                       "        return self.out(h)\n",
               {1, 4, 4}, false, 3, false});
  // A plain chain (ScriptGraph::chain()), walked layer by layer: a pool
  // before its ReLU, an in-place ReLU, a flattening view.
  c.push_back({"chain", "class M(nn.Module):\n"
                        "    def __init__(self):\n"
                        "        super().__init__()\n"
                        "        self.conv1 = nn.Conv2d(1, 3, 3, padding=1)\n"
                        "        self.conv2 = nn.Conv2d(3, 4, 3)\n"
                        "        self.fc = nn.Linear(16, 5)\n"
                        "        self.out = nn.Linear(5, 3)\n"
                        "    def forward(self, x):\n"
                        "        h = F.max_pool2d(F.relu(self.conv1(x)), 2)\n"
                        "        h = F.relu(F.max_pool2d(self.conv2(h), 2))\n"
                        "        h = torch.relu_(self.fc(h.view(h.size(0), -1)))\n"
                        "        return self.out(h)\n",
               {1, 12, 12}, false, 3, false});
  // The same chain flattened as many users write it, x.view(-1, N): a
  // flattening only because N is the rest of the shape.
  Case view = c.back();
  view.name = "chain-view";
  const std::string rows = "h.view(h.size(0), -1)";
  view.body.replace(view.body.find(rows), rows.size(), "h.view(-1, 16)");
  c.push_back(view);
  // The same chain ending in its own log-softmax (a model trained with
  // F.nll_loss): under the logits map its outputs are taken as they are.
  Case nll = c[c.size() - 2];
  nll.name = "chain-logsoftmax";
  const std::string out = "return self.out(h)";
  nll.body.replace(nll.body.find(out), out.size(), "return F.log_softmax(self.out(h), dim=1)");
  c.push_back(nll);
  // The same chain with layers without a bias, the first and the logits'.
  Case unbiased = c[c.size() - 3];
  unbiased.name = "chain-nobias";
  for (const std::string layer : {"nn.Conv2d(1, 3, 3, padding=1", "nn.Linear(5, 3"}) {
    unbiased.body.insert(unbiased.body.find(layer) + layer.size(), ", bias=False");
  }
  c.push_back(unbiased);
  // The same chain with dropout between the convolutions and before the
  // last layer (which passes its input through outside a training step).
  const std::string first = "F.max_pool2d(F.relu(self.conv1(x)), 2)";
  Case dropout = c[c.size() - 4];
  dropout.name = "chain-dropout";
  const std::string init = "        self.out = nn.Linear(5, 3)\n";
  dropout.body.insert(dropout.body.find(init) + init.size(),
                      "        self.drop1 = nn.Dropout(0.3)\n        self.drop2 = nn.Dropout(0.5)\n");
  dropout.body.replace(dropout.body.find(first), first.size(), "self.drop1(" + first + ")");
  const std::string logits = "return self.out(h)";
  dropout.body.replace(dropout.body.find(logits), logits.size(), "return self.out(self.drop2(h))");
  c.push_back(dropout);
  // The same chain with its paddings given as strings, as PyTorch's
  // padding='same' and 'valid' spell them (read as the integers they stand for).
  Case same = c[c.size() - 5];
  same.name = "chain-same";
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"nn.Conv2d(1, 3, 3, padding=1)", "nn.Conv2d(1, 3, 3, padding='same')"},
           {"nn.Conv2d(3, 4, 3)", "nn.Conv2d(3, 4, 3, padding='valid')"}}) {
    same.body.replace(same.body.find(from), from.size(), to);
  }
  c.push_back(same);
  // The chain written otherwise: each (from, to) replaced in its body.
  const Case plain = c[c.size() - 6];
  auto variant = [&](const std::string& name, const std::vector<std::pair<std::string, std::string>>& edits) {
    Case v = plain;
    v.name = name;
    for (const auto& [from, to] : edits) v.body.replace(v.body.find(from), from.size(), to);
    return v;
  };
  // Averaging instead of taking the maximum (LeNet's pools): windows of 2,
  // and of 3 over a 4 x 4 map, whose last row and column no window takes
  // (floor mode).
  c.push_back(variant("chain-avg", {{"nn.Linear(16, 5)", "nn.Linear(4, 5)"},
                                    {"F.max_pool2d(F.relu(self.conv1(x)), 2)",
                                     "F.avg_pool2d(F.relu(self.conv1(x)), 2)"},
                                    {"F.relu(F.max_pool2d(self.conv2(h), 2))",
                                     "F.avg_pool2d(torch.relu(self.conv2(h)), kernel_size=3)"}}));
  // Leaky ReLUs (a pool before the second, of another slope; F.leaky_relu's own).
  c.push_back(variant("chain-leaky", {{"F.relu(self.conv1(x))", "F.leaky_relu(self.conv1(x), 0.1)"},
                                      {"F.relu(F.max_pool2d(self.conv2(h), 2))",
                                       "F.leaky_relu(F.max_pool2d(self.conv2(h), 2), 0.2)"},
                                      {"torch.relu_(", "F.leaky_relu("}}));
  // Layer lists compiled without Python: every layer of the grammar.
  Case images{"layers-images", "", {2, 8, 8}};
  images.spec = "layers:conv(4,3,padding=1),leakyrelu(0.1),res(conv(4,3,padding=1,groups=2),silu),"
                "avgpool(2),conv(6,2,stride=1,dilation=1),relu,avgpool(2,1),layernorm,gelu,res(sigmoid),"
                "gap,linear(5),tanh,softplus";
  images.smooth = false;
  c.push_back(images);
  Case tokens{"layers-tokens", "", {3}, true, 4};
  tokens.spec = "layers:embed(7,6),layernorm,linear(8),gelu,flatten,res(linear(24),tanh)";
  c.push_back(tokens);
  return c;
}

NetworkOptions options_for(const std::string& path, const Case& c, OutputMap map) {
  NetworkOptions o;
  o.spec = ModelSpec::parse(c.spec.empty() ? "torchscript:" + path : c.spec);
  o.input_shape = c.input_shape;
  o.num_classes = c.classes;
  o.output = map;
  o.integer_inputs = c.tokens;
  return o;
}

/// n inputs of the case's shape: token ids in [0, 7) (0 the padding row), else normal.
torch::Tensor inputs(const Case& c, int64_t n) {
  std::vector<int64_t> shape{n};
  shape.insert(shape.end(), c.input_shape.begin(), c.input_shape.end());
  if (c.tokens) return torch::randint(0, 7, shape, torch::kLong).to(torch::kFloat64);
  return torch::randn(shape, torch::kFloat64);
}

void export_case(const TempDir& dir, const Case& c, const std::string& path) {
  if (!c.spec.empty()) return;  // compiled by pathkernel, from the seed
  python(dir, c.body + "torch.manual_seed(7)\ntorch.jit.script(M()).save('" + path + "')\n");
}

/// Every rule, on a fixed rule (the same nodes on both routes): test
/// features against per-example autograd, contractions with per-sample loss
/// gradients against explicit loops, and the output kernel, the tangent
/// kernel and J̄ v against the generic route; certified Gauss on both.
class EveryRule : public ::testing::TestWithParam<std::tuple<std::string, OutputMap>> {};

TEST_P(EveryRule, AgreesWithTheGenericRouteAndAutograd) {
  if (std::get<0>(GetParam()).rfind("layers", 0) != 0) REQUIRE_PYTHON_TORCH();
  TempDir dir;
  for (const Case& c : cases()) {
    if (c.name != std::get<0>(GetParam())) continue;
    const std::string path = dir.path() + "/" + c.name + ".pt";
    export_case(dir, c, path);
    for (OutputMap map : {std::get<1>(GetParam())}) {
      const std::string where = c.name + " " + output_map_name(map);
      // Each evaluator sets its own network's weights: one network each.
      Network net = engine_network(options_for(path, c, map));
      Network generic = engine_network(options_for(path, c, map));
      Network ref = engine_network(options_for(path, c, map));
      const int64_t P = parameter_count(net), K = c.classes, n = 3, B = 5;
      torch::manual_seed(13);
      const torch::Tensor w = flatten_parameters(net);
      torch::Tensor dw = 0.2 * torch::randn({P}, torch::kFloat64);
      // An embedding's padding row has no gradient by definition, so
      // training never moves it: nor does the direction here.
      for (const ParamInfo& p : parameter_layout(net)) {
        if (c.name == "tokens" && p.name == "embed.weight") dw.narrow(0, p.offset, p.shape[1]).zero_();
      }
      const torch::Tensor x = inputs(c, n), xb = inputs(c, B);
      const torch::Tensor yb = torch::randint(0, K, {B}, torch::kLong);
      SegmentEvaluator tev(net), gev(generic, ModuleRoute::Generic);
      ASSERT_EQ(tev.route(), "structured") << where << ": " << tev.route_reason();
      ASSERT_EQ(gev.route(), "generic") << where;
      // The chains are walked as chains (the reason is empty), but a module's
      // own log-softmax under the log-softmax map.
      if (c.name.rfind("chain", 0) == 0 && (c.name != "chain-logsoftmax" || map == OutputMap::Logits)) {
        EXPECT_EQ(tev.route_reason(), "") << where;
      } else if (c.name == "chain-logsoftmax") {
        EXPECT_CONTAINS(tev.route_reason(), "ends in its own log_softmax and its run applies the log-softmax map");
      }
      tev.set_segment(w, dw);
      gev.set_segment(w, dw);

      QuadratureOptions q;
      q.spec = QuadratureSpec::parse("riemann:3");
      const TestFeatures tf = test_features(tev, x, q), gf = test_features(gev, x, q);
      torch::Tensor expected = torch::zeros({n, K, P}, torch::kFloat64);
      const QuadratureRule rule = riemann(3);
      for (size_t j = 0; j < rule.nodes.size(); ++j) {
        expected += rule.weights[j] * reference_jacobian(ref, w + rule.nodes[j] * dw, x);
      }
      EXPECT_LE(max_rel(dense_features(tev, tf), expected), 1e-12) << where;
      EXPECT_LE(max_rel(dense_features(gev, gf), expected), 1e-12) << where;
      EXPECT_LE(max_rel(tf.f1, gf.f1), 1e-12) << where;

      // Contributions' contractions: <J̄_k(x), g_i> with per-sample gradients
      // of each training row's own loss.
      torch::Tensor ec = torch::zeros({n, B, K}, torch::kFloat64);
      for (int64_t i = 0; i < B; ++i) {
        const torch::Tensor yi = yb.narrow(0, i, 1);
        const torch::Tensor g = pathkernel::testing::flat_grad(
            ref, w, xb.narrow(0, i, 1), [&](const torch::Tensor& out) { return training_loss(out, yi, map); });
        ec.select(1, i).copy_(torch::matmul(expected, g));
      }
      EXPECT_LE(max_rel(contract(tev, tf, train_signals(tev, xb, yb, map)), ec), 1e-12) << where;
      EXPECT_LE(max_rel(contract(gev, gf, train_signals(gev, xb, yb, map)), ec), 1e-12) << where;
      // The same contraction through the dense test-side matrices.
      EXPECT_LE(max_rel(contract_dense(tev, expected, train_signals(tev, xb, yb, map)), ec), 1e-12) << where;
      EXPECT_LE(max_rel(output_kernel(tev, tf, xb), output_kernel(gev, gf, xb)), 1e-12) << where;
      EXPECT_LE(max_rel(apply_features(tev, tf, dw), apply_features(gev, gf, dw)), 1e-12) << where;
      const torch::Tensor tk = tangent_kernel(tev, train_output_signals(tev, xb), train_output_signals(tev, x));
      const torch::Tensor gk = tangent_kernel(gev, train_output_signals(gev, xb), train_output_signals(gev, x));
      EXPECT_LE(max_rel(tk, gk), 1e-12) << where;
      EXPECT_LE(max_rel(tangent_kernel_rows(tev, train_output_signals(tev, xb)),
                        tangent_kernel_rows(gev, train_output_signals(gev, xb))), 1e-12) << where;

      // Certified Gauss: the certificate holds on the structured route, and
      // on a smooth module the two routes integrate the same pieces alike.
      QuadratureOptions gauss;
      const TestFeatures ta = test_features(tev, x, gauss);
      EXPECT_LE(ta.certificate_gap, 1e-13) << where;
      if (c.smooth) {
        const TestFeatures ga = test_features(gev, x, gauss);
        EXPECT_LE(max_rel(dense_features(tev, ta), dense_features(gev, ga)), 1e-12) << where;
      } else {
        EXPECT_GT(ta.kinks, 0) << where;
      }
      // A chain's last site held (its switches integrated inside the
      // pieces) against pieces ended at every kink: the same features.
      if (c.name.rfind("chain", 0) == 0) {
        QuadratureOptions held = gauss, pieces = gauss;
        held.last_site = QuadratureOptions::LastSite::Local;
        pieces.last_site = QuadratureOptions::LastSite::Pieces;
        const TestFeatures th = test_features(tev, x, held), tp = test_features(tev, x, pieces);
        EXPECT_LE(th.certificate_gap, 1e-13) << where;
        EXPECT_LE(max_rel(dense_features(tev, th), dense_features(tev, tp)), 1e-12) << where;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    ScriptGraph, EveryRule,
    ::testing::Combine(::testing::Values("conv", "tokens", "relu", "chain", "chain-view", "chain-logsoftmax",
                                         "chain-nobias", "chain-dropout", "chain-same", "chain-avg", "chain-leaky",
                                         "layers-images", "layers-tokens"),
                       ::testing::Values(OutputMap::LogSoftmax, OutputMap::Logits)),
    [](const ::testing::TestParamInfo<EveryRule::ParamType>& info) {
      std::string name = std::get<0>(info.param) + "_" + output_map_name(std::get<1>(info.param));
      for (char& ch : name) {
        if (ch == '-') ch = '_';
      }
      return name;
    });

/// The graphs read as a plain chain of pathkernel's own layers, and those
/// that are not: a residual addition, a ReLU with no param layer before it,
/// a strided convolution, a leaky ReLU of negative slope, average pools
/// other than of non-overlapping windows after a ReLU; and why (a Linear
/// without bias is one).
TEST(ScriptGraph, ReadsAPlainChainOfOwnLayers) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  using Kind = LayerDesc::Kind;
  auto chain_of = [&](const std::string& name, const std::string& body) {
    const std::string path = dir.path() + "/" + name + ".pt";
    python(dir, body + "torch.manual_seed(1)\ntorch.jit.script(M()).save('" + path + "')\n");
    const torch::jit::Module module = torch::jit::load(path);
    std::string why_not;
    const std::unique_ptr<ScriptGraph> graph = ScriptGraph::read(module, why_not);
    EXPECT_NE(graph, nullptr) << name << ": " << why_not;
    return graph ? graph->chain() : std::vector<LayerDesc>{};
  };
  auto kinds_of = [](const std::vector<LayerDesc>& chain) {
    std::vector<Kind> kinds;
    for (const LayerDesc& d : chain) kinds.push_back(d.kind);
    return kinds;
  };
  std::map<std::string, std::vector<LayerDesc>> chains;  // the cases' chains by name
  for (const Case& c : cases()) {
    if (c.name == "chain" || c.name == "chain-view" || c.name == "chain-same" || c.name == "chain-avg" ||
        c.name == "chain-leaky") {
      chains[c.name] = chain_of(c.name, c.body);
    }
  }
  for (const std::string name : {"chain", "chain-view", "chain-same"}) {  // chain-logsoftmax: below
    const std::vector<LayerDesc>& chain = chains[name];
    // The pool before the second ReLU is walked after it: the two commute.
    EXPECT_EQ(kinds_of(chain), std::vector<Kind>({Kind::Conv2d, Kind::ReLU, Kind::MaxPool2d, Kind::Conv2d, Kind::ReLU,
                                                  Kind::MaxPool2d, Kind::Flatten, Kind::Linear, Kind::ReLU,
                                                  Kind::Linear}));
    ASSERT_EQ(chain.size(), 10u);
    EXPECT_EQ(chain[0].module, "conv1");
    EXPECT_EQ(chain[0].padding, 1);
    EXPECT_EQ(chain[0].kernel, 3);
    EXPECT_EQ(chain[3].padding, 0);
    EXPECT_EQ(chain[3].out, 4);
    EXPECT_EQ(chain[2].kernel, 2);
    EXPECT_EQ(chain[7].in, 16);
  }
  const std::vector<LayerDesc>& avg = chains["chain-avg"];
  EXPECT_EQ(kinds_of(avg), std::vector<Kind>({Kind::Conv2d, Kind::ReLU, Kind::AvgPool2d, Kind::Conv2d, Kind::ReLU,
                                              Kind::AvgPool2d, Kind::Flatten, Kind::Linear, Kind::ReLU, Kind::Linear}));
  ASSERT_EQ(avg.size(), 10u);
  EXPECT_EQ(avg[2].kernel, 2);
  EXPECT_EQ(avg[5].kernel, 3);
  // The pool before the second leaky ReLU is walked after it.
  const std::vector<LayerDesc>& leaky = chains["chain-leaky"];
  EXPECT_EQ(kinds_of(leaky), std::vector<Kind>({Kind::Conv2d, Kind::LeakyReLU, Kind::MaxPool2d, Kind::Conv2d,
                                                Kind::LeakyReLU, Kind::MaxPool2d, Kind::Flatten, Kind::Linear,
                                                Kind::LeakyReLU, Kind::Linear}));
  ASSERT_EQ(leaky.size(), 10u);
  EXPECT_EQ(leaky[1].slope, 0.1);
  EXPECT_EQ(leaky[4].slope, 0.2);
  EXPECT_EQ(leaky[8].slope, 0.01);  // F.leaky_relu's own
  // Modules the chain reader refuses (and one it takes): their __init__
  // body and forward.
  // and why it refuses them (ScriptGraph::chain_refusal()).
  struct Module {
    std::string name, init, forward, refusal;  ///< refusal "": a chain
  };
  const std::vector<Module> modules = {
      {"residual", "self.fc = nn.Linear(4, 4)", "x + F.relu(self.fc(x))",
       "the input of aten::linear of 'fc' is also read by aten::add"},
      {"relu_first", "self.fc = nn.Linear(4, 3)", "self.fc(F.relu(x))", "aten::relu does not follow a Linear"},
      {"strided", "self.conv = nn.Conv2d(1, 2, 3, stride=2)\n        self.fc = nn.Linear(2, 3)",
       "self.fc(torch.flatten(self.conv(x), 1))", "aten::conv2d of 'conv' is not a Linear or a stride-1 Conv2d"},
      {"no_bias", "self.fc = nn.Linear(4, 3, bias=False)", "self.fc(x)", ""},
      {"leaky", "self.fc = nn.Linear(4, 3)", "F.leaky_relu(self.fc(x))", ""},
      {"leaky_negative", "self.fc = nn.Linear(4, 3)", "F.leaky_relu(self.fc(x), -0.1)",
       "aten::leaky_relu is none of a chain's"},
      // Average pools: of non-overlapping windows after a ReLU; not before
      // it (the two do not commute), nor overlapping or in ceil mode.
      {"avg_pool", "self.conv = nn.Conv2d(1, 2, 3)\n        self.fc = nn.Linear(8, 3)",
       "self.fc(torch.flatten(F.avg_pool2d(F.relu(self.conv(x)), [2, 2]), 1))", ""},
      {"avg_pool_first", "self.conv = nn.Conv2d(1, 2, 3)\n        self.fc = nn.Linear(8, 3)",
       "self.fc(torch.flatten(F.relu(F.avg_pool2d(self.conv(x), 2)), 1))",
       "aten::relu does not follow a Linear or Conv2d"},
      {"avg_pool_overlapping", "self.conv = nn.Conv2d(1, 2, 3)\n        self.fc = nn.Linear(8, 3)",
       "self.fc(torch.flatten(F.avg_pool2d(F.relu(self.conv(x)), 3, 1), 1))",
       "aten::avg_pool2d is none of a chain's layers"},
      {"avg_pool_ceil", "self.conv = nn.Conv2d(1, 2, 3)\n        self.fc = nn.Linear(8, 3)",
       "self.fc(torch.flatten(F.avg_pool2d(F.relu(self.conv(x)), 2, ceil_mode=True), 1))",
       "aten::avg_pool2d is none of a chain's layers"},
      {"avg_pool_divisor", "self.conv = nn.Conv2d(1, 2, 3)\n        self.fc = nn.Linear(8, 3)",
       "self.fc(torch.flatten(F.avg_pool2d(F.relu(self.conv(x)), 2, divisor_override=3), 1))",
       "aten::avg_pool2d is none of a chain's layers"},
      {"dropout", "self.fc = nn.Linear(4, 3)\n        self.drop = nn.Dropout(0.5)", "self.fc(self.drop(x))", ""},
      {"dropout_before_relu", "self.fc = nn.Linear(4, 3)\n        self.drop = nn.Dropout(0.5)",
       "F.relu(self.drop(self.fc(x)))", "aten::relu does not follow a Linear"},
      {"plain", "self.fc = nn.Linear(4, 3)", "self.fc(x)", ""},
      // Flattenings to rows, spelled as users spell them.
      {"view_rest", "self.fc = nn.Linear(4, 3)", "self.fc(x.view(-1, 4))", ""},
      {"reshape_shape", "self.fc = nn.Linear(4, 3)", "self.fc(x.reshape(x.shape[0], -1))", ""},
      {"view_size_rest", "self.fc = nn.Linear(4, 3)", "self.fc(x.view(x.size(0), 4))", ""},
      {"view_fixed_rows", "self.fc = nn.Linear(4, 3)", "self.fc(x.view(2, -1))", "aten::view is none of"},
      {"log_softmax", "self.fc = nn.Linear(4, 3)", "F.log_softmax(self.fc(x), dim=1)", ""},
      {"log_softmax_inside", "self.fc = nn.Linear(4, 3)\n        self.out = nn.Linear(3, 3)",
       "self.out(F.log_softmax(self.fc(x), dim=1))", "aten::log_softmax is not its last operation"},
      {"view_shape_1", "self.fc = nn.Linear(4, 3)", "self.fc(x.view(x.shape[1], -1))",
       "aten::__getitem__ does not read the operation before it alone"},
      // String paddings: 'same' of an odd kernel and 'valid' pad both sides alike.
      {"same", "self.conv = nn.Conv2d(1, 2, 5, padding='same')\n        self.fc = nn.Linear(2, 3)",
       "self.fc(torch.flatten(self.conv(x), 1))", ""},
      {"valid", "self.conv = nn.Conv2d(1, 2, 3, padding='valid')\n        self.fc = nn.Linear(2, 3)",
       "self.fc(torch.flatten(self.conv(x), 1))", ""},
      {"same_dilated", "self.conv = nn.Conv2d(1, 2, 3, padding='same', dilation=2)\n        self.fc = nn.Linear(2, 3)",
       "self.fc(torch.flatten(self.conv(x), 1))", "aten::conv2d of 'conv' is not a Linear or a stride-1 Conv2d"},
  };
  for (const Module& m : modules) {
    const std::string body = "class M(nn.Module):\n    def __init__(self):\n        super().__init__()\n        " +
                             m.init + "\n    def forward(self, x):\n        return " + m.forward + "\n";
    const std::string path = dir.path() + "/" + m.name + ".pt";
    python(dir, body + "torch.manual_seed(1)\ntorch.jit.script(M()).save('" + path + "')\n");
    std::string why_not;
    const std::unique_ptr<ScriptGraph> graph = ScriptGraph::read(torch::jit::load(path), why_not);
    ASSERT_NE(graph, nullptr) << m.name << ": " << why_not;
    EXPECT_EQ(graph->chain().empty(), !m.refusal.empty()) << m.name;
    if (m.refusal.empty()) {
      EXPECT_EQ(graph->chain_refusal(), "") << m.name;
    } else {
      EXPECT_CONTAINS(graph->chain_refusal(), m.refusal);
    }
  }
}

/// Rows all at t = 0 (the training side's passes) take a graph without the
/// directions' products, and give the values the full graph gives rows at
/// t = 0 beside a row away from the start, bit for bit: the output, each
/// layer's input and output (also where an in-place ReLU follows a layer),
/// and the kink sites.
TEST(ScriptGraph, RowsAtTheStartGiveTheFullGraphsValues) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  for (const Case& c : cases()) {
    if (c.name != "conv" && c.name != "relu" && c.name != "chain") continue;
    SCOPED_TRACE(c.name);
    const std::string path = dir.path() + "/" + c.name + ".pt";
    export_case(dir, c, path);
    torch::jit::Module module = torch::jit::load(path);
    module.to(torch::kFloat64);
    std::string why_not;
    const std::unique_ptr<ScriptGraph> graph = ScriptGraph::read(module, why_not);
    ASSERT_NE(graph, nullptr) << why_not;
    torch::manual_seed(3);
    std::map<std::string, torch::Tensor> params;
    for (const auto& p : module.named_parameters(/*recurse=*/true)) params[p.name] = p.value;
    std::vector<torch::Tensor> directions;
    for (const ScriptLayer& l : graph->layers()) {
      directions.push_back(torch::randn_like(params.at(l.weight)));
      if (!l.bias.empty()) directions.push_back(torch::randn_like(params.at(l.bias)));
    }
    const int64_t R = 4;
    const torch::Tensor x = inputs(c, R);
    const ScriptPass start = graph->run(module, x, torch::zeros({R}, torch::kFloat64), directions);
    torch::Tensor t = torch::zeros({R + 1}, torch::kFloat64);
    t[R] = 0.5;
    const ScriptPass full = graph->run(module, torch::cat({x, x.narrow(0, 0, 1)}), t, directions);
    auto same_rows = [&](const torch::Tensor& a, const torch::Tensor& b) {
      return a.sizes().slice(1) == b.sizes().slice(1) && torch::equal(a, b.narrow(0, 0, R));
    };
    EXPECT_TRUE(same_rows(start.logits, full.logits));
    ASSERT_EQ(start.outputs.size(), full.outputs.size());
    for (size_t l = 0; l < start.outputs.size(); ++l) {
      EXPECT_TRUE(same_rows(start.inputs[l], full.inputs[l])) << "layer " << l;
      EXPECT_TRUE(same_rows(start.outputs[l], full.outputs[l])) << "layer " << l;
    }
    ASSERT_EQ(start.sites.size(), full.sites.size());
    for (size_t j = 0; j < start.sites.size(); ++j) EXPECT_TRUE(same_rows(start.sites[j], full.sites[j])) << "site " << j;
    EXPECT_FALSE(torch::equal(full.outputs.back()[R], full.outputs.back()[0]))
        << "the row away from the start (the first row's input at t = 0.5) moves the last layer's output";
  }
}

/// A string padding that pads one side more ('same' of an even kernel) has
/// no integers to stand for: the structured route refuses the module and
/// says which padding; 'same' of an odd kernel is read as its integers, for
/// a Conv2d and a Conv1d.
TEST(ScriptGraph, RefusesASamePaddingOfAnEvenKernelByName) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  // The module of one convolution `conv` (e.g. "nn.Conv2d(1, 2, 3, padding='same')"), flattened, read.
  auto read_conv = [&](const std::string& name, const std::string& conv, std::string& why_not) {
    const std::string path = dir.path() + "/" + name + ".pt";
    python(dir, "class M(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                "        self.conv = " + conv + "\n"
                "    def forward(self, x):\n        return torch.flatten(self.conv(x), 1)\n"
                "torch.jit.script(M()).save('" + path + "')\n");
    return ScriptGraph::read(torch::jit::load(path), why_not);
  };
  for (const auto& [kernel, refused] : std::vector<std::pair<int, bool>>{{2, true}, {3, false}}) {
    std::string why_not;
    const std::unique_ptr<ScriptGraph> graph =
        read_conv("even", "nn.Conv2d(1, 2, " + std::to_string(kernel) + ", padding='same')", why_not);
    EXPECT_EQ(graph == nullptr, refused) << kernel << ": " << why_not;
    if (refused) {
      EXPECT_CONTAINS(why_not, "conv2d's padding (a string padding has a rule where it pads both sides alike");
    } else {
      ASSERT_EQ(graph->chain().size(), 2u) << graph->chain_refusal();
      EXPECT_EQ(graph->chain()[0].padding, 1);
    }
  }
  // A one-dimensional convolution's 'same' too (the structured route's layer, not a chain's).
  std::string why_not;
  const std::unique_ptr<ScriptGraph> graph = read_conv("conv1d", "nn.Conv1d(2, 3, 5, padding='same')", why_not);
  ASSERT_NE(graph, nullptr) << why_not;
  ASSERT_EQ(graph->layers().size(), 1u);
  EXPECT_EQ(graph->layers()[0].desc.padding2, std::vector<int64_t>{2});
}

/// A seeded dropout is a layer of the chain, with its probability and its
/// site; one whose module is in eval mode passes its input through and is
/// none.
TEST(ScriptGraph, ReadsADropoutAsAChainLayer) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  using Kind = LayerDesc::Kind;
  const std::string path = dir.path() + "/dropout.pt";
  python(dir, "class M(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
              "        self.fc = nn.Linear(4, 5)\n        self.out = nn.Linear(5, 3)\n"
              "        self.first = nn.Dropout(0.2)\n        self.off = nn.Dropout(0.4).eval()\n"
              "        self.second = nn.Dropout(0.5)\n"
              "    def forward(self, x):\n"
              "        return self.out(self.second(self.off(F.relu(self.fc(self.first(x))))))\n"
              "torch.manual_seed(1)\ntorch.jit.script(M()).save('" + path + "')\n");
  std::string why_not;
  const std::unique_ptr<ScriptGraph> graph = ScriptGraph::read(torch::jit::load(path), why_not);
  ASSERT_NE(graph, nullptr) << why_not;
  const std::vector<LayerDesc> chain = graph->chain();
  std::vector<Kind> kinds;
  for (const LayerDesc& d : chain) kinds.push_back(d.kind);
  ASSERT_EQ(kinds, std::vector<Kind>({Kind::Dropout, Kind::Linear, Kind::ReLU, Kind::Dropout, Kind::Linear}))
      << graph->chain_refusal();
  EXPECT_EQ(chain[0].drop, 0.2);
  EXPECT_EQ(chain[0].site, 0);
  EXPECT_EQ(chain[3].drop, 0.5);
  EXPECT_EQ(chain[3].site, 2);  // the sites are the graph's, the one in eval mode included
}

/// A traced module's row count (aten::size, NumToTensor, Int) flattens to
/// rows as a scripted module's does.
TEST(ScriptGraph, ReadsATracedModulesFlatteningToRows) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  const std::string path = dir.path() + "/traced.pt";
  python(dir, "class M(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
              "        self.fc = nn.Linear(4, 5)\n        self.out = nn.Linear(5, 3)\n"
              "    def forward(self, x):\n        return self.out(F.relu(self.fc(x.view(x.size(0), -1))))\n"
              "torch.manual_seed(1)\ntorch.jit.trace(M(), torch.randn(2, 2, 2)).save('" + path + "')\n");
  std::string why_not;
  const std::unique_ptr<ScriptGraph> graph = ScriptGraph::read(torch::jit::load(path), why_not);
  ASSERT_NE(graph, nullptr) << why_not;
  std::vector<LayerDesc::Kind> kinds;
  for (const LayerDesc& d : graph->chain()) kinds.push_back(d.kind);
  using Kind = LayerDesc::Kind;
  EXPECT_EQ(kinds, std::vector<Kind>({Kind::Flatten, Kind::Linear, Kind::ReLU, Kind::Linear}))
      << graph->chain_refusal();
  // Tracing records a convolution as aten::_convolution: read as the
  // conv2d it is, the module a chain (else it took the generic route).
  const std::string cnn = dir.path() + "/traced_cnn.pt";
  python(dir, "class M(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
              "        self.conv = nn.Conv2d(1, 2, 3, padding=1)\n        self.fc = nn.Linear(8, 3)\n"
              "    def forward(self, x):\n        h = F.max_pool2d(F.relu(self.conv(x)), 2)\n"
              "        return self.fc(h.view(h.size(0), -1))\n"
              "torch.manual_seed(1)\ntorch.jit.trace(M(), torch.randn(2, 1, 4, 4)).save('" + cnn + "')\n");
  const std::unique_ptr<ScriptGraph> traced = ScriptGraph::read(torch::jit::load(cnn), why_not);
  ASSERT_NE(traced, nullptr) << why_not;
  kinds.clear();
  for (const LayerDesc& d : traced->chain()) kinds.push_back(d.kind);
  EXPECT_EQ(kinds, std::vector<Kind>({Kind::Conv2d, Kind::ReLU, Kind::MaxPool2d, Kind::Flatten, Kind::Linear}))
      << traced->chain_refusal();
  // And the evaluator walks it as one, agreeing with the module.
  Case c{"traced", "", {1, 4, 4}};
  Network net = engine_network(options_for(cnn, c, OutputMap::LogSoftmax));
  SegmentEvaluator ev(net);
  EXPECT_EQ(ev.route(), "structured");
  EXPECT_EQ(ev.route_reason(), "");
}

/// A module on the structured route whose graph is not a chain says so,
/// and why, in its route's reason; a chain says nothing.
TEST(ScriptGraph, SaysWhyItsGraphIsNotWalkedAsAChain) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  for (const bool leaky : {true, false}) {
    const std::string path = dir.path() + (leaky ? "/leaky.pt" : "/relu.pt");
    // A leaky ReLU of negative slope is none of a chain's layers.
    python(dir, std::string("class M(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                            "        self.fc = nn.Linear(4, 5)\n        self.out = nn.Linear(5, 3)\n"
                            "    def forward(self, x):\n        return self.out(F.") +
                    (leaky ? "leaky_relu(self.fc(x), -0.1)" : "relu(self.fc(x))") + ")\n"
                    "torch.manual_seed(1)\ntorch.jit.script(M()).save('" + path + "')\n");
    Case c{"m", "", {4}};
    Network net = engine_network(options_for(path, c, OutputMap::LogSoftmax));
    SegmentEvaluator ev(net);
    EXPECT_EQ(ev.route(), "structured");
    if (leaky) {
      EXPECT_CONTAINS(ev.route_reason(), "not its layers walked as a chain (slower): aten::leaky_relu is none of");
    } else {
      EXPECT_EQ(ev.route_reason(), "");
    }
  }
}

/// What no rule covers goes to the generic route, and the evaluator says
/// why: a parameter used by an operation without a rule, tied weights, and
/// a parameterised operation that does not keep the examples first (found
/// by comparing the rewritten graph with the module).
TEST(ScriptGraph, FallsBackToTheGenericRouteAndSaysWhy) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  struct Fallback {
    std::string name, body, reason;
  };
  const std::vector<Fallback> fallbacks = {
      {"matmul",
       "class M(nn.Module):\n"
       "    def __init__(self):\n"
       "        super().__init__()\n"
       "        self.w = nn.Parameter(torch.randn(4, 3))\n"
       "    def forward(self, x):\n"
       "        return x @ self.w\n",
       "parameter 'w' is used by aten::matmul"},
      {"tied",
       "class M(nn.Module):\n"
       "    def __init__(self):\n"
       "        super().__init__()\n"
       "        self.fc = nn.Linear(4, 4)\n"
       "        self.out = nn.Linear(4, 3)\n"
       "    def forward(self, x):\n"
       "        return self.out(torch.tanh(self.fc(torch.tanh(self.fc(x)))))\n",
       "is used by 2 operations"},
      {"transposed",
       "class M(nn.Module):\n"
       "    def __init__(self):\n"
       "        super().__init__()\n"
       "        self.fc = nn.Linear(2, 3)\n"
       "    def forward(self, x):\n"
       "        h = self.fc(x.reshape(x.shape[0], 2, 2).transpose(0, 1))\n"
       "        return torch.tanh(h).transpose(0, 1).sum(1)\n",
       "does not reproduce the module's outputs"},
  };
  for (const Fallback& f : fallbacks) {
    const std::string path = dir.path() + "/" + f.name + ".pt";
    python(dir, f.body + "torch.manual_seed(1)\ntorch.jit.script(M()).save('" + path + "')\n");
    Case c{f.name, "", {4}};
    Network net = engine_network(options_for(path, c, OutputMap::LogSoftmax));
    SegmentEvaluator ev(net);
    EXPECT_EQ(ev.route(), "generic") << f.name;
    EXPECT_CONTAINS(ev.route_reason(), f.reason);
    // And the generic route still decomposes it.
    const int64_t P = parameter_count(net);
    ev.set_segment(flatten_parameters(net), 0.1 * torch::ones({P}, torch::kFloat64));
    const TestFeatures tf = test_features(ev, torch::randn({2, 4}, torch::kFloat64), QuadratureOptions{});
    EXPECT_LE(tf.certificate_gap, 1e-13) << f.name;
  }
}

/// A convolutional module with a residual block and average pooling, trained
/// by pathkernel with SGD: both routes decompose it exactly and give the
/// same contributions.
TEST(ScriptGraph, BothRoutesDecomposeATrainedModuleAlike) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  const std::string model = dir.path() + "/res.pt";
  python(dir, "class M(nn.Module):\n"
              "    def __init__(self):\n"
              "        super().__init__()\n"
              "        self.stem = nn.Conv2d(1, 3, 3, padding=1)\n"
              "        self.conv = nn.Conv2d(3, 3, 3, padding=1)\n"
              "        self.head = nn.Linear(12, 3)\n"
              "    def forward(self, x):\n"
              "        h = F.relu(self.stem(x))\n"
              "        h = F.relu(h + self.conv(h))\n"
              "        return self.head(torch.flatten(F.avg_pool2d(h, 2), 1))\n"
              "torch.manual_seed(2)\n"
              "torch.jit.script(M()).save('" + model + "')\n");
  train_small_image_run(dir, "torchscript:" + model);
  PathReader reader(dir.path() + "/run");
  const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 4);
  DecompositionOptions d;
  d.progress = false;
  const Decomposition structured = decompose(reader, x, d);
  d.quadrature.route = ModuleRoute::Generic;
  const Decomposition generic = decompose(reader, x, d);
  EXPECT_LE(summarize(structured).max_rel_error, 1e-12);
  EXPECT_LE(summarize(generic).max_rel_error, 1e-12);
  EXPECT_LE(max_rel(structured.contributions, generic.contributions), 1e-12);
  EXPECT_LT(structured.evaluations, generic.evaluations * 4);  // both certified; neither degenerates
}

}  // namespace
