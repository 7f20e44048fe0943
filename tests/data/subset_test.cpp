// Tests of balanced_subset: balance, short classes, ordering, determinism.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <vector>

#include "pathkernel/dataset.h"
#include "pathkernel/error.h"

namespace {

using pathkernel::balanced_subset;

torch::Tensor labels_of(const std::vector<int64_t>& values) {
  return torch::tensor(values, torch::kLong);
}

/// `per_class[c]` examples of class c, classes interleaved (0,1,2,0,1,2,...)
/// while they last, so that class membership is not a contiguous block.
torch::Tensor interleaved_labels(const std::vector<int64_t>& per_class) {
  std::vector<int64_t> values;
  std::vector<int64_t> left = per_class;
  bool any = true;
  while (any) {
    any = false;
    for (size_t c = 0; c < left.size(); ++c) {
      if (left[c] > 0) {
        values.push_back(static_cast<int64_t>(c));
        --left[c];
        any = true;
      }
    }
  }
  return labels_of(values);
}

/// How many chosen indices fall in each class.
std::map<int64_t, int64_t> class_counts(const torch::Tensor& labels, const torch::Tensor& index) {
  std::map<int64_t, int64_t> counts;
  const torch::Tensor chosen = labels.index_select(0, index);
  for (int64_t i = 0; i < chosen.numel(); ++i) ++counts[chosen[i].item<int64_t>()];
  return counts;
}

std::vector<int64_t> to_vector(const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

TEST(BalancedSubset, ExactBalanceWhenPossible) {
  const torch::Tensor y = interleaved_labels({100, 100, 100});
  const torch::Tensor index = balanced_subset(y, 30, 0);
  ASSERT_EQ(index.numel(), 30);
  const auto counts = class_counts(y, index);
  EXPECT_EQ(counts.at(0), 10);
  EXPECT_EQ(counts.at(1), 10);
  EXPECT_EQ(counts.at(2), 10);
}

TEST(BalancedSubset, RemainderGoesToLowerClassesFirst) {
  // n = 31 over three classes: ten full rounds (30) then class 0's turn.
  const torch::Tensor y = interleaved_labels({50, 50, 50});
  const auto counts = class_counts(y, balanced_subset(y, 31, 3));
  EXPECT_EQ(counts.at(0), 11);
  EXPECT_EQ(counts.at(1), 10);
  EXPECT_EQ(counts.at(2), 10);
}

TEST(BalancedSubset, ShortClassLeavesItsTurnsToOthers) {
  // Class sizes 2, 10, 10. Counting turns by hand for n = 13:
  //   round 0: c0 c1 c2 (3)   round 1: c0 c1 c2 (6)   c0 is now empty
  //   round 2: c1 c2 (8)      round 3: c1 c2 (10)     round 4: c1 c2 (12)
  //   round 5: c1 (13)
  // so class 0 gives 2, class 1 gives 6 and class 2 gives 5.
  const torch::Tensor y = interleaved_labels({2, 10, 10});
  const auto counts = class_counts(y, balanced_subset(y, 13, 11));
  EXPECT_EQ(counts.at(0), 2);
  EXPECT_EQ(counts.at(1), 6);
  EXPECT_EQ(counts.at(2), 5);
}

TEST(BalancedSubset, SortedUniqueAndInRange) {
  const torch::Tensor y = interleaved_labels({40, 7, 25, 3});
  for (int64_t n : {1, 5, 17, 40, 75}) {
    const torch::Tensor index = balanced_subset(y, n, 5);
    EXPECT_EQ(index.scalar_type(), torch::kLong);
    ASSERT_EQ(index.dim(), 1);
    const std::vector<int64_t> v = to_vector(index);
    ASSERT_EQ(static_cast<int64_t>(v.size()), n);
    for (size_t i = 0; i < v.size(); ++i) {
      EXPECT_GE(v[i], 0);
      EXPECT_LT(v[i], y.numel());
      if (i > 0) {
        EXPECT_LT(v[i - 1], v[i]) << "not strictly ascending at " << i << ", n=" << n;
      }
    }
  }
}

TEST(BalancedSubset, AllExamplesWhenNEqualsM) {
  const torch::Tensor y = interleaved_labels({4, 9, 1});
  EXPECT_TRUE(torch::equal(balanced_subset(y, 14, 2), torch::arange(14, torch::kLong)));
}

TEST(BalancedSubset, DeterministicForSeedAndVariesAcrossSeeds) {
  const torch::Tensor y = interleaved_labels({200, 200, 200});
  const torch::Tensor a = balanced_subset(y, 60, 42);
  const torch::Tensor b = balanced_subset(y, 60, 42);
  const torch::Tensor c = balanced_subset(y, 60, 43);
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_FALSE(torch::equal(a, c));
}

TEST(BalancedSubset, ArbitraryLabelValuesAreClasses) {
  const torch::Tensor y = labels_of({9, 5, 9, 5, 9, 5, 9, 5});
  const auto counts = class_counts(y, balanced_subset(y, 4, 0));
  EXPECT_EQ(counts.at(5), 2);
  EXPECT_EQ(counts.at(9), 2);
}

TEST(BalancedSubset, SizeOutOfRangeThrows) {
  const torch::Tensor y = interleaved_labels({3, 3});
  for (int64_t n : {0, -1, 7}) {
    try {
      balanced_subset(y, n, 0);
      ADD_FAILURE() << "no Error for n=" << n;
    } catch (const pathkernel::Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(std::to_string(n)), std::string::npos) << message;
      EXPECT_NE(message.find("[1, 6]"), std::string::npos) << message;
    }
  }
}

TEST(BalancedSubset, RejectsNonInt64Labels) {
  EXPECT_THROW(balanced_subset(torch::zeros({5}, torch::kInt32), 2, 0), pathkernel::Error);
  EXPECT_THROW(balanced_subset(torch::zeros({2, 3}, torch::kLong), 2, 0), pathkernel::Error);
}

}  // namespace
