#include "add_at_rows.h"

#include <algorithm>

#include <ATen/Parallel.h>

#include "pathkernel/error.h"

namespace pathkernel {

namespace {

/// Whether t's entries past its first two axes are one contiguous run per
/// (first, second) index, one after another along the second axis.
bool rows_contiguous(const torch::Tensor& t) {
  int64_t expected = 1;
  for (int64_t d = t.dim() - 1; d >= 1; --d) {
    if (t.size(d) != 1 && t.stride(d) != expected) return false;
    expected *= t.size(d);
  }
  return true;
}

}  // namespace

void add_at_rows(torch::Tensor target, const torch::Tensor& index, const torch::Tensor& source) {
  PK_CHECK(target.dim() >= 2 && source.dim() == target.dim() && index.dim() == 1,
           "add_at_rows: expected a target and a source of the same rank (at least 2) and a 1-D index, got "
               << target.sizes() << ", " << source.sizes() << " and " << index.sizes());
  PK_CHECK(source.size(1) == index.size(0) && source.size(0) == target.size(0) &&
               source.sizes().slice(2) == target.sizes().slice(2),
           "add_at_rows: source " << source.sizes() << " does not match target " << target.sizes() << " at "
                                  << index.size(0) << " rows");
  const bool direct = target.scalar_type() == torch::kFloat64 && source.scalar_type() == torch::kFloat64 &&
                      index.scalar_type() == torch::kLong && target.device().is_cpu() && source.device().is_cpu() &&
                      rows_contiguous(target) && rows_contiguous(source);
  if (!direct) {
    target.index_add_(1, index, source);
    return;
  }
  const torch::Tensor idx = index.contiguous();
  const int64_t* at = idx.data_ptr<int64_t>();
  const int64_t rows = idx.numel(), target_rows = target.size(1);
  int64_t width = 1;
  for (int64_t d = 2; d < target.dim(); ++d) width *= target.size(d);
  for (int64_t i = 0; i < rows; ++i) {
    PK_CHECK(at[i] >= 0 && at[i] < target_rows,
             "add_at_rows: row " << at[i] << " at index position " << i << " is out of range: the target has "
                                 << target_rows << " rows");
  }
  double* out = target.data_ptr<double>();
  const double* in = source.data_ptr<double>();
  const int64_t out_stride = target.stride(0), in_stride = source.stride(0);
  // Small blocks stay on this thread (each first-axis slice is rows · width).
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, rows * width));
  at::parallel_for(0, target.size(0), grain, [&](int64_t a0, int64_t a1) {
    for (int64_t a = a0; a < a1; ++a) {
      double* t = out + a * out_stride;
      const double* s = in + a * in_stride;
      for (int64_t i = 0; i < rows; ++i, s += width) {
        double* row = t + at[i] * width;
        for (int64_t k = 0; k < width; ++k) row[k] += s[k];
      }
    }
  });
}

}  // namespace pathkernel
