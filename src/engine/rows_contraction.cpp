#include "rows_contraction.h"

#include <atomic>

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

RowsContractionScope::RowsContractionScope(bool dense) : previous_(forced.exchange(dense ? kDense : kByRows)) {}

RowsContractionScope::~RowsContractionScope() { forced.store(previous_); }

}  // namespace pathkernel
