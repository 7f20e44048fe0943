// Tests of the test-point selection shared by verify, explain and the fuzz
// harness: counts, index lists, files of indices, and bad input.
#include <gtest/gtest.h>

#include <random>
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
           {"-1", "", 0, 10, "test index list: test index -1 is negative (expected indices in [0, 10))"},
           {"1,x", "", 0, 10, "test index list: 'x' is not a test index or range (expected an index such as 5"},
           {"1,,2", "", 0, 10, "test index list: item 2 of '1,,2' is empty"},
           {"3.5", "", 0, 10, "'3.5' is not a test index or range"},
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

TEST(TestPoints, RangesExpandInTheOrderGiven) {
  struct Case {
    std::string list;
    std::vector<int64_t> expect;
  };
  for (const Case& c : std::vector<Case>{
           {"0-7,12,20-23", {0, 1, 2, 3, 4, 5, 6, 7, 12, 20, 21, 22, 23}},
           {"5-5", {5}},
           {"3,1-2,2", {3, 1, 2, 2}},  // order and repeats kept
           {"28-29,0", {28, 29, 0}},   // up to the last index
           {" 4 - 6 , 9", {4, 5, 6, 9}},  // spaces around items and dashes
       }) {
    TestPointSelection s;
    s.indices = c.list;
    EXPECT_EQ(values(s.resolve(30, 1)), c.expect) << "'" << c.list << "'";
  }
  // A file takes ranges too, between any separators.
  testing::TempDir dir("ranges");
  TestPointSelection file;
  file.file = dir.write("p.txt", "0-2\n\n7 10-11,4\n");
  EXPECT_EQ(values(file.resolve(30, 1)), std::vector<int64_t>({0, 1, 2, 7, 10, 11, 4}));
}

// Random lists of indices and ranges against the plain loop that expands them.
TEST(TestPoints, RandomRangeListsMatchTheirExpansion) {
  for (uint64_t seed = 0; seed < 50; ++seed) {
    std::mt19937_64 rng(seed);
    const int64_t n_test = 1 + static_cast<int64_t>(rng() % 40);
    std::string list;
    std::vector<int64_t> expect;
    const int items = 1 + static_cast<int>(rng() % 6);
    for (int k = 0; k < items; ++k) {
      const int64_t a = static_cast<int64_t>(rng() % n_test), b = static_cast<int64_t>(rng() % n_test);
      const int64_t lo = std::min(a, b), hi = std::max(a, b);
      if (!list.empty()) list += ",";
      if (rng() % 2 == 0) {
        list += std::to_string(lo);
        expect.push_back(lo);
      } else {
        list += std::to_string(lo) + "-" + std::to_string(hi);
        for (int64_t i = lo; i <= hi; ++i) expect.push_back(i);
      }
    }
    EXPECT_EQ(values(parse_test_index_list(list, n_test, "list")), expect)
        << "seed " << seed << ": '" << list << "' of " << n_test;
  }
}

TEST(TestPoints, BadRangesGetAClearError) {
  struct Case {
    std::string list;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {"7-3", "test index list: range '7-3' is reversed: it starts at 7, after its end 3 (expected START-END "
                   "with START <= END, e.g. 3-7)"},
           {"0,5-10", "test index list: range '5-10': index 10 is out of range [0, 10)"},
           {"12-15", "range '12-15': index 12 is out of range [0, 10)"},
           {"3--1", "test index list: range '3--1': index -1 is negative (expected indices in [0, 10))"},
           {"-3-5", "range '-3-5': index -3 is negative"},
           {"-7", "test index -7 is negative"},
           {"5-", "test index list: range '5-' has no end (expected an index such as 5 or an inclusive range such as "
                  "0-7)"},
           {"1- ", "range '1-' has no end"},
           {"2,-", "'-' is not a test index or range"},
           {"1-2-3", "'1-2-3' is not a test index or range"},
           {"a-3", "'a-3' is not a test index or range"},
           {"1-b", "'1-b' is not a test index or range"},
           {"1..3", "'1..3' is not a test index or range"},
           {"+4", "'+4' is not a test index or range"},
           {"0x3", "'0x3' is not a test index or range"},
           {"99999999999999999999", "test index 99999999999999999999 is out of range [0, 10)"},
           {"0-99999999999999999999", "range '0-99999999999999999999': index 99999999999999999999 is out of range"},
           {"-99999999999999999999", "test index -99999999999999999999 is negative"},
           {"1,2,", "item 3 of '1,2,' is empty"},
           {",", "item 1 of ',' is empty"},
           {" ", "item 1 of ' ' is empty"},
       }) {
    EXPECT_CONTAINS(testing::error_message([&] { parse_test_index_list(c.list, 10, "test index list"); }), c.message)
        << "'" << c.list << "'";
  }
  // In a file, runs of separators are one; an empty file selects nothing.
  EXPECT_CONTAINS(testing::error_message([&] { parse_test_index_list(" \n,\n", 10, "file 'f'", true); }),
                  "file 'f': no test points selected (expected indices and ranges such as 0-7,12,20-23)");
  EXPECT_CONTAINS(testing::error_message([&] { parse_test_index_list("0 - 3", 10, "file 'f'", true); }),
                  "file 'f': '-' is not a test index or range");
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
