// Test features with certified quadrature, and the structured contractions.
#include "pathkernel/features.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "pathkernel/error.h"
#include "pathkernel/loss.h"
#include "pathkernel/kinks.h"
#include "pathkernel/layer_rules.h"
#include "add_at_rows.h"
#include "feature_parts.h"
#include "point_groups.h"
#include "rows_contraction.h"

namespace pathkernel {

using Kind = LayerDesc::Kind;
using Form = LayerFeatures::Form;

torch::Tensor layer_sample_gradients(const SegmentEvaluator& ev, const TrainSignals& t, size_t l) {
  const ParamLayer& p = ev.param_layers()[l];
  if (p.desc.kind == Kind::Module) return t.signals[l];
  if (l < t.gradients.size() && t.gradients[l].defined()) return t.gradients[l];
  if (l < t.patches.size() && t.patches[l].defined()) {
    return sample_gradients_of_patches(p.desc, t.patches[l], t.signals[l], p.weight_shape, p.bias_numel);
  }
  return sample_gradients_one(p.desc, t.inputs[l], t.signals[l], p.weight_shape, p.bias_numel);
}

namespace {

/// Layer l's output change for parameter direction v: op_dir(a; v).
torch::Tensor layer_direction(const SegmentEvaluator& ev, size_t l, const torch::Tensor& a, const torch::Tensor& v) {
  return layer_direction(ev.param_layers()[l].desc, a, ev.weight_of(v, l), ev.bias_or_none(v, l));
}

/// Per-row directional derivatives J(w(t_r), x_r) v: [K, R].
/// Layers are param layers first_layer, first_layer + 1, ...; a layer whose
/// signals are undefined adds nothing (a held logits' layer, whose part is
/// taken from its integrals). `directions`, when given, holds each layer's
/// layer_direction(a_l, v) already.
torch::Tensor row_dot(const SegmentEvaluator& ev, const std::vector<torch::Tensor>& inputs,
                      const std::vector<torch::Tensor>& signals, const torch::Tensor& v, size_t first_layer = 0,
                      const std::vector<torch::Tensor>* directions = nullptr) {
  torch::Tensor total;
  for (size_t l = 0; l < inputs.size(); ++l) {
    if (!signals[l].defined()) continue;
    const torch::Tensor z = directions ? (*directions)[l] : layer_direction(ev, first_layer + l, inputs[l], v);  // [R, ...]
    // Per row r, [K, D] times [D]: no [K, R, D] product is formed.
    const torch::Tensor s = torch::bmm(signals[l].flatten(2).transpose(0, 1),
                                       z.expand(signals[l].sizes().slice(1)).flatten(1).unsqueeze(2))
                                .squeeze(2)
                                .t();  // [K, R]
    total = total.defined() ? total + s : s;
  }
  return total;
}

}  // namespace

/// Per-row J(w(t_r), x_r) dw of a pass, [K, R], for its signals: the
/// directions its forward pass formed where it kept them.
torch::Tensor segment_dot(const SegmentEvaluator& ev, const SegmentPass& pass,
                          const std::vector<torch::Tensor>& signals) {
  const bool kept = pass.directions.size() == pass.inputs.size();
  return row_dot(ev, pass.inputs, signals, ev.direction(), 0, kept ? &pass.directions : nullptr);
}

/// Signals of a pass for K cotangents at once, c [K, R, K_out]: per param
/// layer [K, R, ...], the route's way.
std::vector<torch::Tensor> batched_signals(const SegmentEvaluator& ev, const SegmentPass& pass,
                                           const torch::Tensor& c, bool of_logits) {
  return ev.batched_signals(pass, c, of_logits);
}

torch::Tensor conv_windows(const torch::Tensor& v, const torch::Tensor& row, const torch::Tensor& y,
                           const torch::Tensor& x, int64_t padding, int64_t kh, int64_t kw) {
  const int64_t M = row.size(0), Ho = v.size(3), Wo = v.size(4);
  const torch::Tensor yy = (y + padding).view({M, 1, 1}) - torch::arange(kh).view({1, kh, 1});
  const torch::Tensor xx = (x + padding).view({M, 1, 1}) - torch::arange(kw).view({1, 1, kw});
  const torch::Tensor inside = ((yy >= 0) & (yy < Ho) & (xx >= 0) & (xx < Wo)).unsqueeze(3).unsqueeze(4);
  using torch::indexing::Slice;
  return v.index({Slice(), row.view({M, 1, 1}), Slice(), yy.clamp(0, Ho - 1), xx.clamp(0, Wo - 1)}) * inside;
}

torch::Tensor sum_by_group(const torch::Tensor& v, const torch::Tensor& group, int64_t groups) {
  std::vector<int64_t> sizes = v.sizes().vec();
  sizes[1] = groups;
  torch::Tensor sums = torch::zeros(sizes, v.options());
  add_at_rows(sums, group, v);  // index_add_'s bits, without an operation per row
  return sums;
}

torch::Tensor over_slots(const torch::Tensor& v, int64_t S) { return S == 1 ? v : v / static_cast<double>(S); }

SelectionSources selection_sources(const torch::Tensor& selection, double slope) {
  const torch::Tensor leaky = selection <= -2;
  const torch::Tensor unit = torch::where(leaky, -2 - selection, selection.clamp_min(0));
  torch::Tensor weight = (selection >= 0).to(torch::kFloat64);
  if (slope != 0) weight.masked_fill_(leaky, slope);
  return {unit, weight};
}

torch::Tensor routed_by_selection(const torch::Tensor& v, const torch::Tensor& selection, double slope) {
  const int64_t S = selection.size(2);
  const SelectionSources src = selection_sources(selection, slope);
  const torch::Tensor taken = v.gather(1, src.unit.flatten(1)).view(selection.sizes()) * src.weight;
  return S == 1 ? taken.squeeze(2) : over_slots(taken.sum(2), S);
}

torch::Tensor first_of_each_group(const torch::Tensor& group, int64_t groups) {
  std::vector<int64_t> first(static_cast<size_t>(groups), 0);
  auto gp = group.accessor<int64_t, 1>();
  for (int64_t r = group.size(0); r-- > 0;) first[static_cast<size_t>(gp[r])] = r;
  return torch::tensor(first, torch::kLong);
}

/// The cotangents e_k of every output k on every row: [K, R, K].
torch::Tensor unit_cotangents(const SegmentEvaluator& ev, int64_t rows, const torch::TensorOptions& opts) {
  const int64_t k_out = ev.num_outputs();
  return torch::eye(k_out, opts).unsqueeze(1).expand({k_out, rows, k_out});
}

/// Signals for every output k (with `of_logits`, every logit) of a pass,
/// per layer as [K, R, ...].
std::vector<torch::Tensor> all_signals(const SegmentEvaluator& ev, const SegmentPass& pass, bool of_logits) {
  return batched_signals(ev, pass, unit_cotangents(ev, pass.out.size(0), pass.out.options()), of_logits);
}

/// Whether passes must keep an autograd graph for their signals.
bool track_passes(const SegmentEvaluator& ev) { return ev.path_route().needs_graph(); }

/// Measures the certificate of the assembled features.
void measure_certificate(const SegmentEvaluator& ev, TestFeatures& f, const torch::Tensor& dw) {
  torch::Tensor jdw = apply_features(ev, f, dw);
  torch::Tensor scale = f.f0.abs().amax(1, true).clamp_min(1.0);
  f.gap = jdw - (f.f1 - f.f0);
  f.certificate_gap = (f.gap.abs() / scale).max().item<double>();
}

bool TestFeatures::factored() const {
  return std::none_of(layers.begin(), layers.end(),
                      [](const LayerFeatures& lf) { return lf.form == LayerFeatures::Form::Dense; });
}

LayerFeatures::Form layer_form(const SegmentEvaluator& ev, size_t l, const torch::Tensor& a) {
  if (!factored(ev.param_layers()[l].desc, a)) return Form::Dense;
  return l == 0 && ev.first_input_fixed() ? Form::Summed : Form::Rows;
}

namespace {

/// Hidden factors' block (LayerFeatures::HiddenFactors) written into the
/// dense features out [n, K, P] at the layer's weight [H, in] and bias [H]:
/// each test point's rows in one pass per group (its first group written,
/// the others added; a point without groups zero). The block formed and
/// then copied made seven passes over it.
void write_hidden_block(const LayerFeatures::HiddenFactors& hf, const ParamLayer& pl, torch::Tensor& out) {
  PK_ASSERT(out.is_contiguous() && out.scalar_type() == torch::kFloat64);
  const int64_t G = hf.point.size(0), K = hf.w.size(1), H = hf.w.size(2), cols = hf.h.size(2);
  const int64_t in = hf.bias ? cols - 1 : cols, n = out.size(0), P = out.size(2);
  PK_ASSERT(pl.weight_numel == H * in && pl.bias_numel == (hf.bias ? H : 0));
  // Output k's part, D (W[k] ⊗ h0 + dW[k] ⊗ h1 − S) with S = Wᵀ p0 + dWᵀ p1 [H, cols] per group.
  const torch::Tensor S = (torch::matmul(hf.w[0].t(), hf.p.select(1, 0)) + torch::matmul(hf.w[1].t(), hf.p.select(1, 1)))
                              .contiguous();  // [G, H, cols]
  const torch::Tensor h = hf.h.contiguous(), w = hf.w.contiguous(), mask = hf.mask.contiguous();
  const torch::Tensor point = hf.point.contiguous();
  const double *sp = S.data_ptr<double>(), *hp = h.data_ptr<double>(), *wp = w.data_ptr<double>();
  const double* mp = mask.data_ptr<double>();
  const int64_t* pp = point.data_ptr<int64_t>();
  double* o = out.data_ptr<double>();
  std::vector<char> written(static_cast<size_t>(n), 0);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t i = pp[g];
    const bool first = !written[static_cast<size_t>(i)];
    written[static_cast<size_t>(i)] = 1;
    const double *h0 = hp + g * 2 * cols, *h1 = h0 + cols;
    for (int64_t k = 0; k < K; ++k) {
      double* row = o + (i * K + k) * P;
      for (int64_t u = 0; u < H; ++u) {
        // D's entry: 1, or 0, or a leaky ReLU's slope (each term times 1 is itself).
        const double m = mp[g * H + u];
        const bool on = m != 0;
        const double a = on ? m * wp[k * H + u] : 0.0, b = on ? m * wp[(K + k) * H + u] : 0.0;
        const double* s = sp + (g * H + u) * cols;
        double* ow = row + pl.weight_offset + u * in;
        if (!on) {
          if (first) std::fill(ow, ow + in, 0.0);
        } else if (first) {
          for (int64_t j = 0; j < in; ++j) ow[j] = a * h0[j] + b * h1[j] - m * s[j];
        } else {
          for (int64_t j = 0; j < in; ++j) ow[j] += a * h0[j] + b * h1[j] - m * s[j];
        }
        if (!hf.bias) continue;
        const double v = on ? a * h0[in] + b * h1[in] - m * s[in] : 0.0;
        double& ob = row[pl.bias_offset + u];
        ob = first ? v : ob + v;
      }
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    if (written[static_cast<size_t>(i)]) continue;
    out[i].narrow(1, pl.weight_offset, pl.weight_numel).zero_();
    if (hf.bias) out[i].narrow(1, pl.bias_offset, pl.bias_numel).zero_();
  }
}

}  // namespace

torch::Tensor dense_block(const LayerFeatures& lf, int64_t n) {
  if (!lf.hidden.defined()) return lf.block;
  const LayerFeatures::HiddenFactors& hf = lf.hidden;
  const int64_t K = hf.w.size(1), H = hf.w.size(2), in = hf.h.size(2) - (hf.bias ? 1 : 0);
  ParamLayer pl;  // the layer alone: its weight [H, in], then its bias [H]
  pl.weight_numel = H * in;
  pl.bias_offset = pl.weight_numel;
  pl.bias_numel = hf.bias ? H : 0;
  torch::Tensor out = torch::empty({n, K, pl.weight_numel + pl.bias_numel}, hf.h.options());
  write_hidden_block(hf, pl, out);
  return out.transpose(0, 1);
}

torch::Tensor hidden_contract(const LayerFeatures::HiddenFactors& hf, const torch::Tensor& a,
                              const std::vector<torch::Tensor>& sig, int64_t n) {
  const int64_t G = hf.point.size(0), K = hf.w.size(1), H = hf.w.size(2), cols = hf.h.size(2), B = a.size(0);
  PK_ASSERT(a.size(1) == cols);
  // Σ_{h,j} δ_h a_j D_h (W[k,h] h0_j + dW[k,h] h1_j − Σ_k' (W[k',h] p0[k',j] + dW[k',h] p1[k',j]))
  //   = d0_k (h0·a) + d1_k (h1·a) − Σ_k' (d0_k' (p0[k']·a) + d1_k' (p1[k']·a)),
  // with d0 = W (D δ), d1 = dW (D δ).
  const torch::Tensor ha = torch::matmul(hf.h.reshape({G * 2, cols}), a.t()).view({G, 2, 1, B});
  const torch::Tensor pa = torch::matmul(hf.p.reshape({G * 2 * K, cols}), a.t()).view({G, 2, K, B});
  const torch::Tensor w = hf.w.reshape({2 * K, H});
  std::vector<torch::Tensor> per;
  for (const torch::Tensor& s : sig) {
    const torch::Tensor masked = hf.mask.unsqueeze(2) * s.reshape({B, H}).t().unsqueeze(0);  // [G, H, B]
    const torch::Tensor d = torch::matmul(w, masked).view({G, 2, K, B});
    const torch::Tensor r = (d * ha).sum(1) - (d * pa).sum({1, 2}).unsqueeze(1);  // [G, K, B]
    per.push_back(torch::zeros({n, K, B}, r.options()).index_add_(0, hf.point, r).transpose(0, 1));
  }
  return torch::stack(per, 2);
}

torch::Tensor hidden_dot(const LayerFeatures::HiddenFactors& hf, const torch::Tensor& v, int64_t n) {
  const int64_t G = hf.point.size(0), K = hf.w.size(1), H = hf.w.size(2), cols = hf.h.size(2);
  PK_ASSERT(v.size(0) == H && v.size(1) == cols);
  // Σ_{h,j} v[h, j] D_h (...): as hidden_contract with v's rows for δ_h a_j.
  const torch::Tensor vh = torch::matmul(hf.h.reshape({G * 2, cols}), v.t()).view({G, 2, H}) * hf.mask.unsqueeze(1);
  const torch::Tensor vp =
      torch::matmul(hf.p.reshape({G * 2 * K, cols}), v.t()).view({G, 2, K, H}) * hf.mask.view({G, 1, 1, H});
  const torch::Tensor own = torch::matmul(vh.reshape({G, 2 * H}), hf.w.transpose(1, 2).reshape({2 * H, K}));  // [G, K]
  const torch::Tensor r = own - (vp * hf.w.unsqueeze(0)).sum({1, 2, 3}).unsqueeze(1);
  return torch::zeros({n, K}, r.options()).index_add_(0, hf.point, r).t();
}

namespace {

/// The features of consecutive groups of test points as those of all of
/// them, in order: rows, sums and blocks joined, each part's row points
/// shifted past the points before it, counts added.
TestFeatures join_features(std::vector<TestFeatures>& parts) {
  TestFeatures f;
  f.layers.resize(parts[0].layers.size());
  std::vector<torch::Tensor> point, weight, f0, f1, gap;
  for (TestFeatures& p : parts) {
    point.push_back(p.point + f.num_points);
    weight.push_back(p.weight);
    f0.push_back(p.f0);
    f1.push_back(p.f1);
    gap.push_back(p.gap);
    f.num_points += p.num_points;
    f.add_counts(p);
    f.certificate_gap = std::max(f.certificate_gap, p.certificate_gap);
    f.breaks.insert(f.breaks.end(), std::make_move_iterator(p.breaks.begin()), std::make_move_iterator(p.breaks.end()));
  }
  f.point = torch::cat(point);
  f.weight = torch::cat(weight);
  f.f0 = torch::cat(f0);
  f.f1 = torch::cat(f1);
  f.gap = torch::cat(gap);
  for (size_t l = 0; l < f.layers.size(); ++l) {
    LayerFeatures& lf = f.layers[l];
    lf.form = parts[0].layers[l].form;
    // Rows and Summed: inputs rows first, signals [K, rows, ...]; Dense: [K, n, Q].
    std::vector<torch::Tensor> inputs, signals, blocks, held_h, held_ph;
    std::vector<torch::Tensor> hidden_point, hidden_mask, hidden_h, hidden_p;
    int64_t points_before = 0;
    for (TestFeatures& p : parts) {
      LayerFeatures& pl = p.layers[l];
      PK_ASSERT(pl.form == lf.form);
      if (pl.hidden.defined()) {  // every group's, or none
        hidden_point.push_back(pl.hidden.point + points_before);
        hidden_mask.push_back(std::move(pl.hidden.mask));
        hidden_h.push_back(std::move(pl.hidden.h));
        hidden_p.push_back(std::move(pl.hidden.p));
        lf.hidden.w = pl.hidden.w;
        lf.hidden.bias = pl.hidden.bias;
      }
      points_before += p.num_points;
      if (pl.hidden.defined()) {
        PK_ASSERT(!pl.block.defined());
      } else if (lf.form == Form::Dense) {
        blocks.push_back(std::move(pl.block));
        if (pl.held_h.defined()) {
          held_h.push_back(std::move(pl.held_h));
          held_ph.push_back(std::move(pl.held_ph));
        }
      } else {
        inputs.push_back(std::move(pl.inputs));
        signals.push_back(std::move(pl.signals));
      }
    }
    if (!hidden_point.empty()) {
      PK_ASSERT(hidden_point.size() == parts.size());
      lf.hidden.point = torch::cat(hidden_point);
      lf.hidden.mask = torch::cat(hidden_mask);
      lf.hidden.h = torch::cat(hidden_h);
      lf.hidden.p = torch::cat(hidden_p);
    } else if (lf.form == Form::Dense) {
      lf.block = torch::cat(blocks, 1);
      if (held_h.size() == parts.size()) {  // every group's, or none
        lf.held_h = torch::cat(held_h, 0);
        lf.held_ph = torch::cat(held_ph, 0);
      }
    } else {
      lf.inputs = torch::cat(inputs, 0);
      lf.signals = torch::cat(signals, 1);
    }
  }
  return f;
}

}  // namespace

TestFeatures layered_features_in_groups(const SegmentEvaluator& ev, const torch::Tensor& x,
                                       const QuadratureOptions& q) {
  const int64_t n = x.size(0);
  // Test points are independent: with several threads own networks give
  // each its own group (with factored features, up to kFactoredGroupPoints),
  // and every thread takes the next group not yet taken (point_groups.h,
  // docs/math.md §12).
  const bool factored = point_workers(ev, n) > 1 && layered_feature_layout(ev, x.narrow(0, 0, 1)).factored;
  const int64_t groups = point_groups(ev, n, factored);
  if (groups < 2) return layered_test_features(ev, x, q);
  std::vector<TestFeatures> parts(groups);
  run_point_groups(
      groups,
      [&](int64_t g) {
        const int64_t first = group_start(g, groups, n), last = group_start(g + 1, groups, n);
        parts[g] = layered_test_features(ev, x.narrow(0, first, last - first), q);
      },
      point_workers(ev, n));
  return join_features(parts);
}

TestFeatures test_features(const SegmentEvaluator& ev, const torch::Tensor& x, const QuadratureOptions& q) {
  return ev.path_route().test_features(ev, x, q);
}

TrainSignals train_signals(const SegmentEvaluator& ev, const torch::Tensor& x, const torch::Tensor& y,
                           OutputMap map, LossKind loss, const torch::Tensor& weights) {
  if (ev.path_route().couples_batch()) return ev.path_route().batch_loss_signals(x, y, map, loss, weights);
  SegmentPass pass = ev.forward(x, torch::zeros({x.size(0)}, x.options()), track_passes(ev));
  // c_i u_i, u_i = ∂ℓ_i/∂f: a sequence's on its outputs at every position
  const torch::Tensor u = loss_signal(pass.sequence.defined() ? pass.sequence : pass.out, y, map, loss, weights);
  return ev.path_route().loss_signals(ev, x, pass, u);
}

TrainSignals layered_loss_signals(const SegmentEvaluator& ev, const SegmentPass& pass, const torch::Tensor& u) {
  TrainSignals t;
  for (const torch::Tensor& s : batched_signals(ev, pass, u.detach().unsqueeze(0))) t.signals.push_back(s[0]);
  for (auto& a : pass.inputs) t.inputs.push_back(a.detach());
  // Convolutions whose forward pass took their input's patches: their
  // per-sample gradients are formed from the same patches.
  t.patches = pass.patches;
  return t;
}

std::vector<TrainSignals> train_output_signals(const SegmentEvaluator& ev, const torch::Tensor& x,
                                               const torch::Tensor& t) {
  return ev.path_route().output_signals(ev, x, t.defined() ? t : torch::zeros({x.size(0)}, x.options()));
}

std::vector<TrainSignals> layered_output_signals(const SegmentEvaluator& ev, const torch::Tensor& x,
                                                 const torch::Tensor& t) {
  SegmentPass pass = ev.forward(x, t, track_passes(ev));
  std::vector<torch::Tensor> inputs;
  for (auto& a : pass.inputs) inputs.push_back(a.detach());
  const std::vector<torch::Tensor> sig = all_signals(ev, pass);
  std::vector<TrainSignals> out;
  for (int64_t k = 0; k < ev.num_outputs(); ++k) {
    TrainSignals ts{inputs, {}, {}, {}};
    for (const torch::Tensor& s : sig) ts.signals.push_back(s[k]);
    out.push_back(std::move(ts));
  }
  return out;
}

int64_t form_sample_gradients(const SegmentEvaluator& ev, TrainSignals& t) {
  int64_t doubles = 0;
  t.gradients.resize(t.inputs.size());
  for (size_t l = 0; l < t.inputs.size(); ++l) {
    const LayerDesc& d = ev.param_layers()[l].desc;
    if (d.kind == Kind::Module || factored(d, t.inputs[l]) || t.gradients[l].defined()) continue;
    t.gradients[l] = layer_sample_gradients(ev, t, l);
    doubles += t.gradients[l].numel();
    if (l < t.patches.size() && t.patches[l].defined()) {
      doubles -= t.patches[l].numel();
      t.patches[l] = torch::Tensor();
    }
  }
  return doubles;
}

int64_t signal_doubles(const TrainSignals& t) {
  int64_t doubles = 0;
  for (const auto* part : {&t.inputs, &t.signals, &t.gradients, &t.patches}) {
    for (const torch::Tensor& x : *part) doubles += x.defined() ? x.numel() : 0;
  }
  return doubles;
}

namespace {

/// Per output k, layer l's per-row gradient factors: Linear layers give the
/// signals [K, R, out] and inputs [R, in]; Conv2d layers the per-sample
/// gradients [K, R, Q] (inputs undefined).
std::pair<torch::Tensor, torch::Tensor> layer_rows(const SegmentEvaluator& ev, const std::vector<TrainSignals>& a,
                                                   size_t l) {
  const bool fact = factored(ev.param_layers()[l].desc, a[0].inputs[l]);
  std::vector<torch::Tensor> per_k;
  for (const TrainSignals& t : a) per_k.push_back(fact ? t.signals[l].flatten(1) : layer_sample_gradients(ev, t, l));
  torch::Tensor s = torch::stack(per_k);
  if (!fact) return {s, torch::Tensor()};
  return {s, a[0].inputs[l].flatten(1)};
}

}  // namespace

torch::Tensor tangent_kernel(const SegmentEvaluator& ev, const std::vector<TrainSignals>& a,
                             const std::vector<TrainSignals>& b) {
  PK_CHECK(!a.empty() && a.size() == b.size(), "tangent_kernel: need K signal sets on both sides (got "
                                                   << a.size() << " and " << b.size() << ")");
  torch::Tensor total;  // [A, B, K, K]
  for (size_t l = 0; l < ev.param_layers().size(); ++l) {
    auto [sa, ia] = layer_rows(ev, a, l);
    auto [sb, ib] = layer_rows(ev, b, l);
    torch::Tensor part = torch::einsum("kaq,lbq->abkl", {sa, sb});
    // Linear: <δ_a ⊗ [a_a, 1], δ_b ⊗ [a_b, 1]> = (δ_a·δ_b)(a_a·a_b + 1).
    const double bias = ev.param_layers()[l].bias_numel ? 1.0 : 0.0;
    if (ia.defined()) part = part * torch::addmm(torch::full({1}, bias, ia.options()), ia, ib.t()).view({ia.size(0), ib.size(0), 1, 1});
    total = total.defined() ? total + part : part;
  }
  return total;
}

torch::Tensor tangent_kernel_rows(const SegmentEvaluator& ev, const std::vector<TrainSignals>& a) {
  PK_CHECK(!a.empty(), "tangent_kernel_rows: need K signal sets");
  torch::Tensor total;  // [R, K, K]
  for (size_t l = 0; l < ev.param_layers().size(); ++l) {
    auto [s, in] = layer_rows(ev, a, l);
    torch::Tensor part = torch::einsum("krq,lrq->rkl", {s, s});
    const double bias = ev.param_layers()[l].bias_numel ? 1.0 : 0.0;
    if (in.defined()) part = part * (in.pow(2).sum(1) + bias).view({-1, 1, 1});
    total = total.defined() ? total + part : part;
  }
  return total;
}

namespace {

/// The rows of tensors `v` laid end to end (the one tensor itself, uncopied,
/// when there is one).
torch::Tensor end_to_end(const std::vector<torch::Tensor>& v) { return v.size() == 1 ? v[0] : torch::cat(v); }

/// point_outer_sums written into dest [n, K, ...] (each point's and
/// output's out·cols entries contiguous, as in a view of a dense feature
/// matrix): one product per point, its K outputs' rows stacked
/// ([K·out, rows] × [rows, cols]), in place where its K outputs' entries
/// are laid out as the product's.
void point_outer_sums_into(const TestFeatures& f, const torch::Tensor& s, const torch::Tensor& c,
                           const torch::Tensor& dest) {
  const int64_t K = s.size(0), out = s.size(2), cols = c.size(1), n = f.num_points;
  PK_ASSERT(dest.dim() >= 3 && dest.size(0) == n && dest.size(1) == K && dest[0][0].numel() == out * cols);
  // Rows grouped by test point (kept rows come round by round, so sort them).
  const torch::Tensor order = std::get<1>(f.point.sort(/*stable=*/true, 0, false));
  const torch::Tensor st = s.index_select(1, order).permute({0, 2, 1}).reshape({K * out, -1});  // [K·out, R]
  const torch::Tensor ct = (c * f.weight.view({-1, 1})).index_select(0, order);                  // [R, cols]
  const torch::Tensor counts = torch::bincount(f.point, {}, n);
  auto cnt = counts.accessor<int64_t, 1>();
  for (int64_t p = 0, first = 0; p < n; first += cnt[p], ++p) {
    const torch::Tensor to = dest[p];  // [K, ...]
    if (cnt[p] == 0) {
      to.zero_();
    } else if (to.is_contiguous()) {
      torch::Tensor rows = to.view({K * out, cols});
      torch::mm_out(rows, st.narrow(1, first, cnt[p]), ct.narrow(0, first, cnt[p]));
    } else {
      to.view({K, out * cols}).copy_(torch::mm(st.narrow(1, first, cnt[p]), ct.narrow(0, first, cnt[p])).view({K, -1}));
    }
  }
}

/// Σ_r ω_r s_r c_rᵀ per test point, for a Rows layer's signals s [K, R, out]
/// and per-row columns c [R, cols]: [K, n, out, cols]. One product per test
/// point over its rows, so the [K, R, out, cols] outer products (hundreds
/// of MB for a CNN's last layer) are never formed.
torch::Tensor point_outer_sums(const TestFeatures& f, const torch::Tensor& s, const torch::Tensor& c) {
  const int64_t K = s.size(0), out = s.size(2), cols = c.size(1), n = f.num_points;
  torch::Tensor sums = torch::empty({K, n, out, cols}, s.options());
  point_outer_sums_into(f, s, c, sums.transpose(0, 1));
  return sums;
}

/// A held logits' layer's part of contract_outputs (LayerFeatures::held_h),
/// for training inputs a [B, in] and K' sets of signals sig [B, K]:
/// Σ_{o,i} J̄_k[o, i] δ_o a_i = δ_k (h·a) − Σ_o δ_o (ph_o·a), bias in
/// (a's column of ones): [K, n, K', B].
torch::Tensor held_part(const LayerFeatures& lf, const torch::Tensor& a, const std::vector<torch::Tensor>& sig) {
  const int64_t n = lf.held_h.size(0), cols = lf.held_h.size(1), K = lf.held_ph.size(1), B = a.size(0);
  const torch::Tensor flat = a.reshape({B, -1});
  PK_ASSERT(cols == flat.size(1) || cols == flat.size(1) + 1);
  const torch::Tensor ai = cols > flat.size(1) ? torch::cat({flat, torch::ones({B, 1}, flat.options())}, 1) : flat;
  const torch::Tensor ha = torch::matmul(lf.held_h, ai.t());                                   // [n, B]
  const torch::Tensor pa = torch::matmul(lf.held_ph.reshape({n * K, cols}), ai.t()).view({n, K, B});
  std::vector<torch::Tensor> per;
  for (const torch::Tensor& d : sig) {
    const torch::Tensor dt = d.reshape({B, K}).t();  // [K, B]
    per.push_back(dt.unsqueeze(1) * ha.unsqueeze(0) - (pa * dt.unsqueeze(0)).sum(1).unsqueeze(0));  // [K, n, B]
  }
  return torch::stack(per, 2);
}

/// <J̄_k(x_n), ·> against K' sets of training signals of the same rows (one
/// set of inputs: train_signals' loss signals, or train_output_signals' every
/// output): [n, B, K, K']. What depends on the rows' inputs alone, the Summed
/// form's input products and the Rows form's dense block against the
/// training inputs, is formed once for all K' sets, and each form takes one
/// product for all of them.
torch::Tensor contract_outputs(const SegmentEvaluator& ev, const TestFeatures& f, const std::vector<TrainSignals>& ts) {
  const TrainSignals& t0 = ts.front();
  const int64_t Kp = static_cast<int64_t>(ts.size());
  torch::Tensor total;  // [K, n, K', B]
  for (size_t l = 0; l < f.layers.size(); ++l) {
    const LayerFeatures& lf = f.layers[l];
    std::vector<torch::Tensor> sig;  // K' x [B, ...]
    for (const TrainSignals& t : ts) sig.push_back(t.signals[l]);
    torch::Tensor part;
    switch (lf.form) {
      case Form::Summed: {
        // Σ_r ω_r (δ_r·δ_i)(x·a_i + 1) = (x·a_i + 1)((Σ_r ω_r δ_r)·δ_i): the nodes collapse
        // (without the 1 for a layer without bias).
        const double bias = ev.param_layers()[l].bias_numel ? 1.0 : 0.0;
        const torch::Tensor a = torch::addmm(torch::full({1}, bias, f.weight.options()), lf.inputs, t0.inputs[l].t());
        const int64_t K = lf.signals.size(0), n = lf.signals.size(1), B = a.size(1);
        part = torch::matmul(lf.signals, end_to_end(sig).t()).view({K, n, Kp, B}) * a.view({1, n, 1, B});
        break;
      }
      case Form::Rows: {
        const torch::Tensor& s = lf.signals;  // [K, R, out]
        const int64_t K = s.size(0), R = s.size(1), out = s.size(2), in = lf.inputs.size(1);
        const int64_t n = f.num_points, B = t0.inputs[l].size(0);
        const double bias = ev.param_layers()[l].bias_numel ? 1.0 : 0.0;  // the bias's "input" 1
        const int64_t cols = in + (bias ? 1 : 0);
        if (take_dense_block({K, n, R, in, out, cols, B, Kp})) {
          // Many rows a point against few weights (docs/math.md §8): the
          // dense block J̄ = Σ_r ω_r δ_r [a_r, 1]ᵀ per test point
          // [K, n, out, in+1], then δ_iᵀ J̄ [a_i, 1] for every training row:
          // one GEMM against the training inputs, which are read once
          // (per-sample gradients are never formed).
          torch::Tensor ones = torch::ones({R, 1}, f.weight.options());
          torch::Tensor rows = bias ? torch::cat({lf.inputs, ones}, 1) : lf.inputs;  // [R, in+1]
          torch::Tensor block = point_outer_sums(f, s, rows);  // [K, n, out, in+1]
          torch::Tensor ai = bias ? torch::cat({t0.inputs[l], torch::ones({B, 1}, ones.options())}, 1)
                                  : t0.inputs[l];                                                 // [B, in+1]
          const torch::Tensor y = torch::matmul(block.reshape({K * n * out, cols}), ai.t()).view({K, n, out, B});
          std::vector<torch::Tensor> per;
          for (const torch::Tensor& d : sig) per.push_back((y * d.t().view({1, 1, out, B})).sum(2));  // [K, n, B]
          part = Kp == 1 ? per[0].unsqueeze(2) : torch::stack(per, 2);
        } else {
          const torch::Tensor a =
              torch::addmm(torch::full({1}, bias, f.weight.options()), lf.inputs, t0.inputs[l].t());  // [R, B]
          const torch::Tensor dd = torch::matmul(s, end_to_end(sig).t()).view({K, R, Kp, B});
          part = rows_point_sums(dd, a, f.weight, f.point, n);  // [K, n, K', B]
        }
        break;
      }
      case Form::Dense: {
        if (lf.held_h.defined()) {
          part = held_part(lf, t0.inputs[l], sig);
          break;
        }
        if (lf.hidden.defined()) {
          const torch::Tensor a = t0.inputs[l].flatten(1);
          part = hidden_contract(lf.hidden, lf.hidden.bias ? torch::cat({a, torch::ones({a.size(0), 1}, a.options())}, 1) : a,
                                 sig, f.num_points);
          break;
        }
        std::vector<torch::Tensor> g;  // K' x [B, Q]
        for (const TrainSignals& t : ts) g.push_back(layer_sample_gradients(ev, t, l));
        const torch::Tensor& b = lf.block;  // [K, n, Q]
        part = torch::matmul(b, end_to_end(g).t()).view({b.size(0), b.size(1), Kp, -1});
        break;
      }
    }
    total = total.defined() ? total + part : part;
  }
  return total.permute({1, 3, 0, 2}).contiguous();  // [n, B, K, K']
}

}  // namespace

torch::Tensor output_kernel(const SegmentEvaluator& ev, const TestFeatures& f, const torch::Tensor& x) {
  return contract_outputs(ev, f, train_output_signals(ev, x));
}

torch::Tensor aggregate(const TestFeatures& f, const torch::Tensor& x) {
  std::vector<int64_t> w_shape(x.dim(), 1);
  w_shape[1] = x.size(1);
  return sum_by_group(x * f.weight.view(w_shape), f.point, f.num_points);
}

torch::Tensor apply_features(const SegmentEvaluator& ev, const TestFeatures& f, const torch::Tensor& v) {
  torch::Tensor total;  // [K, n]
  for (size_t l = 0; l < ev.param_layers().size(); ++l) {
    const LayerFeatures& lf = f.layers[l];
    torch::Tensor part;
    switch (lf.form) {
      case Form::Dense:
        if (lf.hidden.defined()) {
          const torch::Tensor w = ev.weight_of(v, l);
          part = hidden_dot(lf.hidden, lf.hidden.bias ? torch::cat({w, ev.bias_of(v, l).unsqueeze(1)}, 1) : w,
                            f.num_points);
          break;
        }
        part = torch::matmul(lf.block, torch::cat({ev.weight_of(v, l).flatten(), ev.bias_of(v, l)}));  // bias [0] if none
        break;
      case Form::Summed:
        part = (lf.signals * layer_direction(ev, l, lf.inputs, v).unsqueeze(0)).sum(2);  // z [n, out]
        break;
      case Form::Rows:
        part = aggregate(f, row_dot(ev, {lf.inputs}, {lf.signals}, v, l));
        break;
    }
    total = total.defined() ? total + part : part;
  }
  return total.t();  // [n, K]
}

torch::Tensor contract(const SegmentEvaluator& ev, const TestFeatures& f, const TrainSignals& t) {
  return contract_outputs(ev, f, {t}).squeeze(3);  // [n, B, K]
}

torch::Tensor dense_features(const SegmentEvaluator& ev, const TestFeatures& f) {
  const int64_t n = f.num_points, K = ev.num_outputs();
  // Each layer writes its own parameters' entries: zeros only where a
  // parameter belongs to none.
  int64_t held = 0;
  for (const ParamLayer& pl : ev.param_layers()) held += pl.weight_numel + pl.bias_numel;
  torch::Tensor out = held == ev.parameter_count() ? torch::empty({n, K, held}, f.f0.options())
                                                   : torch::zeros({n, K, ev.parameter_count()}, f.f0.options());
  for (size_t l = 0; l < ev.param_layers().size(); ++l) {
    const ParamLayer& pl = ev.param_layers()[l];
    torch::Tensor weight, bias;  // [K, n, weight_numel], [K, n, out]
    const LayerFeatures& lf = f.layers[l];
    switch (lf.form) {
      case Form::Dense:
        if (lf.hidden.defined()) {
          write_hidden_block(lf.hidden, pl, out);
          continue;
        }
        weight = lf.block.narrow(2, 0, pl.weight_numel);
        bias = lf.block.narrow(2, pl.weight_numel, pl.bias_numel);
        break;
      case Form::Summed:
        weight = (lf.signals.unsqueeze(3) * lf.inputs.unsqueeze(0).unsqueeze(2)).flatten(2);
        bias = lf.signals;
        break;
      case Form::Rows:  // the products written in place: no [K, n, out·in] formed and copied
        point_outer_sums_into(f, lf.signals, lf.inputs, out.narrow(2, pl.weight_offset, pl.weight_numel));
        bias = aggregate(f, lf.signals);
        break;
    }
    if (weight.defined()) out.narrow(2, pl.weight_offset, pl.weight_numel).copy_(weight.transpose(0, 1));
    if (pl.bias_numel) out.narrow(2, pl.bias_offset, pl.bias_numel).copy_(bias.transpose(0, 1));
  }
  return out;
}

torch::Tensor linear_rows_contraction(const torch::Tensor& w, const torch::Tensor& a, const torch::Tensor& delta) {
  const int64_t n = w.size(0), K = w.size(1), out = w.size(2), in = w.size(3), B = a.size(0);
  const torch::Tensor wa = torch::bmm(w.reshape({n * K, out, in}), a.t().unsqueeze(0).expand({n * K, in, B}));
  return torch::einsum("nkob,bo->nbk", {wa.view({n, K, out, B}), delta});
}

torch::Tensor contract_dense(const SegmentEvaluator& ev, const torch::Tensor& a, const TrainSignals& t) {
  const int64_t n = a.size(0), K = a.size(1);
  torch::Tensor total;  // [n, B, K]
  for (size_t l = 0; l < ev.param_layers().size(); ++l) {
    const ParamLayer& pl = ev.param_layers()[l];
    const LayerDesc& d = pl.desc;
    torch::Tensor bias = a.narrow(2, pl.bias_offset, pl.bias_numel);                    // [n, K, out]
    torch::Tensor part;
    if (factored(d, t.inputs[l])) {
      const int64_t out = pl.weight_shape[0], in = pl.weight_shape[1];
      torch::Tensor w = a.narrow(2, pl.weight_offset, pl.weight_numel).reshape({n, K, out, in});
      const torch::Tensor& delta = t.signals[l];                                        // [B, out]
      part = linear_rows_contraction(w, t.inputs[l].flatten(1), delta);
      if (pl.bias_numel) part = part + torch::einsum("nko,bo->nbk", {bias, delta});
    } else {
      torch::Tensor g = layer_sample_gradients(ev, t, l);                              // [B, Q]
      torch::Tensor block = torch::cat({a.narrow(2, pl.weight_offset, pl.weight_numel), bias}, 2);  // [n, K, Q]
      part = torch::einsum("nkq,bq->nbk", {block, g});
    }
    total = total.defined() ? total + part : part;
  }
  return total;
}

FeatureLayout feature_layout(const SegmentEvaluator& ev, const torch::Tensor& example) {
  return ev.path_route().feature_layout(ev, example);
}

FeatureLayout layered_feature_layout(const SegmentEvaluator& ev, const torch::Tensor& example) {
  const SegmentPass pass = ev.forward(example, torch::zeros({example.size(0)}, example.options()), false);
  FeatureLayout layout;
  layout.factored = true;
  int64_t total = 0;
  for (size_t l = 0; l < pass.inputs.size(); ++l) {
    total += pass.inputs[l].numel() + (ev.num_outputs() + 2) * pass.preacts[l].numel();
    if (layer_form(ev, l, pass.inputs[l]) == Form::Dense) layout.factored = false;
  }
  layout.doubles_per_row = total / std::max<int64_t>(1, example.size(0));
  return layout;
}

torch::Tensor feature_angle(const SegmentEvaluator& ev, const TestFeatures& a, const TestFeatures& b) {
  PK_CHECK(a.num_points == b.num_points, "feature_angle: " << a.num_points << " vs " << b.num_points << " test points");
  const torch::Tensor u = dense_features(ev, a).reshape({a.num_points, -1});
  const torch::Tensor v = dense_features(ev, b).reshape({b.num_points, -1});
  const torch::Tensor cos = (u * v).sum(1) / (u.norm(2, 1) * v.norm(2, 1));
  return torch::acos(cos.clamp(-1.0, 1.0)) * (180.0 / M_PI);
}

}  // namespace pathkernel
