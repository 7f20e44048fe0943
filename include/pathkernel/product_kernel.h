// The EPK between two test points along one path segment (docs/math.md §6):
//
//   ∫_0^1 J(w_s + t dw_s, x) J(w_s + t dw_s, x')ᵀ dt
//
// the quadrature of the product, not the product of the averages J̄ J̄'ᵀ.
// With gauss, [0,1] is split at the ends of every piece the certified test
// features of x and x' were integrated on (their kinks and refinement
// splits), so the product is smooth on each piece, and each piece gets twice
// the Gauss–Legendre nodes the features used: the product of two polynomials
// of degree d has degree 2d. Fixed rules (riemann:T, dpk) use their nodes as
// they are, as the paper does.
#pragma once

#include <torch/torch.h>

#include "pathkernel/features.h"
#include "pathkernel/segment.h"

namespace pathkernel {

/// ∫ J(t, x_i) J(t, y_j)ᵀ dt over the segment set in `ev`, for x [n, ...]
/// and y [m, ...]: [n, m, K, K].
torch::Tensor segment_product_kernel(const SegmentEvaluator& ev, const torch::Tensor& x, const torch::Tensor& y,
                                     const QuadratureOptions& options);

/// ∫ J(t, x_i) J(t, x_i)ᵀ dt for each point of x [n, ...] on its own pieces: [n, K, K].
torch::Tensor segment_product_diagonal(const SegmentEvaluator& ev, const torch::Tensor& x,
                                       const QuadratureOptions& options);

}  // namespace pathkernel
