// Functional evaluation of the network along a path segment.
#include "pathkernel/segment.h"

#include <cmath>

#include "pathkernel/context.h"
#include "pathkernel/error.h"
#include "pathkernel/layer_rules.h"
#include "pathkernel/script_graph.h"

namespace pathkernel {

namespace {

/// Whether every row of a pass is at t = 0, where the weights are w_s alone
/// and the direction's products (times 0) add nothing.
bool all_zero(const torch::Tensor& t) { return t.numel() == 0 || !t.ne(0).any().item<bool>(); }

}  // namespace

Network engine_network(NetworkOptions options) {
  options.dtype = torch::kFloat64;
  return build_network(options);
}

SegmentEvaluator::SegmentEvaluator(Network& net, ModuleRoute route) : layers_(net->layers()), net_(nullptr) {
  std::vector<ParamInfo> layout = parameter_layout(net);
  parameter_count_ = pathkernel::parameter_count(net);
  num_outputs_ = net->options().num_classes;
  log_softmax_ = net->options().output == OutputMap::LogSoftmax;
  if (net->is_script() && route == ModuleRoute::Auto && net->script_graph()) {
    net_ = net;
    for (const ScriptLayer& sl : net->script_graph()->layers()) {
      ParamLayer p;
      p.desc = sl.desc;
      for (const ParamInfo& info : layout) {
        if (info.name == sl.weight) {
          p.weight_offset = info.offset;
          p.weight_numel = info.numel;
          p.weight_shape = info.shape;
        } else if (!sl.bias.empty() && info.name == sl.bias) {
          p.bias_offset = info.offset;
          p.bias_numel = info.numel;
        }
      }
      PK_ASSERT(p.weight_numel > 0 && (sl.bias.empty() || p.bias_numel > 0));
      params_.push_back(p);
    }
    relu_after_.assign(static_cast<size_t>(net->script_graph()->sites()), true);
    pool_after_ = net->script_graph()->site_windows();
    if (script_graph_agrees()) {
      script_structured_ = true;
      return;
    }
    route_reason_ = "its graph, rewritten to evaluate rows at their own points of a segment, does not reproduce "
                    "the module's outputs (an operation with parameters does not keep the examples on its first "
                    "dimension)";
    params_.clear();
    relu_after_.clear();
    pool_after_.clear();
  }
  if (net->is_script()) {
    if (route == ModuleRoute::Auto && route_reason_.empty()) route_reason_ = net->script_graph_refusal();
    generic_ = true;
    net_ = net;
    ParamLayer p;
    p.desc = layers_[0];
    p.weight_numel = parameter_count_;
    p.weight_shape = {parameter_count_};
    p.bias_offset = parameter_count_;
    params_.push_back(p);
    relu_after_.push_back(false);
    pool_after_.push_back(0);
    return;
  }
  for (const LayerDesc& d : layers_) {
    if (d.kind != LayerDesc::Kind::Linear && d.kind != LayerDesc::Kind::Conv2d) continue;
    ParamLayer p;
    p.desc = d;
    for (const ParamInfo& info : layout) {
      if (info.name == d.module + ".weight") {
        p.weight_offset = info.offset;
        p.weight_numel = info.numel;
        p.weight_shape = info.shape;
      } else if (info.name == d.module + ".bias") {
        p.bias_offset = info.offset;
        p.bias_numel = info.numel;
      }
    }
    PK_ASSERT(p.weight_numel > 0 && p.bias_numel > 0);
    params_.push_back(p);
  }
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i].kind == LayerDesc::Kind::Linear || layers_[i].kind == LayerDesc::Kind::Conv2d) {
      bool relu = i + 1 < layers_.size() && layers_[i + 1].kind == LayerDesc::Kind::ReLU;
      bool pool = relu && i + 2 < layers_.size() && layers_[i + 2].kind == LayerDesc::Kind::MaxPool2d;
      relu_after_.push_back(relu);
      pool_after_.push_back(pool ? layers_[i + 2].kernel : 0);
    }
  }
}

std::string SegmentEvaluator::route() const {
  return script_structured_ ? "structured" : generic_ ? "generic" : "own";
}

bool SegmentEvaluator::script_graph_agrees() {
  // Two rows of a fixed pattern (integer codes 0 and 1 for token ids) at
  // t = 0.3 and 0.8 along a direction that moves every parameter.
  const NetworkOptions& o = net_->options();
  std::vector<int64_t> shape{2};
  shape.insert(shape.end(), o.input_shape.begin(), o.input_shape.end());
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  const torch::Tensor ramp = torch::arange(numel, torch::kFloat64);
  const torch::Tensor x = (o.integer_inputs ? torch::remainder(ramp, 2) : 0.5 + 0.5 * torch::sin(ramp)).view(shape);
  const torch::Tensor w = flatten_parameters(net_).to(torch::kFloat64);
  const torch::Tensor dw = 0.05 * torch::cos(torch::arange(parameter_count_, torch::kFloat64) + 1) * (1 + w.abs());
  const torch::Tensor t = torch::tensor({0.3, 0.8}, torch::kFloat64);
  set_segment(w, dw);
  bool agrees = false;
  try {
    torch::NoGradGuard guard;
    const torch::Tensor got = forward(x, t, false).out;
    std::vector<torch::Tensor> want;
    for (int64_t r = 0; r < 2; ++r) {
      set_flat_parameters(net_, w + t[r].item<double>() * dw);
      want.push_back(net_->forward(x.narrow(0, r, 1)));
    }
    const torch::Tensor ref = torch::cat(want);
    const double scale = std::max(1.0, ref.abs().max().item<double>());
    agrees = got.sizes() == ref.sizes() && (got - ref).abs().max().item<double>() <= 1e-9 * scale;
  } catch (const c10::Error&) {
    agrees = false;
  }
  set_flat_parameters(net_, w);
  w_ = torch::Tensor();
  dw_ = torch::Tensor();
  placed_t_ = -1;
  return agrees;
}

void SegmentEvaluator::set_segment(const torch::Tensor& w, const torch::Tensor& dw) {
  PK_CHECK(w.dim() == 1 && w.size(0) == parameter_count_ && dw.sizes() == w.sizes(),
           "segment vectors have shapes " << w.sizes() << " and " << dw.sizes() << ", expected ["
                                          << parameter_count_ << "]");
  w_ = w;
  dw_ = dw;
  placed_t_ = -1;
}

namespace {

/// Writes per-tensor gradients into `row` [P] in the flat parameter order.
void copy_flat(const std::vector<torch::Tensor>& grads, torch::Tensor row) {
  int64_t offset = 0;
  for (const torch::Tensor& g : grads) {
    row.narrow(0, offset, g.numel()).copy_(g.reshape({-1}));
    offset += g.numel();
  }
}

}  // namespace

void SegmentEvaluator::place_module(double t) const {
  PK_ASSERT(net_ && w_.defined());
  if (t == placed_t_) return;
  set_flat_parameters(const_cast<Network&>(net_), t == 0 ? w_ : w_ + t * dw_);
  placed_t_ = t;
}

torch::Tensor SegmentEvaluator::module_jacobians(const torch::Tensor& x, const torch::Tensor& t) const {
  PK_ASSERT(generic_);
  // One row at a time, each operation too small to share: with two threads
  // every one of them woke the sleeping OpenMP worker and waited for it (a
  // futex round trip each; 29 s of system time in 126 s on the residual
  // CNN's generic route, which one thread halved).
  OpenMpThreads one_thread(1);
  const int64_t rows = x.size(0), K = num_outputs_;
  torch::Tensor out = torch::empty({rows, K, parameter_count_}, w_.options());
  Network& net = const_cast<Network&>(net_);
  const std::vector<torch::Tensor> params = net->parameters();
  auto t_a = t.accessor<double, 1>();
  for (int64_t r = 0; r < rows; ++r) {
    place_module(t_a[r]);
    torch::AutoGradMode grad_mode(true);
    torch::Tensor f = net->forward(x.narrow(0, r, 1));
    for (int64_t k = 0; k < K; ++k) {
      std::vector<torch::Tensor> g = torch::autograd::grad({f[0][k]}, params, {}, /*retain_graph=*/k + 1 < K);
      copy_flat(g, out[r][k]);
    }
  }
  return out;
}

std::vector<torch::Tensor> SegmentEvaluator::module_sites(const torch::Tensor& x, double t) const {
  PK_ASSERT(generic_ && x.size(0) == 1);
  place_module(t);
  return const_cast<Network&>(net_)->forward_with_sites(x).second;
}

torch::Tensor SegmentEvaluator::module_gradients(const torch::Tensor& x, const torch::Tensor& c) const {
  PK_ASSERT(generic_);
  OpenMpThreads one_thread(1);  // one row at a time: see module_jacobians
  const int64_t rows = x.size(0);
  torch::Tensor out = torch::empty({rows, parameter_count_}, w_.options());
  Network& net = const_cast<Network&>(net_);
  const std::vector<torch::Tensor> params = net->parameters();
  place_module(0.0);
  for (int64_t r = 0; r < rows; ++r) {
    torch::AutoGradMode grad_mode(true);
    torch::Tensor f = net->forward(x.narrow(0, r, 1));
    std::vector<torch::Tensor> g = torch::autograd::grad({(f[0] * c[r]).sum()}, params);
    copy_flat(g, out[r]);
  }
  return out;
}

torch::Tensor SegmentEvaluator::weight_of(const torch::Tensor& v, size_t l) const {
  const ParamLayer& p = params_[l];
  return v.narrow(0, p.weight_offset, p.weight_numel).view(p.weight_shape);
}

torch::Tensor SegmentEvaluator::bias_of(const torch::Tensor& v, size_t l) const {
  const ParamLayer& p = params_[l];
  return v.narrow(0, p.bias_offset, p.bias_numel);
}

torch::Tensor SegmentEvaluator::bias_or_none(const torch::Tensor& v, size_t l) const {
  return params_[l].bias_numel ? bias_of(v, l) : torch::Tensor();
}

SegmentPass SegmentEvaluator::forward(const torch::Tensor& x, const torch::Tensor& t, bool track) const {
  using Kind = LayerDesc::Kind;
  PK_ASSERT(w_.defined());
  PK_CHECK(t.dim() == 1 && t.size(0) == x.size(0),
           "segment rows: " << x.size(0) << " inputs but t has shape " << t.sizes());
  SegmentPass pass;
  if (!generic_ && net_) {
    // The structured route: the rewritten graph at w_s, each row at its t.
    place_module(0.0);
    std::vector<torch::Tensor> dirs;
    for (size_t l = 0; l < params_.size(); ++l) {
      dirs.push_back(weight_of(dw_, l));
      if (params_[l].bias_numel) dirs.push_back(bias_of(dw_, l));
    }
    torch::AutoGradMode grad_mode(track);
    NetworkImpl::SegmentOutputs o = const_cast<Network&>(net_)->forward_segment(x, t, dirs);
    pass.out = o.out;
    pass.logits = o.logits;
    pass.inputs = std::move(o.inputs);
    pass.preacts = std::move(o.outputs);
    pass.sites = std::move(o.sites);
    if (!track) {
      for (auto& a : pass.inputs) a = a.detach();
      for (auto& y : pass.preacts) y = y.detach();
      pass.out = pass.out.detach();
      pass.logits = pass.logits.detach();
    }
    return pass;
  }
  if (generic_) {
    PK_ASSERT(!track && "a Module's rows are differentiated by module_jacobians()");
    torch::NoGradGuard guard;
    Network& net = const_cast<Network&>(net_);
    const int64_t rows = x.size(0);
    pass.out = torch::empty({rows, num_outputs_}, w_.options());
    // One pass per distinct t, over the rows that share it.
    auto [values, inverse] = torch::_unique(t, /*sorted=*/true, /*return_inverse=*/true);
    auto v = values.accessor<double, 1>();
    for (int64_t u = 0; u < values.size(0); ++u) {
      place_module(v[u]);
      torch::Tensor rows_u = torch::nonzero(inverse == u).flatten();
      pass.out.index_copy_(0, rows_u, net->forward(x.index_select(0, rows_u)));
    }
    return pass;
  }
  torch::AutoGradMode grad_mode(track);
  pass.t = t;
  // Every row at w_s (the training side's passes): one product per layer.
  const bool at_start = all_zero(t);
  torch::Tensor h = track ? x.detach().clone().requires_grad_(true) : x;
  size_t l = 0;
  pass.argmax.resize(layers_.size());
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LayerDesc& layer = layers_[i];
    pass.layer_inputs.push_back(h);
    switch (layer.kind) {
      case Kind::Linear: {
        pass.inputs.push_back(h);
        torch::Tensor y = torch::addmm(bias_of(w_, l), h, weight_of(w_, l).t());
        if (!at_start) {
          pass.directions.push_back(torch::addmm(bias_of(dw_, l), h, weight_of(dw_, l).t()));
          y = y + t.view({-1, 1}) * pass.directions.back();
        }
        pass.preacts.push_back(y);
        h = y;
        ++l;
        break;
      }
      case Kind::Conv2d: {
        pass.inputs.push_back(h);
        auto conv = [&](const torch::Tensor& v) {
          return torch::conv2d(h, weight_of(v, l), bias_of(v, l), 1, layer.padding);
        };
        torch::Tensor y = conv(w_);
        if (!at_start) {
          pass.directions.push_back(conv(dw_));
          y = y + t.view({-1, 1, 1, 1}) * pass.directions.back();
        }
        pass.preacts.push_back(y);
        h = y;
        ++l;
        break;
      }
      case Kind::LogSoftmax:
        pass.logits = h;
        h = apply_parameter_free(layer, h);
        break;
      case Kind::MaxPool2d:
        // The argmax comes with the pooled values; the backward walk uses it.
        std::tie(h, pass.argmax[i]) = torch::max_pool2d_with_indices(h, layer.kernel);
        break;
      default: h = apply_parameter_free(layer, h); break;
    }
  }
  pass.out = h;
  if (!pass.logits.defined()) pass.logits = h;
  return pass;
}

int SegmentEvaluator::polynomial_degree() const {
  using Kind = LayerDesc::Kind;
  if (generic_) return 0;
  if (script_structured_) return static_cast<int>(net_->script_graph()->polynomial_degree());
  for (const LayerDesc& d : layers_) {
    const bool piecewise_linear = d.kind == Kind::Linear || d.kind == Kind::Conv2d || d.kind == Kind::ReLU ||
                                  d.kind == Kind::MaxPool2d || d.kind == Kind::Flatten || d.kind == Kind::LogSoftmax;
    if (!piecewise_linear) return 0;
  }
  return static_cast<int>(params_.size());
}

std::vector<torch::Tensor> SegmentEvaluator::signals(const SegmentPass& pass, const torch::Tensor& c,
                                                     bool of_logits) const {
  const torch::Tensor& y = of_logits ? pass.logits : pass.out;
  PK_ASSERT(y.defined() && y.requires_grad());
  torch::Tensor scalar = (y * c).sum();
  std::vector<torch::Tensor> g =
      torch::autograd::grad({scalar}, pass.preacts, {}, /*retain_graph=*/true, false, /*allow_unused=*/true);
  // A layer the outputs do not depend on (a module's unused branch) has signal 0.
  for (size_t l = 0; l < g.size(); ++l) {
    if (!g[l].defined()) g[l] = torch::zeros_like(pass.preacts[l]);
  }
  return g;
}

std::vector<torch::Tensor> SegmentEvaluator::hand_signals(const SegmentPass& pass, const torch::Tensor& c,
                                                          bool of_logits) const {
  using Kind = LayerDesc::Kind;
  PK_ASSERT(hand_backward() && pass.t.defined() && c.dim() == 3);
  torch::NoGradGuard no_grad;
  const int64_t K = c.size(0), R = c.size(1);
  PK_ASSERT(R == pass.out.size(0) && c.size(2) == pass.out.size(1));
  PK_ASSERT(pass.layer_inputs.size() == layers_.size());
  const std::vector<torch::Tensor>& in = pass.layer_inputs;  // each layer's input, rows first
  // [K, R, ...] in the shape of layer i's input.
  auto input_shape = [&](size_t i) {
    std::vector<int64_t> shape{K};
    for (int64_t s : in[i].sizes()) shape.push_back(s);
    return shape;
  };
  auto output_of = [&](size_t i) { return i + 1 < layers_.size() ? in[i + 1] : pass.out; };
  // Walk back: g is the gradient at the current layer's output, [K, R, ...]
  // (the rows' own shape with K in front); the weights at row r are
  // W_s + t_r dW_s, so every param layer's backward is two products, or one
  // when every row is at t = 0 (the training side's passes).
  const torch::Tensor t = pass.t;
  const bool at_start = all_zero(t);
  std::vector<torch::Tensor> sig(params_.size());
  torch::Tensor g = c;
  size_t l = params_.size();
  for (size_t i = layers_.size(); i-- > 0;) {
    const LayerDesc& d = layers_[i];
    switch (d.kind) {
      case Kind::LogSoftmax:
        if (!of_logits) g = g - pass.out.detach().exp() * g.sum(-1, /*keepdim=*/true);
        break;
      case Kind::Linear:
        sig[--l] = g;
        if (l == 0) return sig;
        g = at_start ? torch::matmul(g, weight_of(w_, l))
                     : torch::matmul(g, weight_of(w_, l)) + t.view({1, R, 1}) * torch::matmul(g, weight_of(dw_, l));
        break;
      case Kind::Conv2d: {
        sig[--l] = g;
        if (l == 0) return sig;
        // The input gradient of a stride-1 convolution, as autograd takes it
        // (the input only gives its shape, and is never read).
        const torch::Tensor flat = g.flatten(0, 1), a = pass.inputs[l];
        const torch::Tensor shape_of_input = torch::empty({K * R, a.size(1), a.size(2), a.size(3)}, a.options());
        auto back = [&](const torch::Tensor& v) {
          return std::get<0>(torch::convolution_backward(flat, shape_of_input, weight_of(v, l), c10::nullopt, {1, 1},
                                                         {d.padding, d.padding}, {1, 1}, false, {0, 0}, 1,
                                                         {true, false, false}));
        };
        g = (at_start ? back(w_) : back(w_) + t.repeat({K}).view({-1, 1, 1, 1}) * back(dw_)).unflatten(0, {K, R});
        break;
      }
      case Kind::ReLU:
        // After a max-pool the mask was applied to the pooled gradient.
        if (i + 1 >= layers_.size() || layers_[i + 1].kind != Kind::MaxPool2d) g = g * (in[i] > 0);
        break;
      case Kind::Tanh: {
        const torch::Tensor& y = output_of(i);
        g = g * (1 - y * y);
        break;
      }
      case Kind::GELU: g = g * torch::gelu_backward(torch::ones_like(in[i]), in[i]); break;
      case Kind::MaxPool2d: {
        // Each pooled gradient goes to its window's argmax, kept by the
        // forward pass. A ReLU before the pool passes it where the pooled
        // value is positive: masked here, on the pooled (smaller) gradient,
        // the same values as masking the unpooled one.
        const torch::Tensor& idx = pass.argmax[i];  // [R, C, H', W']
        if (i > 0 && layers_[i - 1].kind == Kind::ReLU) {
          g = g * (output_of(i) > 0);
        }
        g = torch::zeros({K, R, in[i].size(1), in[i].size(2) * in[i].size(3)}, g.options())
                .scatter_add_(3, idx.flatten(2).unsqueeze(0).expand({K, -1, -1, -1}), g.flatten(3))
                .view(input_shape(i));
        break;
      }
      case Kind::Flatten: g = g.reshape(input_shape(i)); break;
      case Kind::Module:
      case Kind::Conv1d:
      case Kind::LayerNorm:
      case Kind::Embedding:
      case Kind::Addend: PK_ASSERT(false && "hand_signals: a layer own networks do not have"); break;
    }
  }
  PK_ASSERT(false && "hand_signals: no param layer");
  return sig;
}

}  // namespace pathkernel
