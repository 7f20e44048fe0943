// Max-pooling of non-overlapping windows and its gradient (max_pool.h).
#include "pathkernel/max_pool.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "pathkernel/error.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace pathkernel {
namespace {

/// Whether v takes a window's maximum from top: LibTorch's rule, the first
/// maximum in row-major order, a NaN taking any number's place (and a later
/// NaN an earlier one's).
template <typename T>
bool takes(T v, T top) {
  return v > top || std::isnan(v);
}

/// The unsigned integer of T's width, for selecting by masks.
template <typename T>
using BitsOf = std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>;

/// (r, ir) where r takes a window's maximum from l (`takes`), else (l, il):
/// selected by masks, without a branch. A branch on which of a window's
/// values is largest is taken at random on real activations, and its
/// mispredictions made the 2 × 2 pool 1.6 (float64) to 4 (float32) times
/// slower.
template <typename T>
void pick(T l, int64_t il, T r, int64_t ir, T& out, int64_t& index) {
  using U = BitsOf<T>;
  const bool take = (r > l) | (r != r);  // `takes`, both sides evaluated
  const U m = U(0) - U(take);
  U lb, rb;
  std::memcpy(&lb, &l, sizeof l);
  std::memcpy(&rb, &r, sizeof r);
  const U ob = (rb & m) | (lb & ~m);
  std::memcpy(&out, &ob, sizeof out);
  const uint64_t mi = uint64_t(0) - uint64_t(take);
  index = static_cast<int64_t>((static_cast<uint64_t>(ir) & mi) | (static_cast<uint64_t>(il) & ~mi));
}

#if defined(__SSE2__)
/// SSE2's lanes of `takes` and `pick`: all ones where r takes l's place
/// (r > l, or r a NaN), and the selection by such a mask.
inline __m128d takes_lanes(__m128d r, __m128d l) { return _mm_or_pd(_mm_cmpgt_pd(r, l), _mm_cmpunord_pd(r, r)); }
inline __m128 takes_lanes(__m128 r, __m128 l) { return _mm_or_ps(_mm_cmpgt_ps(r, l), _mm_cmpunord_ps(r, r)); }
inline __m128d select_lanes(__m128d m, __m128d r, __m128d l) {
  return _mm_or_pd(_mm_and_pd(m, r), _mm_andnot_pd(m, l));
}
inline __m128 select_lanes(__m128 m, __m128 r, __m128 l) { return _mm_or_ps(_mm_and_ps(m, r), _mm_andnot_ps(m, l)); }
inline __m128i select_lanes(__m128i m, __m128i r, __m128i l) {
  return _mm_or_si128(_mm_and_si128(m, r), _mm_andnot_si128(m, l));
}

/// The argmax in the plane of windows j and j + 1 of the row at r0, from
/// 64-bit masks of their three picks (top pair, bottom pair, bottom over
/// top): r0 + 2j + (bottom ? W + the bottom's pick : the top's pick).
inline __m128i window_argmax(__m128i top, __m128i bottom, __m128i below, int64_t r0, int64_t W, int64_t j) {
  const __m128i one = _mm_set1_epi64x(1);
  const __m128i base = _mm_set_epi64x(r0 + 2 * j + 2, r0 + 2 * j);
  const __m128i from_bottom = _mm_add_epi64(_mm_set1_epi64x(W), _mm_and_si128(bottom, one));
  return _mm_add_epi64(base, select_lanes(below, from_bottom, _mm_and_si128(top, one)));
}

/// Windows 0, 1, ... of one row of 2 × 2 windows (a and c its plane's two
/// rows, r0 the first's offset in the plane) by SSE2, two float64 windows at
/// a time, each lane the three picks of pool_planes_2 in its order (the
/// same values and indices). Returns the windows done; the caller pools the
/// rest.
int64_t pool_row_lanes(const double* a, const double* c, int64_t r0, int64_t W, int64_t Wp, double* o, int64_t* ix) {
  int64_t j = 0;
  for (; j + 2 <= Wp; j += 2) {
    const __m128d a01 = _mm_loadu_pd(a + 2 * j), a23 = _mm_loadu_pd(a + 2 * j + 2);
    const __m128d c01 = _mm_loadu_pd(c + 2 * j), c23 = _mm_loadu_pd(c + 2 * j + 2);
    const __m128d ae = _mm_unpacklo_pd(a01, a23), ao = _mm_unpackhi_pd(a01, a23);
    const __m128d ce = _mm_unpacklo_pd(c01, c23), co = _mm_unpackhi_pd(c01, c23);
    const __m128d mt = takes_lanes(ao, ae), mb = takes_lanes(co, ce);
    const __m128d top = select_lanes(mt, ao, ae), bottom = select_lanes(mb, co, ce);
    const __m128d below = takes_lanes(bottom, top);
    _mm_storeu_pd(o + j, select_lanes(below, bottom, top));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(ix + j),
                     window_argmax(_mm_castpd_si128(mt), _mm_castpd_si128(mb), _mm_castpd_si128(below), r0, W, j));
  }
  return j;
}

/// The same for float32, four windows at a time (their 32-bit masks widened
/// to 64 bits for the indices, two windows at a time).
int64_t pool_row_lanes(const float* a, const float* c, int64_t r0, int64_t W, int64_t Wp, float* o, int64_t* ix) {
  int64_t j = 0;
  for (; j + 4 <= Wp; j += 4) {
    const __m128 a0 = _mm_loadu_ps(a + 2 * j), a1 = _mm_loadu_ps(a + 2 * j + 4);
    const __m128 c0 = _mm_loadu_ps(c + 2 * j), c1 = _mm_loadu_ps(c + 2 * j + 4);
    const __m128 ae = _mm_shuffle_ps(a0, a1, _MM_SHUFFLE(2, 0, 2, 0)),
                 ao = _mm_shuffle_ps(a0, a1, _MM_SHUFFLE(3, 1, 3, 1));
    const __m128 ce = _mm_shuffle_ps(c0, c1, _MM_SHUFFLE(2, 0, 2, 0)),
                 co = _mm_shuffle_ps(c0, c1, _MM_SHUFFLE(3, 1, 3, 1));
    const __m128 mt = takes_lanes(ao, ae), mb = takes_lanes(co, ce);
    const __m128 top = select_lanes(mt, ao, ae), bottom = select_lanes(mb, co, ce);
    const __m128 below = takes_lanes(bottom, top);
    _mm_storeu_ps(o + j, select_lanes(below, bottom, top));
    const __m128i t = _mm_castps_si128(mt), b = _mm_castps_si128(mb), m = _mm_castps_si128(below);
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(ix + j),
        window_argmax(_mm_unpacklo_epi32(t, t), _mm_unpacklo_epi32(b, b), _mm_unpacklo_epi32(m, m), r0, W, j));
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(ix + j + 2),
        window_argmax(_mm_unpackhi_epi32(t, t), _mm_unpackhi_epi32(b, b), _mm_unpackhi_epi32(m, m), r0, W, j + 2));
  }
  return j;
}
#else
template <typename T>
int64_t pool_row_lanes(const T*, const T*, int64_t, int64_t, int64_t, T*, int64_t*) {
  return 0;
}
#endif

/// pool_planes for 2 × 2 windows, the pools of the networks pathkernel
/// meets most: each row's pairs first, then the two rows' winners (the
/// rule of `takes` picks the same value and index in that order as in
/// row-major order: the last NaN, else the first maximum). The windows go
/// by SSE2's lanes where the machine has them (pool_row_lanes: about 5
/// times as fast on a batch of 128 images of 16 × 28 × 28), the rest one at
/// a time.
template <typename T>
void pool_planes_2(const T* x, int64_t p0, int64_t p1, int64_t H, int64_t W, T* out, int64_t* index) {
  const int64_t Hp = H / 2, Wp = W / 2;
  for (int64_t p = p0; p < p1; ++p) {
    const T* xp = x + p * H * W;
    T* op = out + p * Hp * Wp;
    int64_t* ip = index + p * Hp * Wp;
    for (int64_t i = 0; i < Hp; ++i) {
      const int64_t r0 = 2 * i * W, r1 = r0 + W;
      const T *a = xp + r0, *c = xp + r1;
      T* o = op + i * Wp;
      int64_t* ix = ip + i * Wp;
      for (int64_t j = pool_row_lanes(a, c, r0, W, Wp, o, ix); j < Wp; ++j) {
        T top, bottom;
        int64_t it, ib;
        pick(a[2 * j], r0 + 2 * j, a[2 * j + 1], r0 + 2 * j + 1, top, it);
        pick(c[2 * j], r1 + 2 * j, c[2 * j + 1], r1 + 2 * j + 1, bottom, ib);
        pick(top, it, bottom, ib, o[j], ix[j]);
      }
    }
  }
}

/// Planes p0 .. p1 of x (each H × W) pooled by k × k windows into out and
/// index (each Hp × Wp), by the rule of `takes`.
template <typename T>
void pool_planes(const T* x, int64_t p0, int64_t p1, int64_t H, int64_t W, int64_t k, T* out, int64_t* index) {
  if (k == 2) return pool_planes_2(x, p0, p1, H, W, out, index);
  const int64_t Hp = H / k, Wp = W / k;
  for (int64_t p = p0; p < p1; ++p) {
    const T* xp = x + p * H * W;
    T* op = out + p * Hp * Wp;
    int64_t* ip = index + p * Hp * Wp;
    for (int64_t i = 0; i < Hp; ++i) {
      for (int64_t j = 0; j < Wp; ++j) {
        int64_t best = i * k * W + j * k;
        T top = -std::numeric_limits<T>::infinity();
        for (int64_t di = 0; di < k; ++di) {
          const int64_t row = (i * k + di) * W + j * k;
          for (int64_t dj = 0; dj < k; ++dj) {
            const T v = xp[row + dj];
            const bool take = takes(v, top);
            top = take ? v : top;
            best = take ? row + dj : best;
          }
        }
        op[i * Wp + j] = top;
        ip[i * Wp + j] = best;
      }
    }
  }
}

/// A window's gradient: g, or g times (its pooled value > 0) where `pooled`
/// is given. The product keeps a masked gradient's sign of zero (and a NaN).
template <typename T>
T passed(const T* g, const T* pooled, int64_t w) {
  return pooled ? g[w] * static_cast<T>(pooled[w] > 0) : g[w];
}

#if defined(__SSE2__)
/// One row of 2 × 2 windows' unpool by SSE2 (a window's two units in a row
/// of the plane are one float64 vector; two windows' are one float32
/// vector): g, index and pooled the row's windows, top and bottom the plane's
/// two rows, r0 the top row's offset in the plane. Each unit is its window's
/// gradient (`passed`) where it is the argmax, else 0 (the argmax's offset
/// in its window, 0, 1, W or W + 1, compared as 32-bit lanes). Returns the
/// windows done.
int64_t unpool_row_lanes(const double* g, const int64_t* index, const double* pooled, int64_t r0, int64_t W, int64_t Wp,
                         double* top, double* bottom) {
  const __m128i top_at = _mm_set_epi32(1, 1, 0, 0);
  const __m128i bottom_at = _mm_set_epi32(static_cast<int32_t>(W + 1), static_cast<int32_t>(W + 1),
                                          static_cast<int32_t>(W), static_cast<int32_t>(W));
  for (int64_t j = 0; j < Wp; ++j) {
    const __m128d v = _mm_set1_pd(passed(g, pooled, j));
    const __m128i at = _mm_set1_epi32(static_cast<int32_t>(index[j] - (r0 + 2 * j)));
    _mm_storeu_pd(top + 2 * j, _mm_and_pd(_mm_castsi128_pd(_mm_cmpeq_epi32(at, top_at)), v));
    _mm_storeu_pd(bottom + 2 * j, _mm_and_pd(_mm_castsi128_pd(_mm_cmpeq_epi32(at, bottom_at)), v));
  }
  return Wp;
}

int64_t unpool_row_lanes(const float* g, const int64_t* index, const float* pooled, int64_t r0, int64_t W, int64_t Wp,
                         float* top, float* bottom) {
  const __m128i top_at = _mm_set_epi32(1, 0, 1, 0);
  const __m128i bottom_at = _mm_set_epi32(static_cast<int32_t>(W + 1), static_cast<int32_t>(W),
                                          static_cast<int32_t>(W + 1), static_cast<int32_t>(W));
  int64_t j = 0;
  for (; j + 2 <= Wp; j += 2) {
    const float v0 = passed(g, pooled, j), v1 = passed(g, pooled, j + 1);
    const __m128 v = _mm_set_ps(v1, v1, v0, v0);
    const int32_t a0 = static_cast<int32_t>(index[j] - (r0 + 2 * j));
    const int32_t a1 = static_cast<int32_t>(index[j + 1] - (r0 + 2 * j + 2));
    const __m128i at = _mm_set_epi32(a1, a1, a0, a0);
    _mm_storeu_ps(top + 2 * j, _mm_and_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(at, top_at)), v));
    _mm_storeu_ps(bottom + 2 * j, _mm_and_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(at, bottom_at)), v));
  }
  return j;
}
#else
template <typename T>
int64_t unpool_row_lanes(const T*, const int64_t*, const T*, int64_t, int64_t, int64_t, T*, T*) {
  return 0;
}
#endif

/// One plane's unpool for 2 × 2 windows: each input unit written once, its
/// window's gradient where it is the argmax and 0 elsewhere (a column or
/// row past the last window 0), rather than the whole plane zeroed first
/// and the argmaxes written after; by SSE2's lanes where the machine has
/// them (unpool_row_lanes: about twice as fast), the rest one at a time.
template <typename T>
void unpool_plane_2(const T* gp, const int64_t* ip, const T* pp, int64_t H, int64_t W, T* dst) {
  const int64_t Hp = H / 2, Wp = W / 2;
  for (int64_t i = 0; i < Hp; ++i) {
    const int64_t r0 = 2 * i * W, r1 = r0 + W, w0 = i * Wp;
    const int64_t done = unpool_row_lanes(gp + w0, ip + w0, pp ? pp + w0 : nullptr, r0, W, Wp, dst + r0, dst + r1);
    for (int64_t j = done; j < Wp; ++j) {
      const int64_t w = w0 + j, at = ip[w];
      const T v = passed(gp, pp, w);
      dst[r0 + 2 * j] = at == r0 + 2 * j ? v : T(0);
      dst[r0 + 2 * j + 1] = at == r0 + 2 * j + 1 ? v : T(0);
      dst[r1 + 2 * j] = at == r1 + 2 * j ? v : T(0);
      dst[r1 + 2 * j + 1] = at == r1 + 2 * j + 1 ? v : T(0);
    }
    if (W % 2) dst[r0 + W - 1] = dst[r1 + W - 1] = T(0);
  }
  if (H % 2) std::fill(dst + (H - 1) * W, dst + H * W, T(0));
}

/// Planes p0 .. p1 of the K outputs' gradients g [K, planes, Hp, Wp] sent to
/// their windows' argmax in out [K, planes, H, W], every other unit 0; a
/// window's gradient as `passed` gives it.
template <typename T>
void unpool_planes(const T* g, const int64_t* index, const T* pooled, int64_t K, int64_t planes, int64_t p0,
                   int64_t p1, int64_t H, int64_t W, int64_t k, T* out) {
  const int64_t Hp = H / k, Wp = W / k;
  for (int64_t o = 0; o < K; ++o) {
    for (int64_t p = p0; p < p1; ++p) {
      const T* gp = g + (o * planes + p) * Hp * Wp;
      const int64_t* ip = index + p * Hp * Wp;
      const T* pp = pooled ? pooled + p * Hp * Wp : nullptr;
      T* dst = out + (o * planes + p) * H * W;
      if (k == 2) {
        unpool_plane_2(gp, ip, pp, H, W, dst);
        continue;
      }
      std::fill(dst, dst + H * W, T(0));
      for (int64_t w = 0; w < Hp * Wp; ++w) dst[ip[w]] = passed(gp, pp, w);
    }
  }
}

/// Planes per task of at::parallel_for: enough that small passes stay on
/// the calling thread.
constexpr int64_t kGrainUnits = 1 << 16;

int64_t grain(int64_t plane_units) { return std::max<int64_t>(1, kGrainUnits / std::max<int64_t>(1, plane_units)); }

}  // namespace

bool pooled_by_hand(const torch::Tensor& x) {
  return (x.scalar_type() == torch::kFloat64 || x.scalar_type() == torch::kFloat32) && x.is_contiguous() &&
         x.device().is_cpu();
}

void pool_windows(const double* x, int64_t C, int64_t H, int64_t W, int64_t k, double* out, int64_t* index) {
  pool_planes(x, 0, C, H, W, k, out, index);
}

void pool_windows(const float* x, int64_t C, int64_t H, int64_t W, int64_t k, float* out, int64_t* index) {
  pool_planes(x, 0, C, H, W, k, out, index);
}

std::tuple<torch::Tensor, torch::Tensor> max_pool_with_indices(const torch::Tensor& x, int64_t k) {
  PK_CHECK(x.dim() == 4 && k >= 1, "max_pool_with_indices: a pooled site is [rows, C, H, W] with a window of 1 or more, got "
                                       << x.sizes() << " and window " << k);
  if (!pooled_by_hand(x) || x.requires_grad() || x.size(2) < k || x.size(3) < k) return torch::max_pool2d_with_indices(x, k);
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), Hp = H / k, Wp = W / k;
  torch::Tensor out = torch::empty({N, C, Hp, Wp}, x.options());
  torch::Tensor index = torch::empty({N, C, Hp, Wp}, x.options().dtype(torch::kLong));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "max_pool_with_indices", [&] {
    const scalar_t* xs = x.data_ptr<scalar_t>();
    scalar_t* os = out.data_ptr<scalar_t>();
    int64_t* is = index.data_ptr<int64_t>();
    at::parallel_for(0, N * C, grain(H * W), [&](int64_t p0, int64_t p1) {
      pool_planes(xs, p0, p1, H, W, k, os, is);
    });
  });
  return {out, index};
}

torch::Tensor max_unpool(const torch::Tensor& g, const torch::Tensor& index, int64_t k, int64_t H, int64_t W,
                         const torch::Tensor& positive) {
  PK_ASSERT(g.dim() == 5 && index.dim() == 4 && g.sizes().slice(1) == index.sizes());
  const int64_t K = g.size(0), N = index.size(0), C = index.size(1), Hp = index.size(2), Wp = index.size(3);
  PK_ASSERT(k >= 1 && H / k == Hp && W / k == Wp);
  const torch::Tensor gc = g.contiguous(), ic = index.contiguous();
  const torch::Tensor pc = positive.defined() ? positive.to(g.scalar_type()).contiguous() : positive;
  if (!pooled_by_hand(gc)) {
    const torch::Tensor gm = pc.defined() ? g * (positive > 0) : g;
    return torch::zeros({K, N, C, H * W}, g.options())
        .scatter_(3, index.flatten(2).unsqueeze(0).expand({K, -1, -1, -1}), gm.flatten(3))
        .view({K, N, C, H, W});
  }
  torch::Tensor out = torch::empty({K, N, C, H, W}, g.options());
  AT_DISPATCH_FLOATING_TYPES(gc.scalar_type(), "max_unpool", [&] {
    const scalar_t* gs = gc.data_ptr<scalar_t>();
    const int64_t* is = ic.data_ptr<int64_t>();
    const scalar_t* ps = pc.defined() ? pc.data_ptr<scalar_t>() : nullptr;
    scalar_t* os = out.data_ptr<scalar_t>();
    at::parallel_for(0, N * C, grain(K * H * W), [&](int64_t p0, int64_t p1) {
      unpool_planes(gs, is, ps, K, N * C, p0, p1, H, W, k, os);
    });
  });
  return out;
}

}  // namespace pathkernel
