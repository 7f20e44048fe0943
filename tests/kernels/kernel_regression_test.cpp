// Kernel regression against a direct solve, and the lazy dynamics against an
// explicit integration of the linearised gradient flow.
#include <gtest/gtest.h>

#include <cmath>

#include "../test_util.h"
#include "pathkernel/kernel_regression.h"

namespace pathkernel {
namespace {

/// An RBF kernel between rows: positive definite for distinct points.
torch::Tensor rbf(const torch::Tensor& a, const torch::Tensor& b) { return torch::exp(-torch::cdist(a, b).pow(2) / 2); }

TEST(KernelRegression, EqualsTheDirectSolveAndInterpolates) {
  torch::manual_seed(1);
  torch::Tensor x = torch::randn({12, 2}, torch::kFloat64), s = torch::randn({5, 2}, torch::kFloat64);
  torch::Tensor y = torch::randn({12, 3}, torch::kFloat64);
  KernelRegressionOptions o;
  o.ridge = 0.1;
  KernelPrediction p = kernel_regression(rbf(x, x), rbf(s, x), y, o);
  torch::Tensor expect = torch::matmul(rbf(s, x), torch::linalg::solve(rbf(x, x) + 0.1 * torch::eye(12, torch::kFloat64), y, true));
  EXPECT_LE((p.mean - expect).abs().max().item<double>(), 1e-10);
  EXPECT_EQ(p.dropped, 0);
  // Without a ridge, at the training points, it reproduces the targets.
  KernelPrediction at_train = kernel_regression(rbf(x, x), rbf(x, x), y, {});
  EXPECT_LE((at_train.mean - y).abs().max().item<double>(), 1e-6);
}

TEST(LazyDynamics, FollowsTheLinearisedGradientFlow) {
  torch::manual_seed(2);
  const int64_t M = 10;
  torch::Tensor x = torch::randn({M, 2}, torch::kFloat64), s = torch::randn({4, 2}, torch::kFloat64);
  torch::Tensor y = torch::randn({M, 3}, torch::kFloat64);
  torch::Tensor f0x = 0.3 * torch::randn({M, 3}, torch::kFloat64), f0s = 0.3 * torch::randn({4, 3}, torch::kFloat64);
  const torch::Tensor kxx = rbf(x, x), ksx = rbf(s, x);
  // Classical Runge–Kutta on df/dτ = −k(., X)(f(X) − Y)/M (fs rides along).
  const double tau = 3.0, h = 1e-3;
  auto rate = [&](const torch::Tensor& fx) { return -(fx - y) / static_cast<double>(M); };
  torch::Tensor fx = f0x.clone(), fs = f0s.clone();
  for (int i = 0; i < static_cast<int>(std::lround(tau / h)); ++i) {
    torch::Tensor r1 = rate(fx), r2 = rate(fx + 0.5 * h * torch::matmul(kxx, r1));
    torch::Tensor r3 = rate(fx + 0.5 * h * torch::matmul(kxx, r2)), r4 = rate(fx + h * torch::matmul(kxx, r3));
    torch::Tensor r = (r1 + 2 * r2 + 2 * r3 + r4) / 6;
    fx = fx + h * torch::matmul(kxx, r);
    fs = fs + h * torch::matmul(ksx, r);
  }
  KernelPrediction p = lazy_dynamics(kxx, ksx, f0x, f0s, y, tau, {});
  EXPECT_LE((p.mean - fs).abs().max().item<double>(), 1e-9);  // RK4's O(h⁴) error
  // At time 0 it is f0; at a long time, f0 plus the regression of the residual.
  EXPECT_LE((lazy_dynamics(kxx, ksx, f0x, f0s, y, 0.0, {}).mean - f0s).abs().max().item<double>(), 1e-15);
  torch::Tensor limit = f0s + kernel_regression(kxx, ksx, y - f0x, {}).mean;
  EXPECT_LE((lazy_dynamics(kxx, ksx, f0x, f0s, y, 1e12, {}).mean - limit).abs().max().item<double>(), 1e-6);
}

TEST(KernelRegression, RefusesBadInput) {
  torch::Tensor k = torch::eye(3, torch::kFloat64);
  EXPECT_CONTAINS(testing::error_message([&] { kernel_regression(k, torch::ones({2, 4}, torch::kFloat64), torch::ones({3, 1}, torch::kFloat64), {}); }),
                  "must be [n, 3]");
  KernelRegressionOptions bad;
  bad.ridge = -1;
  EXPECT_CONTAINS(testing::error_message([&] { kernel_regression(k, k, torch::ones({3, 1}, torch::kFloat64), bad); }),
                  "ridge must be >= 0 (got -1)");
  EXPECT_CONTAINS(testing::error_message([&] { lazy_dynamics(k, k, torch::ones({3, 1}, torch::kFloat64), torch::ones({3, 1}, torch::kFloat64), torch::ones({3, 1}, torch::kFloat64), -2, {}); }),
                  "time must be >= 0 (got -2)");
}

}  // namespace
}  // namespace pathkernel
