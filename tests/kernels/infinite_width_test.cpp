// The infinite-width NTK and NNGP: one layer against direct numerical
// integration of the Gaussian expectations, and the full recursion against
// wide random networks.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include "../test_util.h"
#include "pathkernel/infinite_width.h"
#include "pathkernel/quadrature.h"

namespace pathkernel {
namespace {

const double kPi = std::acos(-1.0);

double normal_pdf(double z) { return std::exp(-0.5 * z * z) / std::sqrt(2 * kPi); }
double normal_cdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

/// E[relu(u) relu(v)] and P(u > 0, v > 0) for (u, v) ~ N(0, [[a, c], [c, b]]):
/// u = √a z1, v = √b (ρ z1 + s z2); the z2 expectation in closed form, the
/// z1 one by composite Gauss–Legendre on [−12, 12].
std::pair<double, double> gaussian_expectations(double a, double b, double c) {
  const double rho = c / std::sqrt(a * b), s = std::sqrt(std::max(0.0, 1 - rho * rho));
  std::vector<double> breaks;
  for (int k = 0; k <= 96; ++k) breaks.push_back(-12.0 + 24.0 * k / 96);
  const QuadratureRule rule = composite_gauss_legendre(20, breaks);
  double relu_relu = 0, both_positive = 0;
  for (size_t j = 0; j < rule.nodes.size(); ++j) {
    const double z1 = rule.nodes[j], w = rule.weights[j] * normal_pdf(z1), m = rho * z1;
    // E_z2[relu(m + s z2)] = m Φ(m/s) + s φ(m/s); P(m + s z2 > 0) = Φ(m/s).
    const double inner = s > 0 ? m * normal_cdf(m / s) + s * normal_pdf(m / s) : std::max(0.0, m);
    const double prob = s > 0 ? normal_cdf(m / s) : (m > 0 ? 1.0 : 0.0);
    if (z1 > 0) {
      relu_relu += w * std::sqrt(a) * z1 * std::sqrt(b) * inner;
      both_positive += w * prob;
    }
  }
  return {relu_relu, both_positive};
}

torch::Tensor points() {
  torch::manual_seed(3);
  torch::Tensor x = torch::randn({4, 10}, torch::kFloat64);
  x[1] = 0.9 * x[0] + 0.1 * x[1];  // nearly parallel to x[0]
  x[3] *= 2.5;                      // a larger norm
  return x;
}

TEST(InfiniteWidth, OneLayerEqualsTheGaussianIntegrals) {
  const torch::Tensor x = points();
  for (double beta : {0.0, 0.5}) {
    InfiniteWidthKernels k = infinite_width_kernels(x, x, {1, beta});
    torch::Tensor s1 = torch::matmul(x, x.t()) / 10.0 + beta * beta;
    for (int64_t i = 0; i < 4; ++i) {
      for (int64_t j = 0; j < 4; ++j) {
        auto [e, p] = gaussian_expectations(s1[i][i].item<double>(), s1[j][j].item<double>(), s1[i][j].item<double>());
        const double nngp = 2 * e + beta * beta, ntk = s1[i][j].item<double>() * 2 * p + nngp;
        EXPECT_NEAR(k.nngp[i][j].item<double>(), nngp, 1e-10 * std::abs(nngp)) << i << "," << j << " β " << beta;
        EXPECT_NEAR(k.ntk[i][j].item<double>(), ntk, 1e-10 * std::abs(ntk)) << i << "," << j << " β " << beta;
      }
    }
  }
  // No hidden layer: the linear model's kernel.
  InfiniteWidthKernels lin = infinite_width_kernels(x, x, {0, 0.5});
  EXPECT_TRUE(torch::allclose(lin.ntk, torch::matmul(x, x.t()) / 10.0 + 0.25, 0, 1e-15));
}

/// A random network of the NTK parametrisation (see infinite_width.h) of
/// `hidden` ReLU layers of `width` units and one output.
struct WideNetwork {
  std::vector<torch::Tensor> weights, biases;
  double beta;

  WideNetwork(int64_t in, int64_t width, int64_t hidden, double beta, uint64_t seed) : beta(beta) {
    torch::manual_seed(seed);
    int64_t fan_in = in;
    for (int64_t l = 0; l <= hidden; ++l) {
      const int64_t out = l == hidden ? 1 : width;
      weights.push_back(torch::randn({out, fan_in}, torch::kFloat64).requires_grad_());
      biases.push_back(torch::randn({out}, torch::kFloat64).requires_grad_());
      fan_in = out;
    }
  }
  /// The output [n] and the last hidden layer's features √(c/n) σ(h^L) [n, width].
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) const {
    torch::Tensor a = x, features;
    for (size_t l = 0; l < weights.size(); ++l) {
      const double scale = l == 0 ? 1.0 / std::sqrt(static_cast<double>(a.size(1)))
                                  : std::sqrt(2.0 / static_cast<double>(a.size(1)));
      if (l + 1 == weights.size()) features = scale * a;
      torch::Tensor h = scale * torch::matmul(a, weights[l].t()) + beta * biases[l];
      a = l + 1 == weights.size() ? h : torch::relu(h);
    }
    return {a.squeeze(1), features};
  }
  std::vector<torch::Tensor> parameters() const {
    std::vector<torch::Tensor> p(weights);
    p.insert(p.end(), biases.begin(), biases.end());
    return p;
  }
};

// Two hidden layers of width 4096, four random networks: the empirical NNGP
// (the last layer's feature covariance plus β²) and the empirical NTK
// (∇f·∇f) fluctuate like 1/√width, a few per cent; the stated tolerance is
// 5% of the kernel's largest entry. A missing Σ̇ factor or a wrong c_σ is
// off by tens of per cent.
TEST(InfiniteWidth, MatchesWideRandomNetworks) {
  const torch::Tensor x = points();
  const double beta = 0.3;
  InfiniteWidthKernels k = infinite_width_kernels(x, x, {2, beta});
  torch::Tensor nngp = torch::zeros({4, 4}, torch::kFloat64), ntk = torch::zeros({4, 4}, torch::kFloat64);
  const int nets = 4;
  for (int r = 0; r < nets; ++r) {
    WideNetwork net(10, 4096, 2, beta, 100 + r);
    auto [out, features] = net.forward(x);
    nngp += (torch::matmul(features, features.t()) + beta * beta).detach() / nets;
    std::vector<torch::Tensor> grads;
    for (int64_t i = 0; i < 4; ++i) {
      std::vector<torch::Tensor> g = torch::autograd::grad({out[i]}, net.parameters(), {}, /*retain_graph=*/true);
      std::vector<torch::Tensor> flat;
      for (auto& t : g) flat.push_back(t.reshape(-1));
      grads.push_back(torch::cat(flat));
    }
    torch::Tensor j = torch::stack(grads);
    ntk += torch::matmul(j, j.t()) / nets;
  }
  const double tol_nngp = 0.05 * k.nngp.abs().max().item<double>(), tol_ntk = 0.05 * k.ntk.abs().max().item<double>();
  EXPECT_LE((nngp - k.nngp).abs().max().item<double>(), tol_nngp) << nngp << "\n" << k.nngp;
  EXPECT_LE((ntk - k.ntk).abs().max().item<double>(), tol_ntk) << ntk << "\n" << k.ntk;
  // The tolerance tells depths apart: the one-layer kernels are outside it.
  InfiniteWidthKernels shallow = infinite_width_kernels(x, x, {1, beta});
  EXPECT_GT((ntk - shallow.ntk).abs().max().item<double>(), tol_ntk);
  EXPECT_GT((nngp - shallow.nngp).abs().max().item<double>(), tol_nngp);
  std::cout << "[ stats    ] NTK max deviation " << (ntk - k.ntk).abs().max().item<double>() / k.ntk.abs().max().item<double>()
            << ", NNGP " << (nngp - k.nngp).abs().max().item<double>() / k.nngp.abs().max().item<double>()
            << " of the largest entry\n";
}

TEST(InfiniteWidth, RejectsBadInput) {
  const torch::Tensor x = points();
  EXPECT_CONTAINS(testing::error_message([&] { infinite_width_kernels(x, torch::zeros({2, 3}), {}); }),
                  "inputs have 10 and 3 features");
  EXPECT_CONTAINS(testing::error_message([&] { infinite_width_kernels(x, x, {-1, 0.0}); }),
                  "hidden layers must be >= 0 (got -1)");
  torch::Tensor bad = x.clone();
  bad[0][0] = NAN;
  EXPECT_CONTAINS(testing::error_message([&] { infinite_width_kernels(bad, x, {}); }), "non-finite");
}

}  // namespace
}  // namespace pathkernel
