// Tests of the composite Gauss–Legendre, Riemann and left-point rules and of
// --quadrature spec parsing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "pathkernel/error.h"
#include "../test_util.h"
#include "pathkernel/quadrature.h"

namespace pathkernel {
namespace {

using testing::error_message;

long double apply(const QuadratureRule& rule, const std::function<long double(long double)>& f) {
  long double sum = 0.0L;
  for (size_t j = 0; j < rule.nodes.size(); ++j) sum += rule.weights[j] * f(rule.nodes[j]);
  return sum;
}

// ---------------------------------------------------------------- composite

TEST(CompositeGaussLegendre, IsExactOnAKinkWhenSplitThere) {
  const double c = 0.3;
  const auto kink = [c](long double t) { return std::fabs(t - c); };
  const long double exact = (static_cast<long double>(c) * c + (1.0L - c) * (1.0L - c)) / 2;  // 0.29
  EXPECT_NEAR(static_cast<double>(exact), 0.29, 1e-16);

  QuadratureRule split = composite_gauss_legendre(1, {0.0, c, 1.0});
  ASSERT_EQ(split.nodes.size(), 2u);
  EXPECT_NEAR(static_cast<double>(apply(split, kink)), static_cast<double>(exact), 1e-15);
  for (int n = 2; n <= 5; ++n) {
    EXPECT_NEAR(static_cast<double>(apply(composite_gauss_legendre(n, {0.0, c, 1.0}), kink)),
                static_cast<double>(exact), 1e-15)
        << "n=" << n;
  }

  // Without the break, Gauss–Legendre converges only algebraically.
  for (int n = 1; n <= 20; ++n) {
    const double error = std::fabs(static_cast<double>(apply(gauss_legendre(n), kink) - exact));
    EXPECT_GT(error, 1e-5) << "n=" << n;
  }
}

TEST(CompositeGaussLegendre, IsExactOnPiecewiseCubicsWithTwoPointsPerPiece) {
  // f = t² + 4·max(t − 0.3, 0)³ − max(0.8 − t, 0)³ has kinks in f'' at 0.3 and 0.8.
  const auto f = [](long double t) {
    const long double p = std::max(t - 0.3L, 0.0L), q = std::max(0.8L - t, 0.0L);
    return t * t + 4 * p * p * p - q * q * q;
  };
  const long double exact = 1.0L / 3 + std::pow(0.7L, 4) - std::pow(0.8L, 4) / 4;
  QuadratureRule rule = composite_gauss_legendre(2, {0.0, 0.3, 0.8, 1.0});
  ASSERT_EQ(rule.nodes.size(), 6u);
  EXPECT_NEAR(static_cast<double>(apply(rule, f)), static_cast<double>(exact), 1e-15);
  for (size_t j = 1; j < rule.nodes.size(); ++j) EXPECT_LT(rule.nodes[j - 1], rule.nodes[j]);
  long double sum = 0;
  for (double w : rule.weights) sum += w;
  EXPECT_NEAR(static_cast<double>(sum), 1.0, 1e-15);
}

TEST(CompositeGaussLegendre, IntegratesAReluLayerExactlyAtItsKinks) {
  // Σ_u c_u relu(p_u(t)) with affine p_u: split at the crossings, each piece is
  // linear, so one node per piece is exact. Closed form per unit: the mean of
  // the ends when neither is negative, else the positive triangle p+²/(2|p1 − p0|).
  const std::vector<double> p0 = {-0.7, 1.3, 0.4, -2.0, 0.25, -0.1, 3.0};
  const std::vector<double> p1 = {0.9, -0.2, 1.1, -0.5, -1.75, 0.0, 3.0};
  const std::vector<double> c = {1.0, -2.0, 0.5, 3.0, 1.5, 1.0, -0.25};
  long double exact = 0;
  for (size_t u = 0; u < p0.size(); ++u) {
    const long double a = p0[u], b = p1[u];
    long double integral;
    if (a >= 0 && b >= 0) {
      integral = (a + b) / 2;
    } else if (a <= 0 && b <= 0) {
      integral = 0;
    } else {
      const long double pos = std::max(a, b);
      integral = pos * pos / (2 * std::fabs(b - a));
    }
    exact += c[u] * integral;
  }
  const auto f = [&](long double t) {
    long double sum = 0;
    for (size_t u = 0; u < p0.size(); ++u) {
      sum += c[u] * std::max(0.0L, p0[u] + t * (static_cast<long double>(p1[u]) - p0[u]));
    }
    return sum;
  };
  const std::vector<double> breaks = breakpoints(affine_crossings(p0, p1));
  ASSERT_EQ(breaks.size(), 5u);  // 0, three crossings, 1
  EXPECT_NEAR(static_cast<double>(apply(composite_gauss_legendre(1, breaks), f)),
              static_cast<double>(exact), 1e-15);
  EXPECT_GT(std::fabs(static_cast<double>(apply(gauss_legendre(3), f) - exact)), 1e-4);
}

TEST(CompositeGaussLegendre, RejectsBadBreaks) {
  EXPECT_NE(error_message([] { composite_gauss_legendre(2, {0.0}); }).find("at least 2 breaks (got 1)"),
            std::string::npos);
  EXPECT_NE(error_message([] { composite_gauss_legendre(2, {0.0, 0.5, 0.5, 1.0}); }).find("strictly ascending"),
            std::string::npos);
  EXPECT_NE(error_message([] { composite_gauss_legendre(2, {0.0, 0.7, 0.4, 1.0}); }).find("strictly ascending"),
            std::string::npos);
  EXPECT_NE(error_message([] { composite_gauss_legendre(2, {0.0, NAN, 1.0}); }).find("finite"), std::string::npos);
  EXPECT_NE(error_message([] { composite_gauss_legendre(0, {0.0, 1.0}); }).find("bad number of nodes"),
            std::string::npos);
}

// ---------------------------------------------------------------- Riemann

TEST(Riemann, HasLeftEndpointNodesAndEqualWeights) {
  QuadratureRule rule = riemann(4);
  EXPECT_EQ(rule.nodes, (std::vector<double>{0.0, 0.25, 0.5, 0.75}));
  EXPECT_EQ(rule.weights, (std::vector<double>(4, 0.25)));
  QuadratureRule r3 = riemann(3);
  EXPECT_EQ(r3.nodes[1], 1.0 / 3);
  EXPECT_EQ(r3.nodes[2], 2.0 / 3);
  EXPECT_EQ(riemann(100).nodes.size(), 100u);
  EXPECT_NE(error_message([] { riemann(0); }).find("T >= 1"), std::string::npos);
}

TEST(Riemann, ConvergesAtFirstOrder) {
  // Left sums of e^t on [0,1] underestimate by (e − 1)/(2T) + O(1/T²).
  const long double exact = std::expm1(1.0L);
  const auto error = [&](int T) {
    return static_cast<double>(exact - apply(riemann(T), [](long double t) { return std::exp(t); }));
  };
  for (int T : {50, 100, 200}) {
    const double ratio = error(2 * T) / error(T);
    EXPECT_GT(ratio, 0.45) << "T=" << T;
    EXPECT_LT(ratio, 0.55) << "T=" << T;
    EXPECT_NEAR(error(T) * 2 * T / static_cast<double>(exact), 1.0, 0.02) << "T=" << T;
  }
}

TEST(Riemann, LeftPointIsRiemannWithOneNode) {
  QuadratureRule dpk = left_point();
  QuadratureRule r1 = riemann(1);
  EXPECT_EQ(dpk.nodes, (std::vector<double>{0.0}));
  EXPECT_EQ(dpk.weights, (std::vector<double>{1.0}));
  EXPECT_EQ(dpk.nodes, r1.nodes);
  EXPECT_EQ(dpk.weights, r1.weights);
}

// ---------------------------------------------------------------- spec

TEST(QuadratureSpec, ParsesValidSpecsAndRoundTrips) {
  struct Case {
    std::string text;
    QuadratureSpec::Kind kind;
    int nodes;
  };
  const Case cases[] = {
      {"gauss", QuadratureSpec::Kind::Gauss, 0},
      {"riemann:100", QuadratureSpec::Kind::Riemann, 100},
      {"riemann:1", QuadratureSpec::Kind::Riemann, 1},
      {"riemann:100000", QuadratureSpec::Kind::Riemann, 100000},
      {"dpk", QuadratureSpec::Kind::Dpk, 0},
  };
  for (const Case& c : cases) {
    QuadratureSpec spec = QuadratureSpec::parse(c.text);
    EXPECT_EQ(spec.kind, c.kind) << c.text;
    EXPECT_EQ(spec.nodes, c.nodes) << c.text;
    EXPECT_EQ(spec.str(), c.text);
    EXPECT_EQ(QuadratureSpec::parse(spec.str()).str(), c.text);
  }
  EXPECT_EQ(QuadratureSpec::parse("riemann:007").str(), "riemann:7");
  EXPECT_EQ(QuadratureSpec().str(), "gauss");  // the default
}

TEST(QuadratureSpec, RejectsBadSpecsWithHelpfulMessages) {
  const std::string range = "T must be an integer in [1, 100000]";
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"riemann", {"'riemann'", range}},
      {"riemann:", {"''", range}},
      {"riemann:0", {"'0'", range}},
      {"riemann:x", {"'x'", range}},
      {"riemann:-3", {"'-3'", range}},
      {"riemann:+5", {"'+5'", range}},
      {"riemann: 5", {"' 5'", range}},
      {"riemann:2.5", {"'2.5'", range}},
      {"riemann:100001", {"'100001'", range}},
      {"riemann:99999999999999999999", {"'99999999999999999999'", range}},
      {"simpson", {"unknown quadrature 'simpson'", "gauss, riemann:T, dpk"}},
      {"", {"unknown quadrature ''", "gauss, riemann:T, dpk"}},
      {"Gauss", {"unknown quadrature 'Gauss'", "gauss, riemann:T, dpk"}},
      {"gauss:5", {"unknown quadrature 'gauss:5'", "gauss, riemann:T, dpk"}},
  };
  for (const auto& [text, parts] : cases) {
    const std::string message = error_message([&] { QuadratureSpec::parse(text); });
    for (const std::string& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos)
          << "spec \"" << text << "\": expected \"" << part << "\" in: " << message;
    }
  }
}

}  // namespace
}  // namespace pathkernel
