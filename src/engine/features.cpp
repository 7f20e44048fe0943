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
#include "point_groups.h"

namespace pathkernel {

namespace {

using Kind = LayerDesc::Kind;
using Form = LayerFeatures::Form;

/// Per-sample gradients of layer l (weight, then bias) from training
/// signals: [B, Q]. A Module's signals are its per-sample gradients [B, P]
/// already.
torch::Tensor layer_sample_gradients(const SegmentEvaluator& ev, const TrainSignals& t, size_t l) {
  const ParamLayer& p = ev.param_layers()[l];
  if (p.desc.kind == Kind::Module) return t.signals[l];
  if (l < t.gradients.size() && t.gradients[l].defined()) return t.gradients[l];
  return sample_gradients_one(p.desc, t.inputs[l], t.signals[l], p.weight_shape, p.bias_numel);
}

/// Layer l's output change for parameter direction v: op_dir(a; v).
torch::Tensor layer_direction(const SegmentEvaluator& ev, size_t l, const torch::Tensor& a, const torch::Tensor& v) {
  return layer_direction(ev.param_layers()[l].desc, a, ev.weight_of(v, l), ev.bias_or_none(v, l));
}

/// Per-row directional derivatives J(w(t_r), x_r) v: [K, R].
/// Layers are param layers first_layer, first_layer + 1, ...
/// `directions`, when given, holds each layer's layer_direction(a_l, v) already.
torch::Tensor row_dot(const SegmentEvaluator& ev, const std::vector<torch::Tensor>& inputs,
                      const std::vector<torch::Tensor>& signals, const torch::Tensor& v, size_t first_layer = 0,
                      const std::vector<torch::Tensor>* directions = nullptr) {
  torch::Tensor total;
  for (size_t l = 0; l < inputs.size(); ++l) {
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

/// Per-row J(w(t_r), x_r) dw of a pass, [K, R], for its signals: the
/// directions its forward pass formed where it kept them.
torch::Tensor segment_dot(const SegmentEvaluator& ev, const SegmentPass& pass,
                          const std::vector<torch::Tensor>& signals) {
  const bool kept = pass.directions.size() == pass.inputs.size();
  return row_dot(ev, pass.inputs, signals, ev.direction(), 0, kept ? &pass.directions : nullptr);
}

/// Signals of a pass for K cotangents at once, c [K, R, K_out]: per param
/// layer [K, R, ...]. Own networks walk their layers back once over all K·R
/// rows (the pass may be untracked); other routes take one autograd
/// backward per k through the pass's graph.
std::vector<torch::Tensor> batched_signals(const SegmentEvaluator& ev, const SegmentPass& pass,
                                           const torch::Tensor& c, bool of_logits = false) {
  if (ev.hand_backward()) return ev.hand_signals(pass, c, of_logits);
  std::vector<std::vector<torch::Tensor>> per_k;
  for (int64_t k = 0; k < c.size(0); ++k) per_k.push_back(ev.signals(pass, c[k], of_logits));
  std::vector<torch::Tensor> stacked;
  for (size_t l = 0; l < pass.preacts.size(); ++l) {
    std::vector<torch::Tensor> ks;
    for (auto& s : per_k) ks.push_back(s[l]);
    stacked.push_back(torch::stack(ks));
  }
  return stacked;
}

/// The cotangents e_k of every output k on every row: [K, R, K].
torch::Tensor unit_cotangents(const SegmentEvaluator& ev, int64_t rows, const torch::TensorOptions& opts) {
  const int64_t k_out = ev.num_outputs();
  return torch::eye(k_out, opts).unsqueeze(1).expand({k_out, rows, k_out});
}

/// Signals for every output k (with `of_logits`, every logit) of a pass,
/// per layer as [K, R, ...].
std::vector<torch::Tensor> all_signals(const SegmentEvaluator& ev, const SegmentPass& pass, bool of_logits = false) {
  return batched_signals(ev, pass, unit_cotangents(ev, pass.out.size(0), pass.out.options()), of_logits);
}

/// Whether passes must keep an autograd graph for their signals.
bool track_passes(const SegmentEvaluator& ev) { return !ev.hand_backward(); }

/// A sub-interval [a, b] of one test point's segment.
struct Piece {
  int64_t point;
  double a, b;
  int depth;
  double parent_gap = std::numeric_limits<double>::infinity();  ///< certificate gap of the piece it was split from
  bool full = false;  ///< take the exact nodes (nodes_for), after fewer failed without a kink
};

constexpr double kEps = 2.220446049250313e-16;
/// Kinks closer than this (in t) to a piece end or to each other are merged:
/// the integral over such a sliver is below the rounding of f(b) − f(a).
constexpr double kMinPiece = 64 * kEps;

/// Splits `pc` at the sorted points `cuts` (those inside it), else at its midpoint.
void split(const Piece& pc, double gap, const std::vector<double>& cuts, std::vector<Piece>& out) {
  double last = pc.a;
  for (double c : cuts) {
    if (c - last > kMinPiece && pc.b - c > kMinPiece) {
      out.push_back({pc.point, last, c, pc.depth + 1, gap});
      last = c;
    }
  }
  if (last == pc.a) {
    const double mid = 0.5 * (pc.a + pc.b);
    out.push_back({pc.point, pc.a, mid, pc.depth + 1, gap});
    last = mid;
  }
  out.push_back({pc.point, last, pc.b, pc.depth + 1, gap});
}

/// Gauss–Legendre nodes for a piece: gauss_nodes on [0,1], fewer on shorter
/// pieces (whose integrand is closer to a low-degree polynomial), at least
/// min_nodes. When `exact` > 0 (the nodes that integrate a piece of a
/// piecewise-linear network exactly, whatever its length) never more than
/// that, and that many on a piece marked `full`: on a network with many
/// kinks most pieces are short enough for fewer nodes to pass the
/// certificate, and one that fails without a kink inside is retried with
/// all of them rather than split.
int64_t nodes_for(const QuadratureOptions& q, const Piece& pc, int64_t exact) {
  const double n_h = std::ceil(q.gauss_nodes * std::sqrt(pc.b - pc.a));
  const auto adaptive =
      static_cast<int64_t>(std::clamp<double>(n_h, std::min(q.min_nodes, q.gauss_nodes), q.gauss_nodes));
  if (exact <= 0) return adaptive;
  return pc.full ? exact : std::min(adaptive, exact);
}

/// One round of adaptive Gauss: the pieces it evaluates, laid out as rows.
/// Piece p owns rows first[p] .. first[p+1]-1 (its nodes) and end rows 2p,
/// 2p+1 (its ends a and b). With split moments (log-softmax pieces of a
/// piecewise-linear network), it also owns moment rows mfirst[p] ..
/// mfirst[p+1]-1 (none for a piece that is not split): nodes where only the
/// softmax factor's single cotangent is walked back (softmax_moments).
struct PieceRound {
  int64_t np = 0, rows = 0, moment_rows = 0;
  std::vector<int64_t> first;                     ///< [np + 1]
  std::vector<int64_t> point, piece_of;           ///< per row: test point, piece
  std::vector<double> t, w;                       ///< per row: node and weight
  std::vector<int64_t> end_point;                 ///< [2 np]: test point of each end
  std::vector<double> ends;                       ///< [2 np]: a, b of each piece
  std::vector<int64_t> mfirst;                    ///< [np + 1]
  std::vector<int64_t> mpoint, mpiece_of;         ///< per moment row: test point, piece
  std::vector<double> mt;                         ///< per moment row: its node
};

/// A piece's nodes when its log-softmax integrand is split (docs/math.md §7):
/// of a budget of m interpolation nodes, ⌈m/2⌉ Gauss–Legendre nodes carry
/// the logits' Jacobian (every output's cotangent) and the others, the
/// Gauss nodes of the next lower order for odd m and of the next higher for
/// even m (the zeros of consecutive Legendre polynomials interlace, so no
/// node repeats), carry the softmax factor alone.
int64_t logit_nodes(int64_t m) { return (m + 1) / 2; }
int64_t moment_nodes(int64_t m) { return m < 2 ? 0 : m % 2 ? m / 2 : m / 2 + 1; }

/// Whether splitting a piece of m nodes and K outputs saves work, counting
/// a forward pass and each cotangent walked back as one: m (K + 1) whole,
/// against ⌈m/2⌉ (K + 1) + 2 · moment nodes split (not for m = 2 and K ≤ 3).
bool split_pays(int64_t m, int64_t outputs) {
  return logit_nodes(m) * (outputs + 1) + 2 * moment_nodes(m) < m * (outputs + 1);
}

/// Takes the pieces of the next round from the front of `pending`: at most
/// max_rows nodes, at least one piece. `pending` keeps them, `next` receives
/// the others (to wait for the next round), so memory stays bounded.
/// `split_outputs` > 0 (log-softmax pieces with that many outputs): pieces
/// are split into Gauss and moment nodes where that saves work.
PieceRound next_round(std::vector<Piece>& pending, std::vector<Piece>& next, const QuadratureOptions& q,
                      int64_t max_rows, int64_t exact_nodes, int64_t split_outputs) {
  PieceRound rd;
  rd.first = {0};
  std::vector<int64_t> moments;  // per piece: its moment nodes
  int64_t taken = 0;
  for (const Piece& pc : pending) {
    const int64_t m = nodes_for(q, pc, exact_nodes);
    const bool split = split_outputs > 0 && split_pays(m, split_outputs);
    const int64_t nodes = split ? logit_nodes(m) : m, extra = split ? moment_nodes(m) : 0;
    if (rd.first.size() > 1 && taken + nodes + extra > max_rows) break;
    taken += nodes + extra;
    rd.first.push_back(rd.first.back() + nodes);
    moments.push_back(extra);
  }
  rd.np = static_cast<int64_t>(rd.first.size()) - 1;
  next.assign(pending.begin() + rd.np, pending.end());
  pending.resize(rd.np);
  rd.rows = rd.first[rd.np];
  rd.point.resize(rd.rows);
  rd.piece_of.resize(rd.rows);
  rd.t.resize(rd.rows);
  rd.w.resize(rd.rows);
  rd.end_point.resize(2 * rd.np);
  rd.ends.resize(2 * rd.np);
  rd.mfirst = {0};
  for (int64_t p = 0; p < rd.np; ++p) {
    const Piece& pc = pending[p];
    const QuadratureRule& rule = gauss_legendre(static_cast<int>(rd.first[p + 1] - rd.first[p]), 0.0, 1.0);
    for (int64_t j = 0, r = rd.first[p]; r < rd.first[p + 1]; ++j, ++r) {
      rd.point[r] = pc.point;
      rd.piece_of[r] = p;
      rd.t[r] = pc.a + (pc.b - pc.a) * rule.nodes[j];
      rd.w[r] = (pc.b - pc.a) * rule.weights[j];
    }
    rd.end_point[2 * p] = rd.end_point[2 * p + 1] = pc.point;
    rd.ends[2 * p] = pc.a;
    rd.ends[2 * p + 1] = pc.b;
    const int64_t extra = moments[p];
    if (extra > 0) {
      for (double u : gauss_legendre(static_cast<int>(extra), 0.0, 1.0).nodes) {
        rd.mpoint.push_back(pc.point);
        rd.mpiece_of.push_back(p);
        rd.mt.push_back(pc.a + (pc.b - pc.a) * u);
      }
    }
    rd.mfirst.push_back(rd.mfirst.back() + extra);
  }
  rd.moment_rows = rd.mfirst.back();
  return rd;
}

/// Rows (point[j], t[j]) as rows of three passes laid end to end: the
/// segment's start (row i: t = 0 of test point i), its end (n + i: t = 1)
/// and `fresh`, the other distinct (point, t) pairs, each once. The scan's
/// ends and the pieces' ends (neighbouring pieces share one, and f is
/// continuous there) are found this way.
struct SharedRows {
  std::vector<int64_t> fresh_point;  ///< per fresh row: its test point
  std::vector<double> fresh_t;       ///< per fresh row: its t
  std::vector<int64_t> index;        ///< per (point[j], t[j]): its row in (start, end, fresh)
};

SharedRows shared_rows(const std::vector<int64_t>& point, const std::vector<double>& t, int64_t n) {
  SharedRows e;
  std::map<std::pair<int64_t, double>, int64_t> seen;
  e.index.reserve(t.size());
  for (size_t j = 0; j < t.size(); ++j) {
    const int64_t i = point[j];
    if (t[j] == 0.0 || t[j] == 1.0) {
      e.index.push_back(t[j] == 0.0 ? i : n + i);
      continue;
    }
    auto [it, fresh] = seen.emplace(std::make_pair(i, t[j]), 2 * n + static_cast<int64_t>(e.fresh_t.size()));
    if (fresh) {
      e.fresh_point.push_back(i);
      e.fresh_t.push_back(t[j]);
    }
    e.index.push_back(it->second);
  }
  return e;
}

/// Rows `index` of tensors `start`, `end` and `fresh` (undefined when no row
/// is fresh) laid end to end.
torch::Tensor end_select(const torch::Tensor& start, const torch::Tensor& end, const torch::Tensor& fresh,
                         const torch::Tensor& index) {
  std::vector<torch::Tensor> parts{start.detach(), end.detach()};
  if (fresh.defined()) parts.push_back(fresh.detach());
  return torch::cat(parts, 0).index_select(0, index);
}

/// For log-softmax pieces of a piecewise-linear network of degree L, each
/// node's softmax moment v_j = ∫_a^b ℓ_j(t) p(t) dt [K], where ℓ_j is the
/// Lagrange basis polynomial of node t_j among all the piece's nodes (its
/// Gauss rows and its moment rows), p = softmax(z) and z the logits. On the
/// piece z is a polynomial of degree L, interpolated exactly through its
/// values at the nodes and the ends (`node_logits` [R, K], `moment_logits`
/// [R_m, K], undefined when there are none, `end_logits` [2 np, K]); the
/// integral is taken by composite Gauss–Legendre on sub-intervals, doubled
/// until two successive sums agree to rounding. No network evaluation is
/// needed. Returns the moments of the Gauss rows [R, K] and of the moment
/// rows [R_m, K].
std::pair<torch::Tensor, torch::Tensor> softmax_moments(const PieceRound& rd, const torch::Tensor& node_logits,
                                                        const torch::Tensor& moment_logits,
                                                        const torch::Tensor& end_logits) {
  constexpr int kFine = 16;        // Gauss nodes per sub-interval
  constexpr int kMaxHalvings = 8;  // up to 256 sub-intervals
  const torch::Tensor zn = node_logits.contiguous(), ze = end_logits.contiguous();
  const torch::Tensor zm = moment_logits.defined() ? moment_logits.contiguous() : torch::Tensor();
  const int64_t K = zn.size(1);
  const double* zn_p = zn.data_ptr<double>();
  const double* ze_p = ze.data_ptr<double>();
  const double* zm_p = zm.defined() ? zm.data_ptr<double>() : nullptr;
  torch::Tensor v = torch::zeros({rd.rows, K}, zn.options()), vm = torch::zeros({rd.moment_rows, K}, zn.options());
  std::vector<double*> out;  // per node of the piece: where its moment goes
  std::vector<double> z(K), p(K);
  for (int64_t pc = 0; pc < rd.np; ++pc) {
    const int64_t r0 = rd.first[pc], g = rd.first[pc + 1] - r0;
    const int64_t m0 = rd.mfirst[pc], e = rd.mfirst[pc + 1] - m0;
    const int64_t m = g + e;
    const double a = rd.ends[2 * pc], b = rd.ends[2 * pc + 1];
    // Interpolation points: the nodes (Gauss rows, then moment rows), a, b;
    // their values and barycentric weights.
    std::vector<double> xs;
    std::vector<const double*> zs;
    out.clear();
    for (int64_t j = 0; j < g; ++j) {
      xs.push_back(rd.t[r0 + j]);
      zs.push_back(zn_p + (r0 + j) * K);
      out.push_back(v.data_ptr<double>() + (r0 + j) * K);
    }
    for (int64_t j = 0; j < e; ++j) {
      xs.push_back(rd.mt[m0 + j]);
      zs.push_back(zm_p + (m0 + j) * K);
      out.push_back(vm.data_ptr<double>() + (m0 + j) * K);
    }
    xs.push_back(a);
    zs.push_back(ze_p + 2 * pc * K);
    xs.push_back(b);
    zs.push_back(ze_p + (2 * pc + 1) * K);
    std::vector<double> bary(xs.size(), 1.0);
    for (size_t i = 0; i < xs.size(); ++i) {
      for (size_t i2 = 0; i2 < xs.size(); ++i2) {
        if (i2 != i) bary[i] /= xs[i] - xs[i2];
      }
    }
    // Σ over the nodes of kFine-node Gauss on S equal sub-intervals of [a, b].
    auto moments = [&](int64_t S) {
      std::vector<double> sum(m * K, 0.0);
      std::vector<double> cuts(S + 1);
      for (int64_t s = 0; s <= S; ++s) cuts[s] = s == S ? b : a + (b - a) * static_cast<double>(s) / S;
      const QuadratureRule fine = composite_gauss_legendre(kFine, cuts);
      for (size_t f = 0; f < fine.nodes.size(); ++f) {
        const double tau = fine.nodes[f], omega = fine.weights[f];
        // z(τ) by the barycentric formula (exactly a data point if τ is one).
        double den = 0;
        std::fill(z.begin(), z.end(), 0.0);
        size_t hit = xs.size();
        for (size_t i = 0; i < xs.size() && hit == xs.size(); ++i) {
          if (tau == xs[i]) hit = i;
        }
        if (hit < xs.size()) {
          std::copy(zs[hit], zs[hit] + K, z.begin());
        } else {
          for (size_t i = 0; i < xs.size(); ++i) {
            const double c = bary[i] / (tau - xs[i]);
            den += c;
            for (int64_t k = 0; k < K; ++k) z[k] += c * zs[i][k];
          }
          for (int64_t k = 0; k < K; ++k) z[k] /= den;
        }
        const double zmax = *std::max_element(z.begin(), z.end());
        double total = 0;
        for (int64_t k = 0; k < K; ++k) total += p[k] = std::exp(z[k] - zmax);
        for (int64_t j = 0; j < m; ++j) {
          double l = 1;  // ℓ_j(τ) on the nodes alone (the first m points)
          for (int64_t j2 = 0; j2 < m; ++j2) {
            if (j2 != j) l *= (tau - xs[j2]) / (xs[j] - xs[j2]);
          }
          const double scale = omega * l / total;
          for (int64_t k = 0; k < K; ++k) sum[j * K + k] += scale * p[k];
        }
      }
      return sum;
    };
    std::vector<double> coarse = moments(1), finer;
    for (int64_t S = 2, halving = 1;; S *= 2, ++halving) {
      finer = moments(S);
      double diff = 0;
      for (size_t i = 0; i < finer.size(); ++i) diff = std::max(diff, std::abs(finer[i] - coarse[i]));
      // Stop at rounding, or before sub-intervals too short to be distinct.
      const bool too_short = (b - a) / static_cast<double>(2 * S) <= 16 * kEps * std::max(std::abs(a), std::abs(b));
      if (diff <= 4 * kEps * (b - a) || halving >= kMaxHalvings || too_short) break;
      coarse = std::move(finer);
    }
    for (int64_t j = 0; j < m; ++j) std::copy(finer.begin() + j * K, finer.begin() + (j + 1) * K, out[j]);
  }
  return {v, vm};
}

/// The logits' signals of exact pieces with the log-softmax weights folded
/// in: row r (node j, Gauss weight ω_j) of the integral Σ_j (ω_j I − 1 v_jᵀ)
/// J_z(t_j) has, for every output k, the signal of the cotangent
/// ω_j e_k − v_r on the logits (the backward pass is linear in it), to be
/// taken with weight 1 (every consumer multiplies by the weight).
std::vector<torch::Tensor> folded_signals(const SegmentEvaluator& ev, const SegmentPass& pass,
                                          const torch::Tensor& weight, const torch::Tensor& v) {
  const torch::Tensor c = unit_cotangents(ev, weight.size(0), weight.options()) * weight.view({1, -1, 1}) -
                          v.unsqueeze(0);  // [K, R, K]
  return batched_signals(ev, pass, c, /*of_logits=*/true);
}

/// Whether a piece's certificate gap |Σ ω J dw − (f(b) − f(a))| is accepted;
/// `scale` is max(1, |f(w_s, x)|) of its test point.
bool piece_accepted(const QuadratureOptions& q, const Piece& pc, double gap, double scale) {
  // The tolerance shares tol * scale over [0,1] by length, with a floor
  // for the rounding of f(b) - f(a) itself.
  const double limit = std::max(q.tol * (pc.b - pc.a), 8 * kEps) * scale;
  // A gap at rounding level that splitting no longer halves is the
  // rounding of the forward pass, not quadrature error: accept it.
  const bool rounding = gap <= 64 * kEps * scale && gap > 0.5 * pc.parent_gap;
  return gap <= limit || rounding || pc.depth >= q.max_depth;
}

/// Sorts each test point's piece ends and drops repeats.
void sort_breaks(TestFeatures& f) {
  for (std::vector<double>& b : f.breaks) {
    std::sort(b.begin(), b.end());
    b.erase(std::unique(b.begin(), b.end()), b.end());
  }
}

/// Signals of one cotangent ([1, R, ...]: moment rows, which belong to every
/// output alike) as every output's: a view [k_out, R, ...], not a copy.
/// Signals of every output are returned as they are.
torch::Tensor every_output(const torch::Tensor& s, int64_t k_out) {
  if (s.size(0) == k_out) return s;
  std::vector<int64_t> sizes = s.sizes().vec();
  sizes[0] = k_out;
  return s.expand(sizes);
}

/// Adds rows (layer inputs a [r, ...], signals s [K, r, ...], test points
/// `point` [r], weights `weight` [r], undefined when all are 1) of a layer kept dense to its block
/// J̄ [K, n, Q] (weight, then bias). A Conv2d layer is contracted per test
/// point over its rows and output positions at once; other layers form
/// their (small) per-row gradients and add them up.
void add_dense(const SegmentEvaluator& ev, size_t l, TestFeatures& f, const torch::Tensor& a, const torch::Tensor& s,
               const torch::Tensor& point, const torch::Tensor& weight) {
  const ParamLayer& pl = ev.param_layers()[l];
  const LayerDesc& d = pl.desc;
  // s [1, r, ...] (one cotangent for every output) adds to every output's
  // block: the convolution's per-point products are formed once and
  // broadcast.
  const int64_t K = s.size(0), q_all = pl.weight_numel + pl.bias_numel;
  torch::Tensor& dense = f.layers[l].block;
  if (!dense.defined()) dense = torch::zeros({ev.num_outputs(), f.num_points, q_all}, s.options());
  std::vector<int64_t> w_shape(s.dim(), 1);
  w_shape[1] = s.size(1);
  if (d.kind != Kind::Conv2d) {
    const torch::Tensor ws = weight.defined() ? s * weight.view(w_shape) : s;
    dense.index_add_(1, point, every_output(sample_gradients(d, a, ws, pl.weight_shape, pl.bias_numel), dense.size(0)));
    return;
  }
  // Rows grouped by test point (they usually come so: no copies then).
  const bool sorted = point.size(0) < 2 || (point.narrow(0, 1, point.size(0) - 1) >=
                                            point.narrow(0, 0, point.size(0) - 1)).all().item<bool>();
  const torch::Tensor order = sorted ? torch::Tensor() : std::get<1>(point.sort(/*stable=*/true, 0, false));
  auto ordered = [&](const torch::Tensor& v, int64_t dim) { return sorted ? v : v.index_select(dim, order); };
  const int64_t groups = d.groups;
  torch::Tensor u = conv_patches(d, ordered(a, 0), pl.weight_shape);                          // [r, Cin·k·k, L]
  torch::Tensor sig = ordered(weight.defined() ? s * weight.view(w_shape) : s, 1).flatten(3);  // [K, r, Cout, L]
  const int64_t cout = sig.size(2), q = u.size(1) / groups, L = u.size(2);
  torch::Tensor counts = torch::bincount(point, {}, f.num_points);
  auto c = counts.accessor<int64_t, 1>();
  for (int64_t p = 0, first = 0; p < f.num_points; first += c[p], ++p) {
    if (c[p] == 0) continue;
    torch::Tensor sp = sig.narrow(1, first, c[p]), up = u.narrow(0, first, c[p]);
    torch::Tensor gw = groups == 1 ? torch::einsum("krcl,rql->kcq", {sp, up})               // [K, Cout, Cin·k·k]
                                   : torch::einsum("krgcl,rgql->kgcq", {sp.reshape({K, c[p], groups, cout / groups, L}),
                                                                        up.reshape({c[p], groups, q, L})});
    torch::Tensor block = gw.reshape({K, -1});
    if (pl.bias_numel) block = torch::cat({block, sp.sum({1, 3})}, 1);
    dense.select(1, p).add_(block);
  }
}

}  // namespace

QuadratureOptions QuadratureOptions::for_run(int64_t steps) const {
  QuadratureOptions q = *this;
  if (run_tol > 0) q.tol = run_tol / static_cast<double>(std::max<int64_t>(1, steps));
  return q;
}

namespace {

/// Measures the certificate of the assembled features.
void finish(const SegmentEvaluator& ev, TestFeatures& f, const torch::Tensor& dw) {
  torch::Tensor jdw = apply_features(ev, f, dw);
  torch::Tensor scale = f.f0.abs().amax(1, true).clamp_min(1.0);
  f.gap = jdw - (f.f1 - f.f0);
  f.certificate_gap = (f.gap.abs() / scale).max().item<double>();
}

/// The kinks of a Module for one test point x [1, ...] inside [a, b]: the
/// points where one of its ReLU inputs (kink sites) crosses 0 and, at a
/// site fused with a max-pool, where a window's argmax switches, counting
/// only what the pool sees (pooled_switches). Changes between `intervals`
/// + 1 evenly spaced samples are located by the same rounds as find_kinks'
/// (SignBracket: Illinois false position, a bisection every fourth round,
/// down to 4 ulp of t) on the unit, or on the difference of the two units
/// a window switches between; each evaluation is one forward pass. An even
/// number of changes of one unit or window inside one interval is not seen
/// (the certificate catches it). Sorted, in (a, b).
std::vector<double> module_kinks(const SegmentEvaluator& ev, const torch::Tensor& x, double a, double b,
                                 int intervals, int64_t& forward_evaluations) {
  const std::vector<int64_t>& windows = ev.module_site_windows();
  std::vector<double> ts(intervals + 1);
  std::vector<std::vector<torch::Tensor>> values(intervals + 1);
  for (int j = 0; j <= intervals; ++j) {
    ts[j] = j == intervals ? b : a + (b - a) * j / intervals;
    values[j] = ev.module_sites(x, ts[j]);
  }
  forward_evaluations += intervals + 1;
  std::vector<double> kinks;
  // Locates, inside interval j, the sign change of y_plus − y_minus (y_plus
  // alone when minus < 0) at site i.
  auto locate = [&](int64_t j, size_t i, int64_t plus, int64_t minus) {
    auto g = [&](const std::vector<torch::Tensor>& sites) {
      const torch::Tensor y = sites[i].reshape({-1});
      return y[plus].item<double>() - (minus >= 0 ? y[minus].item<double>() : 0.0);
    };
    SignBracket br;
    br.lo = ts[j];
    br.hi = ts[j + 1];
    br.glo = g(values[j]);
    br.ghi = g(values[j + 1]);
    forward_evaluations += br.locate([&](double m) { return g(ev.module_sites(x, m)); }, 400);
    kinks.push_back(br.midpoint());
  };
  // Per site, its samples as rows; interval j lies between rows j and j + 1.
  const torch::Tensor at_a = torch::arange(intervals), at_b = at_a + 1;
  for (size_t i = 0; i < windows.size(); ++i) {
    std::vector<torch::Tensor> samples;
    for (const auto& v : values) samples.push_back(v[i]);
    const torch::Tensor y = torch::cat(samples);  // [intervals + 1, ...]
    torch::Tensor flips;                          // [intervals, units]
    if (windows[i] > 0) {
      const PooledSwitches sw = pooled_switches(y, at_a, at_b, windows[i]);
      const torch::Tensor hits = sw.switches.nonzero();  // [F, 2]: interval, window
      auto h = hits.accessor<int64_t, 2>();
      auto to = sw.to.accessor<int64_t, 2>(), from = sw.from.accessor<int64_t, 2>();
      for (int64_t n = 0; n < hits.size(0); ++n) locate(h[n][0], i, to[h[n][0]][h[n][1]], from[h[n][0]][h[n][1]]);
      flips = sw.flips;
    } else {
      flips = (y.index_select(0, at_a) > 0) != (y.index_select(0, at_b) > 0);
    }
    const torch::Tensor units = flips.nonzero();  // [F, 2]: interval, unit
    auto u = units.accessor<int64_t, 2>();
    for (int64_t n = 0; n < units.size(0); ++n) locate(u[n][0], i, u[n][1], -1);
  }
  std::sort(kinks.begin(), kinks.end());
  return kinks;
}

/// Test features of a Module (the generic route): the Jacobian rows come
/// from autograd and are summed into one dense block J̄ [K, n, P]. gauss
/// splits [0,1] at the crossings of the module's kink sites (module_kinks),
/// then refines each piece until its certificate holds: at kinks found by a
/// finer search of the piece, else at its midpoint.
TestFeatures module_test_features(const SegmentEvaluator& ev, const torch::Tensor& x, const QuadratureOptions& q) {
  const int64_t n = x.size(0), K = ev.num_outputs(), P = ev.parameter_count();
  const auto opts = x.options();
  TestFeatures f;
  f.num_points = n;
  f.f0 = ev.forward(x, torch::zeros({n}, opts), false).out;
  f.f1 = ev.forward(x, torch::ones({n}, opts), false).out;
  f.breaks.assign(n, std::vector<double>{0.0, 1.0});
  f.layers.resize(1);  // the module's whole parameter vector, one Dense block
  f.layers[0].block = torch::zeros({K, n, P}, opts);
  std::vector<torch::Tensor> kept_point, kept_weight;
  // Adds rows' weighted Jacobians J [r, K, P] to their test points' blocks.
  auto keep = [&](const torch::Tensor& jac, const torch::Tensor& rows, const torch::Tensor& point,
                  const torch::Tensor& weight) {
    torch::Tensor pr = point.index_select(0, rows), wr = weight.index_select(0, rows);
    f.layers[0].block.index_add_(1, pr, (jac.index_select(0, rows) * wr.view({-1, 1, 1})).transpose(0, 1));
    kept_point.push_back(pr);
    kept_weight.push_back(wr);
  };
  // Jacobian rows per round: at most max_rows, and at most 2^24 doubles.
  const int64_t max_rows = std::clamp<int64_t>((int64_t(1) << 24) / std::max<int64_t>(1, K * P), 1, q.max_rows);

  if (q.spec.kind != QuadratureSpec::Kind::Gauss) {
    const QuadratureRule rule = q.spec.kind == QuadratureSpec::Kind::Dpk ? left_point() : riemann(q.spec.nodes);
    const int64_t nodes = static_cast<int64_t>(rule.nodes.size());
    const torch::Tensor t_all = torch::tensor(rule.nodes, opts), w_all = torch::tensor(rule.weights, opts);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j0 = 0; j0 < nodes; j0 += max_rows) {
        const int64_t nj = std::min(max_rows, nodes - j0);
        torch::Tensor point = torch::full({nj}, i, torch::kLong);
        torch::Tensor jac = ev.module_jacobians(x.index_select(0, point), t_all.narrow(0, j0, nj));
        keep(jac, torch::arange(nj), point, w_all.narrow(0, j0, nj));
        f.evaluations += nj;
      }
    }
  } else {
    // Initial pieces: [0, 1] split at the kinks of the module's ReLUs.
    const bool sites = ev.module_has_sites();
    std::vector<Piece> pending;
    for (int64_t i = 0; i < n; ++i) {
      std::vector<double> cuts;
      if (sites) cuts = module_kinks(ev, x.narrow(0, i, 1), 0.0, 1.0, q.scan_intervals, f.forward_evaluations);
      f.kinks += static_cast<int64_t>(cuts.size());
      const std::vector<double> br = breakpoints(cuts, kMinPiece);
      for (size_t j = 0; j + 1 < br.size(); ++j) pending.push_back({i, br[j], br[j + 1], 0});
    }
    const torch::Tensor scale = f.f0.abs().amax(1).clamp_min(1.0);  // [n]
    auto scale_a = scale.accessor<double, 1>();
    while (!pending.empty()) {
      std::vector<Piece> next;
      const PieceRound rd = next_round(pending, next, q, max_rows, 0, 0);
      const int64_t np = rd.np;
      const torch::Tensor point_t = torch::tensor(rd.point, torch::kLong), w_t = torch::tensor(rd.w, opts);
      const torch::Tensor jac = ev.module_jacobians(x.index_select(0, point_t), torch::tensor(rd.t, opts));
      f.evaluations += rd.rows;
      // Per-piece certificate: Σ_nodes ω J dw against f(b) − f(a).
      const torch::Tensor jdw = torch::matmul(jac, ev.direction());  // [R, K]
      const torch::Tensor integral = torch::zeros({np, K}, opts).index_add_(
          0, torch::tensor(rd.piece_of, torch::kLong), jdw * w_t.unsqueeze(1));  // [np, K]
      const torch::Tensor fe = ev.forward(x.index_select(0, torch::tensor(rd.end_point, torch::kLong)),
                                          torch::tensor(rd.ends, opts), false)
                                   .out.view({np, 2, K});
      f.forward_evaluations += 2 * np;
      const torch::Tensor gap = (integral - (fe.select(1, 1) - fe.select(1, 0))).abs().amax(1);  // [np]
      auto gap_a = gap.accessor<double, 1>();
      std::vector<int64_t> accepted;
      for (int64_t p = 0; p < np; ++p) {
        const Piece& pc = pending[p];
        if (piece_accepted(q, pc, gap_a[p], scale_a[pc.point])) {
          for (int64_t r = rd.first[p]; r < rd.first[p + 1]; ++r) accepted.push_back(r);
          f.breaks[pc.point].push_back(pc.a);
          f.breaks[pc.point].push_back(pc.b);
        } else {
          // Kinks the first scan missed (two crossings of one unit between
          // samples): search the piece more finely, else halve it.
          std::vector<double> cuts;
          if (sites) {
            cuts = module_kinks(ev, x.narrow(0, pc.point, 1), pc.a, pc.b, 4, f.forward_evaluations);
            f.kinks += static_cast<int64_t>(cuts.size());
          }
          split(pc, gap_a[p], cuts, next);
        }
      }
      if (!accepted.empty()) keep(jac, torch::tensor(accepted, torch::kLong), point_t, w_t);
      pending = std::move(next);
    }
    sort_breaks(f);
  }
  f.point = torch::cat(kept_point);
  f.weight = torch::cat(kept_weight);
  finish(ev, f, ev.direction());
  return f;
}

}  // namespace

bool TestFeatures::factored() const {
  return std::none_of(layers.begin(), layers.end(),
                      [](const LayerFeatures& lf) { return lf.form == LayerFeatures::Form::Dense; });
}

LayerFeatures::Form layer_form(const SegmentEvaluator& ev, size_t l, const torch::Tensor& a) {
  if (ev.generic() || !factored(ev.param_layers()[l].desc, a)) return Form::Dense;
  return l == 0 && ev.first_input_fixed() ? Form::Summed : Form::Rows;
}

namespace {

/// Test features of own networks' points x [n, ...], all on this thread.
TestFeatures point_features(const SegmentEvaluator& ev, const torch::Tensor& x, const QuadratureOptions& q) {
  const int64_t n = x.size(0);
  const auto opts = x.options();
  TestFeatures f;
  f.num_points = n;
  SegmentPass p0 = ev.forward(x, torch::zeros({n}, opts), false);
  SegmentPass p1 = ev.forward(x, torch::ones({n}, opts), false);
  f.f0 = p0.out;
  f.f1 = p1.out;
  f.breaks.assign(n, std::vector<double>{0.0, 1.0});

  // Fixed rules: every test point gets the same nodes.
  auto fixed_rows = [&](const QuadratureRule& rule) {
    const int64_t t_count = static_cast<int64_t>(rule.nodes.size());
    torch::Tensor point = torch::arange(n).repeat_interleave(t_count);
    torch::Tensor t = torch::tensor(rule.nodes, opts).repeat({n});
    torch::Tensor w = torch::tensor(rule.weights, opts).repeat({n});
    return std::make_tuple(point, t, w);
  };

  // Each layer's form (LayerFeatures): accepted rows go straight into the
  // Dense blocks and the Summed first layer; only Rows layers keep them.
  const size_t layers = ev.param_layers().size();
  f.layers.resize(layers);
  for (size_t l = 0; l < layers; ++l) f.layers[l].form = layer_form(ev, l, p0.inputs[l]);
  std::vector<torch::Tensor> kept_point, kept_weight;
  std::vector<std::vector<torch::Tensor>> kept_inputs(layers), kept_signals(layers);
  // The first param layer's input is the same at every node of a test point
  // (first_input_fixed), and its block is linear in the signals for a fixed
  // input: the rows' weighted signals are summed per point, Σ_r ω_r δ_r,
  // [K, n, ...]. A factored layer keeps the sum (Summed); any other's block
  // (a convolution, an embedding) is formed from it once per point.
  const bool sum_first = layers > 0 && ev.first_input_fixed();
  torch::Tensor first_sum;
  // Keeps the rows `rows` (ascending) of a pass with signals `sig`; `unit`:
  // their weights are all 1 (folded into the signals). Signals of one
  // cotangent ([1, R, ...]: moment rows) belong to every output alike.
  const int64_t k_out = ev.num_outputs();
  auto keep = [&](const SegmentPass& pass, const std::vector<torch::Tensor>& sig, const torch::Tensor& rows,
                  const torch::Tensor& point, const torch::Tensor& weight, bool unit) {
    const bool all = rows.size(0) == point.size(0);  // every row: no copies
    torch::Tensor pr = all ? point : point.index_select(0, rows), wr = all ? weight : weight.index_select(0, rows);
    for (size_t l = 0; l < layers; ++l) {
      torch::Tensor s = all ? sig[l] : sig[l].index_select(1, rows);
      if (l == 0 && sum_first) {
        std::vector<int64_t> w_shape(s.dim(), 1);
        w_shape[1] = s.size(1);
        if (!first_sum.defined()) {
          std::vector<int64_t> sizes = s.sizes().vec();
          sizes[0] = k_out;
          sizes[1] = n;
          first_sum = torch::zeros(sizes, s.options());
        }
        first_sum.index_add_(1, pr, every_output(unit ? s : s * wr.view(w_shape), k_out));
        continue;
      }
      torch::Tensor a = all ? pass.inputs[l].detach() : pass.inputs[l].detach().index_select(0, rows);
      switch (f.layers[l].form) {
        case Form::Dense: add_dense(ev, l, f, a, s, pr, unit ? torch::Tensor() : wr); break;
        case Form::Rows:
          kept_inputs[l].push_back(a);
          kept_signals[l].push_back(every_output(s, k_out));
          break;
        case Form::Summed: PK_ASSERT(false && "only the first layer is summed"); break;
      }
    }
    kept_point.push_back(pr);
    kept_weight.push_back(wr);
  };

  // The pass of `rows`' fresh rows (undefined when there are none), counted
  // as forward-only; and the sites of rows `index` of (p0, p1, that pass).
  auto fresh_pass = [&](const SharedRows& rows) {
    SegmentPass pf;
    if (rows.fresh_t.empty()) return pf;
    pf = ev.forward(x.index_select(0, torch::tensor(rows.fresh_point, torch::kLong)), torch::tensor(rows.fresh_t, opts),
                    false);
    f.forward_evaluations += static_cast<int64_t>(rows.fresh_t.size());
    return pf;
  };
  auto shared_sites = [&](const SegmentPass& pf, const torch::Tensor& index) {
    std::vector<torch::Tensor> out;
    for (size_t l = 0; l < ev.kink_values(p0).size(); ++l) {
      const torch::Tensor fresh = pf.out.defined() ? ev.kink_values(pf)[l] : torch::Tensor();
      out.push_back(end_select(ev.kink_values(p0)[l], ev.kink_values(p1)[l], fresh, index));
    }
    return out;
  };

  if (q.spec.kind != QuadratureSpec::Kind::Gauss) {
    QuadratureRule rule = q.spec.kind == QuadratureSpec::Kind::Dpk ? left_point() : riemann(q.spec.nodes);
    auto [point, t, w] = fixed_rows(rule);
    SegmentPass pass = ev.forward(x.index_select(0, point), t, track_passes(ev));
    std::vector<torch::Tensor> sig = all_signals(ev, pass);
    keep(pass, sig, torch::arange(point.size(0)), point, w, false);
    f.evaluations = point.size(0);
  } else {
    // Initial pieces: split [0,1] at every kink that a scan of the segment
    // sees. The first layer's kinks are closed-form (its pre-activation is
    // affine in t); deeper ReLU kinks and max-pool switches are detected
    // between scan points and located by root finding.
    const bool first_relu = ev.first_site_affine();
    const int64_t scan = std::max(1, q.scan_intervals);
    std::vector<int64_t> scan_point(n * (scan + 1));
    std::vector<double> scan_t(n * (scan + 1));
    std::vector<KinkBracket> scan_brackets;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j <= scan; ++j) {
        scan_point[i * (scan + 1) + j] = i;
        scan_t[i * (scan + 1) + j] = j == scan ? 1.0 : static_cast<double>(j) / static_cast<double>(scan);
        if (j < scan) scan_brackets.push_back({i * (scan + 1) + j, i * (scan + 1) + j + 1});
      }
    }
    std::vector<std::vector<double>> cuts(n);
    // Only layers after the first can have kinks a scan must find: with one
    // hidden ReLU layer (or smooth activations) every kink is closed-form.
    bool deep_kinks = false;
    for (size_t l = first_relu ? 1 : 0; l < ev.relu_after().size(); ++l) {
      deep_kinks = deep_kinks || ev.relu_after()[l] || ev.pool_after()[l] > 0;
    }
    if (deep_kinks) {
      // The scan's ends, t = 0 and t = 1, are the passes p0 and p1; only the
      // points in between take a pass.
      const SharedRows sr = shared_rows(scan_point, scan_t, n);
      const std::vector<torch::Tensor> scan_sites =
          shared_sites(fresh_pass(sr), torch::tensor(sr.index, torch::kLong));  // [n (scan + 1), ...]
      KinkSearch ks = find_kinks(ev, x, scan_sites, scan_point, scan_t, scan_brackets, first_relu, q.fit_kinks);
      f.forward_evaluations += ks.forward_evaluations;
      f.kinks += static_cast<int64_t>(ks.kinks.size());
      for (const Kink& k : ks.kinks) cuts[k.bracket / scan].push_back(k.t);
    }
    std::vector<Piece> pending;
    for (int64_t i = 0; i < n; ++i) {
      if (first_relu) {
        std::vector<double> c = first_layer_kinks(ev, p0.preacts[0][i], p1.preacts[0][i]);
        f.kinks += static_cast<int64_t>(c.size());
        cuts[i].insert(cuts[i].end(), c.begin(), c.end());
      }
      std::vector<double> br = breakpoints(cuts[i], kMinPiece);
      for (size_t j = 0; j + 1 < br.size(); ++j) pending.push_back({i, br[j], br[j + 1], 0});
    }
    torch::Tensor scale = f.f0.abs().amax(1).clamp_min(1.0);  // [n]
    // A piecewise-linear network's pieces are integrated exactly: its logit
    // Jacobian has degree L − 1 on a piece, so ⌈L/2⌉ Gauss nodes for logits;
    // for log-softmax, (I − 1 pᵀ) J_z with J_z interpolated on those nodes
    // and the moment nodes (next_round), and the softmax factor integrated
    // over the interpolated logits.
    const int64_t degree = q.exact_pieces ? ev.polynomial_degree() : 0;
    const bool fold = degree > 0 && ev.log_softmax_output();
    const int64_t exact_nodes = degree == 0 ? 0 : fold ? degree : (degree + 1) / 2;
    while (!pending.empty()) {
      std::vector<Piece> next;
      const PieceRound rd = next_round(pending, next, q, q.max_rows, exact_nodes, fold ? ev.num_outputs() : 0);
      const int64_t np = rd.np, rows = rd.rows;
      const std::vector<int64_t>& first = rd.first;
      torch::Tensor point_t = torch::tensor(rd.point, torch::kLong), w_t = torch::tensor(rd.w, opts);
      SegmentPass pass = ev.forward(x.index_select(0, point_t), torch::tensor(rd.t, opts), track_passes(ev));
      // The pieces' ends: only those not evaluated yet take a pass.
      const SharedRows er = shared_rows(rd.end_point, rd.ends, n);
      const torch::Tensor end_index = torch::tensor(er.index, torch::kLong);
      const SegmentPass pf = fresh_pass(er);
      const torch::Tensor end_out = end_select(p0.out, p1.out, pf.out, end_index);  // [2 np, K]
      // The moment rows' pass, and their point indices (log-softmax pieces).
      SegmentPass pm;
      torch::Tensor mpoint_t;
      if (rd.moment_rows > 0) {
        mpoint_t = torch::tensor(rd.mpoint, torch::kLong);
        pm = ev.forward(x.index_select(0, mpoint_t), torch::tensor(rd.mt, opts), track_passes(ev));
      }
      std::vector<torch::Tensor> sig, msig;
      if (fold) {
        auto [v, vm] = softmax_moments(rd, pass.logits.detach(), pm.out.defined() ? pm.logits.detach() : torch::Tensor(),
                                       end_select(p0.logits, p1.logits, pf.logits, end_index));
        sig = folded_signals(ev, pass, w_t, v);
        // A moment row's signal, of the cotangent −v_j, is every output's.
        if (rd.moment_rows > 0) msig = batched_signals(ev, pm, -vm.unsqueeze(0), /*of_logits=*/true);
        w_t = torch::ones_like(w_t);
      } else {
        sig = all_signals(ev, pass);
      }
      f.evaluations += rows;
      f.moment_evaluations += rd.moment_rows;
      // Per-piece certificate: Σ_nodes ω J dw against f(b) − f(a).
      torch::Tensor jdw = segment_dot(ev, pass, sig).detach();   // [K, R]
      torch::Tensor integral = torch::zeros({np, jdw.size(0)}, opts).index_add_(
          0, torch::tensor(rd.piece_of, torch::kLong), (jdw * w_t.unsqueeze(0)).t());   // [np, K]
      if (rd.moment_rows > 0) {
        const torch::Tensor mdw = segment_dot(ev, pm, msig).detach();  // [1, R_m]
        integral.index_add_(0, torch::tensor(rd.mpiece_of, torch::kLong), mdw.t().expand({rd.moment_rows, jdw.size(0)}));
      }
      torch::Tensor fe = end_out.view({np, 2, -1});
      torch::Tensor gap = (integral - (fe.select(1, 1) - fe.select(1, 0))).abs().amax(1);  // [np]
      std::vector<Piece> failed;
      std::vector<double> failed_gap;
      std::vector<int64_t> accepted_rows, accepted_moments, bracket_piece;
      std::vector<KinkBracket> brackets;
      auto gap_a = gap.accessor<double, 1>();
      auto scale_a = scale.accessor<double, 1>();
      for (int64_t p = 0; p < np; ++p) {
        const Piece& pc = pending[p];
        if (piece_accepted(q, pc, gap_a[p], scale_a[pc.point])) {
          for (int64_t r = first[p]; r < first[p + 1]; ++r) accepted_rows.push_back(r);
          for (int64_t r = rd.mfirst[p]; r < rd.mfirst[p + 1]; ++r) accepted_moments.push_back(r);
          f.breaks[pc.point].push_back(pc.a);
          f.breaks[pc.point].push_back(pc.b);
          continue;
        }
        // Search a, nodes..., b for kinks that the scan missed.
        int64_t prev = rows + 2 * p;
        for (int64_t r = first[p]; r <= first[p + 1]; ++r) {
          const int64_t next = r < first[p + 1] ? r : rows + 2 * p + 1;
          brackets.push_back({prev, next});
          bracket_piece.push_back(static_cast<int64_t>(failed.size()));
          prev = next;
        }
        failed.push_back(pc);
        failed_gap.push_back(gap_a[p]);
      }
      // Split each failed piece at the kinks inside it, else at its midpoint.
      if (!failed.empty()) {
        const std::vector<torch::Tensor>& sites = ev.kink_values(pass);
        std::vector<torch::Tensor> pre(sites.size());
        const std::vector<torch::Tensor> end_sites = shared_sites(pf, end_index);
        for (size_t l = 0; l < pre.size(); ++l) pre[l] = torch::cat({sites[l].detach(), end_sites[l]}, 0);
        std::vector<int64_t> row_point(rd.point);
        row_point.insert(row_point.end(), rd.end_point.begin(), rd.end_point.end());
        std::vector<double> row_t(rd.t);
        row_t.insert(row_t.end(), rd.ends.begin(), rd.ends.end());
        KinkSearch ks = find_kinks(ev, x, pre, row_point, row_t, brackets, first_relu, q.fit_kinks);
        f.forward_evaluations += ks.forward_evaluations;
        f.kinks += static_cast<int64_t>(ks.kinks.size());
        // Kinks come sorted by bracket, then t, and a piece's brackets ascend in t.
        std::vector<std::vector<double>> piece_cuts(failed.size());
        for (const Kink& k : ks.kinks) piece_cuts[bracket_piece[k.bracket]].push_back(k.t);
        for (size_t i = 0; i < failed.size(); ++i) {
          Piece& pc = failed[i];
          if (piece_cuts[i].empty() && nodes_for(q, pc, exact_nodes) < exact_nodes) {
            pc.full = true;
            pc.parent_gap = failed_gap[i];
            next.push_back(pc);
          } else {
            split(pc, failed_gap[i], piece_cuts[i], next);
          }
        }
      }
      if (!accepted_rows.empty()) keep(pass, sig, torch::tensor(accepted_rows, torch::kLong), point_t, w_t, fold);
      if (!accepted_moments.empty()) {
        keep(pm, msig, torch::tensor(accepted_moments, torch::kLong), mpoint_t,
             torch::ones({rd.moment_rows}, opts), true);
      }
      pending = std::move(next);
    }
  }

  sort_breaks(f);
  // Assemble the kept rows and the first layer's sums.
  for (size_t l = 0; l < layers; ++l) {
    LayerFeatures& lf = f.layers[l];
    if (l == 0 && sum_first) {
      PK_ASSERT(first_sum.defined());
      const torch::Tensor a = p0.inputs[0].detach();  // the first layer's input at every node
      if (lf.form == Form::Summed) {
        lf.inputs = a;
        lf.signals = first_sum;
      } else {
        add_dense(ev, 0, f, a, first_sum, torch::arange(n), torch::Tensor());
      }
    } else if (lf.form == Form::Rows) {
      lf.inputs = torch::cat(kept_inputs[l], 0);
      lf.signals = torch::cat(kept_signals[l], 1);
    }
  }
  f.point = torch::cat(kept_point);
  f.weight = torch::cat(kept_weight);
  finish(ev, f, ev.direction());
  return f;
}

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
    std::vector<torch::Tensor> inputs, signals, blocks;
    for (TestFeatures& p : parts) {
      LayerFeatures& pl = p.layers[l];
      PK_ASSERT(pl.form == lf.form);
      if (lf.form == Form::Dense) {
        blocks.push_back(std::move(pl.block));
      } else {
        inputs.push_back(std::move(pl.inputs));
        signals.push_back(std::move(pl.signals));
      }
    }
    if (lf.form == Form::Dense) {
      lf.block = torch::cat(blocks, 1);
    } else {
      lf.inputs = torch::cat(inputs, 0);
      lf.signals = torch::cat(signals, 1);
    }
  }
  return f;
}

}  // namespace

TestFeatures test_features(const SegmentEvaluator& ev, const torch::Tensor& x, const QuadratureOptions& q) {
  if (ev.generic()) return module_test_features(ev, x, q);
  const int64_t n = x.size(0);
  // Test points are independent: own networks split them into one group per
  // thread (point_groups.h, docs/math.md §12). On the MNIST CNN, 10 points,
  // 2 threads, the groups took 0.75 of the time of every operation shared.
  const int64_t groups = point_groups(ev, n);
  if (groups < 2) return point_features(ev, x, q);
  std::vector<TestFeatures> parts(groups);
  run_point_groups(groups, [&](int64_t g) {
    const int64_t first = group_start(g, groups, n), last = group_start(g + 1, groups, n);
    parts[g] = point_features(ev, x.narrow(0, first, last - first), q);
  });
  return join_features(parts);
}

TrainSignals train_signals(const SegmentEvaluator& ev, const torch::Tensor& x, const torch::Tensor& y,
                           OutputMap map, LossKind loss, const torch::Tensor& weights) {
  SegmentPass pass = ev.forward(x, torch::zeros({x.size(0)}, x.options()), !ev.generic() && track_passes(ev));
  const torch::Tensor u = loss_signal(pass.out, y, map, loss, weights);  // c_i u_i, u_i = ∂ℓ_i/∂f
  TrainSignals t;
  if (ev.generic()) {
    t.inputs = {torch::Tensor()};
    t.signals = {ev.module_gradients(x, u)};  // the per-sample gradients g_i [B, P]
    return t;
  }
  for (const torch::Tensor& s : batched_signals(ev, pass, u.detach().unsqueeze(0))) t.signals.push_back(s[0]);
  for (auto& a : pass.inputs) t.inputs.push_back(a.detach());
  return t;
}

std::vector<TrainSignals> train_output_signals(const SegmentEvaluator& ev, const torch::Tensor& x,
                                               const torch::Tensor& t) {
  if (ev.generic()) {
    const torch::Tensor jac = ev.module_jacobians(x, t.defined() ? t : torch::zeros({x.size(0)}, x.options()));
    std::vector<TrainSignals> out;
    for (int64_t k = 0; k < ev.num_outputs(); ++k) out.push_back({{torch::Tensor()}, {jac.select(1, k)}, {}});
    return out;
  }
  SegmentPass pass =
      ev.forward(x, t.defined() ? t : torch::zeros({x.size(0)}, x.options()), track_passes(ev));
  std::vector<torch::Tensor> inputs;
  for (auto& a : pass.inputs) inputs.push_back(a.detach());
  const std::vector<torch::Tensor> sig = all_signals(ev, pass);
  std::vector<TrainSignals> out;
  for (int64_t k = 0; k < ev.num_outputs(); ++k) {
    TrainSignals ts{inputs, {}, {}};
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

/// Σ_r ω_r s_r c_rᵀ per test point, for a Rows layer's signals s [K, R, out]
/// and per-row columns c [R, cols]: [K, n, out, cols]. One product per test
/// point over its rows, so the [K, R, out, cols] outer products (hundreds
/// of MB for a CNN's last layer) are never formed.
torch::Tensor point_outer_sums(const TestFeatures& f, const torch::Tensor& s, const torch::Tensor& c) {
  const int64_t K = s.size(0), out = s.size(2), cols = c.size(1), n = f.num_points;
  // Rows grouped by test point (kept rows come round by round, so sort them).
  const torch::Tensor order = std::get<1>(f.point.sort(/*stable=*/true, 0, false));
  const torch::Tensor st = s.index_select(1, order).permute({0, 2, 1});                // [K, out, R]
  const torch::Tensor ct = (c * f.weight.view({-1, 1})).index_select(0, order);         // [R, cols]
  const torch::Tensor counts = torch::bincount(f.point, {}, n);
  auto cnt = counts.accessor<int64_t, 1>();
  torch::Tensor sums = torch::zeros({K, n, out, cols}, s.options());
  for (int64_t p = 0, first = 0; p < n; first += cnt[p], ++p) {
    if (cnt[p] == 0) continue;
    sums.select(1, p).copy_(torch::matmul(st.narrow(2, first, cnt[p]), ct.narrow(0, first, cnt[p])));
  }
  return sums;
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
        if (R * (in + out) > n * in * out) {
          // Few weights, many rows (docs/math.md §8): the dense block
          // J̄ = Σ_r ω_r δ_r [a_r, 1]ᵀ per test point [K, n, out, in+1], then
          // δ_iᵀ J̄ [a_i, 1] for every training row: one GEMM against the
          // training inputs, which are read once (per-sample gradients are
          // never formed).
          const int64_t cols = in + (bias ? 1 : 0);
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
          part = aggregate(f, dd * a.view({1, R, 1, B}));  // [K, n, K', B]
        }
        break;
      }
      case Form::Dense: {
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
  std::vector<int64_t> shape = x.sizes().vec();
  shape[1] = f.num_points;
  std::vector<int64_t> w_shape(x.dim(), 1);
  w_shape[1] = x.size(1);
  return torch::zeros(shape, x.options()).index_add_(1, f.point, x * f.weight.view(w_shape));
}

torch::Tensor apply_features(const SegmentEvaluator& ev, const TestFeatures& f, const torch::Tensor& v) {
  torch::Tensor total;  // [K, n]
  for (size_t l = 0; l < ev.param_layers().size(); ++l) {
    const LayerFeatures& lf = f.layers[l];
    torch::Tensor part;
    switch (lf.form) {
      case Form::Dense:
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
  torch::Tensor out = torch::zeros({n, K, ev.parameter_count()}, f.f0.options());
  for (size_t l = 0; l < ev.param_layers().size(); ++l) {
    const ParamLayer& pl = ev.param_layers()[l];
    torch::Tensor weight, bias;  // [K, n, weight_numel], [K, n, out]
    const LayerFeatures& lf = f.layers[l];
    switch (lf.form) {
      case Form::Dense:
        weight = lf.block.narrow(2, 0, pl.weight_numel);
        bias = lf.block.narrow(2, pl.weight_numel, pl.bias_numel);
        break;
      case Form::Summed:
        weight = (lf.signals.unsqueeze(3) * lf.inputs.unsqueeze(0).unsqueeze(2)).flatten(2);
        bias = lf.signals;
        break;
      case Form::Rows:
        weight = point_outer_sums(f, lf.signals, lf.inputs).flatten(2);  // [K, n, out·in]
        bias = aggregate(f, lf.signals);
        break;
    }
    out.narrow(2, pl.weight_offset, pl.weight_numel).copy_(weight.transpose(0, 1));
    if (pl.bias_numel) out.narrow(2, pl.bias_offset, pl.bias_numel).copy_(bias.transpose(0, 1));
  }
  return out;
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
      torch::Tensor wa = torch::matmul(w, t.inputs[l].flatten(1).t());                  // [n, K, out, B]
      part = torch::einsum("nkob,bo->nbk", {wa, delta});
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
  // A Module's rows are summed into a dense block as they are evaluated.
  if (ev.generic()) return {(ev.num_outputs() + 2) * ev.parameter_count(), false};
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
