// Tests of kink location: find_root against long-double references,
// affine_crossings against hand-computed crossings, and breakpoints merging.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "pathkernel/error.h"
#include "../test_util.h"
#include "pathkernel/quadrature.h"

namespace pathkernel {
namespace {

using testing::error_message;

// The distance from x to the reference, in ulps of the reference.
double ulps_from(double x, long double reference) {
  const double r = static_cast<double>(reference);
  const double ulp = std::nextafter(std::fabs(r), INFINITY) - std::fabs(r);
  return static_cast<double>(std::fabs(x - reference) / ulp);
}

// ---------------------------------------------------------------- find_root

TEST(FindRoot, LocatesAReluKinkToWithinFourUlp) {
  // relu(a + b t) has its kink where the pre-activation a + b t crosses 0.
  const double a = -0.3, b = 1.7;
  const long double exact = -static_cast<long double>(a) / b;
  int evaluations = 0;
  const double t = find_root([&](double s) { return a + b * s; }, 0.0, 1.0, &evaluations);
  EXPECT_LE(ulps_from(t, exact), 4.0) << t << " vs " << static_cast<double>(exact);
  EXPECT_GE(evaluations, 3);
  EXPECT_LT(evaluations, 100);
}

TEST(FindRoot, LocatesRandomAffineKinksToWithinFourUlp) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> unit(0.0, 1.0), slope(0.01, 100.0);
  int worst_evaluations = 0;
  double worst_ulps = 0;
  for (int k = 0; k < 2000; ++k) {
    const double b = (k % 2 ? 1 : -1) * slope(rng), root = unit(rng);
    const double a = -b * root;  // the root of the rounded a + b t is near `root`
    const long double exact = -static_cast<long double>(a) / b;
    int evaluations = 0;
    const double t = find_root([&](double s) { return a + b * s; }, 0.0, 1.0, &evaluations);
    worst_ulps = std::max(worst_ulps, ulps_from(t, exact));
    worst_evaluations = std::max(worst_evaluations, evaluations);
  }
  EXPECT_LE(worst_ulps, 4.0);
  EXPECT_LT(worst_evaluations, 100);
}

TEST(FindRoot, LocatesTheRealRootOfACubic) {
  int evaluations = 0;
  const double t = find_root([](double s) { return s * s * s - 2.0; }, 1.0, 2.0, &evaluations);
  EXPECT_LE(ulps_from(t, std::cbrt(2.0L)), 4.0) << t;
  EXPECT_LT(evaluations, 100);
  // −(t − 0.4)(2.5t² − 4t + 4) decreases through 0.4, its only real root (the
  // quadratic factor has discriminant 16 − 40 < 0); t − 0.4 is exact near 0.4.
  const double u = find_root([](double s) { return -(s - 0.4) * (2.5 * s * s - 4 * s + 4); }, 0.0, 1.0,
                             &evaluations);
  EXPECT_LE(ulps_from(u, 0.4), 4.0) << u;
  EXPECT_LT(evaluations, 100);
}

TEST(FindRoot, ReturnsOneOfSeveralBracketedRoots) {
  const auto g = [](double s) { return (s - 0.2) * (s - 0.5) * (s - 0.9); };
  const double t = find_root(g, 0.0, 1.0);
  const double nearest = std::min({std::fabs(t - 0.2), std::fabs(t - 0.5), std::fabs(t - 0.9)});
  EXPECT_LE(nearest, 4e-16) << t;
}

TEST(FindRoot, HandlesMultipleRootsAndJumps) {
  // A root of multiplicity 5 (t − 0.4 is exact near 0.4, so the sign of g is exact).
  int evaluations = 0;
  double t = find_root([](double s) { return std::pow(s - 0.4, 5); }, 0.0, 1.0, &evaluations);
  EXPECT_LE(ulps_from(t, 0.4), 4.0) << t;
  EXPECT_LT(evaluations, 200);
  // A jump (an argmax switch is discontinuous): located to the last bits.
  t = find_root([](double s) { return s < 0.3 ? -1.0 : 2.0; }, 0.0, 1.0, &evaluations);
  EXPECT_LE(ulps_from(t, 0.3), 4.0) << t;
  EXPECT_LT(evaluations, 200);
}

TEST(FindRoot, ReturnsAnEndWhereGIsZero) {
  int evaluations = 0;
  EXPECT_EQ(find_root([](double s) { return s - 0.25; }, 0.25, 1.0, &evaluations), 0.25);
  EXPECT_EQ(evaluations, 1);
  EXPECT_EQ(find_root([](double s) { return s - 1.0; }, 0.25, 1.0, &evaluations), 1.0);
  EXPECT_EQ(evaluations, 2);
  EXPECT_EQ(find_root([](double s) { return s - 0.5; }, 0.5, 0.5), 0.5);
}

TEST(FindRoot, RejectsMissingSignChangesAndBadInput) {
  int evaluations = -1;
  std::string message = error_message([&] { find_root([](double s) { return s * s + 1.0; }, -1.0, 2.0, &evaluations); });
  EXPECT_NE(message.find("no sign change on [-1, 2]"), std::string::npos) << message;
  EXPECT_NE(message.find("g(-1) = 2"), std::string::npos) << message;
  EXPECT_EQ(evaluations, 2);  // counted even when it throws
  message = error_message([] { find_root([](double s) { return s < 0.5 ? -1.0 : NAN; }, 0.0, 1.0); });
  EXPECT_NE(message.find("expected a finite value"), std::string::npos) << message;
  message = error_message([] { find_root([](double s) { return s; }, 1.0, 0.0); });
  EXPECT_NE(message.find("a <= b"), std::string::npos) << message;
}

// ---------------------------------------------------------------- affine_crossings

TEST(AffineCrossings, FindsHandComputedCrossings) {
  // unit: 0 crosses at 1/2; 1 at 1/2 too (merged); 2 stays positive; 3 starts at 0
  // (t = 0, excluded); 4 ends at 0 (t = 1, excluded); 5 is constant; 6 crosses at
  // 3/4; 7 at 1/4; 8 is constant 0.
  const std::vector<double> p0 = {-1.0, 2.0, 3.0, 0.0, 1.0, -2.0, -3.0, 1.0, 0.0};
  const std::vector<double> p1 = {1.0, -2.0, 4.0, 1.0, 0.0, -2.0, 1.0, -3.0, 0.0};
  EXPECT_EQ(affine_crossings(p0, p1), (std::vector<double>{0.25, 0.5, 0.75}));
  EXPECT_TRUE(affine_crossings({}, {}).empty());
  EXPECT_TRUE(affine_crossings({0.0, 5.0}, {-1.0, 0.0}).empty());
  // Sign changes whose crossing rounds to t = 1 or t = 0 count as endpoint crossings.
  EXPECT_TRUE(affine_crossings({1.0, -1e-320}, {-1e-20, 1e10}).empty());
  EXPECT_EQ(affine_crossings({1.0, -1e-300}, {-1e-15, 1.0}).size(), 2u);
}

TEST(AffineCrossings, MatchesTheClosedFormToAnUlp) {
  std::mt19937_64 rng(11);
  std::normal_distribution<double> normal(0.0, 3.0);
  std::vector<double> p0(500), p1(500);
  std::vector<long double> expected;
  for (size_t u = 0; u < p0.size(); ++u) {
    p0[u] = normal(rng);
    p1[u] = normal(rng);
    if ((p0[u] < 0) != (p1[u] < 0)) expected.push_back(p0[u] / (static_cast<long double>(p0[u]) - p1[u]));
  }
  std::sort(expected.begin(), expected.end());
  const std::vector<double> crossings = affine_crossings(p0, p1);
  ASSERT_EQ(crossings.size(), expected.size());
  for (size_t k = 0; k < crossings.size(); ++k) {
    EXPECT_LE(ulps_from(crossings[k], expected[k]), 1.0) << k;
    if (k > 0) {
      EXPECT_LT(crossings[k - 1], crossings[k]);
    }
  }
  // The non-dyadic example: 0.3/1.7.
  EXPECT_LE(ulps_from(affine_crossings({-0.3}, {1.4}).at(0), 0.3L / 1.7L), 1.0);
}

TEST(AffineCrossings, RejectsMismatchedAndNonFiniteInput) {
  EXPECT_NE(error_message([] { affine_crossings({1.0, 2.0}, {1.0}); }).find("p0 has 2 units but p1 has 1"),
            std::string::npos);
  EXPECT_NE(error_message([] { affine_crossings({1.0, NAN}, {1.0, 2.0}); }).find("unit 1"), std::string::npos);
}

// ---------------------------------------------------------------- breakpoints

TEST(Breakpoints, ClipsSortsAndMerges) {
  EXPECT_EQ(breakpoints({}), (std::vector<double>{0.0, 1.0}));
  EXPECT_EQ(breakpoints({0.0, 1.0, -0.5, 1.5, NAN, INFINITY}), (std::vector<double>{0.0, 1.0}));
  EXPECT_EQ(breakpoints({0.5, 0.2, 0.5, 0.7}), (std::vector<double>{0.0, 0.2, 0.5, 0.7, 1.0}));
  // Default gap 1e-12: near-duplicates merge into the first; 2e-12 apart stay.
  EXPECT_EQ(breakpoints({0.7 + 2e-12, 0.2 + 1e-13, 0.2, 0.7, 1e-13, 1.0 - 1e-13}),
            (std::vector<double>{0.0, 0.2, 0.7, 0.7 + 2e-12, 1.0}));
  // A coarse gap: 0.05 is absorbed by 0, 0.35 by 0.3, 0.95 by 1; 0.42 is
  // 0.12 from the last kept break and stays.
  EXPECT_EQ(breakpoints({0.95, 0.42, 0.35, 0.3, 0.05}, 0.1), (std::vector<double>{0.0, 0.3, 0.42, 1.0}));
  // Duplicates merge even with a zero gap.
  EXPECT_EQ(breakpoints({0.5, 0.5, 0.25}, 0.0), (std::vector<double>{0.0, 0.25, 0.5, 1.0}));
}

TEST(Breakpoints, KeepsGapsAndCoversEveryPoint) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> unit(-0.1, 1.1);
  for (double gap : {1e-12, 1e-3, 0.05}) {
    std::vector<double> points(300);
    for (double& p : points) p = unit(rng);
    for (int k = 0; k < 50; ++k) points.push_back(points[k] + gap * 0.5);  // near-duplicates
    const std::vector<double> breaks = breakpoints(points, gap);
    ASSERT_GE(breaks.size(), 2u);
    EXPECT_EQ(breaks.front(), 0.0);
    EXPECT_EQ(breaks.back(), 1.0);
    for (size_t k = 1; k < breaks.size(); ++k) EXPECT_GE(breaks[k] - breaks[k - 1], gap) << k;
    for (double p : points) {
      if (!(p > 0.0 && p < 1.0)) continue;
      const auto it = std::lower_bound(breaks.begin(), breaks.end(), p);
      double nearest = *it - p;
      if (it != breaks.begin()) nearest = std::min(nearest, p - *(it - 1));
      EXPECT_LT(nearest, gap) << p;
    }
    for (size_t k = 1; k + 1 < breaks.size(); ++k) {  // interior breaks are input points
      EXPECT_NE(std::find(points.begin(), points.end(), breaks[k]), points.end()) << breaks[k];
    }
  }
}

TEST(Breakpoints, RejectsABadGap) {
  EXPECT_NE(error_message([] { breakpoints({0.5}, -1e-3); }).find("bad min_gap"), std::string::npos);
  EXPECT_NE(error_message([] { breakpoints({0.5}, NAN); }).find(">= 0"), std::string::npos);
}

}  // namespace
}  // namespace pathkernel
