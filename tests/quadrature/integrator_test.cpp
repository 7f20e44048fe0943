// The certified integrator against toy integrands with known kinks and
// known integrals: polynomials with jumps in the derivative.
#include "pathkernel/integrator.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "pathkernel/error.h"

namespace pathkernel {
namespace {

/// g(t) = t² + s |t − c| (a kink at c) on every point's segment, whose
/// certificate is Σ ω g against G(b) − G(a), G(t) = t³/3 + s (t − c)|t − c|/2.
/// Where its kinks are told is the test's choice.
class KinkedPolynomial : public Integrand {
 public:
  enum class Tell { Initially, WhenFailed, Never };

  KinkedPolynomial(std::vector<double> kinks, double slope, Tell tell)
      : c_(std::move(kinks)), s_(slope), tell_(tell), total_(c_.size(), 0.0) {}

  int64_t points() const override { return static_cast<int64_t>(c_.size()); }
  void integrate_fixed(const QuadratureRule& rule) override {
    fixed_nodes = static_cast<int64_t>(rule.nodes.size());
    for (size_t i = 0; i < c_.size(); ++i) {
      for (size_t j = 0; j < rule.nodes.size(); ++j) total_[i] += rule.weights[j] * g(i, rule.nodes[j]);
    }
  }
  std::vector<double> scales() override { return std::vector<double>(c_.size(), 1.0); }
  std::vector<std::vector<double>> initial_kinks() override {
    std::vector<std::vector<double>> out(c_.size());
    if (tell_ == Tell::Initially) {
      for (size_t i = 0; i < c_.size(); ++i) out[i] = {c_[i]};
    }
    return out;
  }
  int64_t exact_nodes() const override { return exact_; }
  int64_t max_rows() const override { return 64; }
  std::vector<double> certificate_gaps(const PieceRound& rd) override {
    sums_.assign(rd.np, 0.0);
    for (int64_t r = 0; r < rd.rows; ++r) sums_[rd.piece_of[r]] += rd.w[r] * g(rd.point[r], rd.t[r]);
    std::vector<double> gap(rd.np);
    for (int64_t p = 0; p < rd.np; ++p) {
      const size_t i = static_cast<size_t>(rd.end_point[2 * p]);
      const double len = rd.ends[2 * p + 1] - rd.ends[2 * p];
      gap[p] = std::abs(sums_[p] - (G(i, rd.ends[2 * p + 1]) - G(i, rd.ends[2 * p])) + offset_ * len);
    }
    evaluations += rd.rows;
    ++rounds;
    return gap;
  }
  std::vector<std::vector<double>> kinks_in(const PieceRound& rd, const std::vector<int64_t>& failed) override {
    std::vector<std::vector<double>> out(failed.size());
    failed_pieces += static_cast<int64_t>(failed.size());
    for (size_t f = 0; f < failed.size(); ++f) {
      const int64_t p = failed[f];
      const size_t i = static_cast<size_t>(rd.end_point[2 * p]);
      if (tell_ == Tell::WhenFailed && c_[i] > rd.ends[2 * p] && c_[i] < rd.ends[2 * p + 1]) out[f] = {c_[i]};
    }
    return out;
  }
  void accept(const PieceRound& rd, const std::vector<int64_t>& accepted) override {
    for (int64_t p : accepted) {
      total_[static_cast<size_t>(rd.end_point[2 * p])] += sums_[p];
    }
  }

  double exact(size_t i) const { return G(i, 1.0) - G(i, 0.0); }
  double total(size_t i) const { return total_[i]; }
  void set_exact_nodes(int64_t n) { exact_ = n; }
  void set_polynomial(double cubic) { cubic_ = cubic; }
  /// A certificate off by offset × the piece's length: it never closes.
  void set_offset(double offset) { offset_ = offset; }

  int64_t evaluations = 0, rounds = 0, failed_pieces = 0, fixed_nodes = 0;

 private:
  double g(size_t i, double t) const { return cubic_ * t * t * t + t * t + s_ * std::abs(t - c_[i]); }
  double G(size_t i, double t) const {
    return cubic_ * t * t * t * t / 4 + t * t * t / 3 + s_ * (t - c_[i]) * std::abs(t - c_[i]) / 2;
  }

  std::vector<double> c_;
  double s_;
  Tell tell_;
  std::vector<double> total_, sums_;
  int64_t exact_ = 0;
  double cubic_ = 0, offset_ = 0;
};

QuadratureOptions gauss(double tol) {
  QuadratureOptions q;
  q.tol = tol;
  return q;
}

bool contains(const std::vector<double>& v, double x) { return std::find(v.begin(), v.end(), x) != v.end(); }

TEST(Integrator, KinksToldInitiallyGiveExactPiecesInOneRound) {
  KinkedPolynomial f({0.3, 0.71875}, 3.0, KinkedPolynomial::Tell::Initially);
  const std::vector<std::vector<double>> breaks = integrate(f, gauss(1e-14));
  ASSERT_EQ(breaks.size(), 2u);
  EXPECT_EQ(breaks[0], (std::vector<double>{0.0, 0.3, 1.0}));
  EXPECT_EQ(breaks[1], (std::vector<double>{0.0, 0.71875, 1.0}));
  EXPECT_EQ(f.rounds, 1) << "a quadratic on each piece passes its certificate at once";
  EXPECT_EQ(f.failed_pieces, 0);
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(f.total(i), f.exact(i), 4e-16) << "point " << i;
}

TEST(Integrator, AFailedPieceIsSplitAtTheKinksFoundInside) {
  KinkedPolynomial f({0.3, 0.71875}, 3.0, KinkedPolynomial::Tell::WhenFailed);
  const std::vector<std::vector<double>> breaks = integrate(f, gauss(1e-14));
  EXPECT_EQ(breaks[0], (std::vector<double>{0.0, 0.3, 1.0}));
  EXPECT_EQ(breaks[1], (std::vector<double>{0.0, 0.71875, 1.0}));
  EXPECT_EQ(f.failed_pieces, 2) << "[0,1] of each point fails its certificate once";
  EXPECT_EQ(f.rounds, 2);
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(f.total(i), f.exact(i), 4e-16) << "point " << i;
}

TEST(Integrator, AnUntoldKinkIsHalvedDownToTheErrorBudget) {
  // Gauss on a piece of length h across |t − c| errs by about h²: halving
  // stops where that is below the piece's share tol·h of the budget.
  for (double tol : {1e-4, 1e-6, 1e-8}) {
    KinkedPolynomial f({1.0 / 3.0}, 3.0, KinkedPolynomial::Tell::Never);
    const std::vector<std::vector<double>> breaks = integrate(f, gauss(tol));
    EXPECT_GT(f.failed_pieces, 5) << "tol " << tol;
    EXPECT_GT(breaks[0].size(), 6u) << "tol " << tol;
    EXPECT_TRUE(contains(breaks[0], 0.5) && contains(breaks[0], 0.25)) << "midpoint splits, tol " << tol;
    // The error is the sum of the accepted pieces' gaps, each within its
    // share of tol (by length), so within tol in all.
    const double err = std::abs(f.total(0) - f.exact(0));
    EXPECT_LE(err, tol) << "tol " << tol;
    EXPECT_GT(err, 0.0) << "an untold kink is integrated approximately, tol " << tol;
  }
}

TEST(Integrator, TheDepthLimitEndsRefinement) {
  KinkedPolynomial f({1.0 / 3.0}, 3.0, KinkedPolynomial::Tell::Never);
  QuadratureOptions q = gauss(1e-30);
  q.max_depth = 4;
  const std::vector<std::vector<double>> breaks = integrate(f, q);
  // Only the pieces holding the kink fail, one per depth.
  EXPECT_EQ(f.failed_pieces, 4);
  EXPECT_EQ(breaks[0].size(), 6u);
  EXPECT_GT(std::abs(f.total(0) - f.exact(0)), 1e-12) << "accepted at the depth limit, not at the budget";
}

TEST(Integrator, ACertificateThatCannotCloseEndsInAnError) {
  // Every piece fails at every depth: without a bound the pieces would
  // double each round up to 2^max_depth.
  KinkedPolynomial f({0.25, 0.5}, 3.0, KinkedPolynomial::Tell::Initially);
  f.set_offset(1e-6);
  try {
    integrate(f, gauss(1e-12));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("test point 0: its certificate did not close"), std::string::npos) << what;
    EXPECT_NE(what.find("tolerance of 1e-12"), std::string::npos) << what;
  }
  EXPECT_LE(f.failed_pieces, 3 * 16384) << "ended soon after the bound";
}

TEST(Integrator, APieceFailingWithoutAKinkIsRetriedWithTheExactNodes) {
  // A cubic (no kink told, s = 0): 2 Gauss nodes integrate it exactly; a
  // short piece's adaptive rule takes 1, fails, and is retried with 2, not split.
  KinkedPolynomial f({0.5}, 0.0, KinkedPolynomial::Tell::Never);
  f.set_polynomial(5.0);
  f.set_exact_nodes(2);
  QuadratureOptions q = gauss(1e-14);
  q.min_nodes = 1;
  q.gauss_nodes = 1;
  const std::vector<std::vector<double>> breaks = integrate(f, q);
  EXPECT_EQ(breaks[0], (std::vector<double>{0.0, 1.0}));
  EXPECT_EQ(f.failed_pieces, 1);
  EXPECT_EQ(f.evaluations, 1 + 2) << "one node, then the two exact nodes";
  EXPECT_NEAR(f.total(0), f.exact(0), 4e-16);
}

TEST(Integrator, FixedRulesIntegrateOnce) {
  KinkedPolynomial f({0.3}, 3.0, KinkedPolynomial::Tell::Initially);
  QuadratureOptions q;
  q.spec = QuadratureSpec::parse("riemann:4");
  const std::vector<std::vector<double>> breaks = integrate(f, q);
  EXPECT_EQ(breaks[0], (std::vector<double>{0.0, 1.0}));
  EXPECT_EQ(f.fixed_nodes, 4);
  EXPECT_EQ(f.rounds, 0);
  q.spec = QuadratureSpec::parse("dpk");
  KinkedPolynomial d({0.3}, 3.0, KinkedPolynomial::Tell::Initially);
  integrate(d, q);
  EXPECT_EQ(d.fixed_nodes, 1);
}

TEST(Integrator, RoundsHoldAtMostMaxRowsNodes) {
  KinkedPolynomial f(std::vector<double>(20, 0.4), 3.0, KinkedPolynomial::Tell::Initially);
  integrate(f, gauss(1e-14));
  // 20 points × (6 + 7 nodes on [0, 0.4] and [0.4, 1]), 64 rows a round at most.
  EXPECT_GE(f.rounds, 5);
  for (size_t i = 0; i < 20; ++i) EXPECT_NEAR(f.total(i), f.exact(i), 4e-16) << "point " << i;
}

TEST(Integrator, PieceAcceptanceSharesTheBudgetByLength) {
  QuadratureOptions q = gauss(1e-10);
  const Piece half{0, 0.0, 0.5, 1}, quarter{0, 0.0, 0.25, 2};
  EXPECT_TRUE(piece_accepted(q, half, 0.5e-10, 1.0));
  EXPECT_FALSE(piece_accepted(q, quarter, 0.5e-10, 1.0));
  EXPECT_TRUE(piece_accepted(q, quarter, 0.5e-10, 2.0)) << "relative to the point's scale";
  // The floor: 8 ε of the scale, whatever the length.
  EXPECT_TRUE(piece_accepted(gauss(0.0), quarter, 8 * kMachineEps, 1.0));
  EXPECT_FALSE(piece_accepted(gauss(0.0), quarter, 9 * kMachineEps, 1.0));
  // A gap at rounding level that halving did not halve is rounding: up to
  // 16 ε at once, up to 64 ε only after kStuckDepth splits.
  Piece stuck = quarter;
  stuck.parent_gap = 20 * kMachineEps;
  EXPECT_TRUE(piece_accepted(gauss(0.0), stuck, 12 * kMachineEps, 1.0));
  stuck.parent_gap = 40 * kMachineEps;
  EXPECT_FALSE(piece_accepted(gauss(0.0), stuck, 30 * kMachineEps, 1.0)) << "tens of ε after 2 splits";
  stuck.depth = kStuckDepth;
  EXPECT_TRUE(piece_accepted(gauss(0.0), stuck, 30 * kMachineEps, 1.0));
  stuck.parent_gap = 80 * kMachineEps;
  EXPECT_FALSE(piece_accepted(gauss(0.0), stuck, 70 * kMachineEps, 1.0)) << "above 64 ε";
  EXPECT_FALSE(piece_accepted(gauss(0.0), stuck, 30 * kMachineEps, 1.0)) << "halved";
}

TEST(Integrator, SplitCutsAtInnerKinksElseAtTheMidpoint) {
  std::vector<Piece> out;
  split({3, 0.25, 0.75, 2}, 1.0, {0.1, 0.5, 0.75}, out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].b, 0.5);
  EXPECT_EQ(out[1].a, 0.5);
  EXPECT_EQ(out[1].depth, 3);
  EXPECT_EQ(out[1].point, 3);
  EXPECT_EQ(out[1].parent_gap, 1.0);
  out.clear();
  split({0, 0.0, 1.0, 0}, 1.0, {0.5 * kMinPiece}, out);
  ASSERT_EQ(out.size(), 2u) << "a cut within kMinPiece of an end is the midpoint";
  EXPECT_EQ(out[0].b, 0.5);
}

}  // namespace
}  // namespace pathkernel
