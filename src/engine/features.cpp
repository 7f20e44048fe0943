// Test features with certified quadrature, and the structured contractions.
#include "pathkernel/features.h"

#include <algorithm>

#include "pathkernel/error.h"

namespace pathkernel {

namespace {

using Kind = LayerDesc::Kind;

torch::Tensor unfold(const torch::Tensor& a, const LayerDesc& d) {
  namespace F = torch::nn::functional;
  return F::unfold(a, F::UnfoldFuncOptions({d.kernel, d.kernel}).padding(d.padding));
}

/// Layer l's output change for parameter direction v: layer(a; v) with v's bias.
torch::Tensor layer_direction(const SegmentEvaluator& ev, size_t l, const torch::Tensor& a, const torch::Tensor& v) {
  const LayerDesc& d = ev.param_layers()[l].desc;
  if (d.kind == Kind::Linear) return torch::addmm(ev.bias_of(v, l), a, ev.weight_of(v, l).t());
  return torch::conv2d(a, ev.weight_of(v, l), ev.bias_of(v, l), 1, d.padding);
}

/// Per-row directional derivatives J(w(t_r), x_r) v: [K, R].
torch::Tensor row_dot(const SegmentEvaluator& ev, const std::vector<torch::Tensor>& inputs,
                      const std::vector<torch::Tensor>& signals, const torch::Tensor& v) {
  torch::Tensor total;
  for (size_t l = 0; l < inputs.size(); ++l) {
    torch::Tensor z = layer_direction(ev, l, inputs[l], v);                      // [R, ...]
    torch::Tensor s = (signals[l] * z.unsqueeze(0)).flatten(2).sum(2);           // [K, R]
    total = total.defined() ? total + s : s;
  }
  return total;
}

/// Signals for every output k of a tracked pass, stacked per layer as [K, R, ...].
std::vector<torch::Tensor> all_signals(const SegmentEvaluator& ev, const SegmentPass& pass) {
  const int64_t k_out = ev.num_outputs(), rows = pass.out.size(0);
  std::vector<std::vector<torch::Tensor>> per_k;
  for (int64_t k = 0; k < k_out; ++k) {
    torch::Tensor c = torch::zeros({rows, k_out}, pass.out.options().requires_grad(false));
    c.select(1, k).fill_(1);
    per_k.push_back(ev.signals(pass, c));
  }
  std::vector<torch::Tensor> stacked;
  for (size_t l = 0; l < pass.preacts.size(); ++l) {
    std::vector<torch::Tensor> ks;
    for (auto& s : per_k) ks.push_back(s[l]);
    stacked.push_back(torch::stack(ks));
  }
  return stacked;
}

/// A sub-interval [a, b] of one test point's segment.
struct Piece {
  int64_t point;
  double a, b;
  int depth;
};

constexpr double kEps = 2.220446049250313e-16;

/// A kink of the integrand inside a piece: where y[plus] - y[minus] (or
/// y[plus] alone when minus < 0) changes sign, y being param layer `layer`'s
/// pre-activation flattened per row. A ReLU unit that flips is (unit, -1); a
/// max-pool window whose argmax switches from i to j is (j, i).
struct Kink {
  int64_t layer = -1, plus = -1, minus = -1;
};

double kink_value(const torch::TensorAccessor<double, 2>& y, int64_t row, const Kink& k) {
  return y[row][k.plus] - (k.minus >= 0 ? y[row][k.minus] : 0.0);
}

/// For each failed piece, a kink inside it located by bisection on all pieces
/// at once, to machine precision; the midpoint where none is seen (a smooth
/// piece that needs splitting). `ends` holds the end rows of all pending
/// pieces (2p: a, 2p+1: b); `index` maps failed pieces to pending ones.
std::vector<double> locate_kinks(const SegmentEvaluator& ev, const torch::Tensor& x, const SegmentPass& ends,
                                 const std::vector<Piece>& failed, const std::vector<int64_t>& index) {
  const int64_t nf = static_cast<int64_t>(failed.size());
  std::vector<double> cut(nf);
  for (int64_t i = 0; i < nf; ++i) cut[i] = 0.5 * (failed[i].a + failed[i].b);
  if (nf == 0) return cut;
  torch::Tensor at_a = torch::tensor(index, torch::kLong) * 2, at_b = at_a + 1;
  std::vector<Kink> kinks(nf);
  for (size_t l = 0; l < ev.relu_after().size(); ++l) {
    if (!ev.relu_after()[l]) continue;
    torch::Tensor y = ends.preacts[l].detach();
    torch::Tensor ya = y.index_select(0, at_a), yb = y.index_select(0, at_b);
    // ReLU units that change sign.
    torch::Tensor flips = ((ya.flatten(1) > 0) != (yb.flatten(1) > 0));
    torch::Tensor any = flips.any(1), first = flips.to(torch::kInt).argmax(1);
    for (int64_t i = 0; i < nf; ++i) {
      if (kinks[i].layer < 0 && any[i].item<bool>()) kinks[i] = {static_cast<int64_t>(l), first[i].item<int64_t>(), -1};
    }
    // Max-pool windows whose (positive) argmax switches.
    if (int64_t k = ev.pool_after()[l]) {
      auto [ma, ia] = torch::max_pool2d_with_indices(ya, k);
      auto [mb, ib] = torch::max_pool2d_with_indices(yb, k);
      torch::Tensor sw = ((ia != ib) & ((ma > 0) | (mb > 0))).flatten(1);
      torch::Tensor plane = torch::arange(ia.size(1)).view({1, -1, 1, 1}) * (ya.size(2) * ya.size(3));
      torch::Tensor ua = (ia + plane).flatten(1), ub = (ib + plane).flatten(1);
      torch::Tensor any_sw = sw.any(1), first_sw = sw.to(torch::kInt).argmax(1);
      for (int64_t i = 0; i < nf; ++i) {
        if (kinks[i].layer < 0 && any_sw[i].item<bool>()) {
          int64_t w = first_sw[i].item<int64_t>();
          kinks[i] = {static_cast<int64_t>(l), ub[i][w].item<int64_t>(), ua[i][w].item<int64_t>()};
        }
      }
    }
  }
  std::vector<int64_t> who;
  for (int64_t i = 0; i < nf; ++i) {
    if (kinks[i].layer >= 0) who.push_back(i);
  }
  if (who.empty()) return cut;
  const int64_t nw = static_cast<int64_t>(who.size());
  std::vector<double> lo(nw), hi(nw);
  std::vector<int64_t> rows(nw);
  std::vector<bool> positive_at_a(nw);
  std::vector<torch::Tensor> flat_a(ends.preacts.size());
  for (size_t l = 0; l < ends.preacts.size(); ++l) flat_a[l] = ends.preacts[l].detach().flatten(1).contiguous();
  for (int64_t j = 0; j < nw; ++j) {
    const int64_t i = who[j];
    lo[j] = failed[i].a;
    hi[j] = failed[i].b;
    rows[j] = failed[i].point;
    positive_at_a[j] = kink_value(flat_a[kinks[i].layer].accessor<double, 2>(), 2 * index[i], kinks[i]) > 0;
  }
  torch::Tensor xr = x.index_select(0, torch::tensor(rows, torch::kLong));
  for (int iter = 0; iter < 64; ++iter) {
    std::vector<double> mid(nw);
    bool moved = false;
    for (int64_t j = 0; j < nw; ++j) {
      mid[j] = 0.5 * (lo[j] + hi[j]);
      moved |= mid[j] > lo[j] && mid[j] < hi[j];
    }
    if (!moved) break;
    SegmentPass pm = ev.forward(xr, torch::tensor(mid, x.options()), false);
    std::vector<torch::Tensor> flat(pm.preacts.size());
    for (size_t l = 0; l < pm.preacts.size(); ++l) flat[l] = pm.preacts[l].flatten(1).contiguous();
    for (int64_t j = 0; j < nw; ++j) {
      const Kink& k = kinks[who[j]];
      double v = kink_value(flat[k.layer].accessor<double, 2>(), j, k);
      ((v > 0) == positive_at_a[j] ? lo[j] : hi[j]) = mid[j];
    }
  }
  for (int64_t j = 0; j < nw; ++j) {
    const Piece& pc = failed[who[j]];
    double t = 0.5 * (lo[j] + hi[j]);
    if (t > pc.a && t < pc.b) cut[who[j]] = t;
  }
  return cut;
}

/// Dense Conv2d blocks J̄ [K, n, Q] from rows.
void build_dense(const SegmentEvaluator& ev, TestFeatures& f) {
  f.dense.assign(f.inputs.size(), torch::Tensor());
  for (size_t l = 0; l < f.inputs.size(); ++l) {
    const LayerDesc& d = ev.param_layers()[l].desc;
    if (d.kind != Kind::Conv2d) continue;
    torch::Tensor u = unfold(f.inputs[l], d);                                  // [R, Cin·k·k, L]
    const torch::Tensor& s = f.signals[l];                                     // [K, R, Cout, H, W]
    torch::Tensor sig = s.flatten(3);                                          // [K, R, Cout, L]
    torch::Tensor gw = torch::matmul(sig, u.transpose(1, 2).unsqueeze(0));     // [K, R, Cout, Cin·k·k]
    torch::Tensor g = torch::cat({gw.flatten(2), sig.sum(3)}, 2);              // [K, R, Q]
    f.dense[l] = aggregate(f, g);                                              // [K, n, Q]
  }
}

void finish(const SegmentEvaluator& ev, TestFeatures& f, const torch::Tensor& x, const torch::Tensor& dw) {
  build_dense(ev, f);
  if (ev.param_layers()[0].desc.kind == Kind::Linear) {
    f.first_inputs = x.flatten(1);
    f.first_signal = aggregate(f, f.signals[0]);  // [K, n, out]
  }
  torch::Tensor jdw = apply_features(ev, f, dw);
  torch::Tensor scale = f.f0.abs().amax(1, true).clamp_min(1.0);
  f.certificate_gap = ((jdw - (f.f1 - f.f0)).abs() / scale).max().item<double>();
}

}  // namespace

TestFeatures test_features(const SegmentEvaluator& ev, const torch::Tensor& x, const QuadratureOptions& q) {
  const int64_t n = x.size(0);
  const auto opts = x.options();
  TestFeatures f;
  f.num_points = n;
  SegmentPass p0 = ev.forward(x, torch::zeros({n}, opts), false);
  SegmentPass p1 = ev.forward(x, torch::ones({n}, opts), false);
  f.f0 = p0.out;
  f.f1 = p1.out;

  // Fixed rules: every test point gets the same nodes.
  auto fixed_rows = [&](const QuadratureRule& rule) {
    const int64_t t_count = static_cast<int64_t>(rule.nodes.size());
    torch::Tensor point = torch::arange(n).repeat_interleave(t_count);
    torch::Tensor t = torch::tensor(rule.nodes, opts).repeat({n});
    torch::Tensor w = torch::tensor(rule.weights, opts).repeat({n});
    return std::make_tuple(point, t, w);
  };

  std::vector<torch::Tensor> kept_point, kept_weight;
  std::vector<std::vector<torch::Tensor>> kept_inputs, kept_signals;
  auto keep = [&](const SegmentPass& pass, const std::vector<torch::Tensor>& sig, const torch::Tensor& rows,
                  const torch::Tensor& point, const torch::Tensor& weight) {
    std::vector<torch::Tensor> in, sg;
    for (size_t l = 0; l < sig.size(); ++l) {
      in.push_back(pass.inputs[l].detach().index_select(0, rows));
      sg.push_back(sig[l].index_select(1, rows));
    }
    kept_inputs.push_back(in);
    kept_signals.push_back(sg);
    kept_point.push_back(point.index_select(0, rows));
    kept_weight.push_back(weight.index_select(0, rows));
  };

  if (q.spec.kind != QuadratureSpec::Kind::Gauss) {
    QuadratureRule rule = q.spec.kind == QuadratureSpec::Kind::Dpk ? left_point() : riemann(q.spec.nodes);
    auto [point, t, w] = fixed_rows(rule);
    SegmentPass pass = ev.forward(x.index_select(0, point), t, true);
    std::vector<torch::Tensor> sig = all_signals(ev, pass);
    keep(pass, sig, torch::arange(point.size(0)), point, w);
    f.evaluations = point.size(0);
  } else {
    // Initial pieces: split [0,1] at the first layer's ReLU kinks, which are
    // closed-form because its pre-activation is affine in t.
    const bool first_relu = ev.relu_after()[0];
    std::vector<Piece> pending;
    torch::Tensor y0 = p0.preacts[0].flatten(1).contiguous(), y1 = p1.preacts[0].flatten(1).contiguous();
    for (int64_t i = 0; i < n; ++i) {
      std::vector<double> cuts;
      if (first_relu) {
        std::vector<double> a(y0[i].data_ptr<double>(), y0[i].data_ptr<double>() + y0.size(1));
        std::vector<double> b(y1[i].data_ptr<double>(), y1[i].data_ptr<double>() + y1.size(1));
        cuts = affine_crossings(a, b);
      }
      std::vector<double> br = breakpoints(cuts);
      for (size_t j = 0; j + 1 < br.size(); ++j) pending.push_back({i, br[j], br[j + 1], 0});
    }
    torch::Tensor scale = f.f0.abs().amax(1).clamp_min(1.0);  // [n]
    QuadratureRule unit = gauss_legendre(q.gauss_nodes, 0.0, 1.0);
    const int64_t g = q.gauss_nodes;
    while (!pending.empty()) {
      const int64_t np = static_cast<int64_t>(pending.size());
      std::vector<int64_t> point(np * g), piece_of(np * g), end_point(2 * np);
      std::vector<double> t(np * g), w(np * g), ends(2 * np);
      for (int64_t p = 0; p < np; ++p) {
        const Piece& pc = pending[p];
        for (int64_t j = 0; j < g; ++j) {
          point[p * g + j] = pc.point;
          piece_of[p * g + j] = p;
          t[p * g + j] = pc.a + (pc.b - pc.a) * unit.nodes[j];
          w[p * g + j] = (pc.b - pc.a) * unit.weights[j];
        }
        end_point[2 * p] = end_point[2 * p + 1] = pc.point;
        ends[2 * p] = pc.a;
        ends[2 * p + 1] = pc.b;
      }
      torch::Tensor point_t = torch::tensor(point, torch::kLong), w_t = torch::tensor(w, opts);
      SegmentPass pass = ev.forward(x.index_select(0, point_t), torch::tensor(t, opts), true);
      std::vector<torch::Tensor> sig = all_signals(ev, pass);
      f.evaluations += np * g;
      // Per-piece certificate: Σ_nodes ω J dw against f(b) − f(a).
      torch::Tensor rd = row_dot(ev, pass.inputs, sig, ev.direction()).detach();   // [K, R]
      torch::Tensor integral = torch::zeros({np, rd.size(0)}, opts).index_add_(
          0, torch::tensor(piece_of, torch::kLong), (rd * w_t.unsqueeze(0)).t());   // [np, K]
      SegmentPass pe = ev.forward(x.index_select(0, torch::tensor(end_point, torch::kLong)),
                                  torch::tensor(ends, opts), false);
      torch::Tensor fe = pe.out.view({np, 2, -1});
      torch::Tensor gap = (integral - (fe.select(1, 1) - fe.select(1, 0))).abs().amax(1);  // [np]
      std::vector<Piece> next, failed;
      std::vector<int64_t> accepted_rows, failed_index;
      auto gap_a = gap.accessor<double, 1>();
      auto scale_a = scale.accessor<double, 1>();
      for (int64_t p = 0; p < np; ++p) {
        const Piece& pc = pending[p];
        // The tolerance shares tol * scale over [0,1] by length, with a floor
        // for the rounding of f(b) - f(a) itself.
        double limit = std::max(q.tol * (pc.b - pc.a), 64 * kEps) * scale_a[pc.point];
        if (gap_a[p] <= limit || pc.depth >= q.max_depth) {
          for (int64_t j = 0; j < g; ++j) accepted_rows.push_back(p * g + j);
        } else {
          failed.push_back(pc);
          failed_index.push_back(p);
        }
      }
      // Split each failed piece at a kink inside it, else at its midpoint.
      std::vector<double> cut = locate_kinks(ev, x, pe, failed, failed_index);
      for (size_t i = 0; i < failed.size(); ++i) {
        const Piece& pc = failed[i];
        next.push_back({pc.point, pc.a, cut[i], pc.depth + 1});
        next.push_back({pc.point, cut[i], pc.b, pc.depth + 1});
      }
      if (!accepted_rows.empty()) keep(pass, sig, torch::tensor(accepted_rows, torch::kLong), point_t, w_t);
      pending = std::move(next);
    }
  }

  // Assemble the kept rows.
  const size_t layers = kept_inputs.front().size();
  f.inputs.resize(layers);
  f.signals.resize(layers);
  for (size_t l = 0; l < layers; ++l) {
    std::vector<torch::Tensor> in, sg;
    for (size_t c = 0; c < kept_inputs.size(); ++c) {
      in.push_back(kept_inputs[c][l]);
      sg.push_back(kept_signals[c][l]);
    }
    f.inputs[l] = torch::cat(in, 0);
    f.signals[l] = torch::cat(sg, 1);
  }
  torch::Tensor point = torch::cat(kept_point), weight = torch::cat(kept_weight);
  f.point = point;
  f.weight = weight;
  finish(ev, f, x, ev.direction());
  return f;
}

TrainSignals train_signals(const SegmentEvaluator& ev, const torch::Tensor& x, const torch::Tensor& y,
                           OutputMap map) {
  SegmentPass pass = ev.forward(x, torch::zeros({x.size(0)}, x.options()), true);
  torch::Tensor out = pass.out.detach();
  torch::Tensor onehot = torch::zeros_like(out).scatter_(1, y.view({-1, 1}), 1.0);
  // u_i = ∂ℓ_i/∂f: NLL on log-probabilities, or cross entropy on logits.
  torch::Tensor u = map == OutputMap::LogSoftmax ? -onehot : torch::softmax(out, 1) - onehot;
  TrainSignals t;
  t.signals = ev.signals(pass, u);
  for (auto& a : pass.inputs) t.inputs.push_back(a.detach());
  return t;
}

torch::Tensor aggregate(const TestFeatures& f, const torch::Tensor& x) {
  std::vector<int64_t> shape = x.sizes().vec();
  shape[1] = f.num_points;
  std::vector<int64_t> w_shape(x.dim(), 1);
  w_shape[1] = x.size(1);
  return torch::zeros(shape, x.options()).index_add_(1, f.point, x * f.weight.view(w_shape));
}

torch::Tensor apply_features(const SegmentEvaluator& ev, const TestFeatures& f, const torch::Tensor& v) {
  return aggregate(f, row_dot(ev, f.inputs, f.signals, v)).t();  // [n, K]
}

torch::Tensor contract(const SegmentEvaluator& ev, const TestFeatures& f, const TrainSignals& t) {
  torch::Tensor total;  // [K, n, B]
  for (size_t l = 0; l < f.inputs.size(); ++l) {
    const LayerDesc& d = ev.param_layers()[l].desc;
    torch::Tensor part;
    if (l == 0 && f.first_signal.defined()) {
      // Σ_r ω_r (δ_r·δ_i)(x·a_i + 1) = (x·a_i + 1)((Σ_r ω_r δ_r)·δ_i): the nodes collapse.
      torch::Tensor a = torch::addmm(torch::ones({1}, f.weight.options()), f.first_inputs, t.inputs[0].t());  // [n, B]
      part = torch::matmul(f.first_signal, t.signals[0].t()) * a.unsqueeze(0);     // [K, n, B]
    } else if (d.kind == Kind::Linear) {
      const torch::Tensor& s = f.signals[l];                                       // [K, R, out]
      torch::Tensor a = torch::addmm(torch::ones({1}, f.weight.options()), f.inputs[l], t.inputs[l].t());  // [R, B]
      torch::Tensor dd = torch::matmul(s, t.signals[l].t());                        // [K, R, B]
      part = aggregate(f, dd * a.unsqueeze(0));                                    // [K, n, B]
    } else {
      torch::Tensor u = unfold(t.inputs[l], d);                                    // [B, Cin·k·k, L]
      torch::Tensor sig = t.signals[l].flatten(2);                                 // [B, Cout, L]
      torch::Tensor g = torch::cat({torch::bmm(sig, u.transpose(1, 2)).flatten(1), sig.sum(2)}, 1);  // [B, Q]
      part = torch::matmul(f.dense[l], g.t());                                     // [K, n, B]
    }
    total = total.defined() ? total + part : part;
  }
  return total.permute({1, 2, 0}).contiguous();  // [n, B, K]
}

int64_t feature_doubles_per_row(const SegmentEvaluator& ev, const torch::Tensor& example) {
  SegmentPass pass = ev.forward(example, torch::zeros({example.size(0)}, example.options()), false);
  int64_t total = 0;
  for (size_t l = 0; l < pass.inputs.size(); ++l) {
    total += pass.inputs[l].numel() + (ev.num_outputs() + 2) * pass.preacts[l].numel();
  }
  return total / std::max<int64_t>(1, example.size(0));
}

}  // namespace pathkernel
