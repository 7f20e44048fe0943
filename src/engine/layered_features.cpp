// Test features of networks evaluated layer by layer (pathkernel's own
// networks and the structured TorchScript route) as an integrand of the
// certified integrator: each round's rows are one batched pass, their
// signals are kept per layer in the form the layer's rule keeps them, and
// failed pieces are searched for kinks between their evaluated rows.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>
#include <utility>

#include "feature_parts.h"
#include "last_site.h"
#include "pathkernel/error.h"
#include "pathkernel/integrator.h"
#include "pathkernel/kinks.h"
#include "pathkernel/layer_rules.h"
#include "softmax_moments.h"

namespace pathkernel {

namespace {

using Kind = LayerDesc::Kind;
using Form = LayerFeatures::Form;

/// A round's rows each walk K cotangents back through every layer, so its
/// largest blocks hold about rows × K × (one row's activations) doubles.
/// Rounds are held to kRoundDoubles of them (32 MiB), and at least
/// kMinRoundRows rows: a step with many kinks (a large early step) takes
/// more rounds rather than more memory. (The user CNN's one-epoch `verify`:
/// rounds of up to 158 rows, 1.2 GB at its peak, without the bound.)
constexpr int64_t kRoundDoubles = int64_t(1) << 22;
constexpr int64_t kMinRoundRows = 8;

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
/// The logits' cotangents of exact pieces with the log-softmax weights
/// folded in, [K, R, K]: row r (node j, Gauss weight ω_j) of the integral
/// Σ_j (ω_j I − 1 v_jᵀ) J_z(t_j) has, for every output k, the cotangent
/// ω_j e_k − v_r on the logits (the backward pass is linear in it), its
/// signals to be taken with weight 1 (every consumer multiplies by the
/// weight).
torch::Tensor folded_cotangents(const SegmentEvaluator& ev, const torch::Tensor& weight, const torch::Tensor& v) {
  return unit_cotangents(ev, weight.size(0), weight.options()) * weight.view({1, -1, 1}) - v.unsqueeze(0);  // [K, R, K]
}

/// Whether a piece's certificate gap |Σ ω J dw − (f(b) − f(a))| is accepted;
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

/// Entries of a held convolution's block that pieces' own selections move
/// (LayeredFeatures::add_site_of_pairs): per mend m, unit unit[m] of the
/// layer's input on piece row[m] (of test point point[m]) changes by da[m]
/// (its A) and db[m] (its B) from the point's first piece's.
struct SiteMends {
  torch::Tensor row, unit, point, da, db;  ///< [M] each
};

template <typename T>
void add_mend_entries(const T* g, const T* g_dw, const SiteMends& m, int64_t K, int64_t R, int64_t co, int64_t ci,
                      int64_t kh, int64_t kw, int64_t H, int64_t W, int64_t Ho, int64_t Wo, int64_t P, int64_t Q,
                      int64_t n, T* block) {
  const int64_t M = m.row.size(0);
  const int64_t *row = m.row.data_ptr<int64_t>(), *unit = m.unit.data_ptr<int64_t>(), *point = m.point.data_ptr<int64_t>();
  const T *da = m.da.data_ptr<T>(), *db = m.db.data_ptr<T>();
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t j = 0; j < M; ++j) {
      const int64_t c = unit[j] / (H * W), y = unit[j] / W % H, x = unit[j] % W;
      T* out = block + (k * n + point[j]) * Q + c * kh * kw;
      for (int64_t a = 0; a < kh; ++a) {
        const int64_t yy = y + P - a;
        if (yy < 0 || yy >= Ho) continue;  // adds zeros
        for (int64_t b = 0; b < kw; ++b) {
          const int64_t xx = x + P - b;
          if (xx < 0 || xx >= Wo) continue;
          const int64_t at = ((k * R + row[j]) * co * Ho + yy) * Wo + xx;
          for (int64_t o = 0; o < co; ++o) {
            out[o * ci * kh * kw + a * kw + b] += g[at + o * Ho * Wo] * da[j] + g_dw[at + o * Ho * Wo] * db[j];
          }
        }
      }
    }
  }
}

/// Adds to a convolution's block [K, n, Q] (layer pl, input shape
/// `input_shape`, rows first) the mends' products with the pieces' pairs g,
/// g_dw [K, np, C', H', W']: unit (c, y, x) enters weight entry (o, c, i, j)
/// at the output position (y + P − i, x + P − j), g da + g_dw db, added in
/// the order of (k, mend, i, j, o).
void add_conv_mends(const ParamLayer& pl, const std::vector<int64_t>& input_shape, const torch::Tensor& g,
                    const torch::Tensor& g_dw, const SiteMends& m, torch::Tensor& block) {
  PK_ASSERT(pl.desc.kind == Kind::Conv2d);  // a Dense site (a Linear one keeps its rows)
  PK_ASSERT(block.is_contiguous() && g.sizes() == g_dw.sizes());
  const torch::Tensor gc = g.contiguous(), gdc = g_dw.contiguous();
  const SiteMends mc{m.row.contiguous(), m.unit.contiguous(), m.point.contiguous(), m.da.contiguous(),
                     m.db.contiguous()};
  const int64_t K = block.size(0), Q = pl.weight_numel + pl.bias_numel;
  AT_DISPATCH_FLOATING_TYPES(block.scalar_type(), "add_conv_mends", [&] {
    add_mend_entries<scalar_t>(gc.data_ptr<scalar_t>(), gdc.data_ptr<scalar_t>(), mc, K, gc.size(1),
                               pl.weight_shape[0], pl.weight_shape[1], pl.weight_shape[2], pl.weight_shape[3],
                               input_shape[2], input_shape[3], gc.size(3), gc.size(4), pl.desc.padding, Q,
                               block.size(1), block.data_ptr<scalar_t>());
  });
}

/// Counts the kinks a search found in f, each at its site.
void count_found(QuadratureCounts& f, const KinkSearch& ks) {
  for (const Kink& k : ks.kinks) {
    f.count_kinks(k.layer, k.minus >= 0 ? QuadratureCounts::kPoolSwitch : QuadratureCounts::kReluFlip);
  }
}

/// The integrand: test features of points x [n, ...] on the segment set in ev.
class LayeredFeatures final : public Integrand {
 public:
  LayeredFeatures(const SegmentEvaluator& ev, const torch::Tensor& x, const QuadratureOptions& q, TestFeatures& f);

  int64_t points() const override { return n_; }
  void integrate_fixed(const QuadratureRule& rule) override;
  std::vector<double> scales() override;
  std::vector<std::vector<double>> initial_kinks() override;
  int64_t exact_nodes() const override { return exact_nodes_; }
  int64_t split_outputs() const override { return fold_ ? ev_.num_outputs() : 0; }
  int64_t max_rows() const override { return max_rows_; }
  std::vector<double> certificate_gaps(const PieceRound& rd) override;
  std::vector<std::vector<double>> kinks_in(const PieceRound& rd, const std::vector<int64_t>& failed) override;
  /// The kinks inside the failed pieces that the network's rows find.
  std::vector<std::vector<double>> search_kinks(const PieceRound& rd, const std::vector<int64_t>& failed);
  void accept(const PieceRound& rd, const std::vector<int64_t>& accepted) override;

  /// Assembles the kept rows and the first layer's sums into f's layers,
  /// and measures the certificate.
  void assemble();
  /// Adds the held site's switches to `breaks` (per test point, sorted):
  /// the integrand is smooth between them, as the EPK between points needs.
  void add_switches(std::vector<std::vector<double>>& breaks) const;

 private:
  void keep(const SegmentPass& pass, const std::vector<torch::Tensor>& sig, const torch::Tensor& rows,
            const torch::Tensor& point, const torch::Tensor& weight, bool unit);
  void keep_first(const torch::Tensor& s, const torch::Tensor& pr, const torch::Tensor& wr, bool unit);
  /// Rows `pieces` along dim of a tensor of the round's pieces (v itself
  /// when they are all of them).
  torch::Tensor of_pieces(const torch::Tensor& v, int64_t dim, const torch::Tensor& pieces) const;
  /// The pass of rows of points `point` at t (Route::forward_points): the
  /// route takes their first layer from the points' products (points_).
  SegmentPass rows_at(const torch::Tensor& point, const torch::Tensor& t, bool track) const {
    return ev_.forward_points(points_, point, t, track);
  }
  /// Adds the first layer's signals of accepted pieces `pieces` (of the
  /// round's pairs, pair_walk_) to first_sum_: their test points are
  /// `present` [G], piece p's present[group[p]].
  /// `sums`: the pairs' sums by group, where the selection is known.
  void add_first_of_pairs(const torch::Tensor& pieces, const torch::Tensor& present, const torch::Tensor& group,
                          const PairSums& sums);
  /// Adds layer 1's block of accepted pieces `pieces` (as
  /// add_first_of_pairs) to its Dense block (docs/math.md §7): per test
  /// point, its pairs' sums against layer 1's input A + t B under its first
  /// piece's selection, and each piece's own pair where its selection
  /// differs.
  void add_site_of_pairs(const torch::Tensor& pieces, const torch::Tensor& present, const torch::Tensor& group,
                         const PairSums& sums);
  SegmentPass fresh_pass(const SharedRows& rows);
  std::vector<torch::Tensor> shared_sites(const SegmentPass& pf, const torch::Tensor& index) const;
  void evaluate_round(const PieceRound& rd);
  /// The round's pieces' pairs from their rows' signals at layer 1, their
  /// selections and their first-layer parts of J̄ dw (pair_walk_, not held
  /// at layer 1).
  void form_piece_pairs(const PieceRound& rd);
  /// The signals of a pass for cotangents c [K, R, K_out] on its logits:
  /// every param layer's, or with pair_walk_ layer 1's and above.
  std::vector<torch::Tensor> round_signals(const SegmentPass& pass, const torch::Tensor& c) const;
  /// evaluate_round with the last site held: the nodes' cotangents on the
  /// site, walked back, and the logits' layer's integrals per piece.
  void evaluate_held_round(const PieceRound& rd);
  /// The held logits' layer's part of J̄ dw per piece, [np, K].
  torch::Tensor held_dot() const;
  /// Held through a hidden layer: adds the accepted piece p's integrals to
  /// its test point's group of pieces with the same mask.
  void add_hidden_piece(int64_t point, int64_t p);
  /// The kink sites of the round's rows, nodes then ends (formed once a
  /// round, for find_hidden and kinks_in), and the rows' points and t in
  /// that order.
  const std::vector<torch::Tensor>& round_sites();
  std::vector<int64_t> round_points(const PieceRound& rd) const;
  std::vector<double> round_t(const PieceRound& rd) const;
  /// Piece p's rows of round_sites() ascending in t: its ends and its nodes.
  std::vector<int64_t> piece_rows(const PieceRound& rd, int64_t p) const;
  /// Rows a round: at most `most` (QuadratureOptions::max_rows) and within
  /// kRoundDoubles of K cotangents' activations (one row's: its input and
  /// every param layer's output, from p0_).
  int64_t round_rows(int64_t most) const;
  /// Fails (gap +inf) every piece with a switch hidden between its rows
  /// that a pass at the fits' candidate confirms, keeping that row.
  void find_hidden(const PieceRound& rd, std::vector<double>& gap);

  const SegmentEvaluator& ev_;
  const torch::Tensor& x_;
  /// The test points on this step's segment, their first layer's products
  /// formed once (Route::segment_points).
  SegmentPoints points_;
  const QuadratureOptions& q_;
  TestFeatures& f_;
  const int64_t n_, k_out_;
  const torch::TensorOptions opts_;
  SegmentPass p0_, p1_;  ///< every point at t = 0 and t = 1
  int64_t max_rows_ = 0;  ///< rows a round (round_rows)
  size_t layers_ = 0;
  /// The first param layer's input is the same at every node of a test point
  /// (first_input_fixed), and its block is linear in the signals for a fixed
  /// input: the rows' weighted signals are summed per point, Σ_r ω_r δ_r,
  /// [K, n, ...]. A factored layer keeps the sum (Summed); any other's block
  /// (a convolution, an embedding) is formed from it once per point.
  bool sum_first_ = false;
  torch::Tensor first_sum_;
  std::vector<torch::Tensor> kept_point_, kept_weight_;
  std::vector<std::vector<torch::Tensor>> kept_inputs_, kept_signals_;
  bool first_relu_ = false;
  /// Whether switches hidden between a piece's rows are looked for: a
  /// piecewise-linear network (its sites polynomials on a piece) with a
  /// ReLU after a param layer beyond the first (the first's are affine).
  bool check_hidden_ = false;
  /// The round's confirmed hidden switches: per piece its row of
  /// hidden_sites_ (−1 for none), their points and t.
  std::vector<int64_t> hidden_row_, hidden_point_;
  std::vector<double> hidden_t_;
  std::vector<torch::Tensor> hidden_sites_;
  /// A piecewise-linear network's pieces are integrated exactly: its logit
  /// Jacobian has degree L − 1 on a piece, so ⌈L/2⌉ Gauss nodes for logits;
  /// for log-softmax, (I − 1 pᵀ) J_z with J_z interpolated on those nodes
  /// and the moment nodes (next_round), and the softmax factor integrated
  /// over the interpolated logits.
  bool fold_ = false;
  int64_t exact_nodes_ = 0;
  // The current round: its passes (nodes, fresh ends, moment rows), signals
  // and rows.
  SegmentPass pass_, pf_, pm_;
  std::vector<torch::Tensor> round_sites_;  ///< round_sites(), empty until asked for
  std::vector<torch::Tensor> sig_, msig_;
  torch::Tensor point_t_, w_t_, mpoint_t_, end_index_;
  /// The last site held (QuadratureOptions::last_site): pieces end
  /// at the earlier sites' kinks, and each test point's switches of the
  /// held site (sorted) enter through last_site_terms.
  bool held_ = false;
  size_t site_ = 0;  ///< the held site: param layer L − 2, or L − 3 held through a hidden layer
  /// Held through a hidden layer (QuadratureOptions::LastSite::Hidden):
  /// the logits' layer's input is the hidden layer's ReLU, and the hidden
  /// layer's block is formed per test point from its pieces' integrals,
  /// summed over the pieces that share its mask (hidden_groups_).
  bool through_hidden_ = false;
  struct HiddenGroup {
    torch::Tensor mask;
    std::array<torch::Tensor, 8> sums;  ///< h0, h1, p0, p1, len, t1, p0s, p1s (LastSiteTerms)
  };
  std::vector<std::vector<HiddenGroup>> hidden_groups_;
  bool softmax_ = false;
  std::vector<std::vector<double>> switches_;
  LastSiteTerms terms_;  ///< the current round's
  /// The first layer summed, and either held at param layer 1, or held
  /// above it or not held with the route's first selection known
  /// (QuadratureOptions::piece_pairs): the first layer's signals are needed
  /// only as each piece's sum over its rows, whose masks agree (the pieces end at the
  /// first site's kinks), so a pair of cotangents on layer 1 per piece
  /// gives it (Route::first_signals_of_pair): the round's pairs Σ_j G_j and
  /// Σ_j t_j G_j, [K, np, ...] (G_j a row's weighted signal at layer 1,
  /// moment rows' included), each piece's first node row, whose masks (and
  /// first-layer direction) they take, and each piece's first-layer part
  /// of J̄ dw, [K, np] (Route::first_dot_of_pair). The accepted pieces'
  /// signals are summed per test point by
  /// Route::first_signals_of_pairs_summed. Not held, the rows walk back to
  /// layer 1 alone (Route::signals_above_first); held above layer 1, the
  /// nodes' cotangents on the site do (Route::signals_from_above_first).
  bool pair_walk_ = false;
  torch::Tensor piece_g_, piece_gt_, piece_first_row_, piece_first_dot_;
  /// Each piece's first-layer selection (Route::first_selection) at its
  /// first row, [np, U1], taken once a round for the route's pair methods
  /// and layer 1's block; undefined where the route has none.
  torch::Tensor piece_sel_;
  /// Whether layer 1's block (the held site's, or an unheld piece's layer
  /// 1) is formed from the pairs too (add_site_of_pairs): the selection is
  /// known and the block is Dense (a convolution). Held, the nodes'
  /// cotangents are then never formed; not held, the rows' signals at
  /// layer 1 serve the pairs and the certificate alone.
  bool site_of_pairs() const { return piece_sel_.defined() && f_.layers[1].form == Form::Dense; }
  /// Whether the route knows where the layers between the first two param
  /// layers route layer 1's input (Route::first_selection), which the pairs
  /// need beyond a site held at layer 1.
  bool first_selects() const { return ev_.first_selection(p0_, torch::zeros({1}, torch::kLong)).defined(); }
  /// Per test point, the accepted pieces' sums of the logits' layer (last_site.h).
  torch::Tensor h_sum_, ph_sum_, p_sum_, len_sum_;
};

int64_t LayeredFeatures::round_rows(int64_t most) const {
  int64_t per_row = x_.numel() / std::max<int64_t>(1, n_);
  for (const torch::Tensor& y : p0_.preacts) per_row += y.defined() ? y.numel() / std::max<int64_t>(1, n_) : 0;
  const int64_t fit = kRoundDoubles / std::max<int64_t>(1, k_out_ * per_row);
  return std::min(most, std::max(kMinRoundRows, fit));
}

LayeredFeatures::LayeredFeatures(const SegmentEvaluator& ev, const torch::Tensor& x, const QuadratureOptions& q,
                                 TestFeatures& f)
    : ev_(ev), x_(x), q_(q), f_(f), n_(x.size(0)), k_out_(ev.num_outputs()), opts_(x.options()) {
  f.num_points = n_;
  points_ = ev.segment_points(x);
  p0_ = rows_at(torch::arange(n_), torch::zeros({n_}, opts_), false);
  p1_ = rows_at(torch::arange(n_), torch::ones({n_}, opts_), false);
  f.f0 = p0_.out;
  f.f1 = p1_.out;
  max_rows_ = round_rows(q.max_rows);
  // Each layer's form (LayerFeatures): accepted rows go straight into the
  // Dense blocks and the Summed first layer; only Rows layers keep them.
  layers_ = ev.param_layers().size();
  f.layers.resize(layers_);
  for (size_t l = 0; l < layers_; ++l) f.layers[l].form = layer_form(ev, l, p0_.inputs[l]);
  kept_inputs_.resize(layers_);
  kept_signals_.resize(layers_);
  sum_first_ = layers_ > 0 && ev.first_input_fixed();
  first_relu_ = ev.first_site_affine();
  for (size_t l = 1; l < ev.relu_after().size(); ++l) check_hidden_ = check_hidden_ || ev.relu_after()[l];
  check_hidden_ = check_hidden_ && ev.polynomial_degree() > 0;
  const int64_t degree = q.exact_pieces ? ev.polynomial_degree() : 0;
  fold_ = degree > 0 && ev.log_softmax_output();
  exact_nodes_ = degree == 0 ? 0 : fold_ ? degree : (degree + 1) / 2;
  // Held, a piece takes L − 1 nodes against the pieces' own ⌈L/2⌉ (and
  // moment nodes): under Auto, only where that is no more (L = 3).
  using LastSite = QuadratureOptions::LastSite;
  const bool gauss = degree > 0 && q.spec.kind == QuadratureSpec::Kind::Gauss;
  held_ = gauss && ev.last_site_local() &&
          (q.last_site == LastSite::Local || (q.last_site == LastSite::Auto && degree - 1 <= (degree + 1) / 2));
  // Through a hidden layer, L − 2 nodes a piece.
  through_hidden_ = !held_ && gauss && ev.hidden_site_local() &&
            (q.last_site == LastSite::Hidden || (q.last_site == LastSite::Auto && degree - 2 <= (degree + 1) / 2));
  held_ = held_ || through_hidden_;
  if (held_) {
    // ∂y/∂θ at the held site has degree L − 2 on a piece (L − 3 through a
    // hidden layer): L − 1 nodes (L − 2) interpolate it; the softmax factor
    // is integrated with the scalars.
    site_ = layers_ - (through_hidden_ ? 3 : 2);
    softmax_ = ev.log_softmax_output();
    fold_ = false;
    exact_nodes_ = degree - (through_hidden_ ? 2 : 1);
    switches_.resize(static_cast<size_t>(n_));
    f.layers[layers_ - 1].form = Form::Dense;
    if (through_hidden_) {
      f.layers[layers_ - 2].form = Form::Dense;
      hidden_groups_.resize(static_cast<size_t>(n_));
    }
    const int64_t hw = ev.weight_of(ev.start(), layers_ - 1).size(1);
    h_sum_ = torch::zeros({n_, hw}, opts_);
    ph_sum_ = torch::zeros({n_, k_out_, hw}, opts_);
    p_sum_ = torch::zeros({n_, k_out_}, opts_);
    len_sum_ = torch::zeros({n_}, opts_);
    check_hidden_ = false;  // only sites before the held one are fitted
    for (size_t l = 1; l < site_; ++l) check_hidden_ = check_hidden_ || ev.relu_after()[l];
    // Held at layer 1, the site's cotangents summed per piece are its pairs.
    // Held above it, the rows walk back to layer 1 alone and their signals
    // there are summed, as where no site is held, where layer 1 is a
    // convolution: a Linear layer 1's input gradient costs its rows less
    // than the pairs' own work (a deep MLP's verify took 1.2 times as long).
    pair_walk_ = sum_first_ && (site_ == 1 || (q.piece_pairs && f.layers[1].form == Form::Dense && first_selects()));
  } else {
    pair_walk_ = q.piece_pairs && sum_first_ && degree > 0 && layers_ >= 3 &&
                 q.spec.kind == QuadratureSpec::Kind::Gauss && first_selects();
  }
}

void LayeredFeatures::keep_first(const torch::Tensor& s, const torch::Tensor& pr, const torch::Tensor& wr,
                                 bool unit) {
  std::vector<int64_t> w_shape(s.dim(), 1);
  w_shape[1] = s.size(1);
  if (!first_sum_.defined()) {
    std::vector<int64_t> sizes = s.sizes().vec();
    sizes[0] = k_out_;
    sizes[1] = n_;
    first_sum_ = torch::zeros(sizes, s.options());
  }
  first_sum_.index_add_(1, pr, every_output(unit ? s : s * wr.view(w_shape), k_out_));
}

torch::Tensor LayeredFeatures::of_pieces(const torch::Tensor& v, int64_t dim, const torch::Tensor& pieces) const {
  return pieces.size(0) == piece_first_row_.size(0) ? v : v.index_select(dim, pieces);  // every piece: no copy
}

void LayeredFeatures::add_first_of_pairs(const torch::Tensor& pieces, const torch::Tensor& present,
                                         const torch::Tensor& group, const PairSums& sums) {
  const torch::Tensor sel = piece_sel_.defined() ? of_pieces(piece_sel_, 0, pieces) : piece_sel_;
  const torch::Tensor s = ev_.first_signals_of_pairs_summed(pass_, of_pieces(piece_first_row_, 0, pieces), sel,
                                                            of_pieces(piece_g_, 1, pieces),
                                                            of_pieces(piece_gt_, 1, pieces), group, present.size(0),
                                                            sums);
  if (!first_sum_.defined()) {
    std::vector<int64_t> sizes = s.sizes().vec();
    sizes[1] = n_;
    first_sum_ = torch::zeros(sizes, s.options());
  }
  first_sum_.index_add_(1, present, s);
}

void LayeredFeatures::add_site_of_pairs(const torch::Tensor& pieces, const torch::Tensor& present,
                                        const torch::Tensor& group, const PairSums& sums) {
  const torch::Tensor sel = of_pieces(piece_sel_, 0, pieces), rows = of_pieces(piece_first_row_, 0, pieces);
  const torch::Tensor g = of_pieces(piece_g_, 1, pieces), gt = of_pieces(piece_gt_, 1, pieces);
  const int64_t G = present.size(0);
  PK_ASSERT(sums.g.defined() && sums.g_dw.defined());
  // Each test point's first piece; its selection routes the point's sums.
  const torch::Tensor ref = first_of_each_group(group, G), ref_sel = sel.index_select(0, ref);  // [G, U1, S]
  // Layer 1's input on a piece is A + t B: the first layer's output at t = 0
  // and its direction, routed by the piece's selection.
  const torch::Tensor y0 = p0_.preacts[0].detach().index_select(0, present).flatten(1);                  // [G, U0]
  const torch::Tensor d0 = pass_.directions[0].detach().index_select(0, rows.index_select(0, ref)).flatten(1);
  std::vector<int64_t> shape = pass_.inputs[1].sizes().vec();
  shape[0] = 2 * G;
  // Rows A, B of each point in turn (grouped by point, as add_dense takes
  // them best); B's bias columns, which would take Σ_j t_j G_j, are taken
  // back out: the bias has A's alone (its input is 1, not t).
  const torch::Tensor& gts = sums.g_dw;
  const double slope = ev_.slope_after(0);
  const torch::Tensor rows_a_b =
      torch::stack({routed_by_selection(y0, ref_sel, slope), routed_by_selection(d0, ref_sel, slope)}, 1);
  add_dense(ev_, 1, f_, rows_a_b.view(shape),
            torch::stack({sums.g, gts}, 2).flatten(1, 2), present.repeat_interleave(2), torch::Tensor());
  const ParamLayer& pl = ev_.param_layers()[1];
  if (pl.bias_numel > 0) {
    f_.layers[1].block.narrow(2, pl.weight_numel, pl.bias_numel)
        .index_add_(1, present, gts.dim() > 3 ? -gts.flatten(3).sum(3) : -gts);
  }
  // A piece's units routed elsewhere than by its point's first piece: its
  // own pair against the change of A and B there.
  const torch::Tensor at = (sel != ref_sel.index_select(0, group)).nonzero();  // [M, 3]: row, unit, slot
  if (at.size(0) == 0) return;
  SiteMends m;
  m.row = at.select(1, 0);
  m.unit = at.select(1, 1);
  const torch::Tensor in = group.index_select(0, m.row), slot = at.select(1, 2);
  const torch::Tensor own = sel.index({m.row, m.unit, slot}), was = ref_sel.index({in, m.unit, slot});
  const int64_t U0 = y0.size(1), S = sel.size(2);
  auto change = [&](const torch::Tensor& v) {  // v [G, U0]: the entries alone, not the rows
    auto at_unit = [&](const torch::Tensor& s) {
      const SelectionSources src = selection_sources(s, slope);
      return v.view(-1).index_select(0, in * U0 + src.unit) * src.weight;
    };
    return over_slots(at_unit(own) - at_unit(was), S);
  };
  m.point = present.index_select(0, in);
  m.da = change(y0);
  m.db = change(d0);
  add_conv_mends(pl, shape, g, gt, m, f_.layers[1].block);
}

/// Keeps the rows `rows` (ascending) of a pass with signals `sig`; `unit`:
/// their weights are all 1 (folded into the signals). Signals of one
/// cotangent ([1, R, ...]: moment rows) belong to every output alike.
void LayeredFeatures::keep(const SegmentPass& pass, const std::vector<torch::Tensor>& sig, const torch::Tensor& rows,
                           const torch::Tensor& point, const torch::Tensor& weight, bool unit) {
  const bool all = rows.size(0) == point.size(0);  // every row: no copies
  torch::Tensor pr = all ? point : point.index_select(0, rows), wr = all ? weight : weight.index_select(0, rows);
  for (size_t l = 0; l < layers_; ++l) {
    if (!sig[l].defined()) continue;  // the held logits' layer: added by accept
    if (l == 1 && pair_walk_ && site_of_pairs()) continue;  // added from the pairs by accept
    torch::Tensor s = all ? sig[l] : sig[l].index_select(1, rows);
    if (l == 0 && sum_first_) {
      keep_first(s, pr, wr, unit);
      continue;
    }
    torch::Tensor a = all ? pass.inputs[l].detach() : pass.inputs[l].detach().index_select(0, rows);
    switch (f_.layers[l].form) {
      case Form::Dense: add_dense(ev_, l, f_, a, s, pr, unit ? torch::Tensor() : wr); break;
      case Form::Rows:
        kept_inputs_[l].push_back(a);
        kept_signals_[l].push_back(every_output(s, k_out_));
        break;
      case Form::Summed: PK_ASSERT(false && "only the first layer is summed"); break;
    }
  }
  kept_point_.push_back(pr);
  kept_weight_.push_back(wr);
}

/// The pass of `rows`' fresh rows (undefined when there are none), counted
/// as forward-only.
SegmentPass LayeredFeatures::fresh_pass(const SharedRows& rows) {
  SegmentPass pf;
  if (rows.fresh_t.empty()) return pf;
  pf = rows_at(torch::tensor(rows.fresh_point, torch::kLong), torch::tensor(rows.fresh_t, opts_), false);
  f_.forward_evaluations += static_cast<int64_t>(rows.fresh_t.size());
  return pf;
}

/// The sites of rows `index` of (p0, p1, pf).
std::vector<torch::Tensor> LayeredFeatures::shared_sites(const SegmentPass& pf, const torch::Tensor& index) const {
  std::vector<torch::Tensor> out;
  for (size_t l = 0; l < ev_.kink_values(p0_).size(); ++l) {
    const torch::Tensor fresh = pf.out.defined() ? ev_.kink_values(pf)[l] : torch::Tensor();
    out.push_back(end_select(ev_.kink_values(p0_)[l], ev_.kink_values(p1_)[l], fresh, index));
  }
  return out;
}

void LayeredFeatures::integrate_fixed(const QuadratureRule& rule) {
  // Every test point gets the same nodes, in rounds of whole points held to
  // the round's rows (at least one point): a block of points with many
  // nodes each takes more rounds rather than more memory.
  const int64_t t_count = static_cast<int64_t>(rule.nodes.size());
  const int64_t per_round = std::max<int64_t>(1, max_rows_ / std::max<int64_t>(1, t_count));
  const torch::Tensor t_one = torch::tensor(rule.nodes, opts_), w_one = torch::tensor(rule.weights, opts_);
  for (int64_t first = 0; first < n_; first += per_round) {
    const int64_t count = std::min(per_round, n_ - first);
    torch::Tensor point = torch::arange(first, first + count).repeat_interleave(t_count);
    SegmentPass pass = rows_at(point, t_one.repeat({count}), track_passes(ev_));
    std::vector<torch::Tensor> sig = all_signals(ev_, pass);
    keep(pass, sig, torch::arange(point.size(0)), point, w_one.repeat({count}), false);
  }
  f_.evaluations = n_ * t_count;
}

std::vector<double> LayeredFeatures::scales() {
  const torch::Tensor scale = f_.f0.abs().amax(1).clamp_min(1.0);  // [n]
  return std::vector<double>(scale.data_ptr<double>(), scale.data_ptr<double>() + scale.numel());
}

std::vector<std::vector<double>> LayeredFeatures::initial_kinks() {
  // Split [0,1] at every kink that a scan of the segment sees. The first
  // layer's kinks are closed-form (its pre-activation is affine in t);
  // deeper ReLU kinks and max-pool switches are detected between scan
  // points and located by root finding.
  const int64_t scan = std::max(1, q_.scan_intervals);
  std::vector<int64_t> scan_point(n_ * (scan + 1));
  std::vector<double> scan_t(n_ * (scan + 1));
  std::vector<KinkBracket> scan_brackets;
  for (int64_t i = 0; i < n_; ++i) {
    for (int64_t j = 0; j <= scan; ++j) {
      scan_point[i * (scan + 1) + j] = i;
      scan_t[i * (scan + 1) + j] = j == scan ? 1.0 : static_cast<double>(j) / static_cast<double>(scan);
      if (j < scan) scan_brackets.push_back({i * (scan + 1) + j, i * (scan + 1) + j + 1});
    }
  }
  std::vector<std::vector<double>> cuts(n_);
  // Only layers after the first can have kinks a scan must find: with one
  // hidden ReLU layer (or smooth activations) every kink is closed-form.
  bool deep_kinks = false;
  // A held site's switches are found on each piece's interpolant instead.
  const size_t searched = held_ ? site_ : ev_.relu_after().size();
  for (size_t l = first_relu_ ? 1 : 0; l < searched; ++l) {
    deep_kinks = deep_kinks || ev_.relu_after()[l] || ev_.pool_after()[l] > 0;
  }
  if (deep_kinks) {
    // The scan's ends, t = 0 and t = 1, are the passes p0 and p1; only the
    // points in between take a pass.
    const SharedRows sr = shared_rows(scan_point, scan_t, n_);
    std::vector<torch::Tensor> scan_sites =
        shared_sites(fresh_pass(sr), torch::tensor(sr.index, torch::kLong));  // [n (scan + 1), ...]
    scan_sites.resize(searched);
    KinkSearch ks = find_kinks(ev_, x_, scan_sites, scan_point, scan_t, scan_brackets, first_relu_, q_.fit_kinks);
    f_.forward_evaluations += ks.forward_evaluations;
    count_found(f_, ks);
    for (const Kink& k : ks.kinks) cuts[k.bracket / scan].push_back(k.t);
  }
  for (int64_t i = 0; first_relu_ && i < n_; ++i) {
    std::vector<double> c = first_layer_kinks(ev_, p0_.preacts[0][i], p1_.preacts[0][i]);
    f_.count_kinks(0, TestFeatures::kClosedForm, static_cast<int64_t>(c.size()));
    cuts[i].insert(cuts[i].end(), c.begin(), c.end());
  }
  return cuts;
}

/// Evaluates a round: its nodes' pass and signals, its fresh ends, its
/// moment rows'.
void LayeredFeatures::evaluate_round(const PieceRound& rd) {
  if (held_) {
    evaluate_held_round(rd);
    return;
  }
  pass_ = pf_ = SegmentPass();  // the last round's, freed first
  round_sites_.clear();
  sig_.clear();
  point_t_ = torch::tensor(rd.point, torch::kLong);
  w_t_ = torch::tensor(rd.w, opts_);
  pass_ = rows_at(point_t_, torch::tensor(rd.t, opts_), track_passes(ev_));
  // The pieces' ends: only those not evaluated yet take a pass.
  const SharedRows er = shared_rows(rd.end_point, rd.ends, n_);
  end_index_ = torch::tensor(er.index, torch::kLong);
  pf_ = fresh_pass(er);
  // The moment rows' pass, and their point indices (log-softmax pieces).
  pm_ = SegmentPass();
  mpoint_t_ = torch::Tensor();
  if (rd.moment_rows > 0) {
    mpoint_t_ = torch::tensor(rd.mpoint, torch::kLong);
    pm_ = rows_at(mpoint_t_, torch::tensor(rd.mt, opts_), track_passes(ev_));
  }
  msig_.clear();
  if (fold_) {
    auto [v, vm] = softmax_moments(rd, pass_.logits.detach(), pm_.out.defined() ? pm_.logits.detach() : torch::Tensor(),
                                   end_select(p0_.logits, p1_.logits, pf_.logits, end_index_));
    sig_ = round_signals(pass_, folded_cotangents(ev_, w_t_, v));
    // A moment row's signal, of the cotangent −v_j, is every output's.
    if (rd.moment_rows > 0) msig_ = round_signals(pm_, -vm.unsqueeze(0));
    w_t_ = torch::ones_like(w_t_);
  } else {
    sig_ = pair_walk_ ? ev_.batched_signals_above_first(pass_, unit_cotangents(ev_, rd.rows, opts_))
                      : all_signals(ev_, pass_);
  }
  f_.evaluations += rd.rows;
  f_.moment_evaluations += rd.moment_rows;
  if (pair_walk_) form_piece_pairs(rd);
}

std::vector<torch::Tensor> LayeredFeatures::round_signals(const SegmentPass& pass, const torch::Tensor& c) const {
  return pair_walk_ ? ev_.batched_signals_above_first(pass, c, /*of_logits=*/true)
                    : batched_signals(ev_, pass, c, /*of_logits=*/true);
}

void LayeredFeatures::form_piece_pairs(const PieceRound& rd) {
  piece_first_row_ = torch::tensor(std::vector<int64_t>(rd.first.begin(), rd.first.begin() + rd.np), torch::kLong);
  piece_sel_ = ev_.first_selection(pass_, piece_first_row_);
  // G_j = w_j δ_j at layer 1 (the weights are 1 where folded), summed per
  // piece alone and times t_j; a moment row's signal is every output's. A
  // piece's rows are consecutive (first): pieces of as many rows each are
  // summed as a view [K, np, m, ...].
  auto pairs_of = [&](const torch::Tensor& s, const torch::Tensor& w, const torch::Tensor& t,
                      const std::vector<int64_t>& first, const std::vector<int64_t>& piece_of) {
    const int64_t R = s.size(1), m = R / rd.np;
    std::vector<int64_t> shape(s.dim(), 1);
    shape[1] = R;
    const torch::Tensor ws = w.defined() ? s * w.view(shape) : s;
    bool even = m * rd.np == R;
    for (int64_t p = 0; even && p < rd.np; ++p) even = first[p + 1] - first[p] == m;
    if (even) {
      // [K, np, m, U]: the sums over m, and the t-weighted ones as
      // products [1, m] × [m, U] (no copy of the signals).
      const torch::Tensor by = ws.reshape({s.size(0), rd.np, m, -1});
      std::vector<int64_t> out = s.sizes().vec();
      out[1] = rd.np;
      return std::make_pair(by.sum(2).view(out), torch::matmul(t.view({1, rd.np, 1, m}), by).view(out));
    }
    const torch::Tensor piece = torch::tensor(piece_of, torch::kLong);
    return std::make_pair(sum_by_group(ws, piece, rd.np), sum_by_group(ws * t.view(shape), piece, rd.np));
  };
  std::tie(piece_g_, piece_gt_) =
      pairs_of(sig_[1], fold_ || held_ ? torch::Tensor() : w_t_, pass_.t, rd.first, rd.piece_of);
  if (rd.moment_rows > 0) {
    const auto [mg, mgt] = pairs_of(msig_[1], torch::Tensor(), pm_.t, rd.mfirst, rd.mpiece_of);
    piece_g_ = piece_g_ + mg;
    piece_gt_ = piece_gt_ + mgt;
  }
  piece_first_dot_ = ev_.first_dot_of_pair(pass_, piece_first_row_, piece_sel_, piece_g_, piece_gt_);
  f_.short_cotangents += rd.rows * k_out_ + rd.moment_rows;
  f_.pair_pieces += rd.np;
}

void LayeredFeatures::evaluate_held_round(const PieceRound& rd) {
  pass_ = pf_ = SegmentPass();  // the last round's, freed first
  terms_ = LastSiteTerms();
  round_sites_.clear();
  point_t_ = torch::tensor(rd.point, torch::kLong);
  w_t_ = torch::ones({rd.rows}, opts_);  // the weights are in the cotangents
  pass_ = rows_at(point_t_, torch::tensor(rd.t, opts_), false);
  const SharedRows er = shared_rows(rd.end_point, rd.ends, n_);
  end_index_ = torch::tensor(er.index, torch::kLong);
  pf_ = fresh_pass(er);
  const torch::Tensor end_y = end_select(p0_.preacts[site_], p1_.preacts[site_],
                                         pf_.out.defined() ? pf_.preacts[site_] : torch::Tensor(), end_index_);
  terms_ = last_site_terms(ev_, rd, pass_.preacts[site_].detach(), end_y, softmax_, through_hidden_);
  f_.evaluations += rd.rows;
  const std::vector<int64_t> shape = pass_.preacts[site_].sizes().vec();
  if (!pair_walk_ || site_ > 1) {
    // The nodes' cotangents on the site walk back to the first layer, or
    // with the pairs to layer 1 alone, whose signals give them.
    const torch::Tensor c = site_cotangents(terms_, terms_.fields, rd.piece_of, shape);
    sig_ = pair_walk_ ? ev_.signals_from_above_first(pass_, site_, c) : ev_.signals_from(pass_, site_, c);
    if (pair_walk_) form_piece_pairs(rd);
    return;
  }
  // The first layer's signals, and the site's block where the first
  // selection is known, come from each piece's pair Σ_j G_j at W_s and
  // Σ_j t_j G_j at dW; otherwise the site's signals are the nodes' cotangents.
  sig_.assign(layers_, torch::Tensor());
  std::vector<int64_t> first_row(static_cast<size_t>(rd.np));
  for (int64_t p = 0; p < rd.np; ++p) {
    PK_ASSERT(rd.first[p + 1] > rd.first[p]);
    first_row[static_cast<size_t>(p)] = rd.first[p];
  }
  piece_first_row_ = torch::tensor(first_row, torch::kLong);
  piece_sel_ = ev_.first_selection(pass_, piece_first_row_);
  if (!site_of_pairs()) sig_[site_] = site_cotangents(terms_, terms_.fields, rd.piece_of, shape);
  // The cotangents are linear in their fields: the sums are the fields'.
  std::tie(piece_g_, piece_gt_) = piece_cotangent_sums(terms_, rd, pass_.t, shape);
  piece_first_dot_ = ev_.first_dot_of_pair(pass_, piece_first_row_, piece_sel_, piece_g_, piece_gt_);
  (site_of_pairs() ? f_.unwalked_cotangents : f_.short_cotangents) += rd.rows * k_out_;
  f_.pair_pieces += rd.np;
}

torch::Tensor LayeredFeatures::held_dot() const {
  const size_t l = layers_ - 1;
  const torch::Tensor dw = ev_.weight_of(ev_.direction(), l);  // [K, Hw]
  // Output k: h_sum · dW_k + len db_k − Σ_k' (ph_sum_k' · dW_k' + p_sum_k' db_k'), the db terms
  // only with a bias.
  torch::Tensor shared = (terms_.ph_sum * dw.unsqueeze(0)).sum({1, 2});
  torch::Tensor own = torch::matmul(terms_.h_sum, dw.t());
  if (ev_.param_layers()[l].bias_numel > 0) {
    const torch::Tensor db = ev_.bias_of(ev_.direction(), l);  // [K]
    shared = shared + torch::matmul(terms_.p_sum, db);
    own = own + terms_.len.unsqueeze(1) * db.unsqueeze(0);
  }
  return own - shared.unsqueeze(1);
}

std::vector<double> LayeredFeatures::certificate_gaps(const PieceRound& rd) {
  evaluate_round(rd);
  const torch::Tensor end_out = end_select(p0_.out, p1_.out, pf_.out, end_index_);  // [2 np, K]
  // Per-piece certificate: Σ_nodes ω J dw against f(b) − f(a).
  torch::Tensor jdw;  // [K, R]
  // Held, the logits' layer's part comes from its integrals (held_dot).
  if (held_ && pair_walk_ && site_ == 1) {
    jdw = site_dot(terms_, pass_.directions[site_], rd.piece_of);  // the first layer's part is walked per piece (below)
  } else {
    jdw = segment_dot(ev_, pass_, sig_).detach();
  }
  torch::Tensor integral = torch::zeros({rd.np, jdw.size(0)}, opts_).index_add_(
      0, torch::tensor(rd.piece_of, torch::kLong), (jdw * w_t_.unsqueeze(0)).t());  // [np, K]
  if (held_) integral += held_dot();
  if (through_hidden_) integral += terms_.hidden_dot;
  if (pair_walk_) integral += piece_first_dot_.t();
  if (rd.moment_rows > 0) {
    const torch::Tensor mdw = segment_dot(ev_, pm_, msig_).detach();  // [1, R_m]
    integral.index_add_(0, torch::tensor(rd.mpiece_of, torch::kLong), mdw.t().expand({rd.moment_rows, jdw.size(0)}));
  }
  torch::Tensor fe = end_out.view({rd.np, 2, -1});
  torch::Tensor gap = (integral - (fe.select(1, 1) - fe.select(1, 0))).abs().amax(1).contiguous();  // [np]
  std::vector<double> gaps(gap.data_ptr<double>(), gap.data_ptr<double>() + gap.numel());
  find_hidden(rd, gaps);
  // A piece across a switch of the hidden layer's ReLU ends there.
  for (size_t p = 0; p < terms_.hidden_kinks.size(); ++p) {
    if (!terms_.hidden_kinks[p].empty()) gaps[p] = std::numeric_limits<double>::infinity();
  }
  return gaps;
}

const std::vector<torch::Tensor>& LayeredFeatures::round_sites() {
  if (!round_sites_.empty()) return round_sites_;
  const std::vector<torch::Tensor>& sites = ev_.kink_values(pass_);
  const std::vector<torch::Tensor> end_sites = shared_sites(pf_, end_index_);
  for (size_t l = 0; l < sites.size(); ++l) round_sites_.push_back(torch::cat({sites[l].detach(), end_sites[l]}, 0));
  return round_sites_;
}

std::vector<int64_t> LayeredFeatures::round_points(const PieceRound& rd) const {
  std::vector<int64_t> point(rd.point);
  point.insert(point.end(), rd.end_point.begin(), rd.end_point.end());
  return point;
}

std::vector<double> LayeredFeatures::round_t(const PieceRound& rd) const {
  std::vector<double> t(rd.t);
  t.insert(t.end(), rd.ends.begin(), rd.ends.end());
  return t;
}

std::vector<int64_t> LayeredFeatures::piece_rows(const PieceRound& rd, int64_t p) const {
  std::vector<int64_t> rows{rd.rows + 2 * p};
  for (int64_t r = rd.first[p]; r < rd.first[p + 1]; ++r) rows.push_back(r);
  rows.push_back(rd.rows + 2 * p + 1);
  return rows;
}

void LayeredFeatures::find_hidden(const PieceRound& rd, std::vector<double>& gap) {
  hidden_row_.assign(rd.np, -1);
  hidden_point_.clear();
  hidden_t_.clear();
  hidden_sites_.clear();
  if (!check_hidden_) return;
  // The fits' candidates (hidden_switches); each is a switch only if the
  // network's pattern there differs from the piece's first node's.
  std::vector<torch::Tensor> sites = round_sites();
  if (held_) sites.resize(site_);  // the held site switches inside pieces
  std::vector<std::vector<int64_t>> pieces(rd.np);
  for (int64_t p = 0; p < rd.np; ++p) pieces[p] = piece_rows(rd, p);
  const std::vector<double> cand = hidden_switches(ev_, sites, pieces, round_t(rd));
  std::vector<int64_t> piece, reference;
  for (int64_t p = 0; p < rd.np; ++p) {
    if (std::isnan(cand[p])) continue;
    piece.push_back(p);
    reference.push_back(pieces[p][1]);
    hidden_point_.push_back(rd.end_point[2 * p]);
    hidden_t_.push_back(cand[p]);
  }
  if (piece.empty()) return;
  hidden_sites_ = ev_.sites_at(x_.index_select(0, torch::tensor(hidden_point_, torch::kLong)),
                               torch::tensor(hidden_t_, opts_));
  std::vector<torch::Tensor> hidden_earlier = hidden_sites_;
  if (held_) hidden_earlier.resize(site_);
  f_.forward_evaluations += static_cast<int64_t>(piece.size());
  const torch::Tensor ref = torch::tensor(reference, torch::kLong);
  std::vector<torch::Tensor> ref_sites;
  for (const torch::Tensor& y : sites) ref_sites.push_back(y.index_select(0, ref));
  const std::vector<torch::Tensor> at = activation_patterns(ev_, hidden_earlier), was = activation_patterns(ev_, ref_sites);
  torch::Tensor differs = torch::zeros({static_cast<int64_t>(piece.size())}, torch::kBool);
  for (size_t l = 0; l < at.size(); ++l) differs |= (at[l] != was[l]).any(1);
  auto d = differs.accessor<bool, 1>();
  for (size_t j = 0; j < piece.size(); ++j) {
    if (!d[j]) continue;
    gap[piece[j]] = std::numeric_limits<double>::infinity();
    hidden_row_[piece[j]] = static_cast<int64_t>(j);
  }
}

std::vector<std::vector<double>> LayeredFeatures::kinks_in(const PieceRound& rd, const std::vector<int64_t>& failed) {
  // Held through a hidden layer, a piece across the hidden layer's switches
  // ends at them, found on its interpolants; the others are searched.
  if (through_hidden_) {
    std::vector<std::vector<double>> cuts(failed.size());
    std::vector<int64_t> searched, at;
    for (size_t i = 0; i < failed.size(); ++i) {
      const std::vector<double>& k = terms_.hidden_kinks[static_cast<size_t>(failed[i])];
      if (k.empty()) {
        searched.push_back(failed[i]);
        at.push_back(static_cast<int64_t>(i));
        continue;
      }
      cuts[i] = k;
      f_.count_kinks(static_cast<int64_t>(layers_ - 2), QuadratureCounts::kReluFlip, static_cast<int64_t>(k.size()));
    }
    if (searched.empty()) return cuts;
    std::vector<std::vector<double>> found = search_kinks(rd, searched);
    for (size_t j = 0; j < at.size(); ++j) cuts[static_cast<size_t>(at[j])] = std::move(found[j]);
    return cuts;
  }
  return search_kinks(rd, failed);
}

std::vector<std::vector<double>> LayeredFeatures::search_kinks(const PieceRound& rd,
                                                               const std::vector<int64_t>& failed) {
  // Search a, nodes..., b of each failed piece for kinks that the scan
  // missed, with a confirmed hidden switch's row among them (its pattern
  // differs from its neighbours', so both switches are found).
  std::vector<torch::Tensor> pre = round_sites();
  if (held_) pre.resize(site_);  // the held site switches inside pieces
  std::vector<int64_t> row_point = round_points(rd);
  std::vector<double> row_t = round_t(rd);
  const int64_t hidden_base = static_cast<int64_t>(row_t.size());
  if (!hidden_sites_.empty()) {
    for (size_t l = 0; l < pre.size(); ++l) pre[l] = torch::cat({pre[l], hidden_sites_[l].detach()}, 0);
    row_point.insert(row_point.end(), hidden_point_.begin(), hidden_point_.end());
    row_t.insert(row_t.end(), hidden_t_.begin(), hidden_t_.end());
  }
  std::vector<KinkBracket> brackets;
  std::vector<int64_t> bracket_piece;
  for (size_t i = 0; i < failed.size(); ++i) {
    const int64_t p = failed[i];
    std::vector<int64_t> rows = piece_rows(rd, p);
    if (!hidden_row_.empty() && hidden_row_[p] >= 0) {
      const int64_t h = hidden_base + hidden_row_[p];
      auto at = std::upper_bound(rows.begin(), rows.end(), row_t[h],
                                 [&](double v, int64_t r) { return v < row_t[r]; });
      if (at != rows.begin() && at != rows.end() && row_t[*(at - 1)] < row_t[h]) rows.insert(at, h);
    }
    for (size_t j = 0; j + 1 < rows.size(); ++j) {
      brackets.push_back({rows[j], rows[j + 1]});
      bracket_piece.push_back(static_cast<int64_t>(i));
    }
  }
  KinkSearch ks = find_kinks(ev_, x_, pre, row_point, row_t, brackets, first_relu_, q_.fit_kinks);
  f_.forward_evaluations += ks.forward_evaluations;
  count_found(f_, ks);
  // Kinks come sorted by bracket, then t, and a piece's brackets ascend in t.
  std::vector<std::vector<double>> piece_cuts(failed.size());
  for (const Kink& k : ks.kinks) piece_cuts[bracket_piece[k.bracket]].push_back(k.t);
  return piece_cuts;
}

void LayeredFeatures::accept(const PieceRound& rd, const std::vector<int64_t>& accepted) {
  std::vector<int64_t> points;  // the accepted pieces' test points
  for (int64_t p : accepted) points.push_back(rd.end_point[2 * p]);
  const torch::Tensor pt = torch::tensor(points, torch::kLong), pc = torch::tensor(accepted, torch::kLong);
  if (held_ && !accepted.empty()) {
    h_sum_.index_add_(0, pt, terms_.h_sum.index_select(0, pc));
    ph_sum_.index_add_(0, pt, terms_.ph_sum.index_select(0, pc));
    p_sum_.index_add_(0, pt, terms_.p_sum.index_select(0, pc));
    len_sum_.index_add_(0, pt, terms_.len.index_select(0, pc));
    for (int64_t p : accepted) {
      if (through_hidden_) add_hidden_piece(rd.end_point[2 * p], p);
      std::vector<double>& sw = switches_[static_cast<size_t>(rd.end_point[2 * p])];
      sw.insert(sw.end(), terms_.switches[p].begin(), terms_.switches[p].end());
      f_.count_kinks(static_cast<int64_t>(site_), QuadratureCounts::kReluFlip, terms_.flips[p]);
      f_.count_kinks(static_cast<int64_t>(site_), QuadratureCounts::kPoolSwitch, terms_.argmax[p]);
    }
  }
  if (pair_walk_ && !accepted.empty()) {
    // The accepted pieces' test points, numbered 0, 1, … in `group`.
    const auto [present, group] = torch::_unique(pt, /*sorted=*/true, /*return_inverse=*/true);
    // The pairs' sums per test point, once for both (where the selection
    // routes them: the route sums them itself otherwise).
    PairSums sums;
    if (piece_sel_.defined()) {
      sums = {sum_by_group(of_pieces(piece_g_, 1, pc), group, present.size(0)),
              sum_by_group(of_pieces(piece_gt_, 1, pc), group, present.size(0))};
    }
    add_first_of_pairs(pc, present, group, sums);
    if (site_of_pairs()) add_site_of_pairs(pc, present, group, sums);
    f_.pair_sums += present.size(0);
  }
  std::vector<int64_t> rows, moments;
  for (int64_t p : accepted) {
    for (int64_t r = rd.first[p]; r < rd.first[p + 1]; ++r) rows.push_back(r);
    for (int64_t r = rd.mfirst[p]; r < rd.mfirst[p + 1]; ++r) moments.push_back(r);
  }
  // Held, the weights are in the cotangents (w_t_ is 1).
  if (!rows.empty()) keep(pass_, sig_, torch::tensor(rows, torch::kLong), point_t_, w_t_, fold_ || held_);
  if (!moments.empty()) {
    keep(pm_, msig_, torch::tensor(moments, torch::kLong), mpoint_t_, torch::ones({rd.moment_rows}, opts_), true);
  }
}

void LayeredFeatures::add_hidden_piece(int64_t point, int64_t p) {
  const torch::Tensor mask = terms_.mask[p];
  const std::array<torch::Tensor, 8> sums{terms_.h0[p],  terms_.h1[p],  terms_.p0[p],  terms_.p1[p], terms_.len.narrow(0, p, 1),
                                          terms_.t1.narrow(0, p, 1), terms_.p0s[p], terms_.p1s[p]};
  std::vector<HiddenGroup>& groups = hidden_groups_[static_cast<size_t>(point)];
  auto same = std::find_if(groups.begin(), groups.end(), [&](const HiddenGroup& g) { return g.mask.equal(mask); });
  if (same == groups.end()) {
    HiddenGroup& g = groups.emplace_back();
    g.mask = mask.clone();
    for (size_t i = 0; i < sums.size(); ++i) g.sums[i] = sums[i].clone();
    return;
  }
  for (size_t i = 0; i < sums.size(); ++i) same->sums[i].add_(sums[i]);
}

void LayeredFeatures::assemble() {
  for (size_t l = 0; l < layers_; ++l) {
    LayerFeatures& lf = f_.layers[l];
    if (l == 0 && sum_first_) {
      PK_ASSERT(first_sum_.defined());
      const torch::Tensor a = p0_.inputs[0].detach();  // the first layer's input at every node
      if (lf.form == Form::Summed) {
        lf.inputs = a;
        lf.signals = first_sum_;
      } else {
        add_dense(ev_, 0, f_, a, first_sum_, torch::arange(n_), torch::Tensor());
      }
    } else if (lf.form == Form::Rows) {
      lf.inputs = torch::cat(kept_inputs_[l], 0);
      lf.signals = torch::cat(kept_signals_[l], 1);
    }
  }
  if (through_hidden_) {
    // The hidden layer of every output, per test point from its pieces'
    // integrals: one group of factors per mask (LayerFeatures::HiddenFactors).
    LayerFeatures::HiddenFactors& hf = f_.layers[layers_ - 2].hidden;
    hf.bias = ev_.param_layers()[layers_ - 2].bias_numel > 0;
    std::vector<int64_t> point;
    std::vector<torch::Tensor> mask, h, p;
    for (int64_t i = 0; i < n_; ++i) {
      for (const HiddenGroup& g : hidden_groups_[static_cast<size_t>(i)]) {
        const std::array<torch::Tensor, 8>& v = g.sums;  // h0, h1, p0, p1, len, t1, p0s, p1s
        point.push_back(i);
        mask.push_back(g.mask);
        h.push_back(hf.bias ? torch::stack({torch::cat({v[0], v[4]}), torch::cat({v[1], v[5]})})
                            : torch::stack({v[0], v[1]}));
        p.push_back(hf.bias ? torch::stack({torch::cat({v[2], v[6].unsqueeze(1)}, 1), torch::cat({v[3], v[7].unsqueeze(1)}, 1)})
                            : torch::stack({v[2], v[3]}));
      }
    }
    PK_ASSERT(!point.empty() && "every test point has a piece, so a group");
    const size_t fin = layers_ - 1;
    hf.point = torch::tensor(point, torch::kLong);
    hf.mask = torch::stack(mask);
    hf.h = torch::stack(h);
    hf.p = torch::stack(p);
    hf.w = torch::stack({ev_.weight_of(ev_.start(), fin), ev_.weight_of(ev_.direction(), fin)});
  }
  if (held_) {
    // The logits' layer of every output k: weight e_k ⊗ ∫h − ∫p hᵀ, bias e_k len − ∫p.
    LayerFeatures& lf = f_.layers[layers_ - 1];
    const bool bias = ev_.param_layers()[layers_ - 1].bias_numel > 0;
    lf.held_h = bias ? torch::cat({h_sum_, len_sum_.unsqueeze(1)}, 1) : h_sum_;             // [n, cols]
    lf.held_ph = bias ? torch::cat({ph_sum_, p_sum_.unsqueeze(2)}, 2) : ph_sum_;            // [n, K, cols]
    const torch::Tensor eye = torch::eye(k_out_, opts_);
    const int64_t hw = h_sum_.size(1);
    const torch::Tensor weight = eye.view({k_out_, 1, k_out_, 1}) * h_sum_.view({1, n_, 1, hw}) - ph_sum_.unsqueeze(0);
    lf.block = weight.reshape({k_out_, n_, k_out_ * hw});
    if (bias) {
      const torch::Tensor b = eye.view({k_out_, 1, k_out_}) * len_sum_.view({1, n_, 1}) - p_sum_.unsqueeze(0);
      lf.block = torch::cat({lf.block, b}, 2);
    }
  }
  f_.point = torch::cat(kept_point_);
  f_.weight = torch::cat(kept_weight_);
  measure_certificate(ev_, f_, ev_.direction());
}

void LayeredFeatures::add_switches(std::vector<std::vector<double>>& breaks) const {
  for (size_t i = 0; i < switches_.size() && i < breaks.size(); ++i) {
    std::vector<double>& b = breaks[i];
    std::vector<double> sw = switches_[i];
    std::sort(sw.begin(), sw.end());
    for (double t : sw) {
      auto at = std::lower_bound(b.begin(), b.end(), t);
      const bool near = (at != b.end() && *at - t <= kMinPiece) || (at != b.begin() && t - *(at - 1) <= kMinPiece);
      if (!near) b.insert(at, t);
    }
  }
}

}  // namespace

TestFeatures layered_test_features(const SegmentEvaluator& ev, const torch::Tensor& x, const QuadratureOptions& q) {
  TestFeatures f;
  LayeredFeatures integrand(ev, x, q, f);
  f.breaks = integrate(integrand, q);
  integrand.add_switches(f.breaks);
  integrand.assemble();
  return f;
}

}  // namespace pathkernel
