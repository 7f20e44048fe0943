// The metric statistics against values worked out by hand and against
// straightforward references written here.
#include "pathkernel/statistics.h"

#include <cmath>
#include <random>

#include "../test_util.h"

using namespace pathkernel;
using pathkernel::testing::error_message;

TEST(Statistics, AverageRanksGiveTiesTheirMeanRank) {
  struct Case {
    std::vector<double> v, ranks;
  };
  const std::vector<Case> cases = {
      {{10, 20, 20, 30}, {1, 2.5, 2.5, 4}},
      {{3, 3, 3}, {2, 2, 2}},
      {{5, -1, 2}, {3, 1, 2}},
      {{0.5, 0.1, 0.5, 0.1, 0.9}, {3.5, 1.5, 3.5, 1.5, 5}},
  };
  for (const Case& c : cases) EXPECT_EQ(average_ranks(c.v), c.ranks);
}

TEST(Statistics, PearsonAndSpearmanMatchHandComputedValues) {
  // Deviations (-1,0,1) and (-1,1,0): 1 / sqrt(2 * 2).
  EXPECT_DOUBLE_EQ(pearson({1, 2, 3}, {1, 3, 2}), 0.5);
  EXPECT_DOUBLE_EQ(pearson({1, 2, 3}, {-2, -4, -6}), -1.0);
  // No ties: 1 - 6 Σd² / (n(n²-1)) = 1 - 6·2/60.
  EXPECT_NEAR(spearman({1, 2, 3, 4}, {1, 3, 2, 4}), 0.8, 1e-15);
  // Ties: b's ranks are (1, 2, 3.5, 5, 3.5); rank deviations (-2..2) and
  // (-2, -1, .5, 2, .5): 8 / sqrt(10 · 9.5).
  EXPECT_NEAR(spearman({1, 2, 3, 4, 5}, {5, 6, 7, 8, 7}), 8 / std::sqrt(95.0), 1e-15);
  // Monotone but not linear: Spearman 1, Pearson below 1.
  EXPECT_DOUBLE_EQ(spearman({1, 2, 3, 4}, {1, 10, 100, 1000}), 1.0);
  EXPECT_LT(pearson({1, 2, 3, 4}, {1, 10, 100, 1000}), 0.9);
  // A constant sample has no correlation.
  EXPECT_TRUE(std::isnan(pearson({1, 1, 1}, {1, 2, 3})));
  EXPECT_TRUE(std::isnan(spearman({1, 2, 3}, {4, 4, 4})));
}

TEST(Statistics, SpearmanMatchesTheSquaredRankDifferenceFormulaWithoutTies) {
  std::mt19937_64 rng(7);
  for (int n : {2, 3, 5, 17, 100}) {
    std::vector<double> a(n), b(n);
    for (int i = 0; i < n; ++i) {
      a[i] = std::normal_distribution<double>()(rng);
      b[i] = 0.3 * a[i] + std::normal_distribution<double>()(rng);
    }
    const std::vector<double> ra = average_ranks(a), rb = average_ranks(b);
    double d2 = 0;
    for (int i = 0; i < n; ++i) d2 += (ra[i] - rb[i]) * (ra[i] - rb[i]);
    const double nn = n;
    EXPECT_NEAR(spearman(a, b), 1 - 6 * d2 / (nn * (nn * nn - 1)), 1e-12) << "n = " << n;
  }
}

TEST(Statistics, RocAucMatchesHandComputedValuesAndThePairCount) {
  // Positives 0.9 (above all 3 negatives) and 0.7 (above 2 of 3): 5/6.
  EXPECT_DOUBLE_EQ(roc_auc({0.9, 0.8, 0.7, 0.6, 0.5}, {true, false, true, false, false}), 5.0 / 6.0);
  // A tie with a negative counts one half: (0.5 + 1) / 2.
  EXPECT_DOUBLE_EQ(roc_auc({1, 1, 0}, {true, false, false}), 0.75);
  EXPECT_DOUBLE_EQ(roc_auc({3, 2, 1}, {true, true, false}), 1.0);
  EXPECT_DOUBLE_EQ(roc_auc({3, 2, 1}, {false, true, true}), 0.0);
  // Against counting every (positive, negative) pair, with ties from rounding.
  std::mt19937_64 rng(3);
  for (int n : {2, 9, 50}) {
    std::vector<double> s(n);
    std::vector<bool> pos(n);
    for (int i = 0; i < n; ++i) {
      s[i] = std::round(4 * std::normal_distribution<double>()(rng)) / 4;
      pos[i] = i % 3 == 0;
    }
    pos[1] = false;
    double wins = 0, pairs = 0;
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) {
        if (!pos[i] || pos[j]) continue;
        pairs += 1;
        wins += s[i] > s[j] ? 1.0 : s[i] == s[j] ? 0.5 : 0.0;
      }
    }
    EXPECT_NEAR(roc_auc(s, pos), wins / pairs, 1e-15) << "n = " << n;
  }
}

TEST(Statistics, MeanFiniteSkipsUndefinedValues) {
  EXPECT_DOUBLE_EQ(mean_finite({1, NAN, 3}), 2.0);
  EXPECT_TRUE(std::isnan(mean_finite({NAN})));
  EXPECT_TRUE(std::isnan(mean_finite({})));
}

TEST(Statistics, MedianAndSlopeMatchHandComputedValues) {
  EXPECT_DOUBLE_EQ(median_finite({5, 1, NAN, 3}), 3.0);
  EXPECT_DOUBLE_EQ(median_finite({4, 1, 3, 2}), 2.5);
  EXPECT_TRUE(std::isnan(median_finite({NAN})));
  // Σxy / Σx² = (1·2 + 2·3 + 3·7) / (1 + 4 + 9) = 29 / 14.
  EXPECT_DOUBLE_EQ(slope_through_origin({1, 2, 3}, {2, 3, 7}), 29.0 / 14.0);
  EXPECT_DOUBLE_EQ(slope_through_origin({1, -2}, {0.5, -1}), 0.5);
  EXPECT_TRUE(std::isnan(slope_through_origin({0, 0}, {1, 2})));
}

TEST(Statistics, BadInputIsRefusedWithTheValue) {
  EXPECT_CONTAINS(error_message([] { pearson({1, 2}, {1, 2, 3}); }), "differ in size (2 and 3)");
  EXPECT_CONTAINS(error_message([] { spearman({1}, {1}); }), "at least 2 pairs (got 1)");
  EXPECT_CONTAINS(error_message([] { spearman({1, NAN}, {1, 2}); }), "value 1 is nan");
  EXPECT_CONTAINS(error_message([] { roc_auc({1, 2}, {true, true}); }), "0 negatives");
  EXPECT_CONTAINS(error_message([] { roc_auc({1, 2}, {true}); }), "2 scores but 1 labels");
  EXPECT_CONTAINS(error_message([] { slope_through_origin({1, 2}, {1}); }), "differ in size (2 and 1)");
}
