// Kernel regression and the lazy dynamics, through one eigendecomposition.
#include "pathkernel/kernel_regression.h"

#include <cmath>

#include "pathkernel/error.h"

namespace pathkernel {

namespace {

struct Eigen {
  torch::Tensor values, vectors;  ///< kept directions only
  int64_t dropped = 0;
};

/// Checks the shapes and values, and decomposes the symmetric train kernel.
Eigen decompose_train(const torch::Tensor& kxx, const torch::Tensor& ksx, const torch::Tensor& y,
                      const KernelRegressionOptions& o, const char* what) {
  PK_CHECK(kxx.dim() == 2 && kxx.size(0) == kxx.size(1), what << ": the train kernel must be square [M, M], got " << kxx.sizes());
  const int64_t M = kxx.size(0);
  PK_CHECK(ksx.dim() == 2 && ksx.size(1) == M, what << ": the cross kernel must be [n, " << M << "], got " << ksx.sizes());
  PK_CHECK(y.dim() == 2 && y.size(0) == M, what << ": the targets must be [" << M << ", K], got " << y.sizes());
  for (const torch::Tensor* t : {&kxx, &ksx, &y}) {
    PK_CHECK(torch::isfinite(*t).all().item<bool>(), what << ": an input holds a non-finite value");
  }
  PK_CHECK(o.ridge >= 0 && std::isfinite(o.ridge), what << ": ridge must be >= 0 (got " << o.ridge << ")");
  PK_CHECK(o.cutoff >= 0 && o.cutoff < 1, what << ": cutoff must be in [0, 1) (got " << o.cutoff << ")");
  auto [values, vectors] = torch::linalg::eigh(0.5 * (kxx + kxx.t()), "L");
  values = values + o.ridge;
  const double largest = values.abs().max().item<double>();
  torch::Tensor keep = values > o.cutoff * largest;
  Eigen e;
  e.dropped = M - keep.sum().item<int64_t>();
  e.values = values.index({keep});
  e.vectors = vectors.index({torch::indexing::Slice(), keep});
  return e;
}

}  // namespace

KernelPrediction kernel_regression(const torch::Tensor& k_train, const torch::Tensor& k_cross, const torch::Tensor& y,
                                   const KernelRegressionOptions& options) {
  const torch::Tensor kxx = k_train.to(torch::kFloat64), ksx = k_cross.to(torch::kFloat64), yy = y.to(torch::kFloat64);
  Eigen e = decompose_train(kxx, ksx, yy, options, "kernel regression");
  // V diag(1/λ) Vᵀ Y
  torch::Tensor coef = torch::matmul(e.vectors, torch::matmul(e.vectors.t(), yy) / e.values.unsqueeze(1));
  return {torch::matmul(ksx, coef), e.dropped};
}

KernelPrediction lazy_dynamics(const torch::Tensor& k_train, const torch::Tensor& k_cross,
                               const torch::Tensor& f0_train, const torch::Tensor& f0_test, const torch::Tensor& y,
                               double time, const KernelRegressionOptions& options) {
  const torch::Tensor kxx = k_train.to(torch::kFloat64), ksx = k_cross.to(torch::kFloat64), yy = y.to(torch::kFloat64);
  const torch::Tensor f0x = f0_train.to(torch::kFloat64), f0s = f0_test.to(torch::kFloat64);
  PK_CHECK(time >= 0 && std::isfinite(time), "lazy dynamics: the time must be >= 0 (got " << time << ")");
  PK_CHECK(f0x.sizes() == yy.sizes(), "lazy dynamics: f0_train " << f0x.sizes() << " must match the targets " << yy.sizes());
  PK_CHECK(f0s.dim() == 2 && f0s.size(0) == ksx.size(0) && f0s.size(1) == yy.size(1),
           "lazy dynamics: f0_test must be [" << ksx.size(0) << ", " << yy.size(1) << "], got " << f0s.sizes());
  Eigen e = decompose_train(kxx, ksx, yy - f0x, options, "lazy dynamics");
  const double M = static_cast<double>(kxx.size(0));
  // V diag((1 − e^{−τλ/M}) / λ) Vᵀ (Y − f0(X)); expm1 keeps small τλ accurate.
  torch::Tensor gain = -torch::expm1(-time * e.values / M) / e.values;
  torch::Tensor coef = torch::matmul(e.vectors, torch::matmul(e.vectors.t(), yy - f0x) * gain.unsqueeze(1));
  return {f0s + torch::matmul(ksx, coef), e.dropped};
}

}  // namespace pathkernel
