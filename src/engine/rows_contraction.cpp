#include "rows_contraction.h"

#include <atomic>

#include <ATen/Parallel.h>

#include "pathkernel/error.h"

namespace pathkernel {

namespace {

constexpr int kByCost = 0, kByRows = 1, kDense = 2;
std::atomic<int> forced{kByCost};

double d(int64_t v) { return static_cast<double>(v); }

}  // namespace

double dense_block_cost(const RowsLayerSizes& s) {
  return d(s.K) * d(s.out) * (d(s.cols) * (d(s.R) + d(s.n) * d(s.B)) + d(s.n) * d(s.B) * d(s.Kp));
}

double by_rows_cost(const RowsLayerSizes& s) {
  return d(s.R) * d(s.B) * (d(s.in) + d(s.K) * d(s.Kp) * (d(s.out) + 2));
}

bool take_dense_block(const RowsLayerSizes& s) {
  const int how = forced.load();
  if (how != kByCost) return how == kDense;
  return dense_block_cost(s) < by_rows_cost(s);
}

torch::Tensor rows_point_sums(const torch::Tensor& dd, const torch::Tensor& a, const torch::Tensor& weight,
                              const torch::Tensor& point, int64_t n) {
  PK_CHECK(dd.dim() == 4 && a.dim() == 2 && weight.dim() == 1 && point.dim() == 1,
           "rows_point_sums: expected dd [K, R, K', B], a [R, B], weight [R] and point [R], got "
               << dd.sizes() << ", " << a.sizes() << ", " << weight.sizes() << " and " << point.sizes());
  const int64_t K = dd.size(0), R = dd.size(1), Kp = dd.size(2), B = dd.size(3);
  PK_CHECK(a.size(0) == R && a.size(1) == B && weight.size(0) == R && point.size(0) == R,
           "rows_point_sums: a " << a.sizes() << ", weight " << weight.sizes() << " and point " << point.sizes()
                                 << " do not match dd " << dd.sizes());
  const torch::Tensor ddc = dd.to(torch::kFloat64).contiguous(), ac = a.to(torch::kFloat64).contiguous();
  const torch::Tensor wc = weight.to(torch::kFloat64).contiguous(), pc = point.to(torch::kLong).contiguous();
  const int64_t* to = pc.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r) {
    PK_CHECK(to[r] >= 0 && to[r] < n, "rows_point_sums: row " << r << " belongs to point " << to[r]
                                                              << ", outside the " << n << " test points");
  }
  torch::Tensor out = torch::zeros({K, n, Kp, B}, ddc.options());
  const double* in = ddc.data_ptr<double>();
  const double* ap = ac.data_ptr<double>();
  const double* wp = wc.data_ptr<double>();
  double* op = out.data_ptr<double>();
  const int64_t row = Kp * B;  // one (k, r) slice of dd, one (k, p) slice of out
  at::parallel_for(0, K, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      for (int64_t r = 0; r < R; ++r) {
        const double* src = in + (k * R + r) * row;
        double* dst = op + (k * n + to[r]) * row;
        const double* ar = ap + r * B;
        const double w = wp[r];
        for (int64_t j = 0; j < Kp; ++j) {
          for (int64_t b = 0; b < B; ++b) {
            double t = src[j * B + b] * ar[b];
            t = t * w;
            dst[j * B + b] += t;
          }
        }
      }
    }
  });
  return out;
}

RowsContractionScope::RowsContractionScope(bool dense) : previous_(forced.exchange(dense ? kDense : kByRows)) {}

RowsContractionScope::~RowsContractionScope() { forced.store(previous_); }

}  // namespace pathkernel
