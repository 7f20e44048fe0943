// Gaussian-process regression on a precomputed kernel.
#include "pathkernel/gp.h"

#include <cmath>

#include "pathkernel/error.h"

namespace pathkernel {

GpPosterior gp_posterior(const torch::Tensor& k_train_in, const torch::Tensor& k_cross_in,
                         const torch::Tensor& k_test_in, const torch::Tensor& y_in, const GpOptions& options) {
  const torch::Tensor kxx = k_train_in.to(torch::kFloat64), ksx = k_cross_in.to(torch::kFloat64);
  const torch::Tensor kss = k_test_in.to(torch::kFloat64), y = y_in.to(torch::kFloat64);
  PK_CHECK(kxx.dim() == 2 && kxx.size(0) == kxx.size(1),
           "gp: the train kernel must be square [M, M], got " << kxx.sizes());
  const int64_t M = kxx.size(0);
  PK_CHECK(ksx.dim() == 2 && ksx.size(1) == M, "gp: the cross kernel must be [n, " << M << "], got " << ksx.sizes());
  const int64_t n = ksx.size(0);
  PK_CHECK(kss.dim() == 1 && kss.size(0) == n, "gp: the test kernel must be [" << n << "], got " << kss.sizes());
  PK_CHECK(y.dim() == 2 && y.size(0) == M, "gp: the targets must be [" << M << ", K], got " << y.sizes());
  for (const torch::Tensor* t : {&kxx, &ksx, &kss, &y}) {
    PK_CHECK(torch::isfinite(*t).all().item<bool>(), "gp: an input holds a non-finite value");
  }
  PK_CHECK(options.noise >= 0 && std::isfinite(options.noise), "gp: noise must be >= 0 (got " << options.noise << ")");
  PK_CHECK(options.samples >= 0, "gp: samples must be >= 0 (got " << options.samples << ")");

  GpPosterior out;
  const torch::Tensor sym = 0.5 * (kxx + kxx.t()) + options.noise * torch::eye(M, torch::kFloat64);
  const double scale = std::max(sym.diagonal().abs().mean().item<double>(), 1e-300);
  torch::Tensor chol;
  for (double rel = 0;; rel = rel == 0 ? 1e-15 : rel * 10) {
    PK_CHECK(rel <= options.max_jitter * (1 + 1e-9),
             "gp: the train kernel is not positive definite even with jitter " << options.max_jitter
                                                                               << " x its mean diagonal");
    auto [l, info] = torch::linalg_cholesky_ex(sym + rel * scale * torch::eye(M, torch::kFloat64));
    if (info.item<int64_t>() == 0) {
      chol = l;
      out.jitter = rel * scale;
      break;
    }
  }
  out.mean = torch::matmul(ksx, torch::cholesky_solve(y, chol));                      // [n, K]
  torch::Tensor v = torch::linalg_solve_triangular(chol, ksx.t(), /*upper=*/false);  // [M, n]
  out.variance = kss - (v * v).sum(0);
  if (options.samples > 0) {
    torch::Generator gen = at::detail::createCPUGenerator(options.seed);
    const int64_t K = y.size(1);
    torch::Tensor z = torch::randn({options.samples, n, K}, gen, torch::kFloat64);
    torch::Tensor logits = out.mean.unsqueeze(0) + z * out.variance.clamp_min(0).sqrt().view({1, n, 1});
    out.prob_std = torch::softmax(logits, 2).std(0, /*unbiased=*/true);
  }
  return out;
}

}  // namespace pathkernel
