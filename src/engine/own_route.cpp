// The own route: pathkernel's own networks, walked forward and back layer by
// layer by hand; and the structured route of a TorchScript module whose
// graph is a plain chain of such layers (ScriptGraph::chain()), walked the
// same way without running the graph.
#include <algorithm>
#include <tuple>

#include "feature_parts.h"
#include "layered_route.h"
#include "pathkernel/dropout.h"
#include "pathkernel/error.h"
#include "pathkernel/layer_rules.h"
#include "pathkernel/max_pool.h"
#include "pathkernel/script_graph.h"
#include "routes.h"

namespace pathkernel {

namespace {

using Kind = LayerDesc::Kind;

bool has_params(const LayerDesc& d) { return d.kind == Kind::Linear || d.kind == Kind::Conv2d; }

/// The most doubles of a round's rows' own convolution weights
/// (rows_conv_backward): 32 MiB; a larger round walks the pair of weights.
constexpr int64_t kRowWeightDoubles = int64_t(1) << 22;

/// Whether a convolution has own networks' geometry (stride 1, no dilation,
/// one group, `padding` on both sides), which its patches read from it alone.
bool plain_conv(const LayerDesc& d) {
  return d.kind == Kind::Conv2d && d.stride.empty() && d.padding2.empty() && d.dilation.empty() && d.groups == 1;
}

/// conv2d(h, W, b) of a plain convolution from h's patches u [R, C·kh·kw, L]
/// (conv_patches): the product with the weight row by row, b added first,
/// which is the product LibTorch's float64 convolution takes per row after
/// its own im2col (the same values on the README and user CNNs' layers;
/// the patches by hand take a third of the time of its im2col). [R, O, Ho, Wo].
torch::Tensor conv_of_patches(const torch::Tensor& u, const torch::Tensor& W, const torch::Tensor& b, int64_t Ho,
                              int64_t Wo) {
  const int64_t R = u.size(0), O = W.size(0);
  const torch::Tensor w = W.reshape({1, O, -1}).expand({R, O, u.size(1)});
  const torch::Tensor y = b.defined() ? torch::baddbmm(b.view({1, O, 1}), w, u) : torch::bmm(w, u);
  return y.view({R, O, Ho, Wo});
}

/// A param layer's pre-activation at rows each at its t [R], from its
/// products at the segment's start and along its direction, [R, ...]:
/// start + t · direction.
torch::Tensor along_segment(const torch::Tensor& start, const torch::Tensor& t, const torch::Tensor& direction) {
  return start.dim() == 2 ? start + t.view({-1, 1}) * direction
                          : torch::addcmul(start, t.view({-1, 1, 1, 1}), direction);
}

class OwnRoute final : public LayeredRoute {
 public:
  /// A route over `layers` (the network's own, or a module's chain), named `name`.
  OwnRoute(Network& net, std::vector<LayerDesc> layers, std::string name);

  std::string name() const override { return name_; }
  SegmentPass forward(const torch::Tensor& x, const torch::Tensor& t, bool track) const override {
    return forward_rows(x, t, track, rows_at_start(t), nullptr);
  }
  /// The first param layer's products of the points, where only
  /// parameter-free layers that keep each unit (Flatten) come before it.
  SegmentPoints segment_points(const torch::Tensor& x) const override;
  SegmentPass forward_points(const SegmentPoints& points, const torch::Tensor& point, const torch::Tensor& t,
                             bool track) const override;
  bool needs_graph() const override { return false; }
  /// By one backward walk through the layers over all K·R rows: the same
  /// values as K autograd backward passes. The pass may be untracked.
  std::vector<torch::Tensor> signals(const SegmentPass& pass, const torch::Tensor& c, bool of_logits) const override;
  std::vector<torch::Tensor> signals_from(const SegmentPass& pass, size_t layer, const torch::Tensor& g) const override;
  std::vector<torch::Tensor> signals_from_above_first(const SegmentPass& pass, size_t layer,
                                                      const torch::Tensor& g) const override;
  std::vector<torch::Tensor> signals_above_first(const SegmentPass& pass, const torch::Tensor& c,
                                                 bool of_logits) const override;
  torch::Tensor first_signals_of_pair(const SegmentPass& pass, const torch::Tensor& g,
                                      const torch::Tensor& g_dw) const override;
  torch::Tensor first_dot_of_pair(const SegmentPass& pass, const torch::Tensor& rows, const torch::Tensor& selection,
                                  const torch::Tensor& g, const torch::Tensor& g_dw) const override;
  torch::Tensor first_signals_of_pairs_summed(const SegmentPass& pass, const torch::Tensor& rows,
                                              const torch::Tensor& selection, const torch::Tensor& g,
                                              const torch::Tensor& g_dw, const torch::Tensor& group, int64_t groups,
                                              const PairSums& g_sums) const override;
  /// As their backward walk takes them: a unit's gradient goes to its
  /// target alone.
  torch::Tensor first_selection(const SegmentPass& pass, const torch::Tensor& rows) const override;
  bool concurrent_points() const override { return true; }

 private:
  /// Unit `unit[m]` of layer 1's input gradient of row `row[m]` of the pair
  /// g, g_dw (pair_backward's, at those units alone), [K, M].
  torch::Tensor pair_backward_at(const torch::Tensor& g, const torch::Tensor& g_dw, const torch::Tensor& row,
                                 const torch::Tensor& unit, const SegmentPass& pass) const;
  /// The first param layer's products at a pass's rows (SegmentPoints'
  /// start and direction taken at the rows' points).
  struct FirstRows {
    torch::Tensor start, direction;
  };
  /// The pass of rows x at t (at_start: every t is 0); `first` given, the
  /// first param layer's pre-activation is first->start + t first->direction.
  SegmentPass forward_rows(const torch::Tensor& x, const torch::Tensor& t, bool track, bool at_start,
                           const FirstRows* first) const;
  /// Param layer l's products of its inputs h at (W_s, b_s) and at
  /// (dW_s, db_s); a convolution's as one of twice the channels.
  std::pair<torch::Tensor, torch::Tensor> products_at_start_and_direction(const LayerDesc& layer, size_t l,
                                                                         const torch::Tensor& h) const;
  /// The first param layer's pre-activation at rows h from their points'
  /// products, keeping its input and direction in the pass (as
  /// param_forward does).
  torch::Tensor first_from_points(const torch::Tensor& h, const torch::Tensor& t, bool at_start,
                                  const FirstRows& first, SegmentPass& pass) const;
  /// Param layer l's pre-activation at rows h, each at its t (at_start: all
  /// at t = 0), keeping its input and direction in the pass.
  torch::Tensor param_forward(const LayerDesc& layer, size_t l, const torch::Tensor& h, const torch::Tensor& t,
                              bool at_start, SegmentPass& pass) const;
  /// The gradient at param layer l's input from g at its output, [K, R, ...].
  torch::Tensor param_backward(const LayerDesc& d, size_t l, const torch::Tensor& g, const SegmentPass& pass,
                               bool at_start) const;
  /// The gradient at param layer l's input from g at its output taken at
  /// the start's weights and g_dw at the direction's, [K, R, ...].
  torch::Tensor pair_backward(const LayerDesc& d, size_t l, const torch::Tensor& g, const torch::Tensor& g_dw,
                              const SegmentPass& pass) const;
  /// param_backward of convolution l at rows not all at t = 0, each row's
  /// weights formed (kRowWeightDoubles of them at most), [K, R, ...].
  torch::Tensor rows_conv_backward(const LayerDesc& d, size_t l, const torch::Tensor& g,
                                   const SegmentPass& pass) const;
  /// The input gradient of convolution l (stride 1) of rows g [K, R, C', ...]
  /// through `weight` (output channels C'), [K, R, ...] in its input's shape.
  torch::Tensor conv_backward(const LayerDesc& d, size_t l, const torch::Tensor& g, const torch::Tensor& weight,
                              const SegmentPass& pass) const;
  /// The gradient at max-pool layer i's input from g at its output (and
  /// through the ReLU before it, if any), [K, R, ...].
  torch::Tensor pool_backward(size_t i, const torch::Tensor& g, const SegmentPass& pass) const;
  /// The gradient at average-pool layer i's input from g at its output, [K, R, ...].
  torch::Tensor average_pool_backward(size_t i, const torch::Tensor& g, const SegmentPass& pass) const;
  /// The gradient at parameter-free layer i's input from g at its output.
  torch::Tensor free_backward(size_t i, const torch::Tensor& g, const SegmentPass& pass, bool of_logits) const;
  /// Walks g, the gradient at layer `end`'s output [K, R, ...], back to
  /// param layer `lowest` (the first by default), setting the signals of
  /// the param layers from `lowest` up to `end` in sig.
  void walk_back(const SegmentPass& pass, torch::Tensor g, size_t end, bool of_logits,
                 std::vector<torch::Tensor>& sig, size_t lowest = 0) const;
  /// Whether layer i + 1 is a max-pool (which takes layer i's ReLU mask, or
  /// its leaky ReLU's scale, on the pooled gradient).
  bool before_max_pool(size_t i) const { return i + 1 < layers_.size() && layers_[i + 1].kind == Kind::MaxPool2d; }
  /// Whether the last kink site can be held (KinkHints::last_site_local).
  bool last_site_holds() const;
  /// Whether the site below the last hidden layer can be held
  /// (KinkHints::hidden_site_local).
  bool hidden_site_holds() const;
  /// Whether layers first .. last − 1 are a site's ReLU or leaky ReLU, then
  /// an optional max-pool or average pool and an optional flatten alone.
  bool relu_pool_flatten(size_t first, size_t last) const;
  /// The layer index of each param layer.
  std::vector<size_t> param_positions() const;
  /// Whether the last param layer (at: param_positions) is a Linear layer
  /// followed by nothing but a log-softmax: the logits' layer.
  bool logits_last(const std::vector<size_t>& at) const;
  /// Param layer l's index among the layers.
  size_t layer_index(size_t l) const;

  std::vector<LayerDesc> layers_;
  std::string name_;
};

OwnRoute::OwnRoute(Network& net, std::vector<LayerDesc> layers, std::string name)
    : LayeredRoute(net), layers_(std::move(layers)), name_(std::move(name)) {
  std::vector<ParamInfo> layout = parameter_layout(net);
  for (const LayerDesc& d : layers_) {
    if (!has_params(d)) continue;
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
    PK_ASSERT(p.weight_numel > 0);  // a module's layer may have no bias
    params_.push_back(p);
  }
  bool piecewise_linear = true;
  std::vector<bool> leaky;
  std::vector<double> slope;
  std::vector<int64_t> average;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Kind k = layers_[i].kind;
    piecewise_linear = piecewise_linear && (has_params(layers_[i]) || k == Kind::ReLU || k == Kind::LeakyReLU ||
                                            k == Kind::MaxPool2d || k == Kind::AvgPool2d || k == Kind::Flatten ||
                                            k == Kind::LogSoftmax || k == Kind::Dropout);
    if (!has_params(layers_[i])) continue;
    const bool relu = i + 1 < layers_.size() && layers_[i + 1].rectifier();
    const Kind pooled = relu && i + 2 < layers_.size() ? layers_[i + 2].kind : Kind::Module;
    hints_.relu_after.push_back(relu);
    hints_.pool_after.push_back(pooled == Kind::MaxPool2d ? layers_[i + 2].kernel : 0);
    average.push_back(pooled == Kind::AvgPool2d ? layers_[i + 2].kernel : 0);
    leaky.push_back(relu && layers_[i + 1].kind == Kind::LeakyReLU && layers_[i + 1].slope > 0);
    slope.push_back(leaky.back() ? layers_[i + 1].slope : 0.0);
  }
  // Only where some site has one (KinkHints::leaky_after, average_after).
  if (std::find(leaky.begin(), leaky.end(), true) != leaky.end()) {
    hints_.leaky_after = leaky;
    hints_.slope_after = slope;
  }
  if (std::any_of(average.begin(), average.end(), [](int64_t k) { return k > 0; })) hints_.average_after = average;
  hints_.polynomial_degree = piecewise_linear ? static_cast<int>(params_.size()) : 0;
  hints_.first_site_affine = !hints_.relu_after.empty() && hints_.relu_after[0];
  hints_.first_input_fixed = true;
  hints_.last_site_local = piecewise_linear && last_site_holds();
  hints_.hidden_site_local = piecewise_linear && hidden_site_holds();
  // Log-softmax outputs where the layers end in one: the output map of own
  // networks, or a module chain's own log-softmax (its outputs taken as they are).
  log_softmax_ = !layers_.empty() && layers_.back().kind == Kind::LogSoftmax;
}

std::vector<size_t> OwnRoute::param_positions() const {
  std::vector<size_t> at;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (has_params(layers_[i])) at.push_back(i);
  }
  return at;
}

bool OwnRoute::logits_last(const std::vector<size_t>& at) const {
  if (at.empty() || layers_[at.back()].kind != Kind::Linear) return false;
  for (size_t i = at.back() + 1; i < layers_.size(); ++i) {
    if (layers_[i].kind != Kind::LogSoftmax) return false;
  }
  return true;
}

bool OwnRoute::relu_pool_flatten(size_t first, size_t last) const {
  size_t i = first;
  if (i >= last || !layers_[i].rectifier()) return false;
  if (++i < last && (layers_[i].kind == Kind::MaxPool2d || layers_[i].kind == Kind::AvgPool2d)) ++i;
  if (i < last && layers_[i].kind == Kind::Flatten) ++i;
  return i == last;
}

bool OwnRoute::last_site_holds() const {
  const std::vector<size_t> at = param_positions();
  // Between the site and the logits: its ReLU (or leaky ReLU), then an
  // optional max-pool or average pool and an optional flatten.
  return at.size() >= 3 && logits_last(at) && relu_pool_flatten(at[at.size() - 2] + 1, at.back());
}

bool OwnRoute::hidden_site_holds() const {
  const std::vector<size_t> at = param_positions();
  const size_t n = at.size();
  if (n < 4 || !logits_last(at) || layers_[at[n - 2]].kind != Kind::Linear) return false;
  // The hidden layer's ReLU (or leaky ReLU) alone before the logits; the
  // site's, an optional max-pool or average pool and a flatten before the
  // hidden layer.
  return at[n - 2] + 2 == at[n - 1] && layers_[at[n - 2] + 1].rectifier() &&
         relu_pool_flatten(at[n - 3] + 1, at[n - 2]);
}

torch::Tensor OwnRoute::param_forward(const LayerDesc& layer, size_t l, const torch::Tensor& h,
                                      const torch::Tensor& t, bool at_start, SegmentPass& pass) const {
  pass.inputs.push_back(h);
  torch::Tensor y;
  // Outside autograd, a plain convolution runs as the product of its
  // patches (conv_of_patches).
  const bool by_patches = plain_conv(layer) && !torch::GradMode::is_enabled();
  const int64_t Ho = by_patches ? h.size(2) + 2 * layer.padding - weight_of(w_, l).size(2) + 1 : 0;
  const int64_t Wo = by_patches ? h.size(3) + 2 * layer.padding - weight_of(w_, l).size(3) + 1 : 0;
  if (at_start && layer.kind == Kind::Linear) {
    y = torch::linear(h, weight_of(w_, l), bias_or_none(w_, l));  // addmm with a bias, as before
  } else if (at_start) {
    if (by_patches) {
      // The patches stay with the pass: the per-sample gradients take them.
      pass.patches[l] = conv_patches(layer, h, weight_of(w_, l).sizes().vec());
      y = conv_of_patches(pass.patches[l], weight_of(w_, l), bias_or_none(w_, l), Ho, Wo);
    } else {
      y = torch::conv2d(h, weight_of(w_, l), bias_or_none(w_, l), 1, layer.padding);
    }
  } else {
    // A convolution's rows of one input repeated (a view of stride 0 along
    // rows: a test point's rows along its segment) take one row's products,
    // repeated as a view: the convolution works row by row, so each row's
    // bits are the same.
    const bool repeated = layer.kind == Kind::Conv2d && h.size(0) > 1 && h.stride(0) == 0;
    auto [start, direction] = products_at_start_and_direction(layer, l, repeated ? h.narrow(0, 0, 1) : h);
    if (repeated) {
      start = start.expand({h.size(0), -1, -1, -1});
      direction = direction.expand({h.size(0), -1, -1, -1});
    }
    pass.directions.push_back(direction);
    y = along_segment(start, t, direction);
  }
  pass.preacts.push_back(y);
  return y;
}

std::pair<torch::Tensor, torch::Tensor> OwnRoute::products_at_start_and_direction(const LayerDesc& layer, size_t l,
                                                                                   const torch::Tensor& h) const {
  if (layer.kind == Kind::Linear) {
    return {torch::linear(h, weight_of(w_, l), bias_or_none(w_, l)),
            torch::linear(h, weight_of(dw_, l), bias_or_none(dw_, l))};
  }
  // W_s and dW_s as one convolution of twice the channels: the input's
  // patches are formed once, for both.
  const int64_t c = weight_of(w_, l).size(0);
  const torch::Tensor W2 = torch::cat({weight_of(w_, l), weight_of(dw_, l)});
  const torch::Tensor b2 = params_[l].bias_numel ? torch::cat({bias_of(w_, l), bias_of(dw_, l)}) : torch::Tensor();
  torch::Tensor both;
  if (plain_conv(layer) && !torch::GradMode::is_enabled()) {
    const int64_t Ho = h.size(2) + 2 * layer.padding - W2.size(2) + 1;
    const int64_t Wo = h.size(3) + 2 * layer.padding - W2.size(3) + 1;
    both = conv_of_patches(conv_patches(layer, h, W2.sizes().vec()), W2, b2, Ho, Wo);
  } else {
    both = torch::conv2d(h, W2, b2, 1, layer.padding);
  }
  return {both.narrow(1, 0, c), both.narrow(1, c, c)};
}

SegmentPoints OwnRoute::segment_points(const torch::Tensor& x) const {
  PK_ASSERT(w_.defined());
  SegmentPoints points{x, {}, {}};
  size_t i = 0;
  while (i < layers_.size() && layers_[i].kind == Kind::Flatten) ++i;
  if (i == layers_.size() || !has_params(layers_[i])) return points;
  torch::NoGradGuard no_grad;  // as an untracked pass forms them
  torch::Tensor h = x;
  for (size_t j = 0; j < i; ++j) h = apply_parameter_free(layers_[j], h);
  std::tie(points.start, points.direction) = products_at_start_and_direction(layers_[i], 0, h);
  return points;
}

SegmentPass OwnRoute::forward_points(const SegmentPoints& points, const torch::Tensor& point, const torch::Tensor& t,
                                     bool track) const {
  const torch::Tensor x = rows_of_points(points.x, point);
  const bool at_start = rows_at_start(t);
  // A tracked pass (autograd through it) takes the whole pass, and so do a
  // convolution's rows all at the start: their product at W_s alone, as
  // forward() takes it, not the first half of the product at both.
  const bool conv = points.start.defined() && points.start.dim() > 2;
  if (!points.start.defined() || track || (at_start && conv)) return forward_rows(x, t, track, at_start, nullptr);
  // A convolution's products of one point repeated as a view (as forward()
  // takes them); a Linear layer's as rows of their own.
  auto at_rows = [&](const torch::Tensor& v) { return conv ? rows_of_points(v, point) : v.index_select(0, point); };
  const FirstRows first{at_rows(points.start), at_rows(points.direction)};
  return forward_rows(x, t, track, at_start, &first);
}

torch::Tensor OwnRoute::first_from_points(const torch::Tensor& h, const torch::Tensor& t, bool at_start,
                                          const FirstRows& first, SegmentPass& pass) const {
  pass.inputs.push_back(h);
  if (at_start) {
    pass.preacts.push_back(first.start);
    return first.start;
  }
  pass.directions.push_back(first.direction);
  torch::Tensor y = along_segment(first.start, t, first.direction);
  pass.preacts.push_back(y);
  return y;
}

SegmentPass OwnRoute::forward_rows(const torch::Tensor& x, const torch::Tensor& t, bool track, bool at_start,
                                   const FirstRows* first) const {
  PK_ASSERT(w_.defined());
  PK_CHECK(t.dim() == 1 && t.size(0) == x.size(0),
           "segment rows: " << x.size(0) << " inputs but t has shape " << t.sizes());
  SegmentPass pass;
  torch::AutoGradMode grad_mode(track);
  pass.t = t;
  // Every row at w_s (the training side's passes, at_start): one product
  // per layer.
  torch::Tensor h = track ? x.detach().clone().requires_grad_(true) : x;
  size_t l = 0;
  pass.argmax.resize(layers_.size());
  pass.dropout.resize(layers_.size());
  pass.patches.resize(params_.size());
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LayerDesc& layer = layers_[i];
    pass.layer_inputs.push_back(h);
    switch (layer.kind) {
      case Kind::Linear:
      case Kind::Conv2d:
        h = l == 0 && first ? first_from_points(h, t, at_start, *first, pass)
                            : param_forward(layer, l, h, t, at_start, pass);
        ++l;
        break;
      case Kind::LogSoftmax:
        pass.logits = h;
        h = apply_parameter_free(layer, h);
        break;
      case Kind::MaxPool2d:
        // The argmax comes with the pooled values; the backward walk uses it.
        std::tie(h, pass.argmax[i]) = max_pool_with_indices(h, layer.kernel);
        break;
      case Kind::Dropout:
        // The step's masks inside a DropoutStep (the training side), kept
        // for the backward walk; the input as it is elsewhere.
        pass.dropout[i] = dropout_scale(h, layer.drop, /*train=*/true, layer.site, x);
        if (pass.dropout[i].defined()) h = h * pass.dropout[i];
        break;
      default: h = apply_parameter_free(layer, h); break;
    }
  }
  pass.out = h;
  if (!pass.logits.defined()) pass.logits = h;
  return pass;
}

torch::Tensor OwnRoute::param_backward(const LayerDesc& d, size_t l, const torch::Tensor& g, const SegmentPass& pass,
                                       bool at_start) const {
  const torch::Tensor& t = pass.t;
  const int64_t R = g.size(1);
  if (d.kind == Kind::Linear) {
    return at_start ? torch::matmul(g, weight_of(w_, l))
                    : torch::matmul(g, weight_of(w_, l)) + t.view({1, R, 1}) * torch::matmul(g, weight_of(dw_, l));
  }
  if (at_start) return conv_backward(d, l, g, weight_of(w_, l), pass);
  if (R * weight_of(w_, l).numel() <= kRowWeightDoubles) return rows_conv_backward(d, l, g, pass);
  // Row r's weights are W_s + t_r dW_s: its input gradient is that of
  // [g_r, t_r g_r] through [W_s; dW_s], one convolution of twice the
  // channels.
  return pair_backward(d, l, g, g * t.view({1, R, 1, 1, 1}), pass);
}

torch::Tensor OwnRoute::rows_conv_backward(const LayerDesc& d, size_t l, const torch::Tensor& g,
                                           const SegmentPass& pass) const {
  // Row r's K cotangents share its weights W_s + t_r dW_s: one convolution
  // of R groups, group r row r's channels at its weights, half the products
  // of [g_r, t_r g_r] through [W_s; dW_s].
  const int64_t K = g.size(0), R = g.size(1);
  const torch::Tensor W = weight_of(w_, l), dW = weight_of(dw_, l);
  const torch::Tensor rows_w = torch::addcmul(W.unsqueeze(0), pass.t.view({R, 1, 1, 1, 1}), dW.unsqueeze(0));
  const torch::Tensor& a = pass.inputs[l];
  const torch::Tensor shape_of_input = torch::empty({K, R * a.size(1), a.size(2), a.size(3)}, a.options());
  return std::get<0>(torch::convolution_backward(g.reshape({K, R * g.size(2), g.size(3), g.size(4)}), shape_of_input,
                                                 rows_w.flatten(0, 1), c10::nullopt, {1, 1}, {d.padding, d.padding},
                                                 {1, 1}, false, {0, 0}, R, {true, false, false}))
      .view({K, R, a.size(1), a.size(2), a.size(3)});
}

torch::Tensor OwnRoute::pair_backward(const LayerDesc& d, size_t l, const torch::Tensor& g, const torch::Tensor& g_dw,
                                      const SegmentPass& pass) const {
  if (d.kind == Kind::Linear) return torch::matmul(g, weight_of(w_, l)) + torch::matmul(g_dw, weight_of(dw_, l));
  return conv_backward(d, l, torch::cat({g, g_dw}, 2), torch::cat({weight_of(w_, l), weight_of(dw_, l)}), pass);
}

torch::Tensor OwnRoute::conv_backward(const LayerDesc& d, size_t l, const torch::Tensor& g,
                                      const torch::Tensor& weight, const SegmentPass& pass) const {
  // As autograd takes it: the input only gives its shape, and is never read.
  const int64_t K = g.size(0), R = g.size(1);
  const torch::Tensor& a = pass.inputs[l];
  const torch::Tensor shape_of_input = torch::empty({K * R, a.size(1), a.size(2), a.size(3)}, a.options());
  return std::get<0>(torch::convolution_backward(g.flatten(0, 1), shape_of_input, weight, c10::nullopt, {1, 1},
                                                 {d.padding, d.padding}, {1, 1}, false, {0, 0}, 1,
                                                 {true, false, false}))
      .unflatten(0, {K, R});
}

torch::Tensor OwnRoute::free_backward(size_t i, const torch::Tensor& g, const SegmentPass& pass,
                                      bool of_logits) const {
  const std::vector<torch::Tensor>& in = pass.layer_inputs;  // each layer's input, rows first
  const int64_t K = g.size(0);
  // [K, R, ...] in the shape of layer i's input.
  auto input_shape = [&](size_t j) {
    std::vector<int64_t> shape{K};
    for (int64_t s : in[j].sizes()) shape.push_back(s);
    return shape;
  };
  auto output_of = [&](size_t j) { return j + 1 < layers_.size() ? in[j + 1] : pass.out; };
  switch (layers_[i].kind) {
    case Kind::LogSoftmax: return of_logits ? g : g - pass.out.detach().exp() * g.sum(-1, /*keepdim=*/true);
    case Kind::ReLU:
      // After a max-pool the mask was applied to the pooled gradient.
      return before_max_pool(i) ? g : g * (in[i] > 0);
    case Kind::LeakyReLU:
      // As autograd takes it; after a max-pool, applied to the pooled gradient.
      return before_max_pool(i) ? g : torch::where(in[i] > 0, g, g * layers_[i].slope);
    case Kind::Tanh: {
      const torch::Tensor& y = output_of(i);
      return g * (1 - y * y);
    }
    case Kind::GELU: return g * torch::gelu_backward(torch::ones_like(in[i]), in[i]);
    case Kind::MaxPool2d: return pool_backward(i, g, pass);
    case Kind::AvgPool2d: return average_pool_backward(i, g, pass);
    case Kind::Flatten: return g.reshape(input_shape(i));
    case Kind::Dropout: return pass.dropout[i].defined() ? g * pass.dropout[i] : g;
    default: PK_ASSERT(false && "own route: a layer own networks do not have"); return g;
  }
}

torch::Tensor OwnRoute::pool_backward(size_t i, const torch::Tensor& g, const SegmentPass& pass) const {
  // Each pooled gradient goes to its window's argmax, kept by the forward
  // pass. A ReLU before the pool passes it where the pooled value is
  // positive. The windows do not overlap (stride = window), so each input
  // unit receives at most one gradient: one pass writing [K, R, C, H, W],
  // with the rows' argmax shared by the K outputs (max_pool.h; LibTorch's
  // scatter into zeros took about 6 ms for K = 1 at the user CNN's first
  // pool over a batch of 128).
  const std::vector<torch::Tensor>& in = pass.layer_inputs;
  const torch::Tensor& pooled = i + 1 < layers_.size() ? in[i + 1] : pass.out;
  const bool relu = i > 0 && layers_[i - 1].kind == Kind::ReLU;
  // A leaky ReLU before the pool scales the pooled gradient where its
  // winner is not positive (the two commute: the winner's sign is the
  // pooled value's).
  const bool leaky = i > 0 && layers_[i - 1].kind == Kind::LeakyReLU;
  const torch::Tensor gp = leaky ? torch::where(pooled > 0, g, g * layers_[i - 1].slope) : g;
  return max_unpool(gp, pass.argmax[i], layers_[i].kernel, in[i].size(2), in[i].size(3),
                    relu ? pooled : torch::Tensor());
}

torch::Tensor OwnRoute::average_pool_backward(size_t i, const torch::Tensor& g, const SegmentPass& pass) const {
  // Each pooled gradient over k² to each unit of its window, as autograd's
  // backward takes it (the windows do not overlap: one term per unit, the
  // same bits), but as one copy of g expanded: LibTorch's float64 kernel
  // took 21 s of the average-pool CNN's epoch. The rows and columns no
  // window takes get zeros.
  const torch::Tensor& a = pass.layer_inputs[i];
  const int64_t k = layers_[i].kernel, H = a.size(2), W = a.size(3);
  const int64_t K = g.size(0), R = g.size(1), C = g.size(2), Hp = g.size(3), Wp = g.size(4);
  torch::Tensor spread = (g / static_cast<double>(k * k))
                             .reshape({K, R, C, Hp, 1, Wp, 1})
                             .expand({K, R, C, Hp, k, Wp, k})
                             .reshape({K, R, C, Hp * k, Wp * k});
  if (Hp * k == H && Wp * k == W) return spread;
  return torch::constant_pad_nd(spread, {0, W - Wp * k, 0, H - Hp * k});
}

std::vector<torch::Tensor> OwnRoute::signals(const SegmentPass& pass, const torch::Tensor& c, bool of_logits) const {
  PK_ASSERT(pass.t.defined() && c.dim() == 3);
  torch::NoGradGuard no_grad;
  PK_ASSERT(c.size(1) == pass.out.size(0) && c.size(2) == pass.out.size(1));
  PK_ASSERT(pass.layer_inputs.size() == layers_.size());
  std::vector<torch::Tensor> sig(params_.size());
  walk_back(pass, c, layers_.size(), of_logits, sig);
  return sig;
}

std::vector<torch::Tensor> OwnRoute::signals_above_first(const SegmentPass& pass, const torch::Tensor& c,
                                                         bool of_logits) const {
  PK_ASSERT(pass.t.defined() && c.dim() == 3 && pass.layer_inputs.size() == layers_.size());
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> sig(params_.size());
  walk_back(pass, c, layers_.size(), of_logits, sig, std::min<size_t>(1, params_.size() - 1));
  return sig;
}

std::vector<torch::Tensor> OwnRoute::signals_from(const SegmentPass& pass, size_t layer, const torch::Tensor& g) const {
  PK_ASSERT(pass.t.defined() && layer < params_.size() && pass.layer_inputs.size() == layers_.size());
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> sig(params_.size());
  walk_back(pass, g, layer_index(layer) + 1, /*of_logits=*/true, sig);
  return sig;
}

std::vector<torch::Tensor> OwnRoute::signals_from_above_first(const SegmentPass& pass, size_t layer,
                                                              const torch::Tensor& g) const {
  PK_ASSERT(pass.t.defined() && layer >= 1 && layer < params_.size() && pass.layer_inputs.size() == layers_.size());
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> sig(params_.size());
  walk_back(pass, g, layer_index(layer) + 1, /*of_logits=*/true, sig, 1);
  return sig;
}

torch::Tensor OwnRoute::first_signals_of_pair(const SegmentPass& pass, const torch::Tensor& g,
                                               const torch::Tensor& g_dw) const {
  PK_ASSERT(params_.size() >= 2 && pass.layer_inputs.size() == layers_.size());
  torch::NoGradGuard no_grad;
  const size_t i = layer_index(1);
  std::vector<torch::Tensor> sig(params_.size());
  walk_back(pass, pair_backward(layers_[i], 1, g, g_dw, pass), i, /*of_logits=*/true, sig);
  return sig[0];
}

torch::Tensor OwnRoute::first_selection(const SegmentPass& pass, const torch::Tensor& rows) const {
  const size_t first = layer_index(0), second = layer_index(1);
  const int64_t R = rows.size(0);
  const torch::Tensor& y0 = pass.layer_inputs[first + 1];  // layer 0's output, rows first
  // [R, ...units, S]: each unit's S sources, one (itself) to begin with.
  std::vector<int64_t> shape = y0.sizes().vec();
  shape[0] = R;
  shape.push_back(1);
  torch::Tensor target =
      torch::arange(y0[0].numel(), torch::kLong).view(y0.sizes().slice(1)).unsqueeze(0).unsqueeze(-1).expand(shape);
  // Where the rows' values v (at the current units) are not positive: no
  // source after a ReLU, the source u as −2 − u after a leaky ReLU (its
  // slope's share; selection_sources).
  auto unless_positive = [&](const torch::Tensor& v, bool leaky) {
    const torch::Tensor below = (v.index_select(0, rows) <= 0).unsqueeze(-1);
    return leaky ? torch::where(below, -2 - target, target) : target.masked_fill(below, -1);
  };
  for (size_t i = first + 1; i < second; ++i) {
    switch (layers_[i].kind) {
      case Kind::ReLU:
      case Kind::LeakyReLU:
        // Before a max-pool, the pool's windows are the mask (pool_backward).
        if (before_max_pool(i)) break;
        target = unless_positive(pass.layer_inputs[i], layers_[i].kind == Kind::LeakyReLU);
        break;
      case Kind::MaxPool2d: {
        const torch::Tensor idx = pass.argmax[i].index_select(0, rows);  // [R, C, H', W']
        const int64_t S = target.size(-1);
        std::vector<int64_t> pooled = idx.sizes().vec();
        pooled.push_back(S);
        target = target.flatten(2, 3).gather(2, idx.flatten(2).unsqueeze(-1).expand({-1, -1, -1, S})).view(pooled);
        if (i > 0 && layers_[i - 1].rectifier()) {
          target = unless_positive(pass.layer_inputs[i + 1], layers_[i - 1].kind == Kind::LeakyReLU);
        }
        break;
      }
      case Kind::AvgPool2d: {
        // A pooled unit is the mean of its window's k² units' sources (the
        // rows and columns no window takes are dropped).
        const int64_t k = layers_[i].kernel, C = target.size(1), S = target.size(4);
        const int64_t H = target.size(2) / k, W = target.size(3) / k;
        target = target.narrow(2, 0, H * k)
                     .narrow(3, 0, W * k)
                     .reshape({R, C, H, k, W, k, S})
                     .permute({0, 1, 2, 4, 3, 5, 6})
                     .reshape({R, C, H, W, k * k * S});
        break;
      }
      case Kind::Flatten: break;
      case Kind::Dropout:
        if (pass.dropout[i].defined()) return torch::Tensor();  // it scales as well as selects
        break;
      default: return torch::Tensor();
    }
  }
  return target.reshape({R, -1, target.size(-1)});
}

torch::Tensor OwnRoute::pair_backward_at(const torch::Tensor& g, const torch::Tensor& g_dw, const torch::Tensor& row,
                                         const torch::Tensor& unit, const SegmentPass& pass) const {
  const LayerDesc& d = layers_[layer_index(1)];
  if (d.kind == Kind::Linear) {
    auto at = [&](const torch::Tensor& v, const torch::Tensor& w) {
      return (v.index_select(1, row) * w.index_select(1, unit).t().unsqueeze(0)).sum(2);
    };
    return at(g, weight_of(w_, 1)) + at(g_dw, weight_of(dw_, 1));
  }
  // Input unit (c, y, x) of a convolution takes Σ W[o, c, i, j] g[o, y + P
  // − i, x + P − j] over the output positions inside g.
  const int64_t H = pass.inputs[1].size(2), W = pass.inputs[1].size(3);
  const torch::Tensor c = unit.div(H * W, "floor"), y = unit.div(W, "floor").remainder(H), x = unit.remainder(W);
  auto at = [&](const torch::Tensor& v, const torch::Tensor& w) {
    const torch::Tensor kernel = w.permute({1, 2, 3, 0}).index_select(0, c);  // [M, kh, kw, C']
    return (conv_windows(v, row, y, x, d.padding, w.size(2), w.size(3)) * kernel.unsqueeze(3)).sum({1, 2, 4});
  };
  return (at(g, weight_of(w_, 1)) + at(g_dw, weight_of(dw_, 1))).t();  // [K, M]
}

torch::Tensor OwnRoute::first_dot_of_pair(const SegmentPass& pass, const torch::Tensor& rows,
                                          const torch::Tensor& target, const torch::Tensor& g,
                                          const torch::Tensor& g_dw) const {
  torch::NoGradGuard no_grad;
  if (!target.defined()) return Route::first_dot_of_pair(pass, rows, target, g, g_dw);
  // The first layer's direction routed to layer 1's input, through layer 1
  // at the start's weights and the direction's: ⟨walk(g, g_dw), v⟩ =
  // ⟨g, W_s v⟩ + ⟨g_dw, dW v⟩.
  const LayerDesc& d = layers_[layer_index(1)];
  const torch::Tensor dir = pass.directions[0].index_select(0, rows).flatten(1);  // [R, U0]
  std::vector<int64_t> shape = pass.inputs[1].sizes().vec();
  shape[0] = rows.size(0);
  const torch::Tensor v = routed_by_selection(dir, target, hints_.slope_at(0)).view(shape);
  const torch::Tensor weight = torch::cat({weight_of(w_, 1), weight_of(dw_, 1)});
  const torch::Tensor both = d.kind == Kind::Linear ? torch::matmul(v, weight.t())
                                                    : torch::conv2d(v, weight, {}, 1, d.padding);  // [R, 2 C', ...]
  // Per row r, [K, U] g[:, r] against its [U] tangent: one batched
  // product, reading g once.
  const int64_t c = weight.size(0) / 2, R = rows.size(0);
  auto dot = [&](const torch::Tensor& v, int64_t from) {
    return torch::bmm(v.flatten(2).transpose(0, 1), both.narrow(1, from, c).reshape({R, -1, 1})).squeeze(2).t();
  };
  return dot(g, 0) + dot(g_dw, c);
}

torch::Tensor OwnRoute::first_signals_of_pairs_summed(const SegmentPass& pass, const torch::Tensor& rows,
                                                      const torch::Tensor& target, const torch::Tensor& g,
                                                      const torch::Tensor& g_dw, const torch::Tensor& group,
                                                      int64_t groups, const PairSums& g_sums) const {
  torch::NoGradGuard no_grad;
  if (!target.defined()) return Route::first_signals_of_pairs_summed(pass, rows, target, g, g_dw, group, groups);
  const int64_t K = g.size(0);
  // Each group's sums through layer 1, once, routed by its first row's masks.
  auto summed = [&](const torch::Tensor& sum, const torch::Tensor& v) {
    return sum.defined() ? sum : sum_by_group(v, group, groups);
  };
  const torch::Tensor through =
      pair_backward(layers_[layer_index(1)], 1, summed(g_sums.g, g), summed(g_sums.g_dw, g_dw), pass).flatten(2);
  const torch::Tensor ref = target.index_select(0, first_of_each_group(group, groups));  // [groups, U1, S]
  const torch::Tensor& y0 = pass.layer_inputs[layer_index(0) + 1];
  const int64_t U0 = y0[0].numel(), S = target.size(2);
  // A unit's gradient goes to each of its S sources, over S, at the source's weight.
  torch::Tensor out = torch::zeros({K, groups, U0}, g.options());
  const SelectionSources from = selection_sources(ref, hints_.slope_at(0));
  out.scatter_add_(2, from.unit.flatten(1).unsqueeze(0).expand({K, -1, -1}),
                   (over_slots(through, S).unsqueeze(3) * from.weight).flatten(2));
  // A row's units routed elsewhere than by its group's first row: its own
  // gradient there moves from the first row's source to its own.
  const torch::Tensor at = (target != ref.index_select(0, group)).nonzero();  // [M, 3]: row, unit, slot
  torch::Tensor flat = out.view({K, groups * U0});
  for (int64_t from = 0; from < at.size(0); from += kMendChunk) {
    const torch::Tensor chunk = at.narrow(0, from, std::min(kMendChunk, at.size(0) - from));
    const torch::Tensor row = chunk.select(1, 0), unit = chunk.select(1, 1), in = group.index_select(0, row);
    const torch::Tensor value = over_slots(pair_backward_at(g, g_dw, row, unit, pass), S);  // [K, M]
    const torch::Tensor slot = chunk.select(1, 2);
    const SelectionSources own = selection_sources(target.index({row, unit, slot}), hints_.slope_at(0));
    const SelectionSources was = selection_sources(ref.index({in, unit, slot}), hints_.slope_at(0));
    flat.index_add_(1, in * U0 + own.unit, value * own.weight);
    flat.index_add_(1, in * U0 + was.unit, -value * was.weight);
  }
  std::vector<int64_t> shape{K, groups};
  for (int64_t s : y0.sizes().slice(1)) shape.push_back(s);
  return out.view(shape);
}

size_t OwnRoute::layer_index(size_t l) const {
  for (size_t i = 0, seen = 0; i < layers_.size(); ++i) {
    if (has_params(layers_[i]) && seen++ == l) return i;
  }
  PK_ASSERT(false && "own route: no such param layer");
  return layers_.size();
}

void OwnRoute::walk_back(const SegmentPass& pass, torch::Tensor g, size_t end, bool of_logits,
                         std::vector<torch::Tensor>& sig, size_t lowest) const {
  // Walk back: g is the gradient at the current layer's output, [K, R, ...]
  // (the rows' own shape with K in front); the weights at row r are
  // W_s + t_r dW_s, so every param layer's backward is two products, or one
  // when every row is at t = 0 (the training side's passes).
  const bool at_start = rows_at_start(pass.t);
  size_t l = 0;
  for (size_t i = 0; i < end; ++i) l += has_params(layers_[i]) ? 1 : 0;
  for (size_t i = end; i-- > 0;) {
    const LayerDesc& d = layers_[i];
    if (!has_params(d)) {
      g = free_backward(i, g, pass, of_logits);
      continue;
    }
    sig[--l] = g;
    if (l <= lowest) return;
    g = param_backward(d, l, g, pass, at_start);
  }
  PK_ASSERT(false && "own route: no param layer");
}

}  // namespace

std::unique_ptr<Route> make_own_route(Network& net) { return std::make_unique<OwnRoute>(net, net->layers(), "own"); }

std::unique_ptr<Route> make_chain_route(Network& net, std::string& why_not) {
  const ScriptGraph* graph = net->script_graph();
  if (graph == nullptr) return nullptr;
  why_not = graph->chain_refusal();
  if (graph->chain().empty()) return nullptr;
  std::vector<LayerDesc> layers = graph->chain();
  // The output map, as pathkernel's own networks end with it; a module that
  // ends in its own log-softmax has its outputs taken as they are (a second
  // log-softmax would change nothing, but the walk knows one).
  if (net->layers().back().kind == Kind::LogSoftmax) {
    if (layers.back().kind == Kind::LogSoftmax) {
      why_not = "the module ends in its own log_softmax and its run applies the log-softmax map on top";
      return nullptr;
    }
    layers.push_back(net->layers().back());
  }
  auto route = std::make_unique<OwnRoute>(net, std::move(layers), "structured");
  if (!rows_agree_with_module(*route, net)) {
    why_not = "its layers, walked as a chain, do not reproduce the module's outputs";
    return nullptr;
  }
  return route;
}

}  // namespace pathkernel
