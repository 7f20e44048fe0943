// The last site's switches, integrated inside the pieces (docs/math.md §7).
//
// On a piece [a, b] between the earlier sites' kinks, the last site's
// pre-activation y(t) is a polynomial of degree L − 1, known exactly from
// its samples at the piece's m nodes and two ends (m + 2 ≥ L of them). Its
// switches cut the piece into sub-pieces, on each of which the site passes on
// a fixed selection σ of y's units (the ReLU's positive units, or each pool
// window's positive argmax; under an average pool each window's positive
// units, each with its share 1 / k²): h(t) = σ y(t), z(t) = W(t) h(t) + b(t). With
// f_k = z_k − lse(z) (p = softmax(z)) or f_k = z_k (p = 0):
//  - the logits' layer: ∂f_k/∂W = (e_k − p) hᵀ, ∂f_k/∂b = e_k − p, integrated
//    over the sub-pieces as ∫ h, ∫ p hᵀ and ∫ p;
//  - the layers below: ∂f_k/∂θ = Σ_u σ_u [(e_k − p)ᵀ W(t)]_w(u) ∂y_u/∂θ(t),
//    and ∂y_u/∂θ is a polynomial of degree L − 2 on the piece, the
//    interpolant of its values at the m ≥ L − 1 nodes, Σ_j ℓ_j(t) ∂y_u/∂θ(t_j).
//    So node j walks back the cotangent
//      G_{j,k,u} = ∫ σ_u ℓ_j(t) [(e_k − p(t))ᵀ W(t)]_w(u) dt
//    on y, and the piece's integral is exact.
// The switches inside a piece are found on the interpolant, without the
// network: every switch of a unit's sign, or of a pool window's positive
// argmax, is a root of a unit's polynomial or of the difference of two of a
// window's, so the roots in the piece (closed form up to degree 2, else
// located by bisection between sign changes on a grid) are the candidates,
// and the selection at the midpoints between them tells which are switches.
// The integrals of p are taken by 16-node Gauss–Legendre on 1, 2, 4, …
// sub-intervals of each sub-piece until two successive sums agree to
// rounding; the others are polynomials, exact at once.
#include "last_site.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "pathkernel/error.h"
#include "pathkernel/max_pool.h"
#include "pathkernel/quadrature.h"

namespace pathkernel {

namespace {

constexpr int kGaussPoints = 16;
constexpr int kMaxHalvings = 8;  // up to 256 sub-intervals
/// Sub-pieces per batch: as many as S samples of U units each come to at
/// most this many doubles (their samples of h are no more).
constexpr int64_t kChunkDoubles = int64_t{1} << 22;

/// The Lagrange basis polynomial of sample s of the S samples at xs, at x.
template <typename T>
T lagrange_basis(const T* xs, int64_t S, int64_t s, T x) {
  T l = 1;
  for (int64_t r = 0; r < S; ++r) {
    if (r != s) l *= (x - xs[r]) / (xs[s] - xs[r]);
  }
  return l;
}

template <typename T>
void interpolate_rows(const T* y, const T* xs, const T* x, int64_t N, int64_t S, int64_t U, T* out) {
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t s = 0; s < S; ++s) {
      const T l = lagrange_basis(xs + n * S, S, s, x[n]);
      const T* ys_ns = y + (n * S + s) * U;
      T* on = out + n * U;
      for (int64_t u = 0; u < U; ++u) on[u] += l * ys_ns[u];
    }
  }
}

/// The roots in (−1, 1) of the polynomial Σ_i c[i] xⁱ of degree d,
/// appended to `out`: closed form up to degree 2; above, bisection between
/// the sign changes on a grid of 64 intervals (a pair of roots inside one
/// grid interval is not seen).
void roots_in(const double* c, int64_t d, std::vector<double>& out) {
  double scale = 0;
  for (int64_t i = 0; i <= d; ++i) scale = std::max(scale, std::abs(c[i]));
  if (scale == 0) return;  // identical units: they never switch
  auto keep = [&](double x) {
    if (x > -1 && x < 1) out.push_back(x);
  };
  const double tiny = 64 * kMachineEps * scale;
  const double c2 = d >= 2 ? c[2] : 0.0;
  if (d <= 2 || std::all_of(c + 3, c + d + 1, [&](double v) { return std::abs(v) <= tiny; })) {
    if (std::abs(c2) <= tiny) {
      if (std::abs(c[1]) > tiny) keep(-c[0] / c[1]);
      return;
    }
    const double disc = c[1] * c[1] - 4 * c2 * c[0];
    if (disc < 0) return;
    const double q = -0.5 * (c[1] + std::copysign(std::sqrt(disc), c[1]));
    keep(q / c2);
    if (q != 0) keep(c[0] / q);
    return;
  }
  auto value = [&](double x) {
    double v = 0;
    for (int64_t i = d; i >= 0; --i) v = v * x + c[i];
    return v;
  };
  constexpr int kGrid = 64;
  double x0 = -1, v0 = value(x0);
  for (int j = 1; j <= kGrid; ++j) {
    const double x1 = -1 + 2.0 * j / kGrid, v1 = value(x1);
    if ((v0 < 0) != (v1 < 0) && v0 != 0) {
      double lo = x0, hi = x1, vlo = v0;
      for (int it = 0; it < 64 && lo < hi; ++it) {
        const double mid = 0.5 * (lo + hi);
        if (mid == lo || mid == hi) break;
        const double vm = value(mid);
        if ((vm < 0) == (vlo < 0)) {
          lo = mid;
          vlo = vm;
        } else {
          hi = mid;
        }
      }
      keep(0.5 * (lo + hi));
    }
    x0 = x1;
    v0 = v1;
  }
}

/// The pool after a held site's ReLU: a max-pool's window, an average
/// pool's, or neither (both 0); and the ReLU's slope below 0 (a leaky
/// ReLU's, else 0).
struct SitePool {
  int64_t max = 0, average = 0;
  double slope = 0;
  int64_t window() const { return max > 0 ? max : average; }
  bool leaky() const { return slope > 0; }
  /// The units of y each of h's entries takes: its window's under an
  /// average pool, else one.
  int64_t slots() const { return average > 0 ? average * average : 1; }
};

SitePool site_pool(const SegmentEvaluator& ev, size_t site) {
  return {ev.pool_after()[site], ev.average_after(site), ev.slope_after(site)};
}

/// The switches of one piece's held site (its units' polynomials c
/// [d + 1, U] in local x), sorted in local x, counted into `flips` (a
/// window's or unit's sign) and `argmax` (a positive window's winner; any
/// window's after a `leaky` ReLU, which passes negative units on too).
std::vector<double> piece_switches(const torch::Tensor& c, const std::vector<int64_t>& shape, int64_t pool,
                                   bool leaky, int64_t& flips, int64_t& argmax) {
  const torch::Tensor cc = c.t().contiguous();  // [U, d + 1]
  const int64_t d = cc.size(1) - 1, U = cc.size(0);
  const double* cp = cc.data_ptr<double>();
  auto value = [&](int64_t u, double x) {
    double v = 0;
    for (int64_t i = d; i >= 0; --i) v = v * x + cp[u * (d + 1) + i];
    return v;
  };
  std::vector<double> out, cand, diff(static_cast<size_t>(d + 1));
  // A window's units (one unit without a pool): the winner at x, −1 for
  // none; after a leaky ReLU the window's maximum, −2 − it where negative.
  std::vector<int64_t> units;
  auto winner = [&](double x) {
    if (leaky) {
      int64_t best = units[0];
      double top = value(best, x);
      for (size_t i = 1; i < units.size(); ++i) {
        const double v = value(units[i], x);
        if (v > top) {
          top = v;
          best = units[i];
        }
      }
      return top > 0 ? best : -2 - best;
    }
    int64_t best = -1;
    double top = 0;
    for (int64_t u : units) {
      const double v = value(u, x);
      if (v > top) {
        top = v;
        best = u;
      }
    }
    return best;
  };
  // A unit's range on [−1, 1]: exact up to degree 2, else bounded by its
  // coefficients.
  auto range = [&](int64_t u) {
    const double* k = cp + u * (d + 1);
    if (d <= 2) {
      double lo = std::min(value(u, -1.0), value(u, 1.0)), hi = std::max(value(u, -1.0), value(u, 1.0));
      if (d == 2 && k[2] != 0) {
        const double v = -k[1] / (2 * k[2]);
        if (v > -1 && v < 1) {
          lo = std::min(lo, value(u, v));
          hi = std::max(hi, value(u, v));
        }
      }
      return std::make_pair(lo, hi);
    }
    double spread = 0;
    for (int64_t i = 1; i <= d; ++i) spread += std::abs(k[i]);
    return std::make_pair(k[0] - spread, k[0] + spread);
  };
  // Whether a window's pass-on cannot change on the piece: no unit is ever
  // positive, or one stays positive and above every other's range (after a
  // leaky ReLU: one stays above every other's range and keeps its sign).
  std::vector<std::pair<double, double>> r;  // the window's units' ranges (one buffer for every window)
  auto settled = [&]() {
    double best_lo = -std::numeric_limits<double>::infinity(), top_hi = 0;
    size_t best = 0;
    r.clear();
    for (size_t i = 0; i < units.size(); ++i) {
      r.push_back(range(units[i]));
      top_hi = std::max(top_hi, r[i].second);
      if (r[i].first > best_lo) {
        best_lo = r[i].first;
        best = i;
      }
    }
    if (leaky && best_lo <= 0 && r[best].second > 0) return false;  // the winner's sign may change
    if (!leaky && top_hi <= 0) return true;
    if (!leaky && best_lo <= 0) return false;
    for (size_t i = 0; i < units.size(); ++i) {
      if (i != best && r[i].second >= best_lo) return false;
    }
    return true;
  };
  auto window = [&]() {
    if (settled()) return;
    cand.clear();
    for (size_t i = 0; i < units.size(); ++i) {
      roots_in(cp + units[i] * (d + 1), d, cand);
      for (size_t j = 0; j < i; ++j) {
        for (int64_t k = 0; k <= d; ++k) diff[k] = cp[units[i] * (d + 1) + k] - cp[units[j] * (d + 1) + k];
        roots_in(diff.data(), d, cand);
      }
    }
    if (cand.empty()) return;
    std::sort(cand.begin(), cand.end());
    cand.push_back(1.0);
    double from = -1;
    int64_t was = winner(0.5 * (from + cand[0]));
    for (size_t i = 0; i + 1 < cand.size(); ++i) {
      if (cand[i + 1] <= cand[i]) continue;
      const int64_t now = winner(0.5 * (cand[i] + cand[i + 1]));
      if (now != was) {
        out.push_back(cand[i]);
        ((was >= 0) != (now >= 0) ? flips : argmax) += 1;
      }
      was = now;
    }
  };
  if (pool == 0) {
    for (int64_t u = 0; u < U; ++u) {
      units.assign(1, u);
      window();
    }
  } else {
    const int64_t C = shape[1], H = shape[2], W = shape[3];
    for (int64_t ch = 0; ch < C; ++ch) {
      for (int64_t i = 0; i + pool <= H; i += pool) {
        for (int64_t j = 0; j + pool <= W; j += pool) {
          units.clear();
          for (int64_t di = 0; di < pool; ++di) {
            for (int64_t dj = 0; dj < pool; ++dj) units.push_back(ch * H * W + (i + di) * W + j + dj);
          }
          window();
        }
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// Each unit's window (its input to the logits' layer) at a site of shape
/// `shape` (rows first) followed by a pool, max or average, of window `pool`
/// (0: none), [U]; units no window covers get window 0 (they never pass on).
torch::Tensor window_of_unit(const std::vector<int64_t>& shape, int64_t pool) {
  int64_t U = 1;
  for (size_t i = 1; i < shape.size(); ++i) U *= shape[i];
  if (pool == 0) return torch::arange(U);
  const int64_t C = shape[1], H = shape[2], W = shape[3], Hp = H / pool, Wp = W / pool;
  std::vector<int64_t> w(static_cast<size_t>(U), 0);
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t i = 0; i < Hp * pool; ++i) {
      for (int64_t j = 0; j < Wp * pool; ++j) w[(c * H + i) * W + j] = (c * Hp + i / pool) * Wp + j / pool;
    }
  }
  return torch::tensor(w, torch::kLong);
}

/// One group's sub-pieces: the pieces with m nodes each, cut at the site's
/// switches inside them.
struct SubPieces {
  std::vector<int64_t> piece;  ///< per sub-piece: its piece in the group
  std::vector<double> c, d;    ///< per sub-piece: its ends
  torch::Tensor coef;          ///< [ng, d + 1, U]: each piece's units' polynomials in local x
};

/// The sub-pieces of the group's pieces (`pieces`, their samples ys
/// [ng, S, U] at local xs [ng, S]), cut at their switches; each piece's
/// switches (in t) and counts go to `out`.
SubPieces sub_pieces(const PieceRound& rd, const std::vector<int64_t>& pieces, const torch::Tensor& ys,
                     const torch::Tensor& xs, int64_t degree, const std::vector<int64_t>& shape, const SitePool& pool,
                     LastSiteTerms& out) {
  // Each unit's polynomial in local x, fitted through the samples.
  const torch::Tensor V = torch::stack(
      [&] {
        std::vector<torch::Tensor> cols;
        for (int64_t i = 0; i <= degree; ++i) cols.push_back(xs.pow(i));
        return cols;
      }(),
      2);                                                             // [ng, S, d + 1]
  const torch::Tensor coef = torch::matmul(torch::linalg_pinv(V), ys);  // [ng, d + 1, U]
  SubPieces sp;
  sp.coef = coef;
  for (size_t g = 0; g < pieces.size(); ++g) {
    const int64_t p = pieces[g];
    const double a = rd.ends[2 * p], b = rd.ends[2 * p + 1];
    std::vector<double> sw =
        piece_switches(coef[static_cast<int64_t>(g)], shape, pool.max, pool.leaky(), out.flips[p], out.argmax[p]);
    double from = a;
    for (double x : sw) {
      const double t = a + 0.5 * (x + 1) * (b - a);
      if (t - from < kMinPiece || b - t < kMinPiece) continue;
      out.switches[p].push_back(t);
      sp.piece.push_back(static_cast<int64_t>(g));
      sp.c.push_back(from);
      sp.d.push_back(t);
      from = t;
    }
    sp.piece.push_back(static_cast<int64_t>(g));
    sp.c.push_back(from);
    sp.d.push_back(b);
  }
  return sp;
}

/// Sums over sub-pieces (their integrals over t).
struct Sums {
  torch::Tensor q;       ///< [N, S]: ∫ L_s (the samples' basis)
  torch::Tensor c0, c1;  ///< [N, m]: ∫ ℓ_j and ∫ t ℓ_j (the nodes' basis)
  torch::Tensor pq;      ///< [N, K, S]: ∫ p_k L_s
  torch::Tensor p0, p1;  ///< [N, m, K]: ∫ ℓ_j p_k and ∫ t ℓ_j p_k
};

/// The logits' layer at the segment's start and its direction.
struct Logits {
  torch::Tensor w0, dw, b0, db;  ///< [K, Hw], [K, Hw], [K], [K]
};

/// What passes on at each sub-piece's midpoint, and the samples that carry
/// it. Each of h's entries takes `slots` units of y, whose shares it adds:
/// one unit (no pool, or a max-pool's winner), or an average pool's window,
/// each unit's share 1 / slots while it is positive (and a leaky ReLU's
/// slope over slots while it is not).
struct Selection {
  int64_t slots = 1;
  torch::Tensor sel;   ///< [N, Hw · slots]: the units of y (flattened) each of h's entries takes, slot last
  torch::Tensor mask;  ///< [N, Hw · slots]: each one's share where it passes on (1 without slots), else 0
  torch::Tensor hs;    ///< [N, S, Hw]: h at the samples, Σ over the slots of ys[piece, s, sel] mask
};

/// What a rectifier passes on of a unit at y: all of it where y is positive,
/// else `slope` (a leaky ReLU's, or 0 for a ReLU).
template <typename T>
T passed_share(T y, T slope) {
  return y > 0 ? T(1) : slope;
}

/// A max-pool's winner in each window of y [C, H, W] (stride = window
/// `pool`, no padding): the unit (c H W + its index) and its share, 1 where
/// the window's maximum is positive, else `slope` (a leaky ReLU's, or 0), as
/// LibTorch's max_pool2d_with_indices takes it (pool_windows: the first
/// maximum in the window's row-major order; a NaN wins).
template <typename T>
void pool_winners(const T* y, int64_t C, int64_t H, int64_t W, int64_t pool, T slope, int64_t* sel, T* on) {
  pool_windows(y, C, H, W, pool, on, sel);  // the maxima in `on` until they become its shares
  const int64_t plane = (H / pool) * (W / pool);
  for (int64_t w = 0; w < C * plane; ++w) {
    sel[w] += (w / plane) * H * W;
    on[w] = passed_share(on[w], slope);
  }
}

/// An average pool's windows of k × k over y [C, H, W] (stride = window, no
/// padding; the rows and columns no window takes are left out): each
/// window's k² units in row-major order, and each one's share, 1 / k²
/// where it is positive (its ReLU passes it on), else `slope` / k² (a leaky
/// ReLU's slope, or 0).
template <typename T>
void average_slots(const T* y, int64_t C, int64_t H, int64_t W, int64_t k, T slope, int64_t* sel, T* on) {
  const int64_t Hp = H / k, Wp = W / k, A = k * k;
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t i = 0; i < Hp; ++i) {
      for (int64_t j = 0; j < Wp; ++j) {
        const int64_t w = (c * Hp + i) * Wp + j;
        for (int64_t di = 0; di < k; ++di) {
          for (int64_t dj = 0; dj < k; ++dj) {
            const int64_t u = (c * H + i * k + di) * W + j * k + dj, at = w * A + di * k + dj;
            sel[at] = u;
            on[at] = passed_share(y[u], slope) / static_cast<T>(A);
          }
        }
      }
    }
  }
}

template <typename T>
void select_rows(const T* ys, const T* xs, const int64_t* piece, const T* mid, int64_t N, int64_t S, int64_t U,
                 int64_t Hw, const std::vector<int64_t>& shape, const SitePool& pool, int64_t* sel, T* on, T* hs) {
  std::vector<T> y(static_cast<size_t>(U));
  const int64_t A = pool.slots();
  const T slope = static_cast<T>(pool.slope);
  for (int64_t n = 0; n < N; ++n) {
    const T* yp = ys + piece[n] * S * U;
    std::fill(y.begin(), y.end(), T(0));
    interpolate_rows(yp, xs + piece[n] * S, mid + n, 1, S, U, y.data());
    int64_t* sn = sel + n * Hw * A;
    T* mn = on + n * Hw * A;
    if (pool.average > 0) {
      average_slots(y.data(), shape[1], shape[2], shape[3], pool.average, slope, sn, mn);
    } else if (pool.max == 0) {
      for (int64_t u = 0; u < U; ++u) {
        sn[u] = u;
        mn[u] = passed_share(y[u], slope);
      }
    } else {
      pool_winners(y.data(), shape[1], shape[2], shape[3], pool.max, slope, sn, mn);
    }
    for (int64_t s = 0; s < S; ++s) {
      const T* ys_s = yp + s * U;
      T* h = hs + (n * S + s) * Hw;
      for (int64_t w = 0; w < Hw; ++w) {
        const int64_t* sw = sn + w * A;
        const T* mw = mn + w * A;
        T v = ys_s[sw[0]] * mw[0];
        for (int64_t a = 1; a < A; ++a) v += ys_s[sw[a]] * mw[a];
        h[w] = v;
      }
    }
  }
}

/// Which units pass on at each sub-piece's midpoint, from its piece's
/// samples ys[piece[n]] [S, U] at local xs[piece[n]] [S] interpolated at
/// the midpoint's local x mid[n], for a site of shape `shape` (rows first)
/// followed by `pool`; with h's samples. One pass per sub-piece, reading
/// the piece's samples in place.
Selection selection(const torch::Tensor& ys, const torch::Tensor& xs, const torch::Tensor& piece,
                    const torch::Tensor& mid, const std::vector<int64_t>& shape, const SitePool& pool) {
  const int64_t N = piece.size(0), S = ys.size(1), U = ys.size(2), k = pool.window(), A = pool.slots();
  PK_ASSERT(k == 0 || shape.size() == 4);
  const int64_t Hw = k == 0 ? U : shape[1] * (shape[2] / k) * (shape[3] / k);
  const torch::Tensor yc = ys.contiguous(), xc = xs.contiguous(), pc = piece.contiguous(), mc = mid.contiguous();
  Selection out{A, torch::empty({N, Hw * A}, torch::kLong), torch::empty({N, Hw * A}, ys.options()),
                torch::empty({N, S, Hw}, ys.options())};
  AT_DISPATCH_FLOATING_TYPES(ys.scalar_type(), "selection", [&] {
    select_rows<scalar_t>(yc.data_ptr<scalar_t>(), xc.data_ptr<scalar_t>(), pc.data_ptr<int64_t>(),
                          mc.data_ptr<scalar_t>(), N, S, U, Hw, shape, pool, out.sel.data_ptr<int64_t>(),
                          out.mask.data_ptr<scalar_t>(), out.hs.data_ptr<scalar_t>());
  });
  return out;
}

/// One sub-piece [c, d] of a piece [a, b] whose samples are at local xs
/// [S] (the first m the nodes), of K outputs.
struct SubPieceSpan {
  int64_t S = 0, m = 0, K = 0;
  double a = 0, b = 0, c = 0, d = 0;
  const double* xs = nullptr;
};

/// Sub-piece n's span of N: ends c, d, its piece's ends a, b and its
/// samples' local xs (xc [N, S], contiguous).
SubPieceSpan span_of(int64_t n, int64_t m, int64_t K, const std::vector<double>& a, const std::vector<double>& b,
                     const std::vector<double>& c, const std::vector<double>& d, const torch::Tensor& xc) {
  const int64_t S = xc.size(1);
  return {S, m, K, a[n], b[n], c[n], d[n], xc.data_ptr<double>() + n * S};
}

/// A sub-piece with the logits of its selection at the samples:
/// z(t) = Σ_s L_s(t) (z0_s + t z1_s) + b0 + t db.
struct SubPiece : SubPieceSpan {
  const double* z0 = nullptr;  ///< [S, K]
  const double* z1 = nullptr;  ///< [S, K]
  const double* b0 = nullptr;
  const double* db = nullptr;
};

/// One sub-piece's sums, laid out as a row of each of Sums' tensors.
struct SubPieceSums {
  std::vector<double> q, c0, c1, pq, p0, p1;
  SubPieceSums(int64_t S, int64_t m, int64_t K) : q(S), c0(m), c1(m), pq(K * S), p0(m * K), p1(m * K) {}
  void clear() {
    for (std::vector<double>* v : {&q, &c0, &c1, &pq, &p0, &p1}) std::fill(v->begin(), v->end(), 0.0);
  }
};

/// Calls at(t, w, x) at every node of kGaussPoints-node Gauss–Legendre on
/// `parts` equal sub-intervals of the sub-piece [c, d]: the node t, its
/// weight w and its local x in the piece [a, b].
template <typename Fn>
void for_each_node(const SubPieceSpan& sp, int64_t parts, Fn&& at) {
  const QuadratureRule& unit = gauss_legendre(kGaussPoints, 0.0, 1.0);
  const double len = (sp.d - sp.c) / static_cast<double>(parts);
  for (int64_t part = 0; part < parts; ++part) {
    for (size_t g = 0; g < unit.nodes.size(); ++g) {
      const double t = sp.c + len * (static_cast<double>(part) + unit.nodes[g]);
      at(t, len * unit.weights[g], (2 * t - sp.a - sp.b) / (sp.b - sp.a));
    }
  }
}

/// p = exp(z − max z) and its sum, the softmax's denominator.
double unnormalised_softmax(const std::vector<double>& z, std::vector<double>& p) {
  const double top = *std::max_element(z.begin(), z.end());
  double total = 0;
  for (size_t k = 0; k < z.size(); ++k) total += p[k] = std::exp(z[k] - top);
  return total;
}

/// A sub-piece's sums by kGaussPoints-node Gauss–Legendre on `parts` equal
/// sub-intervals (the integrals of p only with `softmax`).
void sub_piece_sums(const SubPiece& sp, int64_t parts, bool softmax, SubPieceSums& out) {
  const int64_t S = sp.S, m = sp.m, K = sp.K;
  std::vector<double> ls(S), lj(m), z(K), p(K);
  out.clear();
  for_each_node(sp, parts, [&](double t, double w, double x) {
    for (int64_t s = 0; s < S; ++s) {  // L_s on all samples, ℓ_j on the nodes alone
      const double l = ls[s] = lagrange_basis(sp.xs, S, s, x);
      out.q[s] += w * l;
    }
    for (int64_t j = 0; j < m; ++j) {
      const double l = lj[j] = lagrange_basis(sp.xs, m, j, x);
      out.c0[j] += w * l;
      out.c1[j] += w * t * l;
    }
    if (!softmax) return;
    for (int64_t k = 0; k < K; ++k) {
      double v = sp.b0[k] + t * sp.db[k];
      for (int64_t s = 0; s < S; ++s) v += ls[s] * (sp.z0[s * K + k] + t * sp.z1[s * K + k]);
      z[k] = v;
    }
    const double total = unnormalised_softmax(z, p);
    for (int64_t k = 0; k < K; ++k) {
      const double wp = w * p[k] / total;
      for (int64_t s = 0; s < S; ++s) out.pq[k * S + s] += wp * ls[s];
      for (int64_t j = 0; j < m; ++j) {
        out.p0[j * K + k] += wp * lj[j];
        out.p1[j * K + k] += wp * t * lj[j];
      }
    }
  });
}

/// The largest change of the integrals of p between two levels of a sub-piece's sums.
double p_change(const SubPieceSums& a, const SubPieceSums& b) {
  double change = 0;
  for (auto [x, y] : {std::make_pair(&a.pq, &b.pq), std::make_pair(&a.p0, &b.p0), std::make_pair(&a.p1, &b.p1)}) {
    for (size_t i = 0; i < x->size(); ++i) change = std::max(change, std::abs((*x)[i] - (*y)[i]));
  }
  return change;
}

/// One sub-piece of a piece held through a hidden layer, with the logits of
/// its selection at the samples: z(t) = Σ_s L_s(t) Σ_a tᵃ z_a,s + Σ_a tᵃ
/// bias_a (a = 0, 1, 2).
struct HiddenSubPiece : SubPieceSpan {
  const double* z = nullptr;     ///< [3, S, K]
  const double* bias = nullptr;  ///< [3, K]
};

/// A hidden sub-piece's sums: ∫ tᵃ L_s (a < 2), ∫ tᵃ ℓ_j (a < 3), ∫ tᵃ p_k
/// L_s (a < 2) and ∫ tᵃ ℓ_j p_k (a < 3).
struct HiddenSubPieceSums {
  std::vector<double> q, c, pq, pc;  ///< [2, S], [3, m], [2, K, S], [3, m, K]
  HiddenSubPieceSums(int64_t S, int64_t m, int64_t K) : q(2 * S), c(3 * m), pq(2 * K * S), pc(3 * m * K) {}
  void clear() {
    for (std::vector<double>* v : {&q, &c, &pq, &pc}) std::fill(v->begin(), v->end(), 0.0);
  }
};

double p_change(const HiddenSubPieceSums& a, const HiddenSubPieceSums& b) {
  double change = 0;
  for (auto [x, y] : {std::make_pair(&a.pq, &b.pq), std::make_pair(&a.pc, &b.pc)}) {
    for (size_t i = 0; i < x->size(); ++i) change = std::max(change, std::abs((*x)[i] - (*y)[i]));
  }
  return change;
}

/// A hidden sub-piece's sums by kGaussPoints-node Gauss–Legendre on `parts`
/// equal sub-intervals (the integrals of p only with `softmax`).
void sub_piece_sums(const HiddenSubPiece& sp, int64_t parts, bool softmax, HiddenSubPieceSums& out) {
  const int64_t S = sp.S, m = sp.m, K = sp.K;
  std::vector<double> ls(S), lj(m), z(K), p(K);
  out.clear();
  for_each_node(sp, parts, [&](double t, double w, double x) {
    const double tw[3] = {w, w * t, w * t * t};
    for (int64_t s = 0; s < S; ++s) {
      const double l = ls[s] = lagrange_basis(sp.xs, S, s, x);
      out.q[s] += tw[0] * l;
      out.q[S + s] += tw[1] * l;
    }
    for (int64_t j = 0; j < m; ++j) {
      const double l = lj[j] = lagrange_basis(sp.xs, m, j, x);
      for (int a = 0; a < 3; ++a) out.c[a * m + j] += tw[a] * l;
    }
    if (!softmax) return;
    for (int64_t k = 0; k < K; ++k) {
      double v = sp.bias[k] + t * (sp.bias[K + k] + t * sp.bias[2 * K + k]);
      for (int64_t s = 0; s < S; ++s) {
        const double* zs = sp.z + s * K + k;  // z_a,s at zs[a S K]
        v += ls[s] * (zs[0] + t * (zs[S * K] + t * zs[2 * S * K]));
      }
      z[k] = v;
    }
    const double total = unnormalised_softmax(z, p);
    for (int64_t k = 0; k < K; ++k) {
      const double pk = p[k] / total;
      for (int64_t s = 0; s < S; ++s) {
        out.pq[k * S + s] += tw[0] * pk * ls[s];
        out.pq[(K + k) * S + s] += tw[1] * pk * ls[s];
      }
      for (int64_t j = 0; j < m; ++j) {
        for (int a = 0; a < 3; ++a) out.pc[(a * m + j) * K + k] += tw[a] * pk * lj[j];
      }
    }
  });
}

/// A sub-piece's sums, refined until two successive levels agree to
/// rounding (the integrals of p; the others are exact at once): until the
/// change is within 64 ε of its length, or, from the third halving on, no
/// longer halves (rounding), or after kMaxHalvings.
template <typename Piece, typename PieceSums>
void converged_sums(const Piece& sp, bool softmax, PieceSums& out, PieceSums& finer) {
  sub_piece_sums(sp, 1, softmax, out);
  if (!softmax) return;
  double last = std::numeric_limits<double>::infinity();
  for (int h = 1; h <= kMaxHalvings; ++h) {
    sub_piece_sums(sp, int64_t{1} << h, softmax, finer);
    const double change = p_change(finer, out);
    std::swap(out, finer);
    if (change <= 64 * kMachineEps * (sp.d - sp.c) || (h >= 3 && change > 0.5 * last)) return;
    last = change;
  }
}

/// The sums of N sub-pieces: ends c, d, their pieces' ends a, b and
/// samples' local xs [N, S], and the logits of their selections at the
/// samples zs0, zs1 [N, S, K].
Sums sums_of(const std::vector<double>& a, const std::vector<double>& b, const std::vector<double>& c,
             const std::vector<double>& d, const torch::Tensor& xs, const torch::Tensor& zs0, const torch::Tensor& zs1,
             const Logits& lg, int64_t m, bool softmax) {
  const int64_t N = xs.size(0), S = xs.size(1), K = zs0.size(2);
  const torch::TensorOptions opts = xs.options();
  Sums out{torch::empty({N, S}, opts),    torch::empty({N, m}, opts),    torch::empty({N, m}, opts),
           torch::zeros({N, K, S}, opts), torch::zeros({N, m, K}, opts), torch::zeros({N, m, K}, opts)};
  const torch::Tensor xc = xs.contiguous(), z0 = zs0.contiguous(), z1 = zs1.contiguous();
  const torch::Tensor b0 = lg.b0.contiguous(), db = lg.db.contiguous();
  SubPieceSums one(S, m, K), spare(S, m, K);
  for (int64_t n = 0; n < N; ++n) {
    SubPiece sp;
    static_cast<SubPieceSpan&>(sp) = span_of(n, m, K, a, b, c, d, xc);
    sp.z0 = z0.data_ptr<double>() + n * S * K;
    sp.z1 = z1.data_ptr<double>() + n * S * K;
    sp.b0 = b0.data_ptr<double>();
    sp.db = db.data_ptr<double>();
    converged_sums(sp, softmax, one, spare);
    std::copy(one.q.begin(), one.q.end(), out.q.data_ptr<double>() + n * S);
    std::copy(one.c0.begin(), one.c0.end(), out.c0.data_ptr<double>() + n * m);
    std::copy(one.c1.begin(), one.c1.end(), out.c1.data_ptr<double>() + n * m);
    if (!softmax) continue;
    std::copy(one.pq.begin(), one.pq.end(), out.pq.data_ptr<double>() + n * K * S);
    std::copy(one.p0.begin(), one.p0.end(), out.p0.data_ptr<double>() + n * m * K);
    std::copy(one.p1.begin(), one.p1.end(), out.p1.data_ptr<double>() + n * m * K);
  }
  return out;
}

template <typename T>
void add_node_rows(const int64_t* row, const int64_t* unit, const T* on, const T* c0, const T* c1, const T* pw,
                   int64_t N, int64_t m, int64_t Hw, int64_t A, int64_t R, int64_t U, T* fields) {
  T *e0 = fields, *e1 = e0 + R * U, *e2 = e1 + R * U;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < m; ++j) {
      const int64_t nj = n * m + j, base = row[nj] * U;
      for (int64_t wa = 0; wa < Hw * A; ++wa) {
        const T share = on[n * Hw * A + wa];
        if (share == 0) continue;  // adds nothing
        const int64_t at = base + unit[n * Hw * A + wa];
        e0[at] += share * c0[nj];
        e1[at] += share * c1[nj];
        if (pw != nullptr) e2[at] += share * pw[nj * Hw + wa / A];
      }
    }
  }
}

/// Adds each sub-piece's node sums to the fields [3, R, U] on the units
/// that pass on: node row rows[n, j] (rows [N, m]), unit sl.sel[n, w, a]
/// (slot a of h's entry w) takes its share sl.mask[n, w, a] of c0[n, j],
/// c1[n, j] and, with the logits' moments, pw[n, j, w] (each field's
/// entries added in the order of (n, j, w, a); a share of 1 adds them as
/// they are).
void add_node_fields(const torch::Tensor& rows, const Selection& sl, const torch::Tensor& c0,
                     const torch::Tensor& c1, const torch::Tensor& pw, torch::Tensor& fields) {
  PK_ASSERT(fields.is_contiguous());
  const torch::Tensor rc = rows.contiguous(), sc = sl.sel.contiguous(), mc = sl.mask.contiguous();
  const torch::Tensor a = c0.contiguous(), b = c1.contiguous(), p = pw.defined() ? pw.contiguous() : pw;
  AT_DISPATCH_FLOATING_TYPES(fields.scalar_type(), "add_node_fields", [&] {
    add_node_rows<scalar_t>(rc.data_ptr<int64_t>(), sc.data_ptr<int64_t>(), mc.data_ptr<scalar_t>(),
                            a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(),
                            p.defined() ? p.data_ptr<scalar_t>() : nullptr, rc.size(0), rc.size(1), sl.hs.size(2),
                            sl.slots, fields.size(1), fields.size(2), fields.data_ptr<scalar_t>());
  });
}

/// Adds each hidden sub-piece's node sums to the fields [4, R, U] on the
/// units that pass on: node row rows[n, j], unit sl.sel[n, w, s] (slot s of
/// h's entry w) takes its share sl.mask[n, w, s] of c[n, a, j] into e_a
/// (a < 3) and, with the softmax, of pw[n, j, w] into e3 (each field's
/// entries added in the order of (n, j, w, s); a share of 1 adds them as
/// they are).
void add_hidden_node_fields(const torch::Tensor& rows, const Selection& sl, const torch::Tensor& c,
                            const torch::Tensor& pw, torch::Tensor& fields) {
  PK_ASSERT(fields.is_contiguous() && fields.scalar_type() == torch::kFloat64);
  const torch::Tensor rc = rows.contiguous(), sc = sl.sel.contiguous(), mc = sl.mask.contiguous();
  const torch::Tensor cc = c.contiguous(), pc = pw.defined() ? pw.contiguous() : pw;
  const int64_t N = rc.size(0), m = rc.size(1), Hw = sl.hs.size(2), A = sl.slots;
  const int64_t R = fields.size(1), U = fields.size(2);
  const int64_t *row = rc.data_ptr<int64_t>(), *unit = sc.data_ptr<int64_t>();
  const double *on = mc.data_ptr<double>(), *cs = cc.data_ptr<double>();
  const double* p = pc.defined() ? pc.data_ptr<double>() : nullptr;
  double* e = fields.data_ptr<double>();
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < m; ++j) {
      const int64_t nj = n * m + j, base = row[nj] * U;
      for (int64_t ws = 0; ws < Hw * A; ++ws) {
        const double share = on[n * Hw * A + ws];
        if (share == 0) continue;  // adds nothing
        const int64_t at = base + unit[n * Hw * A + ws];
        for (int64_t a = 0; a < 3; ++a) e[a * R * U + at] += share * cs[(n * 3 + a) * m + j];
        if (p != nullptr) e[3 * R * U + at] += share * p[nj * Hw + ws / A];
      }
    }
  }
}

/// The sums of N hidden sub-pieces (sums_of's, with z [N, 3, S, K] and
/// bias [N, 3, K]): ∫ tᵃ L_s [N, 2, S], ∫ tᵃ ℓ_j [N, 3, m], ∫ tᵃ p_k L_s
/// [N, 2, K, S], ∫ tᵃ ℓ_j p_k [N, 3, m, K].
struct HiddenSums {
  torch::Tensor q, c, pq, pc;
};

HiddenSums hidden_sums_of(const std::vector<double>& a, const std::vector<double>& b, const std::vector<double>& c,
                          const std::vector<double>& d, const torch::Tensor& xs, const torch::Tensor& z,
                          const torch::Tensor& bias, int64_t m, bool softmax) {
  const int64_t N = xs.size(0), S = xs.size(1), K = z.size(3);
  const torch::TensorOptions opts = xs.options();
  HiddenSums out{torch::empty({N, 2, S}, opts), torch::empty({N, 3, m}, opts), torch::zeros({N, 2, K, S}, opts),
                 torch::zeros({N, 3, m, K}, opts)};
  const torch::Tensor xc = xs.contiguous(), zc = z.contiguous(), bc = bias.contiguous();
  HiddenSubPieceSums one(S, m, K), spare(S, m, K);
  for (int64_t n = 0; n < N; ++n) {
    HiddenSubPiece sp;
    static_cast<SubPieceSpan&>(sp) = span_of(n, m, K, a, b, c, d, xc);
    sp.z = zc.data_ptr<double>() + n * 3 * S * K;
    sp.bias = bc.data_ptr<double>() + n * 3 * K;
    converged_sums(sp, softmax, one, spare);
    std::copy(one.q.begin(), one.q.end(), out.q.data_ptr<double>() + n * 2 * S);
    std::copy(one.c.begin(), one.c.end(), out.c.data_ptr<double>() + n * 3 * m);
    if (!softmax) continue;
    std::copy(one.pq.begin(), one.pq.end(), out.pq.data_ptr<double>() + n * 2 * K * S);
    std::copy(one.pc.begin(), one.pc.end(), out.pc.data_ptr<double>() + n * 3 * m * K);
  }
  return out;
}

/// A group of a round's pieces with m nodes each, and their samples of the
/// site's pre-activation y: nodes then ends, at local x ∈ [−1, 1].
struct PieceGroup {
  int64_t m = 0, S = 0, ng = 0;
  std::vector<int64_t> pieces;
  std::vector<double> pa, pb;   ///< each piece's ends
  torch::Tensor ys, xs, rows, index;  ///< [ng, S, U], [ng, S], node rows [ng, m], pieces [ng]
};

PieceGroup piece_group(const PieceRound& rd, const std::vector<int64_t>& pieces, int64_t m, const torch::Tensor& ny,
                       const torch::Tensor& ey) {
  PieceGroup g;
  g.m = m;
  g.S = m + 2;
  g.ng = static_cast<int64_t>(pieces.size());
  g.pieces = pieces;
  const int64_t U = ny.size(1);
  std::vector<int64_t> node_rows, end_rows;
  std::vector<double> xs;
  for (int64_t p : pieces) {
    const double a = rd.ends[2 * p], b = rd.ends[2 * p + 1];
    for (int64_t r = rd.first[p]; r < rd.first[p + 1]; ++r) {
      node_rows.push_back(r);
      xs.push_back((2 * rd.t[r] - a - b) / (b - a));
    }
    xs.push_back(-1.0);
    xs.push_back(1.0);
    end_rows.push_back(2 * p);
    end_rows.push_back(2 * p + 1);
    g.pa.push_back(a);
    g.pb.push_back(b);
  }
  g.ys = torch::cat({ny.index_select(0, torch::tensor(node_rows, torch::kLong)).view({g.ng, m, U}),
                     ey.index_select(0, torch::tensor(end_rows, torch::kLong)).view({g.ng, 2, U})},
                    1);  // [ng, S, U]
  g.xs = torch::tensor(xs, ny.options()).view({g.ng, g.S});
  g.rows = torch::tensor(node_rows, torch::kLong).view({g.ng, m});
  g.index = torch::tensor(pieces, torch::kLong);
  return g;
}

/// The round's pieces grouped by their node count (all alike but for short
/// pieces).
std::map<int64_t, std::vector<int64_t>> pieces_by_nodes(const PieceRound& rd) {
  std::map<int64_t, std::vector<int64_t>> by_nodes;
  for (int64_t p = 0; p < rd.np; ++p) by_nodes[rd.first[p + 1] - rd.first[p]].push_back(p);
  return by_nodes;
}

/// A chunk of a group's sub-pieces n0 .. n0 + nc − 1: their pieces' ends
/// a, b, their own c, d, and their midpoints' local x.
struct SubChunk {
  int64_t n0 = 0, nc = 0;
  torch::Tensor g;  ///< each one's piece in the group [nc]
  std::vector<double> a, b, c, d, mid;
};

std::vector<SubChunk> sub_chunks(const PieceGroup& grp, const SubPieces& sp, int64_t U) {
  const int64_t N = static_cast<int64_t>(sp.piece.size());
  const int64_t chunk = std::max<int64_t>(1, kChunkDoubles / (grp.S * U));
  const torch::Tensor sub_t = torch::tensor(sp.piece, torch::kLong);
  std::vector<SubChunk> out;
  for (int64_t n0 = 0; n0 < N; n0 += chunk) {
    SubChunk ch;
    ch.n0 = n0;
    ch.nc = std::min(chunk, N - n0);
    ch.g = sub_t.narrow(0, n0, ch.nc);
    for (int64_t n = n0; n < n0 + ch.nc; ++n) {
      const size_t g = static_cast<size_t>(sp.piece[n]);
      ch.a.push_back(grp.pa[g]);
      ch.b.push_back(grp.pb[g]);
      ch.c.push_back(sp.c[n]);
      ch.d.push_back(sp.d[n]);
      ch.mid.push_back((sp.c[n] + sp.d[n] - grp.pa[g] - grp.pb[g]) / (grp.pb[g] - grp.pa[g]));
    }
    out.push_back(std::move(ch));
  }
  return out;
}

/// A param layer's weight and bias at the segment's start and its direction
/// (zero biases where it has none: adding 0 changes no value), and its
/// ReLU's slope below 0 (a leaky ReLU's, else 0).
struct LayerAt {
  torch::Tensor w0, dw, b0, db;
  double slope = 0;
};

LayerAt layer_at(const SegmentEvaluator& ev, size_t l) {
  const int64_t out = ev.weight_of(ev.start(), l).size(0);
  auto bias_of = [&](const torch::Tensor& v) {
    return ev.param_layers()[l].bias_numel > 0 ? ev.bias_of(v, l) : torch::zeros({out}, torch::kFloat64);
  };
  return {ev.weight_of(ev.start(), l), ev.weight_of(ev.direction(), l), bias_of(ev.start()), bias_of(ev.direction()),
          ev.slope_after(l)};
}

/// The value at local x of each of a polynomial's units, c [d + 1, H]
/// (coefficients first) at unit i.
double poly_at(const double* c, int64_t d, int64_t H, int64_t i, double x) {
  double v = 0;
  for (int64_t k = d; k >= 0; --k) v = v * x + c[k * H + i];
  return v;
}

/// Pass 1 of a group held through a hidden layer: the hidden layer's
/// pre-activation on each sub-piece (a polynomial of one degree more than
/// y's, from y's fit through the selection), its sign at the sub-piece's
/// midpoint, and its switches inside: each piece's mask is its first
/// sub-piece's, and a switch (or a sub-piece whose signs differ from it)
/// is a hidden kink of the piece.
void hidden_masks(const PieceGroup& grp, const SubPieces& sp, const SubChunk& ch, const Selection& sel,
                  const LayerAt& hid, LastSiteTerms& out, std::vector<bool>& seen) {
  const int64_t nc = ch.nc, d = sp.coef.size(1) - 1, Hw = sel.hs.size(2), H = hid.w0.size(0);
  // y's coefficients through each sub-piece's selection: [nc, d + 1, Hw],
  // each entry's slots' shares added.
  const torch::Tensor cg = sp.coef.index_select(0, ch.g);
  torch::Tensor hc = cg.gather(2, sel.sel.unsqueeze(1).expand({nc, d + 1, Hw * sel.slots})) * sel.mask.unsqueeze(1);
  if (sel.slots > 1) hc = hc.view({nc, d + 1, Hw, sel.slots}).sum(3);
  const torch::Tensor g0 = torch::matmul(hc, hid.w0.t()), g1 = torch::matmul(hc, hid.dw.t());  // [nc, d + 1, H]
  // In local x, t = α + β x: y_h = g0 + t g1 + b + t db, of degree d + 1.
  std::vector<double> alpha(nc), beta(nc);
  for (int64_t n = 0; n < nc; ++n) {
    alpha[n] = 0.5 * (ch.a[n] + ch.b[n]);
    beta[n] = 0.5 * (ch.b[n] - ch.a[n]);
  }
  const torch::TensorOptions opts = g0.options();
  const torch::Tensor al = torch::tensor(alpha, opts).view({nc, 1, 1}), be = torch::tensor(beta, opts).view({nc, 1, 1});
  torch::Tensor Y = torch::zeros({nc, d + 2, H}, opts);
  Y.narrow(1, 0, d + 1).add_(g0 + al * g1);
  Y.narrow(1, 1, d + 1).add_(be * g1);
  Y.select(1, 0).add_(hid.b0.unsqueeze(0) + al.view({nc, 1}) * hid.db.unsqueeze(0));
  Y.select(1, 1).add_(be.view({nc, 1}) * hid.db.unsqueeze(0));
  const torch::Tensor Yc = Y.contiguous();
  std::vector<double> roots, coef(static_cast<size_t>(d + 2));
  for (int64_t n = 0; n < nc; ++n) {
    const int64_t g = ch.g[n].item<int64_t>(), p = grp.pieces[static_cast<size_t>(g)];
    const double* y = Yc.data_ptr<double>() + n * (d + 2) * H;
    const double xc = (2 * ch.c[n] - ch.a[n] - ch.b[n]) / (ch.b[n] - ch.a[n]);
    const double xd = (2 * ch.d[n] - ch.a[n] - ch.b[n]) / (ch.b[n] - ch.a[n]);
    // The layer's rounding: a unit within it of 0 on the sub-piece passes
    // on no more than that whatever its sign, and a root where the unit
    // stays within it up to the piece's end is that end's own switch (the
    // piece was cut there), moved by rounding.
    double scale = 0;
    for (int64_t i = 0; i < H; ++i) {
      double bound = 0;
      for (int64_t k = 0; k <= d + 1; ++k) bound += std::abs(y[k * H + i]);
      scale = std::max(scale, bound);
    }
    const double noise = 64 * kMachineEps * scale;
    torch::Tensor mask = out.mask[p];
    double* mk = mask.data_ptr<double>();
    std::vector<double>& kinks = out.hidden_kinks[static_cast<size_t>(p)];
    const bool first = !seen[static_cast<size_t>(p)];
    seen[static_cast<size_t>(p)] = true;
    bool differs = false;
    for (int64_t i = 0; i < H; ++i) {
      const double mid = poly_at(y, d + 1, H, i, ch.mid[n]);
      const double pass = passed_share(mid, hid.slope);
      if (first) mk[i] = pass;
      differs = differs || (std::abs(mid) > noise && mk[i] != pass);
      roots.clear();
      for (int64_t k = 0; k <= d + 1; ++k) coef[k] = y[k * H + i];
      roots_in(coef.data(), d + 1, roots);
      for (double x : roots) {
        if (x < xc || x > xd) continue;
        const double end = x < 0 ? -1.0 : 1.0;
        if (std::abs(poly_at(y, d + 1, H, i, 0.5 * (x + end))) <= noise &&
            std::abs(poly_at(y, d + 1, H, i, end)) <= noise) {
          continue;
        }
        const double t = ch.a[n] + 0.5 * (x + 1) * (ch.b[n] - ch.a[n]);
        if (t - ch.a[n] > kMinPiece && ch.b[n] - t > kMinPiece) kinks.push_back(t);
      }
    }
    if (differs && ch.c[n] - ch.a[n] > kMinPiece) kinks.push_back(ch.c[n]);
  }
}

/// The effective weights of a held site through a hidden layer per piece:
/// W(t) D W_h(t) = Σ_a tᵃ E_a [np, 3, K, Hw] and W(t) D b_h(t) + b(t) =
/// Σ_a tᵃ B_a [np, 3, K], D the piece's mask.
std::pair<torch::Tensor, torch::Tensor> effective_weights(const LayerAt& fin, const LayerAt& hid,
                                                          const torch::Tensor& mask) {
  const torch::Tensor wm = fin.w0.unsqueeze(0) * mask.unsqueeze(1), dwm = fin.dw.unsqueeze(0) * mask.unsqueeze(1);
  const torch::Tensor e = torch::stack({torch::matmul(wm, hid.w0), torch::matmul(wm, hid.dw) + torch::matmul(dwm, hid.w0),
                                        torch::matmul(dwm, hid.dw)},
                                       1);
  const torch::Tensor b = torch::stack({torch::matmul(wm, hid.b0) + fin.b0, torch::matmul(wm, hid.db) +
                                                                                torch::matmul(dwm, hid.b0) + fin.db,
                                        torch::matmul(dwm, hid.db)},
                                       1);
  return {e, b};
}

/// A group of pieces held through a hidden layer, with its sub-pieces in
/// chunks and each chunk's selection.
struct HiddenGroup {
  PieceGroup grp;
  SubPieces sp;
  std::vector<SubChunk> chunks;
  std::vector<Selection> sel;
};

/// Pass 1 of a round held through a hidden layer: the pieces' sub-pieces at
/// the site's switches (into out.switches and their counts), their
/// selections, each piece's mask out.mask [np, H] and the hidden layer's
/// kinks inside it (out.hidden_kinks, sorted).
std::vector<HiddenGroup> hidden_groups(const SegmentEvaluator& ev, const PieceRound& rd, const torch::Tensor& ny,
                                       const torch::Tensor& ey, const std::vector<int64_t>& shape, const LayerAt& hid,
                                       LastSiteTerms& out) {
  const size_t site = ev.param_layers().size() - 3;
  const int64_t np = rd.np, U = ny.size(1);
  const SitePool pool = site_pool(ev, site);
  const int64_t degree = ev.polynomial_degree() - 2;  // of y on a piece
  out.switches.resize(static_cast<size_t>(np));
  out.hidden_kinks.resize(static_cast<size_t>(np));
  out.flips.assign(static_cast<size_t>(np), 0);
  out.argmax.assign(static_cast<size_t>(np), 0);
  out.mask = torch::zeros({np, hid.w0.size(0)}, ny.options());
  std::vector<HiddenGroup> groups;
  std::vector<bool> seen(static_cast<size_t>(np), false);
  for (const auto& [m, pieces] : pieces_by_nodes(rd)) {
    HiddenGroup& gr = groups.emplace_back();
    gr.grp = piece_group(rd, pieces, m, ny, ey);
    gr.sp = sub_pieces(rd, pieces, gr.grp.ys, gr.grp.xs, degree, shape, pool, out);
    gr.chunks = sub_chunks(gr.grp, gr.sp, U);
    for (const SubChunk& ch : gr.chunks) {
      gr.sel.push_back(selection(gr.grp.ys, gr.grp.xs, ch.g, torch::tensor(ch.mid, ny.options()), shape, pool));
      PK_ASSERT(gr.sel.back().hs.size(2) == hid.w0.size(1));
      hidden_masks(gr.grp, gr.sp, ch, gr.sel.back(), hid, out, seen);
    }
  }
  for (std::vector<double>& k : out.hidden_kinks) {
    std::sort(k.begin(), k.end());
    k.erase(std::unique(k.begin(), k.end()), k.end());
  }
  return groups;
}

/// Pass 2: every sub-piece's sums under its piece's mask, into the node
/// rows' fields [4, R, U] and the pieces' integrals of the hidden layer's
/// input (out.h0, h1, p0, p1, p0s, p1s), with the effective weights e [np,
/// 3, K, Hw] and biases [np, 3, K].
void add_hidden_sums(const std::vector<HiddenGroup>& groups, const torch::Tensor& e, const torch::Tensor& bias,
                     bool softmax, torch::Tensor& fields, LastSiteTerms& out) {
  const int64_t np = e.size(0), K = e.size(2), Hw = e.size(3);
  const torch::TensorOptions opts = e.options();
  for (torch::Tensor* v : {&out.h0, &out.h1}) *v = torch::zeros({np, Hw}, opts);
  for (torch::Tensor* v : {&out.p0, &out.p1}) *v = torch::zeros({np, K, Hw}, opts);
  for (torch::Tensor* v : {&out.p0s, &out.p1s}) *v = torch::zeros({np, K}, opts);
  for (const HiddenGroup& gr : groups) {
    for (size_t c = 0; c < gr.chunks.size(); ++c) {
      const SubChunk& ch = gr.chunks[c];
      const Selection& sl = gr.sel[c];
      const torch::Tensor piece = gr.grp.index.index_select(0, ch.g);
      const torch::Tensor ep = e.index_select(0, piece);  // [nc, 3, K, Hw]
      const torch::Tensor z = torch::matmul(sl.hs.unsqueeze(1), ep.transpose(2, 3));  // [nc, 3, S, K]
      const HiddenSums s = hidden_sums_of(ch.a, ch.b, ch.c, ch.d, gr.grp.xs.index_select(0, ch.g), z,
                                          bias.index_select(0, piece), gr.grp.m, softmax);
      out.h0.index_add_(0, piece, torch::bmm(s.q.narrow(1, 0, 1), sl.hs).squeeze(1));
      out.h1.index_add_(0, piece, torch::bmm(s.q.narrow(1, 1, 1), sl.hs).squeeze(1));
      torch::Tensor pw;  // [nc, m, Hw]
      if (softmax) {
        out.p0.index_add_(0, piece, torch::bmm(s.pq.select(1, 0), sl.hs));
        out.p1.index_add_(0, piece, torch::bmm(s.pq.select(1, 1), sl.hs));
        out.p0s.index_add_(0, piece, s.pq.select(1, 0).sum(2));
        out.p1s.index_add_(0, piece, s.pq.select(1, 1).sum(2));
        pw = torch::matmul(s.pc, ep).sum(1);  // Σ_a ∫ tᵃ ℓ_j pᵀ E_a
      }
      add_hidden_node_fields(gr.grp.rows.index_select(0, ch.g), sl, s.c, pw, fields);
    }
  }
}

/// From the pieces' integrals of the hidden layer's input: the logits'
/// layer's sums (its input D y_h, y_h = W_h(t) h + b_h(t)) and the hidden
/// layer's part of J̄ dw (its block, LayerFeatures::HiddenFactors, against [dW_h, db_h]).
void finish_hidden_terms(const LayerAt& fin, const LayerAt& hid, LastSiteTerms& out) {
  const torch::Tensor lt = out.len.unsqueeze(1), tt = out.t1.unsqueeze(1);
  out.h_sum = out.mask * (torch::matmul(out.h0, hid.w0.t()) + torch::matmul(out.h1, hid.dw.t()) + lt * hid.b0 +
                          tt * hid.db);
  out.ph_sum = out.mask.unsqueeze(1) * (torch::matmul(out.p0, hid.w0.t()) + torch::matmul(out.p1, hid.dw.t()) +
                                        out.p0s.unsqueeze(2) * hid.b0 + out.p1s.unsqueeze(2) * hid.db);
  out.p_sum = out.p0s;
  const torch::Tensor u0 = torch::matmul(out.h0, hid.dw.t()) + lt * hid.db;
  const torch::Tensor u1 = torch::matmul(out.h1, hid.dw.t()) + tt * hid.db;
  const torch::Tensor v0 = torch::matmul(out.p0, hid.dw.t()) + out.p0s.unsqueeze(2) * hid.db;
  const torch::Tensor v1 = torch::matmul(out.p1, hid.dw.t()) + out.p1s.unsqueeze(2) * hid.db;
  const torch::Tensor wm = fin.w0.unsqueeze(0) * out.mask.unsqueeze(1), dwm = fin.dw.unsqueeze(0) * out.mask.unsqueeze(1);
  const torch::Tensor own = torch::matmul(wm, u0.unsqueeze(2)).squeeze(2) + torch::matmul(dwm, u1.unsqueeze(2)).squeeze(2);
  out.hidden_dot = own - (wm * v0 + dwm * v1).sum({1, 2}).unsqueeze(1);
}

/// The terms of a round held through a hidden layer (last_site_terms).
LastSiteTerms hidden_site_terms(const SegmentEvaluator& ev, const PieceRound& rd, const torch::Tensor& node_y,
                                const torch::Tensor& end_y, bool softmax) {
  const size_t fin_l = ev.param_layers().size() - 1;
  const LayerAt fin = layer_at(ev, fin_l), hid = layer_at(ev, fin_l - 1);
  const torch::Tensor ny = node_y.flatten(1), ey = end_y.flatten(1);  // [R, U], [2 np, U]
  const torch::TensorOptions opts = ny.options();
  const std::vector<int64_t> shape = node_y.sizes().vec();
  LastSiteTerms out;
  std::vector<double> len(static_cast<size_t>(rd.np)), t1(static_cast<size_t>(rd.np));
  for (int64_t p = 0; p < rd.np; ++p) {
    const double a = rd.ends[2 * p], b = rd.ends[2 * p + 1];
    len[static_cast<size_t>(p)] = b - a;
    t1[static_cast<size_t>(p)] = 0.5 * (b - a) * (b + a);
  }
  out.len = torch::tensor(len, opts);
  out.t1 = torch::tensor(t1, opts);
  const std::vector<HiddenGroup> groups = hidden_groups(ev, rd, ny, ey, shape, hid, out);
  const auto [e, bias] = effective_weights(fin, hid, out.mask);  // [np, 3, K, Hw], [np, 3, K]
  out.fields = torch::zeros({4, rd.rows, ny.size(1)}, opts);
  add_hidden_sums(groups, e, bias, softmax, out.fields, out);
  finish_hidden_terms(fin, hid, out);
  out.eu = e;
  out.w_of_u = window_of_unit(shape, site_pool(ev, fin_l - 2).window());
  return out;
}

/// The cotangents [K, R, ...] of fields [3, R, U] (LastSiteTerms::fields)
/// for a site of shape `shape` (its first entry, the rows, is not read).
torch::Tensor cotangents_of(const torch::Tensor& fields, const torch::Tensor& w0u, const torch::Tensor& dwu,
                            const std::vector<int64_t>& shape) {
  const int64_t K = w0u.size(0), R = fields.size(1), U = fields.size(2);
  std::vector<int64_t> cot_shape{K, R};
  cot_shape.insert(cot_shape.end(), shape.begin() + 1, shape.end());
  if (fields.scalar_type() != torch::kFloat64) {
    torch::Tensor cot = w0u.unsqueeze(1) * fields[0];  // [K, R, U]
    cot.addcmul_(dwu.unsqueeze(1), fields[1]).sub_(fields[2]);
    return cot.view(cot_shape);
  }
  // One pass over the output (three tensor operations would take three).
  const torch::Tensor e = fields.contiguous(), a = w0u.contiguous(), b = dwu.contiguous();
  torch::Tensor cot = torch::empty({K, R, U}, fields.options());
  const double *e0 = e.data_ptr<double>(), *e1 = e0 + R * U, *e2 = e1 + R * U;
  double* out = cot.data_ptr<double>();
  for (int64_t k = 0; k < K; ++k) {
    const double *ak = a.data_ptr<double>() + k * U, *bk = b.data_ptr<double>() + k * U;
    for (int64_t r = 0; r < R; ++r) {
      const int64_t at = r * U;
      double* o = out + (k * R + r) * U;
      for (int64_t u = 0; u < U; ++u) o[u] = ak[u] * e0[at + u] + bk[u] * e1[at + u] - e2[at + u];
    }
  }
  return cot.view(cot_shape);
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> piece_cotangent_sums(const LastSiteTerms& terms, const PieceRound& rd,
                                                             const torch::Tensor& t, const std::vector<int64_t>& shape) {
  const torch::Tensor e = terms.fields.contiguous(), tc = t.contiguous();
  const int64_t R = e.size(1), U = e.size(2), np = rd.np;
  PK_ASSERT(static_cast<int64_t>(rd.piece_of.size()) == R && tc.numel() == R);
  const int64_t F = e.size(0);
  torch::Tensor sum = torch::zeros({F, np, U}, e.options()), tsum = torch::zeros({F, np, U}, e.options());
  AT_DISPATCH_FLOATING_TYPES(e.scalar_type(), "piece_cotangent_sums", [&] {
    const scalar_t* ep = e.data_ptr<scalar_t>();
    const scalar_t* tp = tc.data_ptr<scalar_t>();
    scalar_t *sp = sum.data_ptr<scalar_t>(), *tsp = tsum.data_ptr<scalar_t>();
    for (int64_t f = 0; f < F; ++f) {
      for (int64_t r = 0; r < R; ++r) {
        const scalar_t* er = ep + (f * R + r) * U;
        const int64_t at = (f * np + rd.piece_of[r]) * U;
        for (int64_t u = 0; u < U; ++u) {
          sp[at + u] += er[u];
          tsp[at + u] += er[u] * tp[r];
        }
      }
    }
  });
  std::vector<int64_t> own(static_cast<size_t>(np));
  std::iota(own.begin(), own.end(), 0);
  return {site_cotangents(terms, sum, own, shape), site_cotangents(terms, tsum, own, shape)};
}

torch::Tensor site_cotangents(const LastSiteTerms& terms, const torch::Tensor& fields,
                              const std::vector<int64_t>& piece_of, const std::vector<int64_t>& shape) {
  if (!terms.hidden()) return cotangents_of(fields, terms.w0u, terms.dwu, shape);
  const int64_t K = terms.eu.size(2), Hw = terms.eu.size(3), R = fields.size(1), U = fields.size(2);
  PK_ASSERT(static_cast<int64_t>(piece_of.size()) == R && fields.size(0) == 4);
  std::vector<int64_t> cot_shape{K, R};
  cot_shape.insert(cot_shape.end(), shape.begin() + 1, shape.end());
  const torch::Tensor e = fields.contiguous(), eu = terms.eu.contiguous(), w = terms.w_of_u.contiguous();
  torch::Tensor cot = torch::empty({K, R, U}, fields.options());
  AT_DISPATCH_FLOATING_TYPES(fields.scalar_type(), "site_cotangents", [&] {
    const scalar_t* ep = e.data_ptr<scalar_t>();
    const scalar_t* E = eu.data_ptr<scalar_t>();
    const int64_t* wu = w.data_ptr<int64_t>();
    scalar_t* out = cot.data_ptr<scalar_t>();
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t r = 0; r < R; ++r) {
        const scalar_t* E0 = E + (piece_of[r] * 3 * K + k) * Hw;
        const scalar_t *E1 = E0 + K * Hw, *E2 = E1 + K * Hw;
        const scalar_t *e0 = ep + r * U, *e1 = e0 + R * U, *e2 = e1 + R * U, *e3 = e2 + R * U;
        scalar_t* o = out + (k * R + r) * U;
        for (int64_t u = 0; u < U; ++u) o[u] = E0[wu[u]] * e0[u] + E1[wu[u]] * e1[u] + E2[wu[u]] * e2[u] - e3[u];
      }
    }
  });
  return cot.view(cot_shape);
}

torch::Tensor site_dot(const LastSiteTerms& terms, const torch::Tensor& direction,
                       const std::vector<int64_t>& piece_of) {
  const torch::Tensor d = direction.flatten(1);  // [R, U]
  if (terms.hidden()) {
    return (site_cotangents(terms, terms.fields, piece_of, d.sizes().vec()) * d.unsqueeze(0)).sum(2);
  }
  // G_{k,r} · d_r = (e0 ⊙ d) w0uᵀ + (e1 ⊙ d) dwuᵀ − Σ_u e2 ⊙ d, per row.
  const torch::Tensor ed = terms.fields * d.unsqueeze(0);  // [3, R, U]
  return (torch::matmul(ed[0], terms.w0u.t()) + torch::matmul(ed[1], terms.dwu.t()) - ed[2].sum(1, true)).t();
}

LastSiteTerms last_site_terms(const SegmentEvaluator& ev, const PieceRound& rd, const torch::Tensor& node_y,
                              const torch::Tensor& end_y, bool softmax, bool hidden) {
  if (hidden) return hidden_site_terms(ev, rd, node_y, end_y, softmax);
  const size_t fin = ev.param_layers().size() - 1, site = fin - 1;
  const LayerAt at = layer_at(ev, fin);
  Logits lg{at.w0, at.dw, at.b0, at.db};
  const int64_t K = lg.w0.size(0), Hw = lg.w0.size(1), R = rd.rows, np = rd.np;
  const torch::Tensor ny = node_y.flatten(1), ey = end_y.flatten(1);  // [R, U], [2 np, U]
  const int64_t U = ny.size(1);
  const torch::TensorOptions opts = ny.options();
  const SitePool pool = site_pool(ev, site);
  const std::vector<int64_t> shape = node_y.sizes().vec();
  // Node row r's cotangent on unit u (window w(u)) for output k is
  // W0[k, w(u)] e0[r, u] + dW[k, w(u)] e1[r, u] − e2[r, u]: the sums over the
  // piece's sub-pieces n (where u passes on) of ∫ ℓ_j, ∫ t ℓ_j and
  // ∫ ℓ_j pᵀ W(t)[:, w(u)].
  const torch::Tensor w_of_u = window_of_unit(shape, pool.window());  // [U]
  torch::Tensor fields = torch::zeros({3, R, U}, opts);  // e0, e1, e2
  LastSiteTerms out;
  out.h_sum = torch::zeros({np, Hw}, opts);
  out.ph_sum = torch::zeros({np, K, Hw}, opts);
  out.p_sum = torch::zeros({np, K}, opts);
  out.switches.resize(static_cast<size_t>(np));
  out.flips.assign(static_cast<size_t>(np), 0);
  out.argmax.assign(static_cast<size_t>(np), 0);
  const int64_t degree = ev.polynomial_degree() - 1;  // of y on a piece
  std::vector<double> len(static_cast<size_t>(np));
  for (int64_t p = 0; p < np; ++p) len[static_cast<size_t>(p)] = rd.ends[2 * p + 1] - rd.ends[2 * p];
  out.len = torch::tensor(len, opts);
  for (const auto& [m, pieces] : pieces_by_nodes(rd)) {
    const PieceGroup grp = piece_group(rd, pieces, m, ny, ey);
    const SubPieces sp = sub_pieces(rd, pieces, grp.ys, grp.xs, degree, shape, pool, out);
    for (const SubChunk& ch : sub_chunks(grp, sp, U)) {
      const torch::Tensor& g = ch.g;
      const torch::Tensor xg = grp.xs.index_select(0, g);
      const Selection sl = selection(grp.ys, grp.xs, g, torch::tensor(ch.mid, opts), shape, pool);
      const torch::Tensor& hs = sl.hs;  // [nc, S, Hw]
      PK_ASSERT(hs.size(2) == Hw);
      const Sums s = sums_of(ch.a, ch.b, ch.c, ch.d, xg, torch::matmul(hs, lg.w0.t()), torch::matmul(hs, lg.dw.t()),
                             lg, m, softmax);
      // The logits' layer, per piece.
      const torch::Tensor piece = grp.index.index_select(0, g);
      out.h_sum.index_add_(0, piece, torch::bmm(s.q.unsqueeze(1), hs).squeeze(1));
      torch::Tensor pw;  // [nc, m, Hw]
      if (softmax) {
        out.ph_sum.index_add_(0, piece, torch::bmm(s.pq, hs));
        out.p_sum.index_add_(0, piece, s.pq.sum(2));
        pw = torch::matmul(s.p0, lg.w0) + torch::matmul(s.p1, lg.dw);
      }
      // The nodes' sums on the units that pass on: node row r, the units of sl.sel[n, w].
      add_node_fields(grp.rows.index_select(0, g), sl, s.c0, s.c1, pw, fields);
    }
  }
  out.w0u = lg.w0.index_select(1, w_of_u);
  out.dwu = lg.dw.index_select(1, w_of_u);
  out.fields = fields;
  return out;
}

}  // namespace pathkernel
