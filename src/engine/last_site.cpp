// The last site's switches, integrated inside the pieces (docs/math.md §7).
//
// On a piece [a, b] between the earlier sites' kinks, the last site's
// pre-activation y(t) is a polynomial of degree L − 1, known exactly from
// its samples at the piece's m nodes and two ends (m + 2 ≥ L of them). Its
// switches cut the piece into sub-pieces, on each of which the site passes on
// a fixed selection σ of y's units (the ReLU's positive units, or each pool
// window's positive argmax): h(t) = σ y(t), z(t) = W(t) h(t) + b(t). With
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

/// The switches of one piece's held site (its units' polynomials c
/// [d + 1, U] in local x), sorted in local x, counted into `flips` (a
/// window's or unit's sign) and `argmax` (a positive window's winner).
std::vector<double> piece_switches(const torch::Tensor& c, const std::vector<int64_t>& shape, int64_t pool,
                                   int64_t& flips, int64_t& argmax) {
  const torch::Tensor cc = c.t().contiguous();  // [U, d + 1]
  const int64_t d = cc.size(1) - 1, U = cc.size(0);
  const double* cp = cc.data_ptr<double>();
  auto value = [&](int64_t u, double x) {
    double v = 0;
    for (int64_t i = d; i >= 0; --i) v = v * x + cp[u * (d + 1) + i];
    return v;
  };
  std::vector<double> out, cand, diff(static_cast<size_t>(d + 1));
  // A window's units (one unit without a pool): the winner at x, −1 for none.
  std::vector<int64_t> units;
  auto winner = [&](double x) {
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
  // positive, or one stays positive and above every other's range.
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
    if (top_hi <= 0) return true;
    if (best_lo <= 0) return false;
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
        (was < 0 || now < 0 ? flips : argmax) += 1;
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
/// `shape` (rows first) followed by a max-pool of `pool` (0: none), [U];
/// units no window covers get window 0 (they never pass on).
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
};

/// The sub-pieces of the group's pieces (`pieces`, their samples ys
/// [ng, S, U] at local xs [ng, S]), cut at their switches; each piece's
/// switches (in t) and counts go to `out`.
SubPieces sub_pieces(const PieceRound& rd, const std::vector<int64_t>& pieces, const torch::Tensor& ys,
                     const torch::Tensor& xs, int64_t degree, const std::vector<int64_t>& shape, int64_t pool,
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
  for (size_t g = 0; g < pieces.size(); ++g) {
    const int64_t p = pieces[g];
    const double a = rd.ends[2 * p], b = rd.ends[2 * p + 1];
    std::vector<double> sw = piece_switches(coef[static_cast<int64_t>(g)], shape, pool, out.flips[p], out.argmax[p]);
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

/// What passes on at each sub-piece's midpoint, and the samples that carry it.
struct Selection {
  torch::Tensor sel;   ///< [N, Hw]: the unit of y (flattened) each of h's entries takes
  torch::Tensor mask;  ///< [N, Hw]: 1 where that unit passes on, else 0
  torch::Tensor hs;    ///< [N, S, Hw]: h at the samples, ys[piece, s, sel] mask
};

/// A max-pool's winner in each window of y [C, H, W] (stride = window
/// `pool`, no padding): the unit (c H W + its index) and whether the
/// window's maximum is positive, as LibTorch's max_pool2d_with_indices
/// takes it (pool_windows: the first maximum in the window's row-major
/// order; a NaN wins).
template <typename T>
void pool_winners(const T* y, int64_t C, int64_t H, int64_t W, int64_t pool, int64_t* sel, T* on) {
  pool_windows(y, C, H, W, pool, on, sel);  // the maxima in `on` until they become its flags
  const int64_t plane = (H / pool) * (W / pool);
  for (int64_t w = 0; w < C * plane; ++w) {
    sel[w] += (w / plane) * H * W;
    on[w] = static_cast<T>(on[w] > 0);
  }
}

template <typename T>
void select_rows(const T* ys, const T* xs, const int64_t* piece, const T* mid, int64_t N, int64_t S, int64_t U,
                 int64_t Hw, const std::vector<int64_t>& shape, int64_t pool, int64_t* sel, T* on, T* hs) {
  std::vector<T> y(static_cast<size_t>(U));
  for (int64_t n = 0; n < N; ++n) {
    const T* yp = ys + piece[n] * S * U;
    std::fill(y.begin(), y.end(), T(0));
    interpolate_rows(yp, xs + piece[n] * S, mid + n, 1, S, U, y.data());
    int64_t* sn = sel + n * Hw;
    T* mn = on + n * Hw;
    if (pool == 0) {
      for (int64_t u = 0; u < U; ++u) {
        sn[u] = u;
        mn[u] = static_cast<T>(y[u] > 0);
      }
    } else {
      pool_winners(y.data(), shape[1], shape[2], shape[3], pool, sn, mn);
    }
    for (int64_t s = 0; s < S; ++s) {
      const T* ys_s = yp + s * U;
      T* h = hs + (n * S + s) * Hw;
      for (int64_t w = 0; w < Hw; ++w) h[w] = ys_s[sn[w]] * mn[w];
    }
  }
}

/// Which units pass on at each sub-piece's midpoint, from its piece's
/// samples ys[piece[n]] [S, U] at local xs[piece[n]] [S] interpolated at
/// the midpoint's local x mid[n], for a site of shape `shape` (rows first)
/// followed by a max-pool of `pool` (0: none); with h's samples. One pass
/// per sub-piece, reading the piece's samples in place.
Selection selection(const torch::Tensor& ys, const torch::Tensor& xs, const torch::Tensor& piece,
                    const torch::Tensor& mid, const std::vector<int64_t>& shape, int64_t pool) {
  const int64_t N = piece.size(0), S = ys.size(1), U = ys.size(2);
  PK_ASSERT(pool == 0 || shape.size() == 4);
  const int64_t Hw = pool == 0 ? U : shape[1] * (shape[2] / pool) * (shape[3] / pool);
  const torch::Tensor yc = ys.contiguous(), xc = xs.contiguous(), pc = piece.contiguous(), mc = mid.contiguous();
  Selection out{torch::empty({N, Hw}, torch::kLong), torch::empty({N, Hw}, ys.options()),
                torch::empty({N, S, Hw}, ys.options())};
  AT_DISPATCH_FLOATING_TYPES(ys.scalar_type(), "selection", [&] {
    select_rows<scalar_t>(yc.data_ptr<scalar_t>(), xc.data_ptr<scalar_t>(), pc.data_ptr<int64_t>(),
                          mc.data_ptr<scalar_t>(), N, S, U, Hw, shape, pool, out.sel.data_ptr<int64_t>(),
                          out.mask.data_ptr<scalar_t>(), out.hs.data_ptr<scalar_t>());
  });
  return out;
}

/// One sub-piece [c, d] of a piece [a, b] whose samples are at local xs
/// [S] (the first m the nodes), with the logits of its selection at the
/// samples: z(t) = Σ_s L_s(t) (z0_s + t z1_s) + b0 + t db.
struct SubPiece {
  int64_t S = 0, m = 0, K = 0;
  double a = 0, b = 0, c = 0, d = 0;
  const double* xs = nullptr;
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

/// A sub-piece's sums by kGaussPoints-node Gauss–Legendre on `parts` equal
/// sub-intervals (the integrals of p only with `softmax`).
void sub_piece_sums(const SubPiece& sp, int64_t parts, bool softmax, SubPieceSums& out) {
  const QuadratureRule& unit = gauss_legendre(kGaussPoints, 0.0, 1.0);
  const int64_t S = sp.S, m = sp.m, K = sp.K;
  std::vector<double> ls(S), lj(m), z(K), p(K);
  out.clear();
  const double len = (sp.d - sp.c) / static_cast<double>(parts);
  for (int64_t part = 0; part < parts; ++part) {
    for (size_t g = 0; g < unit.nodes.size(); ++g) {
      const double t = sp.c + len * (static_cast<double>(part) + unit.nodes[g]);
      const double w = len * unit.weights[g];
      const double x = (2 * t - sp.a - sp.b) / (sp.b - sp.a);
      for (int64_t s = 0; s < S; ++s) {  // L_s on all samples, ℓ_j on the nodes alone
        const double l = ls[s] = lagrange_basis(sp.xs, S, s, x);
        out.q[s] += w * l;
      }
      for (int64_t j = 0; j < m; ++j) {
        const double l = lj[j] = lagrange_basis(sp.xs, m, j, x);
        out.c0[j] += w * l;
        out.c1[j] += w * t * l;
      }
      if (!softmax) continue;
      double top = -std::numeric_limits<double>::infinity(), total = 0;
      for (int64_t k = 0; k < K; ++k) {
        double v = sp.b0[k] + t * sp.db[k];
        for (int64_t s = 0; s < S; ++s) v += ls[s] * (sp.z0[s * K + k] + t * sp.z1[s * K + k]);
        z[k] = v;
        top = std::max(top, v);
      }
      for (int64_t k = 0; k < K; ++k) total += p[k] = std::exp(z[k] - top);
      for (int64_t k = 0; k < K; ++k) {
        const double wp = w * p[k] / total;
        for (int64_t s = 0; s < S; ++s) out.pq[k * S + s] += wp * ls[s];
        for (int64_t j = 0; j < m; ++j) {
          out.p0[j * K + k] += wp * lj[j];
          out.p1[j * K + k] += wp * t * lj[j];
        }
      }
    }
  }
}

/// A sub-piece's sums, refined until two successive levels agree to
/// rounding (the integrals of p; the others are exact at once): until the
/// change is within 64 ε of its length, or, from the third halving on, no
/// longer halves (rounding), or after kMaxHalvings.
void converged_sums(const SubPiece& sp, bool softmax, SubPieceSums& out, SubPieceSums& finer) {
  sub_piece_sums(sp, 1, softmax, out);
  if (!softmax) return;
  double last = std::numeric_limits<double>::infinity();
  for (int h = 1; h <= kMaxHalvings; ++h) {
    sub_piece_sums(sp, int64_t{1} << h, softmax, finer);
    double change = 0;
    for (auto [a, b] : {std::make_pair(&finer.pq, &out.pq), std::make_pair(&finer.p0, &out.p0),
                        std::make_pair(&finer.p1, &out.p1)}) {
      for (size_t i = 0; i < a->size(); ++i) change = std::max(change, std::abs((*a)[i] - (*b)[i]));
    }
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
    sp.S = S;
    sp.m = m;
    sp.K = K;
    sp.a = a[n];
    sp.b = b[n];
    sp.c = c[n];
    sp.d = d[n];
    sp.xs = xc.data_ptr<double>() + n * S;
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
                   int64_t N, int64_t m, int64_t Hw, int64_t R, int64_t U, T* fields) {
  T *e0 = fields, *e1 = e0 + R * U, *e2 = e1 + R * U;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < m; ++j) {
      const int64_t nj = n * m + j, base = row[nj] * U;
      for (int64_t w = 0; w < Hw; ++w) {
        if (on[n * Hw + w] == 0) continue;  // adds nothing
        const int64_t at = base + unit[n * Hw + w];
        e0[at] += c0[nj];
        e1[at] += c1[nj];
        if (pw != nullptr) e2[at] += pw[nj * Hw + w];
      }
    }
  }
}

/// Adds each sub-piece's node sums to the fields [3, R, U] on the units
/// that pass on: node row rows[n, j] (rows [N, m]), unit sel[n, w] where
/// mask[n, w] is 1, takes c0[n, j], c1[n, j] and, with the logits' moments,
/// pw[n, j, w] (each field's entries added in the order of (n, j, w)).
void add_node_fields(const torch::Tensor& rows, const torch::Tensor& sel, const torch::Tensor& mask,
                     const torch::Tensor& c0, const torch::Tensor& c1, const torch::Tensor& pw, torch::Tensor& fields) {
  PK_ASSERT(fields.is_contiguous());
  const torch::Tensor rc = rows.contiguous(), sc = sel.contiguous(), mc = mask.contiguous();
  const torch::Tensor a = c0.contiguous(), b = c1.contiguous(), p = pw.defined() ? pw.contiguous() : pw;
  AT_DISPATCH_FLOATING_TYPES(fields.scalar_type(), "add_node_fields", [&] {
    add_node_rows<scalar_t>(rc.data_ptr<int64_t>(), sc.data_ptr<int64_t>(), mc.data_ptr<scalar_t>(),
                            a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(),
                            p.defined() ? p.data_ptr<scalar_t>() : nullptr, rc.size(0), rc.size(1), sc.size(1),
                            fields.size(1), fields.size(2), fields.data_ptr<scalar_t>());
  });
}

}  // namespace

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

std::pair<torch::Tensor, torch::Tensor> piece_cotangent_sums(const LastSiteTerms& terms, const PieceRound& rd,
                                                             const torch::Tensor& t, const std::vector<int64_t>& shape) {
  const torch::Tensor e = terms.fields.contiguous(), tc = t.contiguous();
  const int64_t R = e.size(1), U = e.size(2), np = rd.np;
  PK_ASSERT(static_cast<int64_t>(rd.piece_of.size()) == R && tc.numel() == R);
  torch::Tensor sum = torch::zeros({3, np, U}, e.options()), tsum = torch::zeros({3, np, U}, e.options());
  AT_DISPATCH_FLOATING_TYPES(e.scalar_type(), "piece_cotangent_sums", [&] {
    const scalar_t* ep = e.data_ptr<scalar_t>();
    const scalar_t* tp = tc.data_ptr<scalar_t>();
    scalar_t *sp = sum.data_ptr<scalar_t>(), *tsp = tsum.data_ptr<scalar_t>();
    for (int64_t f = 0; f < 3; ++f) {
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
  return {cotangents_of(sum, terms.w0u, terms.dwu, shape), cotangents_of(tsum, terms.w0u, terms.dwu, shape)};
}

LastSiteTerms last_site_terms(const SegmentEvaluator& ev, const PieceRound& rd, const torch::Tensor& node_y,
                              const torch::Tensor& end_y, bool softmax) {
  const size_t fin = ev.param_layers().size() - 1, site = fin - 1;
  // A logits' layer without a bias: zero biases (adding 0 changes no value).
  auto bias_of = [&](const torch::Tensor& v) {
    return ev.param_layers()[fin].bias_numel > 0 ? ev.bias_of(v, fin)
                                                 : torch::zeros({ev.num_outputs()}, torch::kFloat64);
  };
  Logits lg{ev.weight_of(ev.start(), fin), ev.weight_of(ev.direction(), fin), bias_of(ev.start()),
            bias_of(ev.direction())};
  const int64_t K = lg.w0.size(0), Hw = lg.w0.size(1), R = rd.rows, np = rd.np;
  const torch::Tensor ny = node_y.flatten(1), ey = end_y.flatten(1);  // [R, U], [2 np, U]
  const int64_t U = ny.size(1);
  const torch::TensorOptions opts = ny.options();
  const int64_t pool = ev.pool_after()[site];
  const std::vector<int64_t> shape = node_y.sizes().vec();
  // Node row r's cotangent on unit u (window w(u)) for output k is
  // W0[k, w(u)] e0[r, u] + dW[k, w(u)] e1[r, u] − e2[r, u]: the sums over the
  // piece's sub-pieces n (where u passes on) of ∫ ℓ_j, ∫ t ℓ_j and
  // ∫ ℓ_j pᵀ W(t)[:, w(u)].
  const torch::Tensor w_of_u = window_of_unit(shape, pool);  // [U]
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
  // Pieces by their node count (all alike but for short pieces).
  std::map<int64_t, std::vector<int64_t>> by_nodes;
  for (int64_t p = 0; p < np; ++p) {
    by_nodes[rd.first[p + 1] - rd.first[p]].push_back(p);
    len[static_cast<size_t>(p)] = rd.ends[2 * p + 1] - rd.ends[2 * p];
  }
  out.len = torch::tensor(len, opts);
  for (const auto& [m, pieces] : by_nodes) {
    const int64_t ng = static_cast<int64_t>(pieces.size()), S = m + 2;
    // Each piece's samples of y, nodes then ends, at local x ∈ [−1, 1].
    std::vector<int64_t> node_rows, end_rows;
    std::vector<double> xs, pa, pb;
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
      pa.push_back(a);
      pb.push_back(b);
    }
    const torch::Tensor ys = torch::cat({ny.index_select(0, torch::tensor(node_rows, torch::kLong)).view({ng, m, U}),
                                         ey.index_select(0, torch::tensor(end_rows, torch::kLong)).view({ng, 2, U})},
                                        1);  // [ng, S, U]
    const torch::Tensor xs_t = torch::tensor(xs, opts).view({ng, S});
    const torch::Tensor rows_t = torch::tensor(node_rows, torch::kLong).view({ng, m});
    const torch::Tensor pieces_t = torch::tensor(pieces, torch::kLong);
    const SubPieces sp = sub_pieces(rd, pieces, ys, xs_t, degree, shape, pool, out);
    const int64_t N = static_cast<int64_t>(sp.piece.size());
    const int64_t chunk = std::max<int64_t>(1, kChunkDoubles / (S * U));
    const torch::Tensor sub_t = torch::tensor(sp.piece, torch::kLong);
    std::vector<double> sa, sb;  // each sub-piece's piece's ends
    for (int64_t g : sp.piece) {
      sa.push_back(pa[static_cast<size_t>(g)]);
      sb.push_back(pb[static_cast<size_t>(g)]);
    }
    for (int64_t n0 = 0; n0 < N; n0 += chunk) {
      const int64_t nc = std::min(chunk, N - n0);
      const torch::Tensor g = sub_t.narrow(0, n0, nc), xg = xs_t.index_select(0, g);
      auto part = [&](const std::vector<double>& v) {
        return std::vector<double>(v.begin() + n0, v.begin() + n0 + nc);
      };
      const std::vector<double> a = part(sa), b = part(sb), c = part(sp.c), d = part(sp.d);
      std::vector<double> mid(static_cast<size_t>(nc));
      for (int64_t n = 0; n < nc; ++n) mid[n] = (c[n] + d[n] - a[n] - b[n]) / (b[n] - a[n]);
      const auto [sel, mask, hs] = selection(ys, xs_t, g, torch::tensor(mid, opts), shape, pool);  // hs [nc, S, Hw]
      PK_ASSERT(sel.size(1) == Hw);
      const Sums s = sums_of(a, b, c, d, xg, torch::matmul(hs, lg.w0.t()), torch::matmul(hs, lg.dw.t()), lg, m,
                             softmax);
      // The logits' layer, per piece.
      const torch::Tensor piece = pieces_t.index_select(0, g);
      out.h_sum.index_add_(0, piece, torch::bmm(s.q.unsqueeze(1), hs).squeeze(1));
      torch::Tensor pw;  // [nc, m, Hw]
      if (softmax) {
        out.ph_sum.index_add_(0, piece, torch::bmm(s.pq, hs));
        out.p_sum.index_add_(0, piece, s.pq.sum(2));
        pw = torch::matmul(s.p0, lg.w0) + torch::matmul(s.p1, lg.dw);
      }
      // The nodes' sums on the units that pass on: node row r, unit sel[n, w].
      add_node_fields(rows_t.index_select(0, g), sel, mask, s.c0, s.c1, pw, fields);
    }
  }
  out.w0u = lg.w0.index_select(1, w_of_u);
  out.dwu = lg.dw.index_select(1, w_of_u);
  out.fields = fields;
  return out;
}

}  // namespace pathkernel
