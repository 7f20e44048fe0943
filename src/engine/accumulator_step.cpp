#include "accumulator_step.h"

#include <algorithm>
#include <cmath>

#include <ATen/Parallel.h>

#include "pathkernel/error.h"

namespace pathkernel {

namespace {

/// The metrics a step takes: P_s and the buffer's Q_s, each null for the identity.
struct Metrics {
  const double* update = nullptr;
  const double* buffer = nullptr;
};

/// The step over elements [p0, p1) of one row (the metrics and acc given
/// where kMetric, kBufferMetric and kBuffer say).
template <bool kMetric, bool kBuffer, bool kBufferMetric = false>
__attribute__((always_inline)) inline void step_row(double* a, double* acc, Metrics m, int64_t p0, int64_t p1,
                                                    const AccumulatorScalars& c) {
  for (int64_t p = p0; p < p1; ++p) {
    double j = a[p];
    if constexpr (kMetric) j = j * m.update[p];
    if constexpr (kBuffer) {
      const double s = std::fma(c.kappa, j, c.beta * acc[p]);
      acc[p] = s;
      if constexpr (kBufferMetric) {
        a[p] = std::fma(c.gamma, s * m.buffer[p], c.alpha * j);
      } else {
        a[p] = std::fma(c.gamma, s, c.alpha * j);
      }
    } else {
      a[p] = c.alpha * j;
    }
  }
}

/// The step over elements [i0, i1) of the flattened [n·K·P] blocks
/// (metric read at i mod P). Inlined into both loops below.
__attribute__((always_inline)) inline void step_elements(double* a, double* acc, Metrics m, int64_t P, int64_t i0,
                                                        int64_t i1, const AccumulatorScalars& c) {
  for (int64_t row = i0 / P; row * P < i1; ++row) {
    const int64_t p0 = std::max(i0, row * P) - row * P, p1 = std::min(i1, (row + 1) * P) - row * P;
    double* ar = a + row * P;
    double* accr = acc ? acc + row * P : nullptr;
    if (accr && m.buffer && m.update) step_row<true, true, true>(ar, accr, m, p0, p1, c);
    else if (accr && m.buffer) step_row<false, true, true>(ar, accr, m, p0, p1, c);
    else if (accr && m.update) step_row<true, true>(ar, accr, m, p0, p1, c);
    else if (accr) step_row<false, true>(ar, accr, m, p0, p1, c);
    else if (m.update) step_row<true, false>(ar, accr, m, p0, p1, c);
    else step_row<false, false>(ar, accr, m, p0, p1, c);
  }
}

/// Compiled with FMA instructions: std::fma inline, vectorised.
__attribute__((target("avx2,fma"))) void step_fma(double* a, double* acc, Metrics m, int64_t P, int64_t i0,
                                                   int64_t i1, const AccumulatorScalars& c) {
  step_elements(a, acc, m, P, i0, i1, c);
}

/// Elsewhere: the C library's fma, which rounds once too (the same bits).
void step_portable(double* a, double* acc, Metrics m, int64_t P, int64_t i0, int64_t i1,
                   const AccumulatorScalars& c) {
  step_elements(a, acc, m, P, i0, i1, c);
}

/// A metric as a contiguous float64 vector of the P parameters (undefined stays so).
torch::Tensor checked_metric(const torch::Tensor& metric, int64_t P, const char* what) {
  PK_CHECK(!metric.defined() || (metric.dim() == 1 && metric.size(0) == P && metric.scalar_type() == torch::kFloat64),
           "accumulator_step: the " << what << " " << metric.sizes() << " is not a float64 vector of the " << P
                                    << " parameters");
  return metric.defined() ? metric.contiguous() : metric;
}

bool has_fma() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

}  // namespace

torch::Tensor accumulator_step(torch::Tensor jp, const torch::Tensor& metric, const torch::Tensor& acc,
                               const AccumulatorScalars& c, const torch::Tensor& buffer_metric) {
  PK_CHECK(jp.dim() == 3 && jp.scalar_type() == torch::kFloat64 && jp.is_contiguous(),
           "accumulator_step: expected contiguous float64 features [n, K, P], got " << jp.sizes() << " of "
                                                                                     << jp.scalar_type());
  const int64_t P = jp.size(2);
  PK_CHECK(!acc.defined() || (acc.sizes() == jp.sizes() && acc.scalar_type() == torch::kFloat64 && acc.is_contiguous()),
           "accumulator_step: the accumulator " << acc.sizes() << " does not match the features " << jp.sizes()
                                                << " (contiguous float64 expected)");
  PK_CHECK(!buffer_metric.defined() || acc.defined(), "accumulator_step: a buffer metric without an accumulator");
  const torch::Tensor m = checked_metric(metric, P, "metric");
  const torch::Tensor q = checked_metric(buffer_metric, P, "buffer metric");
  double* a = jp.data_ptr<double>();
  double* s = acc.defined() ? acc.data_ptr<double>() : nullptr;
  const Metrics metrics{m.defined() ? m.data_ptr<double>() : nullptr, q.defined() ? q.data_ptr<double>() : nullptr};
  const auto step = has_fma() ? step_fma : step_portable;
  at::parallel_for(0, jp.numel(), 1 << 15, [&](int64_t i0, int64_t i1) { step(a, s, metrics, P, i0, i1, c); });
  return jp;
}

}  // namespace pathkernel
