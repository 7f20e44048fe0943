// Detecting and locating the kinks of the integrand along a segment.
#include "pathkernel/kinks.h"

#include <algorithm>
#include <cmath>

#include "pathkernel/error.h"
#include "pathkernel/quadrature.h"

namespace pathkernel {

namespace {

constexpr double kEps = 2.220446049250313e-16;

/// A sign change of y[plus] − y[minus] (y[plus] alone when minus < 0) inside
/// a bracket, y being param layer `layer`'s pre-activation flattened per row.
/// A ReLU unit that flips is (unit, −1); a max-pool window whose argmax
/// switches from i to j is (j, i).
struct Target {
  int64_t bracket, layer, plus, minus;
  double lo, hi, glo, ghi;
  int last_side = 0;  // −1: lo moved last, +1: hi moved last
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

}  // namespace

KinkSearch find_kinks(const SegmentEvaluator& ev, const torch::Tensor& x, const std::vector<torch::Tensor>& preacts,
                      const std::vector<int64_t>& point, const std::vector<double>& t,
                      const std::vector<KinkBracket>& brackets, bool skip_first_layer, int64_t rows_per_pass) {
  PK_ASSERT(preacts.size() == ev.relu_after().size() && point.size() == t.size() && rows_per_pass > 0);
  KinkSearch out;
  if (brackets.empty()) return out;
  std::vector<int64_t> a_rows, b_rows;
  for (const KinkBracket& b : brackets) {
    PK_ASSERT(t[b.row_a] < t[b.row_b] && point[b.row_a] == point[b.row_b]);
    a_rows.push_back(b.row_a);
    b_rows.push_back(b.row_b);
  }
  const torch::Tensor at_a = torch::tensor(a_rows, torch::kLong), at_b = torch::tensor(b_rows, torch::kLong);

  // Detection: every unit whose pattern differs at the two ends of a bracket.
  std::vector<Target> targets;
  std::vector<torch::Tensor> flat(preacts.size());
  for (size_t l = 0; l < preacts.size(); ++l) flat[l] = preacts[l].detach().flatten(1).contiguous();
  auto add = [&](int64_t l, const torch::Tensor& hits, const torch::Tensor& plus, const torch::Tensor& minus) {
    torch::Tensor nz = hits.nonzero();  // [F, 2]: bracket, column
    auto nz_a = nz.accessor<int64_t, 2>();
    const bool pool = plus.defined();
    torch::Tensor p = pool ? plus.contiguous() : nz, m = pool ? minus.contiguous() : nz;
    auto p_a = p.accessor<int64_t, 2>(), m_a = m.accessor<int64_t, 2>();
    for (int64_t i = 0; i < nz.size(0); ++i) {
      const int64_t b = nz_a[i][0], c = nz_a[i][1];
      targets.push_back({b, l, pool ? p_a[b][c] : c, pool ? m_a[b][c] : -1, t[a_rows[b]], t[b_rows[b]], 0, 0});
    }
  };
  for (size_t l = 0; l < preacts.size(); ++l) {
    if (!ev.relu_after()[l] || (l == 0 && skip_first_layer)) continue;
    torch::Tensor ya = flat[l].index_select(0, at_a), yb = flat[l].index_select(0, at_b);
    torch::Tensor flips = (ya > 0) != (yb > 0);
    if (const int64_t k = ev.pool_after()[l]) {
      const torch::Tensor& y = preacts[l].detach();  // [R, C, H, W]
      auto [m, ind] = torch::max_pool2d_with_indices(y, k);
      torch::Tensor plane = torch::arange(y.size(1)).view({1, -1, 1, 1}) * (y.size(2) * y.size(3));
      torch::Tensor unit = (ind + plane).flatten(1), mf = m.flatten(1);
      torch::Tensor ua = unit.index_select(0, at_a), ub = unit.index_select(0, at_b);
      torch::Tensor ma = mf.index_select(0, at_a), mb = mf.index_select(0, at_b);
      // Pooling sees a unit's sign only while it is its window's positive
      // maximum: the flips of the others are not kinks of the network.
      torch::Tensor seen_a = torch::zeros_like(flips).scatter_(1, ua, ma > 0);
      torch::Tensor seen_b = torch::zeros_like(flips).scatter_(1, ub, mb > 0);
      flips &= seen_a | seen_b;
      // An argmax switch matters while the window is positive; one into or out
      // of a zero window is the ReLU kink of the unit that crosses 0.
      add(static_cast<int64_t>(l), (ua != ub) & (ma > 0) & (mb > 0), ub, ua);
    }
    add(static_cast<int64_t>(l), flips, torch::Tensor(), torch::Tensor());
  }
  for (Target& k : targets) {
    auto y = flat[k.layer].accessor<double, 2>();
    k.glo = value(y, a_rows[k.bracket], k);
    k.ghi = value(y, b_rows[k.bracket], k);
    if (k.glo == 0) settle(k, k.lo);
    else if (k.ghi == 0) settle(k, k.hi);
  }

  // Location: Illinois false position on every bracket at once; every fourth
  // step bisects, so each bracket at least halves every four steps.
  for (int iter = 0; iter < 400; ++iter) {
    std::vector<size_t> active;
    for (size_t i = 0; i < targets.size(); ++i) {
      if (!targets[i].done) active.push_back(i);
    }
    if (active.empty()) break;
    for (size_t c0 = 0; c0 < active.size(); c0 += static_cast<size_t>(rows_per_pass)) {
      const size_t nc = std::min(active.size() - c0, static_cast<size_t>(rows_per_pass));
      std::vector<int64_t> rows(nc);
      std::vector<double> ts(nc);
      for (size_t j = 0; j < nc; ++j) {
        const Target& k = targets[active[c0 + j]];
        double s = k.lo - k.glo * (k.hi - k.lo) / (k.ghi - k.glo);
        if (iter % 4 == 3 || !(s > k.lo && s < k.hi)) s = 0.5 * (k.lo + k.hi);
        rows[j] = point[a_rows[k.bracket]];
        ts[j] = s;
      }
      SegmentPass pm = ev.forward(x.index_select(0, torch::tensor(rows, torch::kLong)), torch::tensor(ts, x.options()),
                                  false);
      out.forward_evaluations += static_cast<int64_t>(nc);
      const std::vector<torch::Tensor>& sites = ev.kink_values(pm);
      std::vector<torch::Tensor> pf(sites.size());
      for (size_t l = 0; l < sites.size(); ++l) pf[l] = sites[l].flatten(1).contiguous();
      for (size_t j = 0; j < nc; ++j) {
        Target& k = targets[active[c0 + j]];
        const double s = ts[j], v = value(pf[k.layer].accessor<double, 2>(), static_cast<int64_t>(j), k);
        PK_CHECK(std::isfinite(v), "kink search: non-finite pre-activation at t = " << s);
        if (v == 0) {
          settle(k, s);
          continue;
        }
        if ((v > 0) == (k.glo > 0)) {
          k.lo = s;
          k.glo = v;
          if (k.last_side == -1) k.ghi *= 0.5;
          k.last_side = -1;
        } else {
          k.hi = s;
          k.ghi = v;
          if (k.last_side == 1) k.glo *= 0.5;
          k.last_side = 1;
        }
        if (k.hi - k.lo <= 4 * kEps * std::max(std::abs(k.lo), std::abs(k.hi))) settle(k, 0.5 * (k.lo + k.hi));
      }
    }
  }
  for (const Target& k : targets) {
    out.kinks.push_back({k.bracket, k.done ? k.root : 0.5 * (k.lo + k.hi), k.layer, k.plus, k.minus});
  }
  std::sort(out.kinks.begin(), out.kinks.end(),
            [](const Kink& p, const Kink& q) { return p.bracket != q.bracket ? p.bracket < q.bracket : p.t < q.t; });
  return out;
}

std::vector<double> first_layer_kinks(const SegmentEvaluator& ev, const torch::Tensor& y0, const torch::Tensor& y1) {
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
        size_t cur = 0;
        for (size_t i = 1; i < lo.size(); ++i) {
          if (lo[i] > lo[cur] || (lo[i] == lo[cur] && slope[i] > slope[cur])) cur = i;
        }
        long double t = 0;
        while (true) {
          size_t best = cur;
          long double best_t = 1;
          for (size_t i = 0; i < lo.size(); ++i) {
            if (slope[i] <= slope[cur]) continue;
            const long double ti = (lo[cur] - lo[i]) / (slope[i] - slope[cur]);
            if (ti < t) continue;
            if (ti < best_t || (ti == best_t && (best == cur || slope[i] > slope[best]))) {
              best = i;
              best_t = ti;
            }
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
