// The one-rank world (no launcher, as in this test binary) and the split of
// work by cost; the collectives of several ranks are exercised under mpirun
// by across_ranks_test.cpp.
#include <gtest/gtest.h>

#include <numeric>

#include "../test_util.h"
#include "pathkernel/distributed.h"

namespace pathkernel {
namespace {

TEST(Communicator, AloneIsOneRankWhoseCollectivesReturnTheirInput) {
  const Communicator& world = Communicator::world();
  EXPECT_EQ(world.rank(), 0);
  EXPECT_EQ(world.size(), 1);
  EXPECT_TRUE(world.root());
  EXPECT_EQ(world.local_size(), 1);
  EXPECT_EQ(world.broadcast("abc"), "abc");
  EXPECT_EQ(world.sum(int64_t{7}), 7);
  EXPECT_EQ(world.max(2.5), 2.5);
  EXPECT_EQ(world.all_gather(1.5), std::vector<double>{1.5});
  const torch::Tensor t = torch::arange(12, torch::kFloat64).view({3, 4});
  EXPECT_TRUE(torch::equal(world.gather_rows(t), t));
  const torch::Tensor empty = torch::zeros({0, 4}, torch::kLong);
  EXPECT_EQ(world.gather_rows(empty).sizes(), empty.sizes());
}

TEST(Communicator, CheckThrowsTheAgreedErrorOnlyWhenThereIsOne) {
  const Communicator& world = Communicator::world();
  EXPECT_NO_THROW(world.check(""));
  try {
    world.check("test index 99 is out of range [0, 10)");
    ADD_FAILURE() << "expected an AgreedError";
  } catch (const AgreedError& e) {
    EXPECT_STREQ(e.what(), "test index 99 is out of range [0, 10)");
  }
  // agree() turns an exception of the block into the agreed error.
  EXPECT_THROW(world.agree([] { throw Error("bad run"); }), AgreedError);
  EXPECT_NO_THROW(world.agree([] {}));
}

TEST(Communicator, CollectivesRefuseTensorsTheyCannotSend) {
  const Communicator& world = Communicator::world();
  EXPECT_CONTAINS(testing::error_message([&] { world.gather_rows(torch::zeros({2}, torch::kFloat32)); }),
                  "tensors travel as float64 or int64 (got Float)");
  EXPECT_CONTAINS(testing::error_message([&] { world.gather_rows(torch::tensor(1.0, torch::kFloat64)); }),
                  "needs a row dimension");
  EXPECT_CONTAINS(testing::error_message([&] { world.send(torch::Tensor(), 1); }), "undefined");
  // Alone, there is no one to send to or receive from.
  EXPECT_CONTAINS(testing::error_message([&] { world.send(torch::zeros({2}, torch::kFloat64), 0); }),
                  "send: rank 0 is not another rank of this job (rank 0 of 1)");
  torch::Tensor into = torch::zeros({2}, torch::kFloat64);
  EXPECT_CONTAINS(testing::error_message([&] { world.receive(into, 1); }),
                  "receive: rank 1 is not another rank of this job (rank 0 of 1)");
}

/// The slow reference: every contiguous split into `parts`, the one whose
/// largest share is smallest.
double best_max_share(const std::vector<double>& c, int parts) {
  const int n = static_cast<int>(c.size());
  std::vector<double> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + c[i];
  // best[p][i]: the smallest largest share of the first i items in p parts.
  std::vector<std::vector<double>> best(parts + 1, std::vector<double>(n + 1, 1e300));
  best[0][0] = 0;
  for (int p = 1; p <= parts; ++p) {
    for (int i = 0; i <= n; ++i) {
      for (int j = 0; j <= i; ++j) best[p][i] = std::min(best[p][i], std::max(best[p - 1][j], prefix[i] - prefix[j]));
    }
  }
  return best[parts][n];
}

TEST(SplitByCost, SharesAreContiguousCoverEveryItemAndStayNearTheBest) {
  struct Case {
    std::vector<double> costs;
    int parts;
  };
  const std::vector<Case> cases = {
      {{1, 1, 1, 1, 1, 1, 1, 1}, 2}, {{1, 1, 1, 1, 1, 1, 1, 1}, 3}, {{5, 1, 1, 1, 1, 1}, 2},
      {{1, 1, 1, 1, 1, 9}, 2},       {{3, 3}, 4},                   {{}, 3},
      {{0, 0, 0}, 2},                {{2, 7, 1, 8, 2, 8, 1, 8}, 3}, {{94, 2, 37, 5, 60, 1, 12}, 4},
  };
  for (const Case& c : cases) {
    const std::vector<int64_t> b = split_by_cost(c.costs, c.parts);
    ASSERT_EQ(b.size(), static_cast<size_t>(c.parts) + 1);
    EXPECT_EQ(b.front(), 0);
    EXPECT_EQ(b.back(), static_cast<int64_t>(c.costs.size()));
    const double total = std::accumulate(c.costs.begin(), c.costs.end(), 0.0);
    const double largest = c.costs.empty() ? 0 : *std::max_element(c.costs.begin(), c.costs.end());
    double worst = 0;
    for (int r = 0; r < c.parts; ++r) {
      ASSERT_LE(b[r], b[r + 1]) << "shares must not overlap";
      const double share = std::accumulate(c.costs.begin() + b[r], c.costs.begin() + b[r + 1], 0.0);
      worst = std::max(worst, share);
      // No share exceeds its part by more than one item's cost.
      EXPECT_LE(share, total / c.parts + largest + 1e-12) << "part " << r << " of " << c.parts;
    }
    if (!c.costs.empty() && total > 0) {
      EXPECT_LE(worst, best_max_share(c.costs, c.parts) + largest) << c.parts << " parts";
    }
  }
  // Equal costs: counts differ by at most one; no costs at all: equal counts,
  // the extra items to the first ranks.
  EXPECT_EQ(split_by_cost(std::vector<double>(7, 1.0), 3), (std::vector<int64_t>{0, 2, 5, 7}));
  EXPECT_EQ(split_by_cost(std::vector<double>(2, 0.0), 3), (std::vector<int64_t>{0, 1, 2, 2}));
}

TEST(SplitByCost, RefusesBadInput) {
  EXPECT_CONTAINS(testing::error_message([] { split_by_cost({1, 2}, 0); }),
                  "the number of parts must be >= 1 (got 0)");
  EXPECT_CONTAINS(testing::error_message([] { split_by_cost({1, -2}, 2); }), "costs must be >= 0 (got -2)");
}

}  // namespace
}  // namespace pathkernel
