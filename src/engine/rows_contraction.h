// How a Rows layer's test features meet a batch of training rows
// (contract_outputs in features.cpp, docs/math.md §8): by rows, or through
// a dense block of J̄ per test point, whichever takes fewer multiply-adds.
// Internal to the engine.
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace pathkernel {

/// A Rows layer's sizes in one contraction: K outputs, n test points, R
/// rows (all points'), the layer's in and out units, cols = in (+1 with a
/// bias), B training rows, K' sets of training signals.
struct RowsLayerSizes {
  int64_t K = 0, n = 0, R = 0, in = 0, out = 0, cols = 0, B = 0, Kp = 1;
};

/// Multiply-adds of the dense block: forming Σ_r ω_r δ_{k,r} [a_r; 1]ᵀ per
/// test point (K·out·cols·R), its product with the training inputs
/// (K·n·out·cols·B) and the K' signals' sums (K·n·out·B·K').
double dense_block_cost(const RowsLayerSizes& s);

/// Multiply-adds by rows: the rows' inputs against the training inputs
/// (R·in·B), their signals against the training signals (K·R·out·B·K'),
/// the products and the sums into test points (2·K·R·B·K').
double by_rows_cost(const RowsLayerSizes& s);

/// Whether contract_outputs takes the dense block: where it costs less, or
/// as a RowsContractionScope says.
bool take_dense_block(const RowsLayerSizes& s);

/// The by-rows form's sums into test points: out[k, p, j, b] = Σ over the
/// rows r of point p (point[r] = p), in row order, of
/// (dd[k, r, j, b] · a[r, b]) · weight[r], for dd [K, R, K', B], a [R, B],
/// weight [R] (float64) and point [R] (int64, each in [0, n)); returns
/// [K, n, K', B]. The bits of summing `dd * a * weight` by point (each
/// product rounded, then added from zero in row order), in one pass over dd
/// without its two [K, R, K', B] products.
torch::Tensor rows_point_sums(const torch::Tensor& dd, const torch::Tensor& a, const torch::Tensor& weight,
                              const torch::Tensor& point, int64_t n);

/// For tests: while one lives, every Rows layer is contracted one way (its
/// dense block, or by rows), whatever the costs; process-wide.
class RowsContractionScope {
 public:
  explicit RowsContractionScope(bool dense);
  ~RowsContractionScope();
  RowsContractionScope(const RowsContractionScope&) = delete;
  RowsContractionScope& operator=(const RowsContractionScope&) = delete;

 private:
  int previous_;
};

}  // namespace pathkernel
