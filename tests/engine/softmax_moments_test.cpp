// The softmax moments of log-softmax pieces (src/engine/softmax_moments.cpp)
// against the same integrals taken in long double in each piece's own
// coordinate, on a long piece and on one much shorter than its distance
// from 0 (where the nodes' own rounding is all the sums can agree to).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include <torch/torch.h>

#include "pathkernel/integrator.h"
#include "pathkernel/quadrature.h"
#include "../../src/engine/softmax_moments.h"

namespace pathkernel {
namespace {

constexpr int64_t K = 4;

/// Logits of degree 2 in t: z_k(t) = c0_k + c1_k t + c2_k t².
struct Logits {
  long double c[3][K] = {{0.3L, -1.1L, 0.8L, 0.0L}, {2.5L, -0.7L, 1.9L, -3.0L}, {-1.2L, 2.2L, 0.4L, 1.0L}};
  long double at(long double t, int64_t k) const { return c[0][k] + c[1][k] * t + c[2][k] * t * t; }
};

/// ∫_a^b ℓ_j(t) softmax(z(t))_k dt for the piece's nodes xs, by 64-node
/// Gauss–Legendre in u = (t − a)/(b − a) ∈ [0, 1], in long double.
std::vector<long double> reference(const Logits& z, double a, double b, const std::vector<double>& xs) {
  const long double h = static_cast<long double>(b) - a;
  std::vector<long double> u;
  for (double x : xs) u.push_back((static_cast<long double>(x) - a) / h);
  const QuadratureRule g = composite_gauss_legendre(16, {0.0, 0.25, 0.5, 0.75, 1.0});
  std::vector<long double> v(xs.size() * K, 0.0L);
  for (size_t f = 0; f < g.nodes.size(); ++f) {
    const long double uf = g.nodes[f], t = a + h * uf;
    long double p[K], total = 0;
    for (int64_t k = 0; k < K; ++k) total += p[k] = std::exp(z.at(t, k));
    for (size_t j = 0; j < xs.size(); ++j) {
      long double l = 1;
      for (size_t i = 0; i < xs.size(); ++i) {
        if (i != j) l *= (uf - u[i]) / (u[j] - u[i]);
      }
      for (int64_t k = 0; k < K; ++k) v[j * K + k] += h * g.weights[f] * l * p[k] / total;
    }
  }
  return v;
}

TEST(SoftmaxMoments, MatchLongDoubleIntegralsOnLongAndShortPieces) {
  const Logits z;
  // Two Gauss rows and one moment row per piece: [0.2, 0.9], and a piece
  // of length 2e-6 at 0.7.
  const std::vector<std::pair<double, double>> pieces = {{0.2, 0.9}, {0.7, 0.7 + 2e-6}};
  PieceRound rd;
  rd.np = 2;
  rd.first = {0};
  rd.mfirst = {0};
  std::vector<double> node_z, moment_z, end_z;
  auto logits_at = [&](double t, std::vector<double>& out) {
    for (int64_t k = 0; k < K; ++k) out.push_back(static_cast<double>(z.at(t, k)));
  };
  for (const auto& [a, b] : pieces) {
    const QuadratureRule g = gauss_legendre(2, a, b);
    for (size_t j = 0; j < 2; ++j) {
      rd.t.push_back(g.nodes[j]);
      logits_at(g.nodes[j], node_z);
    }
    rd.first.push_back(static_cast<int64_t>(rd.t.size()));
    rd.mt.push_back(a + (b - a) / 2);
    logits_at(rd.mt.back(), moment_z);
    rd.mfirst.push_back(static_cast<int64_t>(rd.mt.size()));
    rd.ends.push_back(a);
    rd.ends.push_back(b);
    logits_at(a, end_z);
    logits_at(b, end_z);
  }
  rd.rows = static_cast<int64_t>(rd.t.size());
  rd.moment_rows = static_cast<int64_t>(rd.mt.size());
  auto as_tensor = [](const std::vector<double>& v) {
    return torch::tensor(v, torch::kFloat64).view({-1, K});
  };
  const auto [v, vm] = softmax_moments(rd, as_tensor(node_z), as_tensor(moment_z), as_tensor(end_z));
  ASSERT_EQ(v.sizes(), (std::vector<int64_t>{4, K}));
  ASSERT_EQ(vm.sizes(), (std::vector<int64_t>{2, K}));
  for (int64_t pc = 0; pc < 2; ++pc) {
    const auto [a, b] = pieces[static_cast<size_t>(pc)];
    const std::vector<double> xs = {rd.t[2 * pc], rd.t[2 * pc + 1], rd.mt[pc]};
    const std::vector<long double> ref = reference(z, a, b, xs);
    for (size_t j = 0; j < xs.size(); ++j) {
      for (int64_t k = 0; k < K; ++k) {
        const double got = j < 2 ? v[2 * pc + static_cast<int64_t>(j)][k].item<double>() : vm[pc][k].item<double>();
        const double want = static_cast<double>(ref[j * K + k]);
        // The moments are known to the rounding of their nodes' places
        // (about ε·|t| each) and no closer: 1e-15 absolute on t ≤ 1.
        EXPECT_NEAR(got, want, 1e-15) << "piece " << pc << ", node " << j << ", output " << k;
      }
    }
  }
}

}  // namespace
}  // namespace pathkernel
