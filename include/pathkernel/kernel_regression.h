// Kernel regression on a precomputed kernel, and the linearised ("lazy")
// training dynamics it is the limit of (docs/math.md §9; Jacot et al. 2018):
//
//   regression   f(x) = k(x, X) (k(X, X) + λ I)⁻¹ Y
//   lazy, time τ f_τ(x) = f_0(x) + k(x, X) k(X, X)⁻¹ (I − e^{−τ k(X, X)/M}) (Y − f_0(X))
//
// The second is gradient flow on the squared loss (1/2M) Σ_i |f(x_i) − y_i|²
// of the network linearised at its initialisation, whose tangent kernel is
// k; τ = η × steps. It tends to the regression of the residual as τ → ∞.
// Both use the eigendecomposition of the symmetric train kernel; directions
// whose eigenvalue is below `cutoff` × the largest are dropped (a
// pseudo-inverse), and the count dropped is reported.
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace pathkernel {

struct KernelRegressionOptions {
  double ridge = 0.0;    ///< λ, added to the train kernel's diagonal (>= 0)
  double cutoff = 1e-12; ///< relative eigenvalue below which a direction is dropped
};

struct KernelPrediction {
  torch::Tensor mean;   ///< [n, K]
  int64_t dropped = 0;  ///< eigen-directions of the train kernel left out
};

/// Kernel regression from k_train [M, M], k_cross [n, M] and targets y [M, K].
/// Throws Error on mismatched shapes, non-finite values or bad options.
KernelPrediction kernel_regression(const torch::Tensor& k_train, const torch::Tensor& k_cross, const torch::Tensor& y,
                                   const KernelRegressionOptions& options);

/// The lazy-dynamics prediction at time τ (= η × steps) from the tangent
/// kernel at initialisation k_train [M, M], k_cross [n, M], the initial
/// outputs f0_train [M, K] and f0_test [n, K], and targets y [M, K].
KernelPrediction lazy_dynamics(const torch::Tensor& k_train, const torch::Tensor& k_cross,
                               const torch::Tensor& f0_train, const torch::Tensor& f0_test, const torch::Tensor& y,
                               double time, const KernelRegressionOptions& options);

}  // namespace pathkernel
