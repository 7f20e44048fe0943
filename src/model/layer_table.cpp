// The layer kinds in one table: each kind's names, graph rewrite, direction,
// per-sample gradients and kink behaviour.
#include "pathkernel/layer_table.h"

#include <algorithm>

#include <torch/csrc/jit/ir/ir.h>

#include "pathkernel/error.h"
#include "pathkernel/script_pool.h"

namespace pathkernel {

namespace {

using Kind = LayerDesc::Kind;
using torch::jit::Node;
using torch::jit::Value;

c10::Symbol aten(const char* name) { return c10::Symbol::fromQualString(std::string("aten::") + name); }

/// A constant input's value, or None when it is not a constant.
c10::optional<c10::IValue> constant(Value* v) { return torch::jit::toIValue(v); }

std::vector<int64_t> int_list(Value* v, const std::string& what) {
  auto iv = constant(v);
  PK_CHECK(iv && iv->isIntList(), what << " is not a constant list of integers");
  return iv->toIntVector();
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

/// The operation's name for messages, e.g. "conv2d".
std::string op_name(const Node* n) { return n->kind().toUnqualString(); }

// ---- Which inputs hold the parameters ----------------------------------

/// Weight at input 1, bias at input 2 (linear, convolutions).
int weight_then_bias(const Node*, size_t offset, const std::string&) {
  return offset == 1 ? 0 : offset == 2 ? 1 : -1;
}

int layer_norm_params(const Node*, size_t offset, const std::string&) {
  return offset == 2 ? 0 : offset == 3 ? 1 : -1;
}

int embedding_params(const Node*, size_t offset, const std::string&) { return offset == 0 ? 0 : -1; }

/// A parameter added to a tensor that is not itself a parameter, with scale 1.
int addend_params(const Node* n, size_t offset, const std::string& param) {
  if (offset > 1 || n->inputs().size() != 3) return -1;
  Value* other = n->input(1 - offset);
  if (other->type()->kind() != c10::TypeKind::TensorType || other->node()->kind() == c10::prim::GetAttr) return -1;
  auto alpha = constant(n->input(2));
  PK_CHECK(alpha && alpha->isInt() && alpha->toInt() == 1,
           "parameter '" << param << "' is added with a scale other than 1");
  return 0;
}

// ---- Geometry read from the graph ----------------------------------------

void read_nothing(const Node*, LayerDesc&) {}

void read_conv(const Node* n, LayerDesc& d) {
  const std::string op = op_name(n);
  d.stride = int_list(n->input(3), op + "'s stride");
  d.padding2 = int_list(n->input(4), op + "'s padding (a string padding has a rule where it pads both sides "
                                          "alike: 'valid', or 'same' with an odd dilation·(kernel − 1) + 1)");
  d.dilation = int_list(n->input(5), op + "'s dilation");
  auto groups = constant(n->input(6));
  PK_CHECK(groups && groups->isInt(), op << "'s groups is not a constant");
  d.groups = groups->toInt();
}

void read_layer_norm(const Node* n, LayerDesc& d) {
  d.norm_shape = int_list(n->input(1), "layer_norm's normalized shape");
  auto eps = constant(n->input(4));
  PK_CHECK(eps && eps->isDouble(), "layer_norm's eps is not a constant");
  d.eps = eps->toDouble();
  PK_CHECK(n->input(2)->node()->kind() == c10::prim::GetAttr,
           "layer_norm with a bias parameter and no weight parameter has no rule");
}

void read_embedding(const Node* n, LayerDesc& d) {
  auto padding_idx = constant(n->input(2)), scale = constant(n->input(3));
  PK_CHECK(padding_idx && padding_idx->isInt(), "embedding's padding_idx is not a constant");
  PK_CHECK(scale && scale->isBool() && !scale->toBool(),
           "embedding with scale_grad_by_freq has no rule (its gradient depends on the batch)");
  d.padding_index = padding_idx->toInt();
}

// ---- Graph rewrites: op_dir(a; dW, db) as IR -----------------------------

DirectionValues rewrite_linear(const DirectionSite& at) {
  Value* a = at.node->input(0);
  return {a, at.graph->insert(aten("linear"), {a, at.dw, at.db ? at.db : at.none})};
}

/// The operation itself, on the directions (conv1d, conv2d).
DirectionValues rewrite_conv(const DirectionSite& at) {
  Node* n = at.node;
  Value* a = n->input(0);
  return {a, at.graph->insert(n->kind(), {a, at.dw, at.db ? at.db : at.none, n->input(3), n->input(4), n->input(5),
                                          n->input(6)})};
}

DirectionValues rewrite_layer_norm(const DirectionSite& at) {
  Node* n = at.node;
  Value* a = n->input(0);
  Value* xhat = at.graph->insert(aten("layer_norm"), {a, n->input(1), at.none, at.none, n->input(4), n->input(5)});
  Value* dir = at.graph->insert(aten("mul"), {xhat, at.dw});
  if (at.db) dir = at.graph->insert(aten("add"), {dir, at.db});
  return {a, dir};
}

DirectionValues rewrite_embedding(const DirectionSite& at) {
  Node* n = at.node;
  Value* ids = n->input(1);
  return {ids, at.graph->insert(aten("embedding"), {at.dw, ids, n->input(2), n->input(3), n->input(4)})};
}

DirectionValues rewrite_addend(const DirectionSite& at) {
  Value* a = at.node->input(at.weight_input == 0 ? 1 : 0);
  return {a, at.graph->insert(aten("expand_as"), {at.dw, at.node->output()})};
}

// ---- Directions and per-sample gradients ---------------------------------

/// A 2-D convolution's stride, padding and dilation per spatial dimension.
struct ConvGeometry {
  std::vector<int64_t> stride{1, 1}, padding, dilation{1, 1};
};

ConvGeometry geometry(const LayerDesc& d) {
  ConvGeometry g;
  g.padding = d.padding2.empty() ? std::vector<int64_t>{d.padding, d.padding} : d.padding2;
  if (!d.stride.empty()) g.stride = d.stride;
  if (!d.dilation.empty()) g.dilation = d.dilation;
  if (g.stride.size() == 1) g.stride.push_back(g.stride[0]);
  if (g.padding.size() == 1) g.padding.push_back(g.padding[0]);
  if (g.dilation.size() == 1) g.dilation.push_back(g.dilation[0]);
  return g;
}

torch::Tensor linear_direction(const LayerDesc&, const torch::Tensor& a, const torch::Tensor& vw,
                               const torch::Tensor& vb) {
  return torch::linear(a, vw, vb);
}

GradientFactors linear_gradients(const LayerDesc&, const torch::Tensor& a, const torch::Tensor& delta,
                                 const std::vector<int64_t>& weight_shape, int64_t bias_numel) {
  const int64_t K = delta.size(0), R = delta.size(1);
  const int64_t out = weight_shape[0], in = weight_shape[1];
  const torch::Tensor A = a.reshape({R, -1, in});          // [R, T, in]
  const torch::Tensor D = delta.reshape({K, R, -1, out});  // [K, R, T, out]
  GradientFactors g;
  g.weight = torch::einsum("krto,rti->kroi", {D, A}).reshape({K, R, out * in});
  if (bias_numel) g.bias = D.sum(2);
  return g;
}

torch::Tensor conv2d_direction(const LayerDesc& d, const torch::Tensor& a, const torch::Tensor& vw,
                               const torch::Tensor& vb) {
  const ConvGeometry g = geometry(d);
  return torch::conv2d(a, vw, vb, g.stride, g.padding, g.dilation, d.groups);
}

/// A 2-D convolution's input plane [H, W], output [ho, wo], strides,
/// paddings and dilations.
struct PatchGeometry {
  int64_t H, W, ho, wo, sh, sw, ph, pw, dh, dw;
};

/// One kernel offset's (i, j) patch rows: the [ho, wo] window of one input
/// plane that the offset sees, zero outside the plane.
template <typename T>
void copy_offset(const T* plane, T* out, const PatchGeometry& g, int64_t i, int64_t j) {
  // The output columns x whose input column x sw + j dw − pw is inside [0, W).
  const int64_t shift = j * g.dw - g.pw;
  const int64_t x_lo = shift >= 0 ? 0 : std::min(g.wo, (-shift + g.sw - 1) / g.sw);
  const int64_t x_hi = g.W - 1 - shift < 0 ? 0 : std::min(g.wo, (g.W - 1 - shift) / g.sw + 1);
  for (int64_t y = 0; y < g.ho; ++y) {
    T* row = out + y * g.wo;
    const int64_t sy = y * g.sh + i * g.dh - g.ph;
    if (sy < 0 || sy >= g.H || x_lo >= x_hi) {
      std::fill(row, row + g.wo, T(0));
      continue;
    }
    const T* in = plane + sy * g.W + shift;
    std::fill(row, row + x_lo, T(0));
    if (g.sw == 1) {
      std::copy(in + x_lo, in + x_hi, row + x_lo);
    } else {
      for (int64_t x = x_lo; x < x_hi; ++x) row[x] = in[x * g.sw];
    }
    std::fill(row + x_hi, row + g.wo, T(0));
  }
}

/// The patches of a contiguous [R, C, H, W] into out [R, C, kh, kw, ho, wo].
template <typename T>
void copy_patches(const torch::Tensor& a, torch::Tensor& out, const PatchGeometry& g, int64_t kh, int64_t kw) {
  const int64_t planes = a.size(0) * a.size(1);
  const T* in = a.data_ptr<T>();
  T* o = out.data_ptr<T>();
  for (int64_t p = 0; p < planes; ++p) {
    for (int64_t i = 0; i < kh; ++i) {
      for (int64_t j = 0; j < kw; ++j) copy_offset(in + p * g.H * g.W, o + ((p * kh + i) * kw + j) * g.ho * g.wo, g, i, j);
    }
  }
}

/// The patches [R, C_in·kh·kw, L] of a [R, C_in, H, W], as unfold (im2col)
/// forms them, copied row by row (zero outside the input). The same values
/// as LibTorch's im2col, which on float64 took 2.7 to 3.3 times as long on
/// the README CNN's layers; one strided copy per kernel offset took 4 times
/// as long as this loop on the training batch of 100 rows.
torch::Tensor conv2d_patches(const LayerDesc& d, const torch::Tensor& a, const std::vector<int64_t>& weight_shape) {
  const ConvGeometry c = geometry(d);
  const int64_t kh = weight_shape[2], kw = weight_shape[3], R = a.size(0), C = a.size(1);
  PatchGeometry g{a.size(2), a.size(3), 0, 0, c.stride[0], c.stride[1], c.padding[0], c.padding[1], c.dilation[0],
                  c.dilation[1]};
  g.ho = (g.H + 2 * g.ph - g.dh * (kh - 1) - 1) / g.sh + 1;
  g.wo = (g.W + 2 * g.pw - g.dw * (kw - 1) - 1) / g.sw + 1;
  PK_CHECK(g.ho > 0 && g.wo > 0, "a convolution's input " << a.sizes() << " is smaller than its kernel " << kh << "x" << kw);
  if (a.requires_grad() && torch::GradMode::is_enabled()) {
    // In a graph (a caller differentiates through the patches): LibTorch's
    // im2col, which autograd follows.
    namespace F = torch::nn::functional;
    return F::unfold(a, F::UnfoldFuncOptions({kh, kw}).padding(c.padding).stride(c.stride).dilation(c.dilation));
  }
  torch::Tensor out = torch::empty({R, C, kh, kw, g.ho, g.wo}, a.options());
  const torch::Tensor in = a.contiguous();
  AT_DISPATCH_FLOATING_TYPES(in.scalar_type(), "conv2d_patches", [&] { copy_patches<scalar_t>(in, out, g, kh, kw); });
  return out.view({R, C * kh * kw, g.ho * g.wo});
}

/// Σ_positions δ ⊗ patch per group, Σ_positions δ: any convolution, from
/// its input's patches u [R, C_in·kernel, L].
GradientFactors conv_gradients_of_patches(const LayerDesc& d, const torch::Tensor& u, const torch::Tensor& delta,
                                          const std::vector<int64_t>& weight_shape, int64_t bias_numel) {
  const int64_t K = delta.size(0), R = delta.size(1);
  const int64_t groups = d.groups, cout = weight_shape[0];
  const int64_t q = u.size(1) / groups, L = u.size(2);
  const torch::Tensor D = delta.reshape({K, R, groups, cout / groups, L});
  GradientFactors g;
  g.weight = torch::einsum("krgcl,rgql->krgcq", {D, u.view({R, groups, q, L})}).reshape({K, R, -1});
  if (bias_numel) g.bias = D.sum(4).reshape({K, R, cout});
  return g;
}

GradientFactors conv_gradients(const LayerDesc& d, const torch::Tensor& a, const torch::Tensor& delta,
                               const std::vector<int64_t>& weight_shape, int64_t bias_numel) {
  return conv_gradients_of_patches(d, layer_rule(d.kind).patches(d, a, weight_shape), delta, weight_shape, bias_numel);
}

torch::Tensor conv1d_direction(const LayerDesc& d, const torch::Tensor& a, const torch::Tensor& vw,
                               const torch::Tensor& vb) {
  return torch::conv1d(a, vw, vb, d.stride, d.padding2, d.dilation, d.groups);
}

/// The patches of a [R, C_in, L] as those of [R, C_in, 1, L] for a 1 x k kernel.
torch::Tensor conv1d_patches(const LayerDesc& d, const torch::Tensor& a, const std::vector<int64_t>& weight_shape) {
  namespace F = torch::nn::functional;
  return F::unfold(a.unsqueeze(2), F::UnfoldFuncOptions({1, weight_shape[2]})
                                       .padding({0, d.padding2[0]})
                                       .stride({1, d.stride[0]})
                                       .dilation({1, d.dilation[0]}));
}

torch::Tensor layer_norm_direction(const LayerDesc& d, const torch::Tensor& a, const torch::Tensor& vw,
                                   const torch::Tensor& vb) {
  torch::Tensor y = torch::layer_norm(a, d.norm_shape, {}, {}, d.eps) * vw;
  return vb.defined() ? y + vb : y;
}

GradientFactors layer_norm_gradients(const LayerDesc& d, const torch::Tensor& a, const torch::Tensor& delta,
                                     const std::vector<int64_t>&, int64_t bias_numel) {
  const int64_t K = delta.size(0), R = delta.size(1);
  const int64_t s = numel_of(d.norm_shape);
  const torch::Tensor xhat = torch::layer_norm(a, d.norm_shape, {}, {}, d.eps).reshape({R, -1, s});
  const torch::Tensor D = delta.reshape({K, R, -1, s});
  GradientFactors g;
  g.weight = torch::einsum("krms,rms->krs", {D, xhat});
  if (bias_numel) g.bias = D.sum(2);
  return g;
}

torch::Tensor embedding_direction(const LayerDesc& d, const torch::Tensor& a, const torch::Tensor& vw,
                                  const torch::Tensor&) {
  return torch::embedding(vw, a.to(torch::kLong), d.padding_index);
}

GradientFactors embedding_gradients(const LayerDesc& d, const torch::Tensor& a, const torch::Tensor& delta,
                                    const std::vector<int64_t>& weight_shape, int64_t) {
  const int64_t K = delta.size(0), R = delta.size(1);
  const int64_t vocab = weight_shape[0], dim = weight_shape[1];
  const torch::Tensor ids = a.to(torch::kLong).reshape({1, R, -1, 1});  // [1, R, T, 1]
  const torch::Tensor D = delta.reshape({K, R, -1, dim});               // [K, R, T, dim]
  torch::Tensor g = torch::zeros({K, R, vocab, dim}, delta.options());
  g.scatter_add_(2, ids.expand_as(D), D);
  if (d.padding_index >= 0) g.select(2, d.padding_index).zero_();
  return {g.reshape({K, R, vocab * dim}), torch::Tensor()};
}

/// Broadcast along the rows by the caller.
torch::Tensor addend_direction(const LayerDesc&, const torch::Tensor&, const torch::Tensor& vw,
                               const torch::Tensor&) {
  return vw;
}

/// δ summed over the dimensions the parameter is broadcast along.
GradientFactors addend_gradients(const LayerDesc&, const torch::Tensor&, const torch::Tensor& delta,
                                 const std::vector<int64_t>& weight_shape, int64_t) {
  const int64_t K = delta.size(0), R = delta.size(1);
  std::vector<int64_t> target{K, R};
  for (int64_t i = 2 + static_cast<int64_t>(weight_shape.size()); i < delta.dim(); ++i) target.push_back(1);
  target.insert(target.end(), weight_shape.begin(), weight_shape.end());
  return {delta.sum_to_size(target).reshape({K, R, -1}), torch::Tensor()};
}

// ---- The table -----------------------------------------------------------

/// An entry for a parameterised kind.
LayerRule parameterised(Kind kind, const char* name, const char* op,
                        int (*param_input)(const Node*, size_t, const std::string&),
                        void (*read)(const Node*, LayerDesc&), DirectionValues (*rewrite)(const DirectionSite&),
                        decltype(LayerRule::direction) direction, decltype(LayerRule::gradients) gradients) {
  LayerRule r{kind, name, op};
  r.parameterised = true;
  r.param_input = param_input;
  r.read = read;
  r.rewrite = rewrite;
  r.direction = direction;
  r.gradients = gradients;
  return r;
}

/// An entry for a parameter-free kind of pathkernel's own networks.
LayerRule parameter_free(Kind kind, const char* name, const char* op, decltype(LayerRule::apply) apply,
                         bool piecewise_linear) {
  LayerRule r{kind, name, op};
  r.apply = apply;
  r.piecewise_linear = piecewise_linear;
  return r;
}

std::vector<LayerRule> make_layer_table() {
  std::vector<LayerRule> t;
  LayerRule linear = parameterised(Kind::Linear, "linear", "aten::linear", weight_then_bias, read_nothing,
                                   rewrite_linear, linear_direction, linear_gradients);
  linear.factored_rows = true;
  t.push_back(linear);
  LayerRule conv2d = parameterised(Kind::Conv2d, "conv2d", "aten::conv2d", weight_then_bias, read_conv, rewrite_conv,
                                   conv2d_direction, conv_gradients);
  conv2d.patches = conv2d_patches;
  conv2d.gradients_of_patches = conv_gradients_of_patches;
  t.push_back(conv2d);
  LayerRule conv1d = parameterised(Kind::Conv1d, "conv1d", "aten::conv1d", weight_then_bias, read_conv, rewrite_conv,
                                   conv1d_direction, conv_gradients);
  conv1d.patches = conv1d_patches;
  conv1d.gradients_of_patches = conv_gradients_of_patches;
  t.push_back(conv1d);
  LayerRule norm = parameterised(Kind::LayerNorm, "layer_norm", "aten::layer_norm", layer_norm_params,
                                 read_layer_norm, rewrite_layer_norm, layer_norm_direction, layer_norm_gradients);
  norm.piecewise_linear = false;
  t.push_back(norm);
  t.push_back(parameterised(Kind::Embedding, "embedding", "aten::embedding", embedding_params, read_embedding,
                            rewrite_embedding, embedding_direction, embedding_gradients));
  t.push_back(parameterised(Kind::Addend, "addend", "aten::add", addend_params, read_nothing, rewrite_addend,
                            addend_direction, addend_gradients));
  LayerRule module{Kind::Module, "module", nullptr};
  module.parameterised = true;
  module.piecewise_linear = false;
  t.push_back(module);
  t.push_back(parameter_free(
      Kind::ReLU, "relu", "aten::relu", [](const LayerDesc&, const torch::Tensor& x) { return torch::relu(x); }, true));
  t.push_back(parameter_free(
      Kind::Tanh, "tanh", "aten::tanh", [](const LayerDesc&, const torch::Tensor& x) { return torch::tanh(x); }, false));
  t.push_back(parameter_free(
      Kind::GELU, "gelu", "aten::gelu", [](const LayerDesc&, const torch::Tensor& x) { return torch::gelu(x); }, false));
  t.push_back(parameter_free(
      Kind::MaxPool2d, "max_pool2d", "aten::max_pool2d",
      // By hand where LibTorch's pool would be slow (script_pool.h): the
      // same values, indices and gradients, so the same bits.
      [](const LayerDesc& d, const torch::Tensor& x) {
        return script_max_pool2d(x, {d.kernel, d.kernel}, {d.kernel, d.kernel}, {0, 0}, {1, 1}, false);
      },
      true));
  t.push_back(parameter_free(
      Kind::LeakyReLU, "leaky_relu", "aten::leaky_relu",
      [](const LayerDesc& d, const torch::Tensor& x) { return torch::leaky_relu(x, d.slope); }, true));
  t.push_back(parameter_free(
      Kind::AvgPool2d, "avg_pool2d", "aten::avg_pool2d",
      [](const LayerDesc& d, const torch::Tensor& x) {
        return torch::avg_pool2d(x, {d.kernel, d.kernel}, {d.kernel, d.kernel});
      },
      true));
  t.push_back(parameter_free(
      Kind::Flatten, "flatten", "aten::flatten", [](const LayerDesc&, const torch::Tensor& x) { return x.flatten(1); },
      true));
  t.push_back(parameter_free(
      Kind::LogSoftmax, "log_softmax", "aten::log_softmax",
      [](const LayerDesc&, const torch::Tensor& x) { return torch::log_softmax(x, 1); }, true));
  // As evaluated away from a training step, which is everywhere a layer is
  // applied alone: its masks need the network's input, which a route has
  // (seeded_dropout).
  t.push_back(parameter_free(
      Kind::Dropout, "dropout", "pathkernel::dropout", [](const LayerDesc&, const torch::Tensor& x) { return x; },
      true));
  return t;
}

/// A max-pool over the last two dimensions: the site as it is, [R, C, H, W].
torch::Tensor pool2d_rows(const torch::Tensor& site, int64_t) { return site; }

/// A max-pool over the last dimension: a site [R, C, L] as [R, C, k, m k]
/// (m = L / k windows, floor mode), every row the site's first m k values,
/// so that a k x k window holds one window of the pool k times and its
/// argmax (the first of equal values) is the pool's, in the first row.
torch::Tensor pool1d_rows(const torch::Tensor& site, int64_t window) {
  const int64_t length = site.size(2) / window * window;
  return site.narrow(2, 0, length).unsqueeze(2).expand({site.size(0), site.size(1), window, length}).contiguous();
}

std::vector<GraphOpRule> make_graph_op_table() {
  std::vector<GraphOpRule> t;
  for (const char* op : {"relu", "relu_", "leaky_relu", "leaky_relu_", "avg_pool2d", "adaptive_avg_pool2d",
                         "flatten", "view", "reshape", "add", "add_", "sub", "sub_", "neg", "mean", "sum", "cat",
                         "permute", "transpose", "contiguous", "squeeze", "unsqueeze", "select", "slice", "clone",
                         "avg_pool1d", "adaptive_avg_pool1d"}) {
    t.push_back({op});
  }
  t.push_back({"max_pool2d", false, 2, pool2d_rows});
  t.push_back({"max_pool1d", false, 1, pool1d_rows});
  return t;
}

}  // namespace

const std::vector<LayerRule>& layer_table() {
  static const std::vector<LayerRule> table = make_layer_table();
  return table;
}

const LayerRule& layer_rule(LayerDesc::Kind kind) {
  const std::vector<LayerRule>& t = layer_table();
  auto it = std::find_if(t.begin(), t.end(), [&](const LayerRule& r) { return r.kind == kind; });
  PK_ASSERT(it != t.end() && "a layer kind without an entry in the layer table");
  return *it;
}

const LayerRule* layer_rule_for_op(const std::string& op) {
  for (const LayerRule& r : layer_table()) {
    if (r.parameterised && r.op != nullptr && op == r.op) return &r;
  }
  return nullptr;
}

const std::vector<GraphOpRule>& graph_op_table() {
  static const std::vector<GraphOpRule> table = make_graph_op_table();
  return table;
}

const GraphOpRule* graph_op_rule(const std::string& op) {
  for (const GraphOpRule& r : graph_op_table()) {
    if (op == r.op) return &r;
  }
  return nullptr;
}

}  // namespace pathkernel
