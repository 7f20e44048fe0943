// The infinite-width NTK and NNGP of a fully-connected ReLU network
// (docs/math.md §6; Jacot et al. 2018, Lee et al. 2019), in the NTK
// parametrisation with bias scale β:
//
//   h¹ = W¹ x / √n0 + β b¹,   h^{l+1} = √(c_σ / n_l) W^{l+1} σ(h^l) + β b^{l+1},
//
// every weight and bias entry N(0, 1), σ = ReLU, c_σ = 2. As the widths grow
// the output's covariance over initialisations tends to the NNGP kernel Σ and
// its tangent kernel ∇f(x)·∇f(x') to the deterministic NTK Θ:
//
//   Σ¹(x,x') = x·x'/n0 + β²
//   Σ^{l+1}  = c_σ √(Σ_xx Σ_x'x') (sin θ + (π−θ) cos θ) / (2π) + β²
//   Σ̇^{l+1}  = c_σ (π−θ) / (2π),       θ = arccos(Σ_xx' / √(Σ_xx Σ_x'x'))
//   Θ¹ = Σ¹,  Θ^{l+1} = Θ^l Σ̇^{l+1} + Σ^{l+1}
#pragma once

#include <torch/torch.h>

namespace pathkernel {

struct InfiniteWidthOptions {
  int64_t hidden_layers = 1;  ///< ReLU layers between input and output (>= 0)
  double bias_scale = 0.0;    ///< β (>= 0)
};

struct InfiniteWidthKernels {
  torch::Tensor nngp;  ///< [n1, n2] Σ^{L+1}(x1_i, x2_j)
  torch::Tensor ntk;   ///< [n1, n2] Θ^{L+1}(x1_i, x2_j)
};

/// Near θ = 0 (x' ≈ x) the arccos turns the rounding of Σ_xx' into a
/// relative error of about 1e-8: √ε, not ε.
/// Both kernels between the rows of x1 [n1, d] and x2 [n2, d] (inputs are
/// flattened), in float64. Throws Error on mismatched feature sizes,
/// non-finite inputs or bad options.
InfiniteWidthKernels infinite_width_kernels(const torch::Tensor& x1, const torch::Tensor& x2,
                                            const InfiniteWidthOptions& options);

}  // namespace pathkernel
