// The infinite-width NTK and NNGP recursions for ReLU networks.
#include "pathkernel/infinite_width.h"

#include <cmath>

#include "pathkernel/error.h"

namespace pathkernel {

InfiniteWidthKernels infinite_width_kernels(const torch::Tensor& x1_in, const torch::Tensor& x2_in,
                                            const InfiniteWidthOptions& options) {
  PK_CHECK(options.hidden_layers >= 0, "hidden layers must be >= 0 (got " << options.hidden_layers << ")");
  PK_CHECK(std::isfinite(options.bias_scale) && options.bias_scale >= 0,
           "bias scale must be finite and >= 0 (got " << options.bias_scale << ")");
  const torch::Tensor x1 = x1_in.to(torch::kFloat64).flatten(1), x2 = x2_in.to(torch::kFloat64).flatten(1);
  PK_CHECK(x1.size(1) == x2.size(1), "infinite-width kernels: inputs have " << x1.size(1) << " and " << x2.size(1)
                                                                         << " features: expected the same");
  PK_CHECK(torch::isfinite(x1).all().item<bool>() && torch::isfinite(x2).all().item<bool>(),
           "infinite-width kernels: inputs hold a non-finite value");
  const double pi = std::acos(-1.0), c_sigma = 2.0, b2 = options.bias_scale * options.bias_scale;
  const double n0 = static_cast<double>(std::max<int64_t>(1, x1.size(1)));
  torch::Tensor s12 = torch::matmul(x1, x2.t()) / n0 + b2;
  torch::Tensor s11 = (x1 * x1).sum(1) / n0 + b2, s22 = (x2 * x2).sum(1) / n0 + b2;
  torch::Tensor theta_k = s12.clone();
  for (int64_t l = 0; l < options.hidden_layers; ++l) {
    torch::Tensor norm = torch::sqrt(s11.unsqueeze(1) * s22.unsqueeze(0));
    // A zero-variance input (x = 0, β = 0) has σ(u) = 0: its E[σσ] is 0.
    torch::Tensor cos = torch::where(norm > 0, s12 / norm.clamp_min(1e-300), torch::zeros_like(s12)).clamp(-1, 1);
    torch::Tensor angle = torch::acos(cos);
    torch::Tensor expect = norm * (torch::sin(angle) + (pi - angle) * cos) / (2 * pi);
    torch::Tensor sdot = c_sigma * (pi - angle) / (2 * pi);
    s12 = c_sigma * expect + b2;
    s11 = c_sigma * s11 / 2 + b2;  // θ = 0: E[σ(u)²] = Σ_xx / 2
    s22 = c_sigma * s22 / 2 + b2;
    theta_k = theta_k * sdot + s12;
  }
  return {s12, theta_k};
}

}  // namespace pathkernel
