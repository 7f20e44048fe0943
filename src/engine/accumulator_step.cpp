#include "accumulator_step.h"

#include <algorithm>
#include <cmath>

#include <ATen/Parallel.h>

#include "pathkernel/error.h"

namespace pathkernel {

namespace {

/// The step over elements [i0, i1) of the flattened [n·K·P] blocks
/// (metric read at i mod P). Inlined into both loops below.
__attribute__((always_inline)) inline void step_elements(double* a, double* acc, const double* metric, int64_t P,
                                                        int64_t i0, int64_t i1, const AccumulatorScalars& c) {
  for (int64_t row = i0 / P; row * P < i1; ++row) {
    const int64_t b = std::max(i0, row * P), e = std::min(i1, (row + 1) * P);
    double* ar = a + row * P;
    double* accr = acc ? acc + row * P : nullptr;
    const int64_t p0 = b - row * P, p1 = e - row * P;
    if (metric && accr) {
      for (int64_t p = p0; p < p1; ++p) {
        const double j = ar[p] * metric[p];
        const double s = std::fma(c.kappa, j, c.beta * accr[p]);
        accr[p] = s;
        ar[p] = std::fma(c.gamma, s, c.alpha * j);
      }
    } else if (accr) {
      for (int64_t p = p0; p < p1; ++p) {
        const double j = ar[p];
        const double s = std::fma(c.kappa, j, c.beta * accr[p]);
        accr[p] = s;
        ar[p] = std::fma(c.gamma, s, c.alpha * j);
      }
    } else if (metric) {
      for (int64_t p = p0; p < p1; ++p) ar[p] = c.alpha * (ar[p] * metric[p]);
    } else {
      for (int64_t p = p0; p < p1; ++p) ar[p] = c.alpha * ar[p];
    }
  }
}

/// Compiled with FMA instructions: std::fma inline, vectorised.
__attribute__((target("avx2,fma"))) void step_fma(double* a, double* acc, const double* metric, int64_t P,
                                                   int64_t i0, int64_t i1, const AccumulatorScalars& c) {
  step_elements(a, acc, metric, P, i0, i1, c);
}

/// Elsewhere: the C library's fma, which rounds once too (the same bits).
void step_portable(double* a, double* acc, const double* metric, int64_t P, int64_t i0, int64_t i1,
                   const AccumulatorScalars& c) {
  step_elements(a, acc, metric, P, i0, i1, c);
}

bool has_fma() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

}  // namespace

torch::Tensor accumulator_step(torch::Tensor jp, const torch::Tensor& metric, const torch::Tensor& acc,
                               const AccumulatorScalars& c) {
  PK_CHECK(jp.dim() == 3 && jp.scalar_type() == torch::kFloat64 && jp.is_contiguous(),
           "accumulator_step: expected contiguous float64 features [n, K, P], got " << jp.sizes() << " of "
                                                                                     << jp.scalar_type());
  const int64_t P = jp.size(2);
  PK_CHECK(!acc.defined() || (acc.sizes() == jp.sizes() && acc.scalar_type() == torch::kFloat64 && acc.is_contiguous()),
           "accumulator_step: the accumulator " << acc.sizes() << " does not match the features " << jp.sizes()
                                                << " (contiguous float64 expected)");
  PK_CHECK(!metric.defined() || (metric.dim() == 1 && metric.size(0) == P && metric.scalar_type() == torch::kFloat64),
           "accumulator_step: the metric " << metric.sizes() << " is not a float64 vector of the " << P
                                           << " parameters");
  const torch::Tensor m = metric.defined() ? metric.contiguous() : metric;
  double* a = jp.data_ptr<double>();
  double* s = acc.defined() ? acc.data_ptr<double>() : nullptr;
  const double* mp = m.defined() ? m.data_ptr<double>() : nullptr;
  const auto step = has_fma() ? step_fma : step_portable;
  at::parallel_for(0, jp.numel(), 1 << 15, [&](int64_t i0, int64_t i1) { step(a, s, mp, P, i0, i1, c); });
  return jp;
}

}  // namespace pathkernel
