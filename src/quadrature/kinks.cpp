// Detecting and locating the kinks of the integrand along a segment.
#include "pathkernel/kinks.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "pathkernel/error.h"
#include "pathkernel/max_pool.h"
#include "pathkernel/quadrature.h"

namespace pathkernel {

namespace {

constexpr double kEps = 2.220446049250313e-16;

/// A sign change of y[plus] − y[minus] (y[plus] alone when minus < 0) inside
/// a bracket, y being param layer `layer`'s pre-activation flattened per row.
/// A ReLU unit that flips is (unit, −1); a max-pool window whose argmax
/// switches from i to j is (j, i).
struct Target : SignBracket {
  int64_t bracket = 0, layer = 0, plus = 0, minus = -1;
  int degree = 1;  // the degree of its pre-activation in t on a piece (the fit's degree)
  /// Every evaluation of its value, oldest first, with the hash of the
  /// activation pattern of the sites before its own (the piece it is on).
  struct Sample {
    double t, v;
    uint64_t piece;
  };
  std::vector<Sample> samples;
  uint64_t piece_lo = 0, piece_hi = 0;  // the pieces of lo and hi
  double scale = 0;    // the largest |value| of its layer's sites at lo: the size of their rounding
  double widen = 1;    // the pair around a fitted root r is r ± widen · δ (see find_kinks)
  double pair_a = 0, pair_b = 0;  // the pair of the latest round
  bool done = false;
  double root = 0;
};

double value(const torch::TensorAccessor<double, 2>& y, int64_t row, const Target& k) {
  return y[row][k.plus] - (k.minus >= 0 ? y[row][k.minus] : 0.0);
}

void settle(Target& k, double root) {
  k.done = true;
  k.root = root;
}

/// The root in (lo, hi) of the polynomial through the target's latest
/// degree + 1 samples (distinct t), if it changes sign there; NaN otherwise.
/// On a piece where no unit upstream switches, the unit's pre-activation is
/// that polynomial, so the root is the kink up to rounding. `slope` receives
/// the polynomial's derivative there.
double fitted_root(const Target& k, double& slope) {
  // Only when lo and hi are on one piece (no switch upstream between them,
  // as far as their patterns tell) is the unit one polynomial across the
  // bracket; fit the samples on that piece.
  if (k.piece_lo != k.piece_hi) return std::numeric_limits<double>::quiet_NaN();
  std::vector<double> ts, c;
  for (auto it = k.samples.rbegin(); it != k.samples.rend() && static_cast<int>(ts.size()) <= k.degree; ++it) {
    if (it->piece != k.piece_lo || std::find(ts.begin(), ts.end(), it->t) != ts.end()) continue;
    ts.push_back(it->t);
    c.push_back(it->v);
  }
  if (static_cast<int>(ts.size()) <= k.degree) return std::numeric_limits<double>::quiet_NaN();
  const size_t n = ts.size();
  for (size_t j = 1; j < n; ++j) {  // Newton's divided differences, in place
    for (size_t i = n - 1; i >= j; --i) c[i] = (c[i] - c[i - 1]) / (ts[i] - ts[i - j]);
  }
  auto p = [&](double t) {
    double v = c[n - 1];
    for (size_t i = n - 1; i-- > 0;) v = v * (t - ts[i]) + c[i];
    return v;
  };
  double a = k.lo, b = k.hi, pa = p(a);
  const double pb = p(b);
  if (!std::isfinite(pa) || !std::isfinite(pb) || (pa > 0) == (pb > 0) || pa == 0 || pb == 0) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  for (int i = 0; i < 200 && b - a > 2 * kEps * std::max(std::abs(a), std::abs(b)); ++i) {
    const double m = 0.5 * (a + b), pm = p(m);
    if (pm == 0) {
      a = b = m;
      break;
    }
    if ((pm > 0) == (pa > 0)) {
      a = m;
      pa = pm;
    } else {
      b = m;
    }
  }
  const double r = 0.5 * (a + b);
  double v = c[n - 1], dv = 0;  // Horner's rule with the derivative
  for (size_t i = n - 1; i-- > 0;) {
    dv = dv * (r - ts[i]) + v;
    v = v * (r - ts[i]) + c[i];
  }
  slope = dv;
  return r;
}

/// Moves the target's bracket to the evaluation (s, v) of its value, on
/// piece `piece`.
void update(Target& k, double s, double v, uint64_t piece) {
  if (k.done || !(s > k.lo && s < k.hi)) return;
  if (v == 0) {
    settle(k, s);
    return;
  }
  (k.narrow(s, v) < 0 ? k.piece_lo : k.piece_hi) = piece;
  if (k.closed()) settle(k, 0.5 * (k.lo + k.hi));
}

/// Per row of `sites` (flattened per row) and per site l: a hash of the
/// activation pattern of the sites before l, [rows][sites]: the signs of
/// the ReLU units, and per max-pool window the unit it passes on (or none).
/// Two rows with the same hash at l are on the same piece for site l's units.
std::vector<std::vector<uint64_t>> upstream_pieces(const KinkSites& ev, const std::vector<torch::Tensor>& sites) {
  const int64_t rows = sites.empty() ? 0 : sites[0].size(0);
  std::vector<std::vector<uint64_t>> h(rows, std::vector<uint64_t>(sites.size(), 0));
  std::vector<uint64_t> acc(rows, 0x9e3779b97f4a7c15ull);
  auto mix = [](uint64_t a, uint64_t b) {
    a ^= b + 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2);
    return a;
  };
  const std::vector<torch::Tensor> patterns = activation_patterns(ev, sites);
  for (size_t l = 0; l < sites.size(); ++l) {
    for (int64_t r = 0; r < rows; ++r) h[r][l] = acc[r];
    if (!ev.relu_after()[l]) continue;
    auto p = patterns[l].accessor<int64_t, 2>();
    for (int64_t r = 0; r < rows; ++r) {
      uint64_t a = acc[r];
      for (int64_t u = 0; u < p.size(1); ++u) a = mix(a, static_cast<uint64_t>(p[r][u]) + 3);
      acc[r] = a;
    }
  }
  return h;
}

/// Site values y [P, S, ...] (P pieces of S rows) as the quantities that
/// stay ≤ 0 while a piece keeps the pattern of its row `ref`, [P, S, M]: a
/// ReLU unit's value with the sign that makes it ≤ 0 there; with a pool of
/// window k, per window each unit's and the zero line's margin over the
/// window's winner at `ref` (the units of rows or columns the windows leave
/// out never pass on, and are left out). After a `leaky` ReLU the winner is
/// the units' maximum at any sign, and the zero line's column is instead the
/// winner's value with the sign that makes it ≤ 0 at `ref`.
torch::Tensor margins(const torch::Tensor& y, int64_t k, int64_t ref, bool leaky) {
  const int64_t P = y.size(0), S = y.size(1);
  if (k == 0) {
    const torch::Tensor v = y.flatten(2);
    return v * torch::where(v.select(1, ref) > 0, -1.0, 1.0).unsqueeze(1);
  }
  const int64_t C = y.size(2), h = y.size(3) / k, w = y.size(4) / k;
  torch::Tensor win = y.narrow(3, 0, h * k).narrow(4, 0, w * k).reshape({P, S, C, h, k, w, k});
  win = win.permute({0, 1, 2, 3, 5, 4, 6}).reshape({P, S, C * h * w, k * k});
  if (!leaky) win = torch::cat({win, torch::zeros({P, S, C * h * w, 1}, y.options())}, 3);  // the zero line last
  const torch::Tensor winner = win.select(1, ref).argmax(2, /*keepdim=*/true).unsqueeze(1).expand({P, S, -1, 1});
  const torch::Tensor top = win.gather(3, winner);  // [P, S, windows, 1]
  if (!leaky) return (win - top).flatten(2);
  const torch::Tensor sign = torch::where(top.select(1, ref) > 0, -1.0, 1.0).unsqueeze(1);
  return torch::cat({win - top, top * sign}, 3).flatten(2);
}

/// The polynomial with coefficients c [P, d + 1, M] (ascending powers) at
/// u [P, M] or [P, G, M] (broadcast), by Horner's rule.
torch::Tensor horner(const torch::Tensor& c, const torch::Tensor& u) {
  const bool grid = u.dim() == 3;
  torch::Tensor v = torch::zeros_like(u);
  for (int64_t j = c.size(1); j-- > 0;) v = v * u + (grid ? c.select(1, j).unsqueeze(1) : c.select(1, j));
  return v;
}

/// Where in (0, 1) the polynomials c [P, d + 1, M] are largest, and their
/// value there, each [P, M] (−inf where no interior maximum is found). Up
/// to degree 3 at the roots of the derivative, exactly (the stable
/// quadratic formula, which takes degree 2 too); above, on a grid of 32.
std::pair<torch::Tensor, torch::Tensor> interior_max(const torch::Tensor& c) {
  const int64_t d = c.size(1) - 1;
  const auto none = -std::numeric_limits<double>::infinity();
  if (d > 3) {
    const torch::Tensor u = (torch::arange(32, c.options()) + 0.5) / 32.0;
    const torch::Tensor v = horner(c, u.view({1, -1, 1}).expand({c.size(0), -1, c.size(2)}));
    auto [best, at] = v.max(1);
    return {u.index_select(0, at.flatten()).view_as(best), best};
  }
  // p' = a u² + b u + e.
  const torch::Tensor a = d == 3 ? 3 * c.select(1, 3) : torch::zeros_like(c.select(1, 0));
  const torch::Tensor b = 2 * c.select(1, 2), e = c.select(1, 1);
  const torch::Tensor disc = b * b - 4 * a * e;
  const torch::Tensor q = -0.5 * (b + torch::where(b < 0, -1.0, 1.0) * disc.clamp_min(0).sqrt());
  torch::Tensor u_best, v_best;
  for (const torch::Tensor& u : {q / a, e / q}) {
    const torch::Tensor inside = (disc >= 0) & (u > 0) & (u < 1);
    const torch::Tensor uu = torch::where(inside, u, torch::full_like(u, 0.5));
    const torch::Tensor v = torch::where(inside, horner(c, uu), torch::full_like(uu, none));
    if (!v_best.defined()) {
      u_best = uu;
      v_best = v;
    } else {
      u_best = torch::where(v > v_best, uu, u_best);
      v_best = torch::maximum(v, v_best);
    }
  }
  return {u_best, v_best};
}

}  // namespace

const std::vector<bool>& KinkSites::leaky_after() const {
  static const std::vector<bool> none;
  return none;
}

std::vector<torch::Tensor> activation_patterns(const KinkSites& ev, const std::vector<torch::Tensor>& sites) {
  std::vector<torch::Tensor> out;
  for (size_t l = 0; l < sites.size(); ++l) {
    const torch::Tensor y = sites[l].detach();
    if (!ev.relu_after()[l]) {
      out.push_back(torch::zeros({y.size(0), 0}, torch::kLong));
    } else if (const int64_t k = ev.pool_after()[l]) {
      auto [m, ind] = max_pool_with_indices(y, k);
      const torch::Tensor negative = ev.leaky(l) ? -2 - ind : torch::full_like(ind, -1);
      out.push_back(torch::where(m > 0, ind, negative).flatten(1).contiguous());
    } else {
      out.push_back((y.flatten(1) > 0).to(torch::kLong).contiguous());
    }
  }
  return out;
}

std::vector<double> hidden_switches(const KinkSites& ev, const std::vector<torch::Tensor>& sites,
                                    const std::vector<std::vector<int64_t>>& pieces, const std::vector<double>& t) {
  std::vector<double> out(pieces.size(), std::numeric_limits<double>::quiet_NaN());
  std::vector<double> best(pieces.size(), 0.0);  // the largest crossing so far, relative to its site's scale
  // Pieces of as many rows are fitted together.
  std::map<size_t, std::vector<size_t>> by_rows;
  for (size_t p = 0; p < pieces.size(); ++p) by_rows[pieces[p].size()].push_back(p);
  for (const auto& [S, group] : by_rows) {
    if (S < 3) continue;  // a unit through two rows is linear there
    std::vector<int64_t> rows;
    std::vector<double> u;  // each row's place in its piece, in [0, 1]
    for (size_t p : group) {
      const double a = t[pieces[p].front()], b = t[pieces[p].back()];
      for (int64_t r : pieces[p]) {
        rows.push_back(r);
        u.push_back((t[r] - a) / (b - a));
      }
    }
    const int64_t P = static_cast<int64_t>(group.size()), n = static_cast<int64_t>(S);
    const torch::Tensor index = torch::tensor(rows, torch::kLong);
    for (size_t l = 1; l < sites.size(); ++l) {
      const int64_t d = static_cast<int64_t>(l) + 1;  // site l's degree in t on a piece
      if (!ev.relu_after()[l] || n < d + 1) continue;
      const torch::Tensor y = sites[l].detach().index_select(0, index);
      std::vector<int64_t> shape{P, n};
      for (int64_t i = 1; i < y.dim(); ++i) shape.push_back(y.size(i));
      const torch::Tensor m = margins(y.view(shape), ev.pool_after()[l], 1, ev.leaky(l));  // [P, S, M]
      // The least-squares polynomial of degree d through each margin's rows.
      const torch::Tensor uu = torch::tensor(u, y.options()).view({P, n, 1});
      const torch::Tensor V = uu.pow(torch::arange(d + 1, y.options()).view({1, 1, -1}));  // [P, S, d + 1]
      const torch::Tensor c = torch::matmul(torch::linalg_pinv(V), m);                      // [P, d + 1, M]
      auto [at, value] = interior_max(c);
      // A crossing within the rows' rounding (64 ε of the site's largest
      // value) is none.
      const torch::Tensor scale = y.abs().flatten(1).view({P, -1}).amax(1).clamp_min(1e-300);
      auto [top, unit] = (value / scale.unsqueeze(1)).max(1);
      top = top.to(torch::kFloat64).contiguous();
      const torch::Tensor u_top = at.gather(1, unit.unsqueeze(1)).squeeze(1).to(torch::kFloat64).contiguous();
      auto top_a = top.accessor<double, 1>();
      auto u_a = u_top.accessor<double, 1>();
      for (int64_t i = 0; i < P; ++i) {
        const size_t p = group[i];
        if (!(top_a[i] > 64 * kEps) || top_a[i] <= best[p]) continue;
        best[p] = top_a[i];
        const double a = t[pieces[p].front()], b = t[pieces[p].back()];
        out[p] = a + (b - a) * u_a[i];
      }
    }
  }
  return out;
}

PooledSwitches pooled_switches(const torch::Tensor& y, const torch::Tensor& at_a, const torch::Tensor& at_b,
                               int64_t k, bool leaky) {
  PK_CHECK(y.dim() == 4, "pooled_switches: a pooled site is [rows, C, H, W], got " << y.sizes());
  auto [m, ind] = max_pool_with_indices(y, k);
  const torch::Tensor plane = torch::arange(y.size(1)).view({1, -1, 1, 1}) * (y.size(2) * y.size(3));
  // After a leaky ReLU every window passes its maximum on, as if positive.
  const torch::Tensor positive = leaky ? torch::ones_like(m, torch::kBool).flatten(1) : m.flatten(1) > 0;
  const torch::Tensor unit = (ind + plane).flatten(1), flat = y.flatten(1) > 0;
  PooledSwitches out;
  out.from = unit.index_select(0, at_a);
  out.to = unit.index_select(0, at_b);
  const torch::Tensor pa = positive.index_select(0, at_a), pb = positive.index_select(0, at_b);
  out.flips = flat.index_select(0, at_a) != flat.index_select(0, at_b);
  torch::Tensor seen_a = torch::zeros_like(out.flips).scatter_(1, out.from, pa);
  torch::Tensor seen_b = torch::zeros_like(out.flips).scatter_(1, out.to, pb);
  out.flips &= seen_a | seen_b;
  out.switches = (out.from != out.to) & pa & pb;
  return out;
}

int SignBracket::narrow(double s, double v) {
  if ((v > 0) == (glo > 0)) {
    lo = s;
    glo = v;
    if (side == -1) ghi *= 0.5;
    side = -1;
  } else {
    hi = s;
    ghi = v;
    if (side == 1) glo *= 0.5;
    side = 1;
  }
  return side;
}

double SignBracket::next(int round) const {
  const double s = lo - glo * (hi - lo) / (ghi - glo);
  return round % 4 == 3 || !(s > lo && s < hi) ? 0.5 * (lo + hi) : s;
}

bool SignBracket::closed() const { return hi - lo <= 4 * kEps * std::max(std::abs(lo), std::abs(hi)); }

int SignBracket::locate(const std::function<double(double)>& g, int max_rounds) {
  int round = 0;
  while (round < max_rounds && !closed()) {
    const double s = next(round++);
    const double v = g(s);
    if (v == 0) {
      lo = hi = s;
      break;
    }
    narrow(s, v);
  }
  return round;
}

namespace {

/// One kink search (find_kinks): its rows, targets and what the fits need.
struct Search {
  const KinkSites& ev;
  const torch::Tensor& x;
  const std::vector<torch::Tensor>& preacts;
  const std::vector<int64_t>& point;
  const std::vector<double>& t;
  const bool fit_polynomials;
  const int64_t rows_per_pass;
  std::vector<int64_t> a_rows, b_rows;  ///< per bracket: its two rows
  std::vector<Target> targets;
  std::vector<torch::Tensor> flat;      ///< per site: its values at the rows, flattened per row
  KinkSearch out;

  void detect(const std::vector<KinkBracket>& brackets, bool skip_first_layer);
  void add(int64_t l, const torch::Tensor& hits, const torch::Tensor& plus, const torch::Tensor& minus);
  void prepare();
  void locate();
  /// One round of location: the rows it evaluates (per row its target and
  /// t), and which targets take a pair around a fitted root.
  void plan(int iter, const std::vector<size_t>& active, std::vector<size_t>& row_target, std::vector<double>& row_t,
            std::vector<bool>& paired);
  void evaluate(const std::vector<size_t>& row_target, const std::vector<double>& row_t);
  void review(const std::vector<size_t>& active, const std::vector<bool>& paired);
};

/// Adds a target per hit (bracket, column) of site l: the unit itself, or
/// with a pool the windows' units `plus` and `minus`.
void Search::add(int64_t l, const torch::Tensor& hits, const torch::Tensor& plus, const torch::Tensor& minus) {
  torch::Tensor nz = hits.nonzero();  // [F, 2]: bracket, column
  auto nz_a = nz.accessor<int64_t, 2>();
  const bool pool = plus.defined();
  torch::Tensor p = pool ? plus.contiguous() : nz, m = pool ? minus.contiguous() : nz;
  auto p_a = p.accessor<int64_t, 2>(), m_a = m.accessor<int64_t, 2>();
  for (int64_t i = 0; i < nz.size(0); ++i) {
    const int64_t b = nz_a[i][0], c = nz_a[i][1];
    Target k;
    k.bracket = b;
    k.layer = l;
    k.plus = pool ? p_a[b][c] : c;
    k.minus = pool ? m_a[b][c] : -1;
    k.lo = t[a_rows[b]];
    k.hi = t[b_rows[b]];
    targets.push_back(std::move(k));
  }
}

/// Detection: every unit whose pattern differs at the two ends of a bracket.
void Search::detect(const std::vector<KinkBracket>& brackets, bool skip_first_layer) {
  for (const KinkBracket& b : brackets) {
    PK_ASSERT(t[b.row_a] < t[b.row_b] && point[b.row_a] == point[b.row_b]);
    a_rows.push_back(b.row_a);
    b_rows.push_back(b.row_b);
  }
  const torch::Tensor at_a = torch::tensor(a_rows, torch::kLong), at_b = torch::tensor(b_rows, torch::kLong);
  flat.resize(preacts.size());
  for (size_t l = 0; l < preacts.size(); ++l) flat[l] = preacts[l].detach().flatten(1).contiguous();
  for (size_t l = 0; l < preacts.size(); ++l) {
    if (!ev.relu_after()[l] || (l == 0 && skip_first_layer)) continue;
    if (const int64_t k = ev.pool_after()[l]) {
      const torch::Tensor& y = preacts[l].detach();  // [R, C, H, W]
      const PooledSwitches sw = pooled_switches(y, at_a, at_b, k, ev.leaky(l));
      add(static_cast<int64_t>(l), sw.switches, sw.to, sw.from);
      add(static_cast<int64_t>(l), sw.flips, torch::Tensor(), torch::Tensor());
    } else {
      torch::Tensor ya = flat[l].index_select(0, at_a), yb = flat[l].index_select(0, at_b);
      add(static_cast<int64_t>(l), (ya > 0) != (yb > 0), torch::Tensor(), torch::Tensor());
    }
  }
}

/// The targets' values at their bracket's ends and, for the fits, their
/// scale, pieces and the samples beyond either end on the same piece.
void Search::prepare() {
  // What the fits need: per row, each site's largest |value| and the pieces.
  std::vector<std::vector<double>> row_scale(flat.size());
  std::vector<std::vector<uint64_t>> pieces;
  std::map<int64_t, std::vector<int64_t>> rows_of_point;
  std::vector<int64_t> position(t.size(), -1);
  if (fit_polynomials && !targets.empty()) {
    for (size_t l = 0; l < flat.size(); ++l) {
      const torch::Tensor m = flat[l].abs().amax(1).contiguous();
      row_scale[l].assign(m.data_ptr<double>(), m.data_ptr<double>() + m.numel());
    }
    pieces = upstream_pieces(ev, preacts);
    // Per test point, its rows in ascending t (one row per t); each row's place there.
    for (int64_t r = 0; r < static_cast<int64_t>(t.size()); ++r) rows_of_point[point[r]].push_back(r);
    for (auto& [p, line] : rows_of_point) {
      std::sort(line.begin(), line.end(), [&](int64_t a, int64_t b) { return t[a] < t[b]; });
      std::vector<int64_t> distinct;
      for (int64_t r : line) {
        if (distinct.empty() || t[distinct.back()] != t[r]) distinct.push_back(r);
        position[r] = static_cast<int64_t>(distinct.size()) - 1;
      }
      line = std::move(distinct);
    }
  }
  for (Target& k : targets) {
    auto y = flat[k.layer].accessor<double, 2>();
    k.glo = value(y, a_rows[k.bracket], k);
    k.ghi = value(y, b_rows[k.bracket], k);
    if (fit_polynomials) {
      k.scale = row_scale[k.layer][a_rows[k.bracket]];
      k.piece_lo = pieces[a_rows[k.bracket]][k.layer];
      k.piece_hi = pieces[b_rows[k.bracket]][k.layer];
    }
    // Site l of pathkernel's own layers is param layer l's pre-activation,
    // of degree l + 1 in t on a piece; a module's sites are taken to be of
    // the degree of their place, up to 4 (a wrong guess costs only speed).
    k.degree = static_cast<int>(std::min<int64_t>(k.layer + 1, 4));
    if (fit_polynomials) {
      // The rows beyond either end on the same piece are samples of the same
      // polynomial: with them a fit needs fewer evaluations, often none.
      const std::vector<int64_t>& line = rows_of_point[point[a_rows[k.bracket]]];
      for (int64_t side : {-1, 1}) {
        const int64_t from = side < 0 ? a_rows[k.bracket] : b_rows[k.bracket];
        const uint64_t piece = side < 0 ? k.piece_lo : k.piece_hi;
        int taken = 0;
        for (int64_t j = position[from] + side; j >= 0 && j < static_cast<int64_t>(line.size()) && taken < k.degree - 1;
             j += side) {
          const int64_t r = line[j];
          if (pieces[r][k.layer] != piece) break;
          k.samples.push_back({t[r], value(y, r, k), piece});
          ++taken;
        }
      }
      k.samples.push_back({k.lo, k.glo, k.piece_lo});
      k.samples.push_back({k.hi, k.ghi, k.piece_hi});
    }
    if (k.glo == 0) settle(k, k.lo);
    else if (k.ghi == 0) settle(k, k.hi);
  }
}

void Search::plan(int iter, const std::vector<size_t>& active, std::vector<size_t>& row_target,
                  std::vector<double>& row_t, std::vector<bool>& paired) {
  for (size_t i : active) {
    Target& k = targets[i];
    double slope = 0;
    const double r =
        !fit_polynomials || iter % 4 == 3 ? std::numeric_limits<double>::quiet_NaN() : fitted_root(k, slope);
    if (std::isfinite(r) && slope != 0 && std::isfinite(slope)) {
      // δ: a few ulp of t, or the t over which the unit's rounding
      // (2 ε of its layer's largest value) moves it, if that is more.
      const double delta =
          k.widen * std::max(1.5 * kEps * std::abs(r), 2 * kEps * k.scale / std::abs(slope));
      const double a = std::max(r - delta, std::nextafter(k.lo, k.hi));
      const double b = std::min(r + delta, std::nextafter(k.hi, k.lo));
      row_target.push_back(i);
      row_t.push_back(a);
      if (b > a) {
        row_target.push_back(i);
        row_t.push_back(b);
      }
      paired[i] = true;
      k.pair_a = a;
      k.pair_b = b;
      continue;
    }
    row_target.push_back(i);
    row_t.push_back(k.next(iter));
  }
}

/// Evaluates the round's rows, rows_per_pass per forward pass, and moves
/// each row's target's bracket.
void Search::evaluate(const std::vector<size_t>& row_target, const std::vector<double>& row_t) {
  for (size_t c0 = 0; c0 < row_t.size(); c0 += static_cast<size_t>(rows_per_pass)) {
    const size_t nc = std::min(row_t.size() - c0, static_cast<size_t>(rows_per_pass));
    std::vector<int64_t> rows(nc);
    for (size_t j = 0; j < nc; ++j) rows[j] = point[a_rows[targets[row_target[c0 + j]].bracket]];
    const std::vector<double> ts(row_t.begin() + static_cast<std::ptrdiff_t>(c0),
                                 row_t.begin() + static_cast<std::ptrdiff_t>(c0 + nc));
    const std::vector<torch::Tensor> sites =
        ev.sites_at(x.index_select(0, torch::tensor(rows, torch::kLong)), torch::tensor(ts, x.options()));
    out.forward_evaluations += static_cast<int64_t>(nc);
    std::vector<torch::Tensor> pf(sites.size());
    for (size_t l = 0; l < sites.size(); ++l) pf[l] = sites[l].flatten(1).contiguous();
    std::vector<std::vector<uint64_t>> round_pieces;
    if (fit_polynomials) round_pieces = upstream_pieces(ev, sites);
    for (size_t j = 0; j < nc; ++j) {
      Target& k = targets[row_target[c0 + j]];
      const double v = value(pf[k.layer].accessor<double, 2>(), static_cast<int64_t>(j), k);
      PK_CHECK(std::isfinite(v), "kink search: non-finite pre-activation at t = " << ts[j]);
      if (fit_polynomials) {
        k.samples.push_back({ts[j], v, round_pieces[j][k.layer]});
        if (k.samples.size() > 8) k.samples.erase(k.samples.begin());
      }
      update(k, ts[j], v, fit_polynomials ? round_pieces[j][k.layer] : 0);
    }
  }
}

/// Where the pair that caught a target's sign change puts its root: the
/// line through the pair's two values crosses zero there (the pair is a few
/// units of rounding noise wide, so the unit is a line across it), kept
/// inside the bracket; the bracket's midpoint if the pair's values are not
/// both at hand with opposite signs.
double pair_root(const Target& k) {
  const Target::Sample *a = nullptr, *b = nullptr;
  for (const Target::Sample& q : k.samples) {
    if (q.t == k.pair_a) a = &q;
    if (q.t == k.pair_b) b = &q;
  }
  if (a == nullptr || b == nullptr || a->v == 0 || b->v == 0 || (a->v < 0) == (b->v < 0)) {
    return 0.5 * (k.lo + k.hi);
  }
  const double r = a->t - a->v * (b->t - a->t) / (b->v - a->v);
  return std::min(std::max(r, k.lo), k.hi);
}

void Search::review(const std::vector<size_t>& active, const std::vector<bool>& paired) {
  // A pair that missed the root (the fit's rounding is above a few ulp)
  // is placed wider next time; one that caught it, at the width again.
  for (size_t i : active) {
    Target& k = targets[i];
    if (!paired[i] || k.done) continue;
    const bool caught = k.lo >= k.pair_a && k.hi <= k.pair_b;
    // Near its root a unit's value is rounding as much as slope, so the
    // sign the network gives is noisy within about δ of the true root: a
    // pair a few δ wide that catches the sign change locates the kink as
    // well as bisecting inside that noise would.
    if (caught && k.widen <= 16) {
      settle(k, pair_root(k));
    } else {
      k.widen = caught ? 1 : 4 * k.widen;
    }
  }
}

void Search::locate() {
  // Location, on every bracket at once (one forward pass per round): an
  // Illinois false-position step, and every fourth round a bisection, so
  // each bracket at least halves every four rounds. With fit_polynomials,
  // once a target has degree + 1 samples on one piece, the root of the
  // polynomial through them is the kink up to rounding: the round evaluates
  // a pair of points either side of it, as far as the unit's rounding noise,
  // which closes the bracket when it catches the sign change.
  for (int iter = 0; iter < 400; ++iter) {
    std::vector<size_t> active;
    for (size_t i = 0; i < targets.size(); ++i) {
      if (!targets[i].done) active.push_back(i);
    }
    if (active.empty()) break;
    std::vector<size_t> row_target;
    std::vector<double> row_t;
    std::vector<bool> paired(targets.size(), false);
    plan(iter, active, row_target, row_t, paired);
    evaluate(row_target, row_t);
    review(active, paired);
  }
}

}  // namespace

KinkSearch find_kinks(const KinkSites& ev, const torch::Tensor& x, const std::vector<torch::Tensor>& preacts,
                      const std::vector<int64_t>& point, const std::vector<double>& t,
                      const std::vector<KinkBracket>& brackets, bool skip_first_layer, bool fit_polynomials,
                      int64_t rows_per_pass) {
  PK_ASSERT(preacts.size() <= ev.relu_after().size() && point.size() == t.size() && rows_per_pass > 0);
  if (brackets.empty()) return {};
  Search search{ev, x, preacts, point, t, fit_polynomials, rows_per_pass, {}, {}, {}, {}, {}};
  search.detect(brackets, skip_first_layer);
  search.prepare();
  search.locate();
  KinkSearch& out = search.out;
  for (const Target& k : search.targets) {
    out.kinks.push_back({k.bracket, k.done ? k.root : 0.5 * (k.lo + k.hi), k.layer, k.plus, k.minus});
  }
  std::sort(out.kinks.begin(), out.kinks.end(),
            [](const Kink& p, const Kink& q) { return p.bracket != q.bracket ? p.bracket < q.bracket : p.t < q.t; });
  return std::move(out);
}

std::vector<double> first_layer_kinks(const KinkSites& ev, const torch::Tensor& y0, const torch::Tensor& y1) {
  PK_CHECK(y0.sizes() == y1.sizes(), "first_layer_kinks: pre-activations at t = 0 " << y0.sizes()
                                         << " and t = 1 " << y1.sizes() << " differ in shape");
  if (!ev.relu_after()[0]) return {};
  const torch::Tensor a0 = y0.to(torch::kFloat64).contiguous(), a1 = y1.to(torch::kFloat64).contiguous();
  std::vector<double> p0(a0.data_ptr<double>(), a0.data_ptr<double>() + a0.numel());
  std::vector<double> p1(a1.data_ptr<double>(), a1.data_ptr<double>() + a1.numel());
  const int64_t k = ev.pool_after()[0];
  if (k == 0) return affine_crossings(p0, p1);
  PK_CHECK(y0.dim() == 3, "first_layer_kinks: a pooled layer's pre-activation is [C, H, W], got " << y0.sizes());
  const int64_t channels = y0.size(0), height = y0.size(1), width = y0.size(2);
  // After a ReLU the zero line (line 0) is one of the envelope's lines; after
  // a leaky ReLU it is not, and the envelope's own zero crossings are kinks.
  const size_t first = ev.leaky(0) ? 1 : 0;
  std::vector<double> kinks;
  std::vector<long double> lo, slope;
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t h = 0; h + k <= height; h += k) {
      for (int64_t w = 0; w + k <= width; w += k) {
        // The window's output max(0, max_u y_u(t)) is the upper envelope of
        // lines, the zero line first: walk it from t = 0, taking at each
        // step the earliest line to overtake the current one.
        lo.assign(1, 0.0L);
        slope.assign(1, 0.0L);
        for (int64_t i = 0; i < k; ++i) {
          for (int64_t j = 0; j < k; ++j) {
            const int64_t u = (c * height + h + i) * width + w + j;
            PK_CHECK(std::isfinite(p0[u]) && std::isfinite(p1[u]),
                     "first_layer_kinks: unit " << u << " has a non-finite pre-activation (" << p0[u] << " at t = 0, "
                                                << p1[u] << " at t = 1)");
            lo.push_back(p0[u]);
            slope.push_back(static_cast<long double>(p1[u]) - p0[u]);
          }
        }
        size_t cur = first;
        for (size_t i = first + 1; i < lo.size(); ++i) {
          if (lo[i] > lo[cur] || (lo[i] == lo[cur] && slope[i] > slope[cur])) cur = i;
        }
        long double t = 0;
        while (true) {
          size_t best = cur;
          long double best_t = 1;
          for (size_t i = first; i < lo.size(); ++i) {
            if (slope[i] <= slope[cur]) continue;
            const long double ti = (lo[cur] - lo[i]) / (slope[i] - slope[cur]);
            if (ti < t) continue;
            if (ti < best_t || (ti == best_t && (best == cur || slope[i] > slope[best]))) {
              best = i;
              best_t = ti;
            }
          }
          if (first > 0 && slope[cur] != 0) {
            // The current line's zero crossing while it is the maximum.
            const long double z = -lo[cur] / slope[cur];
            if (z > t && z > 0 && z < best_t) kinks.push_back(static_cast<double>(z));
          }
          if (best == cur || best_t >= 1) break;
          if (best_t > 0) kinks.push_back(static_cast<double>(best_t));
          cur = best;
          t = best_t;
        }
      }
    }
  }
  std::sort(kinks.begin(), kinks.end());
  kinks.erase(std::unique(kinks.begin(), kinks.end()), kinks.end());
  return kinks;
}

}  // namespace pathkernel
