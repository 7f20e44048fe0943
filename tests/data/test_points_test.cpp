// Tests of the test-point selection shared by verify, explain and the fuzz
// harness: counts, index lists, files of indices, and bad input.
#include <gtest/gtest.h>

#include <vector>

#include "../test_util.h"
#include "pathkernel/dataset.h"
#include "pathkernel/error.h"
#include "pathkernel/test_points.h"

namespace pathkernel {
namespace {

std::vector<int64_t> values(const torch::Tensor& t) {
  EXPECT_EQ(t.scalar_type(), torch::kLong);
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

TEST(TestPoints, CountsListsAndFilesSelectTheSamePoints) {
  testing::TempDir dir("points");
  TestPointSelection none, count, list, file;
  count.count = 3;
  list.indices = "0,1,2";
  file.file = dir.write("p.txt", "0 1\n\n2\n");
  const std::vector<int64_t> first3 = {0, 1, 2};
  EXPECT_EQ(values(none.resolve(10, 3)), first3);
  EXPECT_EQ(values(count.resolve(10, 100)), first3);
  EXPECT_EQ(values(list.resolve(10, 100)), first3);
  EXPECT_EQ(values(file.resolve(10, 100)), first3);
  // A count larger than the test set takes all of it; lists keep order and repeats.
  count.count = 50;
  EXPECT_EQ(values(count.resolve(4, 1)), std::vector<int64_t>({0, 1, 2, 3}));
  list.indices = "7,2,7";
  EXPECT_EQ(values(list.resolve(10, 1)), std::vector<int64_t>({7, 2, 7}));
}

TEST(TestPoints, BadSelectionsGetAClearError) {
  testing::TempDir dir("bad_points");
  struct Case {
    std::string indices, file_text;
    int64_t count, n_test;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {"0,12", "", 0, 10, "test index list: test index 12 is out of range [0, 10)"},
           {"-1", "", 0, 10, "test index -1 is out of range [0, 10)"},
           {"1,x", "", 0, 10, "'x' is not a test index"},
           {"1,,2", "", 0, 10, "'' is not a test index"},
           {"3.5", "", 0, 10, "'3.5' is not a test index"},
           {"", "4\n10\n", 0, 10, "test index 10 is out of range [0, 10)"},
           {"", "\n \n", 0, 10, "no test points selected"},
           {"", "", -2, 10, "the number of test points must be >= 1 (got -2)"},
           {"", "", 5, 0, "the data has no test points"},
           {"1", "", 5, 10, "choose the test points one way"},
       }) {
    TestPointSelection s;
    s.indices = c.indices;
    s.count = c.count;
    if (!c.file_text.empty()) s.file = dir.write("f.txt", c.file_text);
    EXPECT_CONTAINS(testing::error_message([&] { s.resolve(c.n_test, 1); }), c.message)
        << "indices '" << c.indices << "' count " << c.count;
  }
  TestPointSelection missing;
  missing.file = dir / "absent.txt";
  EXPECT_CONTAINS(testing::error_message([&] { missing.resolve(10, 1); }), "absent.txt");
}

TEST(TestPoints, BalancedSelectionsAreBalancedSubsetsOfTheLabels) {
  // 12 test points of 3 classes, ordered by class: the first 6 are classes 0 and 1 only.
  const torch::Tensor labels = torch::tensor({0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2}, torch::kLong);
  TestPointSelection balanced, none, first;
  balanced.balanced = 6;
  balanced.seed = 3;
  const std::vector<int64_t> b = values(balanced.resolve(labels, 100));
  EXPECT_EQ(b, values(balanced_subset(labels, 6, 3)));
  EXPECT_EQ(values(torch::bincount(labels.index_select(0, torch::tensor(b, torch::kLong)))),
            std::vector<int64_t>({2, 2, 2}));
  // Nothing set: the default count, balanced when asked, else the first ones.
  none.seed = 3;
  EXPECT_EQ(values(none.resolve(labels, 6, true)), b);
  EXPECT_EQ(values(none.resolve(labels, 6)), std::vector<int64_t>({0, 1, 2, 3, 4, 5}));
  // A count means the first N, whatever the default.
  first.count = 2;
  EXPECT_EQ(values(first.resolve(labels, 6, true)), std::vector<int64_t>({0, 1}));
  // More than there are takes all of them; without labels a balanced choice is refused.
  balanced.balanced = 50;
  EXPECT_EQ(values(balanced.resolve(labels, 1)).size(), 12u);
  EXPECT_CONTAINS(testing::error_message([&] { balanced.resolve(12, 1); }), "needs the test labels");
  balanced.count = 2;
  EXPECT_CONTAINS(testing::error_message([&] { balanced.resolve(labels, 1); }),
                  "choose the test points one way: a count, a class-balanced count, an index list or a file (got 2)");
}

}  // namespace
}  // namespace pathkernel
