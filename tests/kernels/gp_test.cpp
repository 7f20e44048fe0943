// GP regression on a precomputed kernel against the direct formulas.
#include <gtest/gtest.h>

#include "../test_util.h"
#include "pathkernel/gp.h"

namespace pathkernel {
namespace {

struct Problem {
  torch::Tensor kxx, ksx, kss, y;
};

/// A linear-kernel problem: features φ [M + n, d], K = φ φᵀ.
Problem problem(int64_t M, int64_t n, int64_t d) {
  torch::manual_seed(4);
  torch::Tensor phi = torch::randn({M + n, d}, torch::kFloat64);
  torch::Tensor k = torch::matmul(phi, phi.t());
  return {k.narrow(0, 0, M).narrow(1, 0, M), k.narrow(0, M, n).narrow(1, 0, M), k.narrow(0, M, n).narrow(1, M, n).diagonal(),
          torch::randn({M, 3}, torch::kFloat64)};
}

TEST(Gp, PosteriorEqualsTheDirectFormula) {
  Problem p = problem(8, 5, 20);  // d > M: positive definite
  GpOptions o;
  o.noise = 0.1;
  GpPosterior g = gp_posterior(p.kxx, p.ksx, p.kss, p.y, o);
  torch::Tensor inv = torch::inverse(p.kxx + 0.1 * torch::eye(8, torch::kFloat64));
  torch::Tensor mean = torch::matmul(torch::matmul(p.ksx, inv), p.y);
  torch::Tensor var = p.kss - torch::matmul(torch::matmul(p.ksx, inv), p.ksx.t()).diagonal();
  EXPECT_EQ(g.jitter, 0.0);
  EXPECT_LE((g.mean - mean).abs().max().item<double>(), 1e-10 * mean.abs().max().item<double>());
  EXPECT_LE((g.variance - var).abs().max().item<double>(), 1e-10 * p.kss.abs().max().item<double>());
  EXPECT_GT(var.min().item<double>(), 0.0);
  // The probabilities' spread: [n, K], positive, and zero without variance.
  ASSERT_EQ(g.prob_std.sizes(), (std::vector<int64_t>{5, 3}));
  EXPECT_GT(g.prob_std.min().item<double>(), 0.0);
  EXPECT_LE(g.prob_std.max().item<double>(), 0.5 + 1e-12);
  GpPosterior at_train = gp_posterior(p.kxx, p.kxx, p.kxx.diagonal(), p.y, GpOptions{});
  EXPECT_LE(at_train.variance.abs().max().item<double>(), 1e-9 * p.kxx.diagonal().max().item<double>());
  EXPECT_LE((at_train.mean - p.y).abs().max().item<double>(), 1e-8);  // interpolates without noise
}

TEST(Gp, SingularKernelGetsReportedJitter) {
  Problem p = problem(12, 3, 4);  // rank 4 < M = 12
  GpPosterior g = gp_posterior(p.kxx, p.ksx, p.kss, p.y, GpOptions{});
  EXPECT_GT(g.jitter, 0.0);
  EXPECT_LE(g.jitter, 1e-6 * p.kxx.diagonal().mean().item<double>() * (1 + 1e-9));
  EXPECT_TRUE(torch::isfinite(g.mean).all().item<bool>());
}

TEST(Gp, RejectsBadInput) {
  Problem p = problem(4, 2, 6);
  EXPECT_CONTAINS(testing::error_message([&] { gp_posterior(p.kxx, p.ksx.narrow(1, 0, 3), p.kss, p.y, {}); }),
                  "cross kernel must be [n, 4], got [2, 3]");
  torch::Tensor neg = -torch::eye(4, torch::kFloat64);
  EXPECT_CONTAINS(testing::error_message([&] { gp_posterior(neg, p.ksx, p.kss, p.y, {}); }),
                  "not positive definite even with jitter");
  torch::Tensor nan = p.y.clone();
  nan[0][0] = NAN;
  EXPECT_CONTAINS(testing::error_message([&] { gp_posterior(p.kxx, p.ksx, p.kss, nan, {}); }), "non-finite");
}

}  // namespace
}  // namespace pathkernel
