// Tests of the Gauss–Legendre rules against closed forms, exactness on
// monomials, the classical error term, and 50-digit mpmath references.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "pathkernel/error.h"
#include "../test_util.h"
#include "pathkernel/quadrature.h"

namespace pathkernel {
namespace {

using testing::error_message;

// Σ_j w_j t_j^d, accumulated in long double so that only the rule's own
// rounding shows.
long double apply_monomial(const QuadratureRule& rule, int d) {
  long double sum = 0.0L;
  for (size_t j = 0; j < rule.nodes.size(); ++j) {
    sum += static_cast<long double>(rule.weights[j]) * std::pow(static_cast<long double>(rule.nodes[j]), d);
  }
  return sum;
}

double ulp(double x) { return std::nextafter(std::fabs(x), INFINITY) - std::fabs(x); }

long double factorial(int k) {
  long double f = 1.0L;
  for (int i = 2; i <= k; ++i) f *= i;
  return f;
}

const std::vector<int> kSizes = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11,
                                 12, 13, 14, 15, 16, 17, 18, 19, 20, 64};

TEST(GaussLegendre, ShapesOrderAndWeightSum) {
  for (int n : kSizes) {
    QuadratureRule rule = gauss_legendre(n);
    ASSERT_EQ(rule.nodes.size(), static_cast<size_t>(n));
    ASSERT_EQ(rule.weights.size(), static_cast<size_t>(n));
    long double sum = 0.0L;
    for (int j = 0; j < n; ++j) {
      EXPECT_GT(rule.nodes[j], 0.0) << "n=" << n;
      EXPECT_LT(rule.nodes[j], 1.0) << "n=" << n;
      EXPECT_GT(rule.weights[j], 0.0) << "n=" << n;
      if (j > 0) {
        EXPECT_LT(rule.nodes[j - 1], rule.nodes[j]) << "n=" << n << " j=" << j;
      }
      sum += rule.weights[j];
    }
    EXPECT_NEAR(static_cast<double>(sum), 1.0, 1e-15) << "n=" << n;
  }
}

TEST(GaussLegendre, IntegratesMonomialsUpToDegree2nMinus1Exactly) {
  for (int n : kSizes) {
    QuadratureRule rule = gauss_legendre(n);
    for (int d = 0; d <= 2 * n - 1; ++d) {
      const long double exact = 1.0L / (d + 1);
      const long double rel = std::fabs(apply_monomial(rule, d) - exact) / exact;
      EXPECT_LE(static_cast<double>(rel), 1e-14) << "n=" << n << " d=" << d;
    }
  }
}

TEST(GaussLegendre, MissesDegree2nByTheClassicalErrorTerm) {
  // ∫_0^1 f − Q_n f = (n!)^4 / ((2n+1) ((2n)!)^3) f^(2n)(ξ); for f = t^(2n),
  // f^(2n) = (2n)! is constant, so the error is known exactly.
  for (int n = 1; n <= 6; ++n) {
    const long double exact = 1.0L / (2 * n + 1);
    const long double error = exact - apply_monomial(gauss_legendre(n), 2 * n);
    const long double expected =
        std::pow(factorial(n), 4) / ((2 * n + 1) * std::pow(factorial(2 * n), 2));
    EXPECT_GT(static_cast<double>(error / exact), 1e-16) << "n=" << n;
    EXPECT_NEAR(static_cast<double>(error / expected), 1.0, 1e-6) << "n=" << n;
  }
}

TEST(GaussLegendre, IsSymmetricAboutTheMidpoint) {
  for (int n : kSizes) {
    QuadratureRule rule = gauss_legendre(n);
    for (int j = 0; j < n; ++j) {
      EXPECT_NEAR(rule.nodes[j] + rule.nodes[n - 1 - j], 1.0, 2.3e-16) << "n=" << n << " j=" << j;
      EXPECT_DOUBLE_EQ(rule.weights[j], rule.weights[n - 1 - j]) << "n=" << n << " j=" << j;
    }
    if (n % 2 == 1) {
      EXPECT_EQ(rule.nodes[n / 2], 0.5) << "n=" << n;
    }
  }
}

TEST(GaussLegendre, MatchesClosedFormsForTwoThreeAndFivePoints) {
  QuadratureRule r2 = gauss_legendre(2);
  EXPECT_NEAR(r2.nodes[0], 0.5 - 1 / (2 * std::sqrt(3.0)), 1e-15);
  EXPECT_NEAR(r2.nodes[1], 0.5 + 1 / (2 * std::sqrt(3.0)), 1e-15);
  EXPECT_NEAR(r2.weights[0], 0.5, 1e-15);
  EXPECT_NEAR(r2.weights[1], 0.5, 1e-15);

  QuadratureRule r3 = gauss_legendre(3);
  EXPECT_NEAR(r3.nodes[0], 0.5 - std::sqrt(0.6) / 2, 1e-15);
  EXPECT_NEAR(r3.nodes[1], 0.5, 1e-15);
  EXPECT_NEAR(r3.nodes[2], 0.5 + std::sqrt(0.6) / 2, 1e-15);
  EXPECT_NEAR(r3.weights[0], 5.0 / 18, 1e-15);
  EXPECT_NEAR(r3.weights[1], 8.0 / 18, 1e-15);
  EXPECT_NEAR(r3.weights[2], 5.0 / 18, 1e-15);

  // n = 5 on [−1,1]: 0, ±(1/3)√(5 ∓ 2√(10/7)); weights 128/225, (322 ± 13√70)/900.
  QuadratureRule r5 = gauss_legendre(5);
  const long double s = std::sqrt(10.0L / 7.0L), r70 = std::sqrt(70.0L);
  const long double x_inner = std::sqrt(5.0L - 2.0L * s) / 3.0L;
  const long double x_outer = std::sqrt(5.0L + 2.0L * s) / 3.0L;
  const long double nodes[5] = {(1 - x_outer) / 2, (1 - x_inner) / 2, 0.5L, (1 + x_inner) / 2,
                                (1 + x_outer) / 2};
  const long double weights[5] = {(322 - 13 * r70) / 1800, (322 + 13 * r70) / 1800, 64.0L / 225,
                                  (322 + 13 * r70) / 1800, (322 - 13 * r70) / 1800};
  for (int j = 0; j < 5; ++j) {
    EXPECT_LE(std::fabs(r5.nodes[j] - static_cast<double>(nodes[j])), ulp(r5.nodes[j])) << j;
    EXPECT_LE(std::fabs(r5.weights[j] - static_cast<double>(weights[j])), ulp(r5.weights[j])) << j;
  }
}

TEST(GaussLegendre, MatchesMpmathReferencesToAnUlp) {
  // Lower-half nodes and weights on [0,1], from mpmath at 50 digits (Newton
  // on mpmath.legendre, which evaluates P_n as a hypergeometric series).
  struct Ref {
    int n, j;
    long double node, weight;
  };
  const Ref refs[] = {
      {20, 0, 0.00343570040745253760693880576434L, 0.00880700356957605915593098117593L},
      {20, 9, 0.461736739433251333122679795301L, 0.0763766935653629253490421659775L},
      {64, 0, 0.000347479132113930271547187827182L, 0.000891640360848216473648039572486L},
      {64, 1, 0.0018299416140223603265377496618L, 0.00207351663028123381764376786428L},
      {64, 31, 0.487824853668287783745522078573L, 0.0243454785045698601916826953674L},
  };
  for (const Ref& ref : refs) {
    QuadratureRule rule = gauss_legendre(ref.n);
    const double node = rule.nodes[ref.j], weight = rule.weights[ref.j];
    EXPECT_LE(std::fabs(node - ref.node), ulp(node)) << "n=" << ref.n << " j=" << ref.j;
    EXPECT_LE(std::fabs(weight - ref.weight), ulp(weight)) << "n=" << ref.n << " j=" << ref.j;
    // The mirrored node, measured from 1.
    const double upper = rule.nodes[ref.n - 1 - ref.j];
    EXPECT_LE(std::fabs(upper - (1.0L - ref.node)), ulp(upper)) << "n=" << ref.n << " j=" << ref.j;
  }
}

TEST(GaussLegendre, MapsToAnInterval) {
  // ∫_{−2}^{3} t^9 dt = (3^10 − 2^10)/10 and ∫ t^8 = (3^9 + 2^9)/9; 5 points are exact to degree 9.
  QuadratureRule rule = gauss_legendre(5, -2.0, 3.0);
  long double sum_w = 0, sum9 = 0, sum8 = 0;
  for (int j = 0; j < 5; ++j) {
    sum_w += rule.weights[j];
    sum9 += rule.weights[j] * std::pow(static_cast<long double>(rule.nodes[j]), 9);
    sum8 += rule.weights[j] * std::pow(static_cast<long double>(rule.nodes[j]), 8);
    if (j > 0) {
      EXPECT_LT(rule.nodes[j - 1], rule.nodes[j]);
    }
  }
  EXPECT_NEAR(static_cast<double>(sum_w), 5.0, 1e-14);
  EXPECT_NEAR(static_cast<double>(sum9 / 5802.5L), 1.0, 1e-14);
  EXPECT_NEAR(static_cast<double>(sum8 / ((19683.0L + 512.0L) / 9.0L)), 1.0, 1e-14);
  EXPECT_EQ(rule.nodes[2], 0.5);
}

TEST(GaussLegendre, ConvergesFastOnAnalyticIntegrands) {
  // ∫_0^1 e^t = e − 1, ∫_0^1 1/(1 + t²) = π/4.
  for (int n : {10, 20, 64}) {
    QuadratureRule rule = gauss_legendre(n);
    long double e = 0, atan = 0;
    for (int j = 0; j < n; ++j) {
      e += rule.weights[j] * std::exp(static_cast<long double>(rule.nodes[j]));
      atan += rule.weights[j] / (1 + static_cast<long double>(rule.nodes[j]) * rule.nodes[j]);
    }
    EXPECT_NEAR(static_cast<double>(e), std::expm1(1.0), 4e-16) << "n=" << n;
    if (n >= 20) {
      EXPECT_NEAR(static_cast<double>(atan), 0.78539816339744830962, 4e-16) << "n=" << n;
    }
  }
}

TEST(GaussLegendre, CachedRulesAreIdenticalAcrossCallsAndThreads) {
  QuadratureRule first = gauss_legendre(37);
  std::vector<QuadratureRule> results(4);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) threads.emplace_back([&results, k] { results[k] = gauss_legendre(37 + 2 * (k % 2)); });
  for (auto& t : threads) t.join();
  for (int k = 0; k < 4; k += 2) {
    EXPECT_EQ(results[k].nodes, first.nodes);
    EXPECT_EQ(results[k].weights, first.weights);
  }
  EXPECT_EQ(results[1].nodes, results[3].nodes);
  EXPECT_EQ(results[1].nodes, gauss_legendre(39).nodes);
}

TEST(GaussLegendre, RejectsBadArguments) {
  EXPECT_NE(error_message([] { gauss_legendre(0); }).find("bad number of nodes 0"), std::string::npos);
  EXPECT_NE(error_message([] { gauss_legendre(10001); }).find("[1, 10000]"), std::string::npos);
  EXPECT_NE(error_message([] { gauss_legendre(3, 1.0, 1.0); }).find("a < b"), std::string::npos);
  EXPECT_NE(error_message([] { gauss_legendre(3, 0.0, NAN); }).find("bad interval"), std::string::npos);
}

}  // namespace
}  // namespace pathkernel
