// Every entry of the layer table, one row each: its direction against
// central differences of the layer, its per-sample gradients against
// per-sample autograd and central differences of c·f for both output maps
// (f the output map of a fixed linear head on the layer's output), and its
// graph rewrite (a one-operation TorchScript module read by ScriptGraph)
// against the layer evaluated at W_s + t dW.
#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include <torch/script.h>

#include "pathkernel/layer_rules.h"
#include "pathkernel/layer_table.h"
#include "pathkernel/loss.h"
#include "pathkernel/script_graph.h"

namespace {

using namespace pathkernel;
using Kind = LayerDesc::Kind;
using Forward = std::function<torch::Tensor(const torch::Tensor& a, const torch::Tensor& w, const torch::Tensor& b)>;

/// One layer to test: its description, input, parameter shapes, the layer
/// written out with LibTorch (the reference), and the same layer as a
/// TorchScript forward over parameters self.w and self.b ("" when the kind
/// has no graph operation of its own).
struct Row {
  std::string name;
  LayerDesc desc;
  std::vector<int64_t> input;  ///< per-row input shape
  std::vector<int64_t> weight, bias;
  Forward forward;
  std::string script;
  int64_t vocab = 0;         ///< token ids in [0, vocab) instead of real inputs
  int64_t frozen_rows = 0;   ///< leading weight rows without gradient (an embedding's padding row)
  bool factored = false;     ///< per-sample gradients kept as (δ, a)
};

LayerDesc desc(Kind kind) {
  LayerDesc d;
  d.kind = kind;
  return d;
}

LayerDesc conv(Kind kind, std::vector<int64_t> stride, std::vector<int64_t> padding, std::vector<int64_t> dilation,
               int64_t groups) {
  LayerDesc d = desc(kind);
  d.stride = std::move(stride);
  d.padding2 = std::move(padding);
  d.dilation = std::move(dilation);
  d.groups = groups;
  return d;
}

std::vector<Row> rows() {
  std::vector<Row> r;
  r.push_back({"linear_rows", desc(Kind::Linear), {5}, {4, 5}, {4},
               [](auto& a, auto& w, auto& b) { return torch::linear(a, w, b); },
               "torch.linear(x, self.w, self.b)", 0, 0, true});
  r.push_back({"linear_tokens", desc(Kind::Linear), {3, 5}, {4, 5}, {4},
               [](auto& a, auto& w, auto& b) { return torch::linear(a, w, b); }, "torch.linear(x, self.w, self.b)"});
  r.push_back({"conv2d", conv(Kind::Conv2d, {2, 1}, {1, 0}, {1, 2}, 2), {2, 6, 7}, {4, 1, 3, 2}, {4},
               [](auto& a, auto& w, auto& b) { return torch::conv2d(a, w, b, {2, 1}, {1, 0}, {1, 2}, 2); },
               "torch.conv2d(x, self.w, self.b, [2, 1], [1, 0], [1, 2], 2)"});
  // Strided across columns, padded wider than the dilated kernel's reach on one side.
  r.push_back({"conv2d_wide_stride", conv(Kind::Conv2d, {1, 3}, {2, 3}, {2, 1}, 1), {2, 5, 8}, {3, 2, 2, 2}, {3},
               [](auto& a, auto& w, auto& b) { return torch::conv2d(a, w, b, {1, 3}, {2, 3}, {2, 1}, 1); },
               "torch.conv2d(x, self.w, self.b, [1, 3], [2, 3], [2, 1], 1)"});
  r.push_back({"conv1d", conv(Kind::Conv1d, {2}, {1}, {1}, 2), {2, 9}, {4, 1, 3}, {4},
               [](auto& a, auto& w, auto& b) { return torch::conv1d(a, w, b, {2}, {1}, {1}, 2); },
               "torch.conv1d(x, self.w, self.b, [2], [1], [1], 2)"});
  LayerDesc own = desc(Kind::Conv2d);  // pathkernel's own: kernel 3, padding 1, no graph
  own.kernel = 3;
  own.padding = 1;
  r.push_back({"conv2d_own", own, {1, 5, 5}, {3, 1, 3, 3}, {3},
               [](auto& a, auto& w, auto& b) { return torch::conv2d(a, w, b, 1, 1); }, ""});
  LayerDesc norm = desc(Kind::LayerNorm);
  norm.norm_shape = {6};
  norm.eps = 1e-5;
  r.push_back({"layer_norm", norm, {3, 6}, {6}, {6},
               [](auto& a, auto& w, auto& b) { return torch::layer_norm(a, {6}, w, b, 1e-5); },
               "torch.layer_norm(x, [6], self.w, self.b, 1e-05, False)"});
  LayerDesc embed = desc(Kind::Embedding);
  embed.padding_index = 0;
  r.push_back({"embedding", embed, {4}, {7, 3}, {},
               [](auto& a, auto& w, auto&) { return torch::embedding(w, a.to(torch::kLong), 0); },
               "torch.embedding(self.w, x, 0, False, False)", 7, 1});
  r.push_back({"addend", desc(Kind::Addend), {3, 6}, {3, 6}, {},
               [](auto& a, auto& w, auto&) { return a + w; }, "x + self.w"});
  return r;
}

double rel(const torch::Tensor& got, const torch::Tensor& want) {
  EXPECT_EQ(got.sizes(), want.sizes());
  if (got.sizes() != want.sizes()) return 1e300;
  return (got - want).abs().max().item<double>() / std::max(1e-300, want.abs().max().item<double>());
}

/// Inputs [n, ...]: token ids as doubles, else normal.
torch::Tensor inputs(const Row& row, int64_t n) {
  std::vector<int64_t> shape{n};
  shape.insert(shape.end(), row.input.begin(), row.input.end());
  if (row.vocab) return torch::randint(0, row.vocab, shape, torch::kLong).to(torch::kFloat64);
  return torch::randn(shape, torch::kFloat64);
}

torch::Tensor param(const std::vector<int64_t>& shape) {
  return shape.empty() ? torch::Tensor() : torch::randn(shape, torch::kFloat64);
}

/// c·f per row for the row's layer at (w, b): f the output map of the head
/// on the layer's flattened output. [R].
torch::Tensor objective(const Row& row, const torch::Tensor& a, const torch::Tensor& w, const torch::Tensor& b,
                        const torch::Tensor& head, const torch::Tensor& c, OutputMap map) {
  torch::Tensor z = torch::matmul(row.forward(a, w, b).flatten(1), head.t());
  if (map == OutputMap::LogSoftmax) z = torch::log_softmax(z, 1);
  return (z * c).sum(1);
}

class EveryLayerRule : public ::testing::TestWithParam<std::tuple<std::string, OutputMap>> {
 protected:
  void SetUp() override {
    for (const Row& r : rows()) {
      if (r.name == std::get<0>(GetParam())) row_ = r;
    }
    ASSERT_FALSE(row_.name.empty());
    torch::manual_seed(29);
    a_ = inputs(row_, R);
    w_ = param(row_.weight);
    b_ = param(row_.bias);
    dw_ = param(row_.weight);
    db_ = param(row_.bias);
    if (row_.frozen_rows) dw_.narrow(0, 0, row_.frozen_rows).zero_();
  }
  static constexpr int64_t R = 3, K = 2;
  Row row_;
  torch::Tensor a_, w_, b_, dw_, db_;
};

TEST_P(EveryLayerRule, DirectionIsTheLayersDerivativeAlongTheParameters) {
  const double h = 1e-3;
  auto at = [&](double s) {
    return row_.forward(a_, w_ + s * dw_, b_.defined() ? b_ + s * db_ : b_);
  };
  torch::Tensor want = (at(h) - at(-h)) / (2 * h);
  torch::Tensor got = layer_direction(row_.desc, a_, dw_, db_);
  if (row_.desc.kind == Kind::Addend) got = got.expand_as(want);  // broadcast along the rows by the caller
  EXPECT_LE(rel(got, want), 1e-9) << row_.name;
  EXPECT_EQ(factored(row_.desc, a_), row_.factored) << row_.name;
}

TEST_P(EveryLayerRule, SampleGradientsMatchAutogradAndCentralDifferences) {
  const OutputMap map = std::get<1>(GetParam());
  const std::string where = row_.name + " " + output_map_name(map);
  const int64_t D = row_.forward(a_.narrow(0, 0, 1), w_, b_).numel(), classes = 3;
  const torch::Tensor head = torch::randn({classes, D}, torch::kFloat64);
  const torch::Tensor c = torch::randn({K, R, classes}, torch::kFloat64);
  // The signals δ_k = ∂(c_k·f)/∂y at the layer's output, by autograd.
  const torch::Tensor y = row_.forward(a_, w_, b_).detach().requires_grad_(true);
  std::vector<torch::Tensor> deltas;
  for (int64_t k = 0; k < K; ++k) {
    torch::Tensor z = torch::matmul(y.flatten(1), head.t());
    if (map == OutputMap::LogSoftmax) z = torch::log_softmax(z, 1);
    deltas.push_back(torch::autograd::grad({(z * c[k]).sum()}, {y})[0]);
  }
  const int64_t bias_numel = b_.defined() ? b_.numel() : 0;
  const torch::Tensor got = sample_gradients(row_.desc, a_, torch::stack(deltas), row_.weight, bias_numel);
  const int64_t Qw = w_.numel(), Q = Qw + bias_numel;
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{K, R, Q})) << where;
  torch::Tensor autograd = torch::zeros({K, R, Q}, torch::kFloat64), central = torch::zeros({K, R, Q}, torch::kFloat64);
  const double h = 1e-5;
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t r = 0; r < R; ++r) {
      const torch::Tensor ar = a_.narrow(0, r, 1), cr = c[k].narrow(0, r, 1);
      torch::Tensor w = w_.clone().requires_grad_(true), b = b_.defined() ? b_.clone().requires_grad_(true) : b_;
      std::vector<torch::Tensor> wrt{w};
      if (b.defined()) wrt.push_back(b);
      const auto g = torch::autograd::grad({objective(row_, ar, w, b, head, cr, map).sum()}, wrt);
      autograd[k][r].narrow(0, 0, Qw).copy_(g[0].flatten());
      if (b.defined()) autograd[k][r].narrow(0, Qw, bias_numel).copy_(g[1].flatten());
      for (int64_t q = row_.frozen_rows * (row_.weight.size() > 1 ? row_.weight[1] : 1); q < Q; ++q) {
        auto value = [&](double s) {
          torch::Tensor ws = w_.clone(), bs = b_.defined() ? b_.clone() : b_;
          (q < Qw ? ws.view({-1})[q] : bs.view({-1})[q - Qw]).add_(s);
          return objective(row_, ar, ws, bs, head, cr, map).item<double>();
        };
        central[k][r][q] = (value(h) - value(-h)) / (2 * h);
      }
    }
  }
  EXPECT_LE(rel(got, autograd), 1e-12) << where;
  EXPECT_LE(rel(got, central), 1e-7) << where;
  const torch::Tensor one = sample_gradients_one(row_.desc, a_, deltas[1], row_.weight, bias_numel);
  EXPECT_LE(rel(one, got[1]), 1e-14) << where;
  if (has_patches(row_.desc)) {
    // The patches contract with δ to the weight's gradient.
    const torch::Tensor u = conv_patches(row_.desc, a_, row_.weight);
    EXPECT_EQ(u.size(0), R) << where;
    EXPECT_EQ(u.size(1), row_.input[0] * Qw / (row_.weight[0] * row_.weight[1])) << where;
    if (row_.desc.kind == LayerDesc::Kind::Conv2d) {
      // The same values as LibTorch's im2col (unfold), the reference.
      auto pair = [](std::vector<int64_t> v, int64_t otherwise) {
        if (v.empty()) v = {otherwise};
        if (v.size() == 1) v.push_back(v[0]);
        return v;
      };
      namespace F = torch::nn::functional;
      const LayerDesc& d = row_.desc;
      const torch::Tensor ref = F::unfold(a_, F::UnfoldFuncOptions({row_.weight[2], row_.weight[3]})
                                                  .padding(pair(d.padding2, d.padding))
                                                  .stride(pair(d.stride, 1))
                                                  .dilation(pair(d.dilation, 1)));
      EXPECT_TRUE(torch::equal(u, ref)) << where;
      // In a graph the same values, and autograd follows them.
      const torch::Tensor tracked = conv_patches(row_.desc, a_.clone().requires_grad_(true), row_.weight);
      EXPECT_TRUE(tracked.requires_grad()) << where;
      EXPECT_TRUE(torch::equal(tracked.detach(), ref)) << where;
    }
  }
}

TEST_P(EveryLayerRule, GraphRewriteEvaluatesTheLayerAlongTheSegment) {
  if (row_.script.empty()) GTEST_SKIP() << row_.name << " has no graph operation of its own";
  torch::jit::Module module(c10::QualifiedName("__torch__.pathkernel.OneLayer"));
  module.register_parameter("w", w_.clone(), false);
  if (b_.defined()) module.register_parameter("b", b_.clone(), false);
  module.define("def forward(self, x):\n    return " + row_.script + "\n");
  std::string why;
  std::unique_ptr<ScriptGraph> graph = ScriptGraph::read(module, why);
  ASSERT_TRUE(graph) << row_.name << ": " << why;
  ASSERT_EQ(graph->layers().size(), 1u) << row_.name;
  const LayerDesc& d = graph->layers()[0].desc;
  EXPECT_EQ(d.kind, row_.desc.kind) << row_.name;
  EXPECT_EQ(d.stride, row_.desc.stride) << row_.name;
  EXPECT_EQ(d.padding2, row_.desc.padding2) << row_.name;
  EXPECT_EQ(d.dilation, row_.desc.dilation) << row_.name;
  EXPECT_EQ(d.groups, row_.desc.groups) << row_.name;
  EXPECT_EQ(d.norm_shape, row_.desc.norm_shape) << row_.name;
  EXPECT_EQ(d.eps, row_.desc.eps) << row_.name;
  EXPECT_EQ(d.padding_index, row_.desc.padding_index) << row_.name;
  EXPECT_EQ(graph->layers()[0].bias.empty(), !b_.defined()) << row_.name;

  const torch::Tensor t = torch::tensor({0.0, 0.4, 1.0}, torch::kFloat64);
  std::vector<torch::Tensor> directions{dw_};
  if (db_.defined()) directions.push_back(db_);
  const torch::Tensor x = row_.vocab ? a_.to(torch::kLong) : a_;
  torch::NoGradGuard no_grad;
  const ScriptPass pass = graph->run(module, x, t, directions);
  for (int64_t r = 0; r < R; ++r) {
    const double s = t[r].item<double>();
    const torch::Tensor want = row_.forward(a_.narrow(0, r, 1), w_ + s * dw_, b_.defined() ? b_ + s * db_ : b_);
    EXPECT_LE(rel(pass.outputs[0].narrow(0, r, 1), want), 1e-13) << row_.name << " row " << r;
    EXPECT_LE(rel(pass.logits.narrow(0, r, 1), want), 1e-13) << row_.name << " row " << r;
  }
  EXPECT_TRUE(torch::equal(pass.inputs[0].to(torch::kFloat64), a_)) << row_.name;
}

TEST(LayerTable, EveryKindHasOneEntryAndEveryOperationOneKind) {
  std::set<Kind> kinds;
  std::set<std::string> ops;
  for (const LayerRule& rule : layer_table()) {
    EXPECT_TRUE(kinds.insert(rule.kind).second) << rule.name;
    EXPECT_EQ(&layer_rule(rule.kind), &rule) << rule.name;
    if (rule.op) {
      EXPECT_TRUE(ops.insert(rule.op).second) << rule.op;
    }
    if (rule.parameterised && rule.op) {
      EXPECT_EQ(layer_rule_for_op(rule.op), &rule) << rule.op;
      EXPECT_TRUE(rule.param_input && rule.read && rule.rewrite && rule.direction && rule.gradients) << rule.name;
    }
    if (!rule.parameterised) {
      EXPECT_TRUE(rule.apply) << rule.name;
    }
  }
  // Every parameterised kind with a graph operation has a row above.
  std::set<Kind> tested;
  for (const Row& r : rows()) tested.insert(r.desc.kind);
  for (const LayerRule& rule : layer_table()) {
    if (rule.parameterised && rule.op) {
      EXPECT_TRUE(tested.count(rule.kind)) << rule.name << " has no test row";
    }
  }
  EXPECT_EQ(layer_rule_for_op("aten::relu"), nullptr);  // parameter-free: no parameterised rule
  for (const GraphOpRule& op : graph_op_table()) {
    EXPECT_EQ(graph_op_rule(op.op), &op) << op.op;
    if (op.pool_dims) {
      EXPECT_TRUE(op.kink_rows) << op.op;
    }
  }
}

/// Every max-pool of the graph op table: the layout the kink search reads
/// (k x k windows of [R, C, H, W]) pools to the pool's own values, and each
/// window's argmax there holds that value.
TEST(LayerTable, EveryMaxPoolsKinkLayoutPoolsAsThePool) {
  torch::manual_seed(31);
  for (const GraphOpRule& op : graph_op_table()) {
    if (!op.pool_dims) continue;
    for (int64_t k : {2, 3}) {
      std::vector<int64_t> shape{3, 2};
      std::string window = "[";
      for (int d = 0; d < op.pool_dims; ++d) {
        shape.push_back(7);
        window += (d ? ", " : "") + std::to_string(k);
      }
      torch::jit::Module module(c10::QualifiedName("__torch__.pathkernel.Pool"));
      module.define("def forward(self, x):\n    return torch." + std::string(op.op) + "(x, " + window + "])\n");
      const torch::Tensor site = torch::randn(shape, torch::kFloat64);
      const torch::Tensor want = module.forward({site}).toTensor().flatten(1);
      const torch::Tensor rows = op.kink_rows(site, k);
      ASSERT_EQ(rows.dim(), 4) << op.op;
      auto [pooled, index] = torch::max_pool2d_with_indices(rows, k);
      EXPECT_TRUE(torch::equal(pooled.flatten(1), want)) << op.op << " window " << k;
      EXPECT_TRUE(torch::equal(rows.flatten(2).gather(2, index.flatten(2)).flatten(1), want)) << op.op;
    }
  }
}

std::vector<std::string> row_names() {
  std::vector<std::string> names;
  for (const Row& r : rows()) names.push_back(r.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(LayerRules, EveryLayerRule,
                         ::testing::Combine(::testing::ValuesIn(row_names()),
                                            ::testing::Values(OutputMap::LogSoftmax, OutputMap::Logits)),
                         [](const ::testing::TestParamInfo<EveryLayerRule::ParamType>& info) {
                           std::string name = std::get<0>(info.param) + "_" + output_map_name(std::get<1>(info.param));
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

}  // namespace
