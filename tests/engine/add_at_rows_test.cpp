// add_at_rows against LibTorch's index_add_ along the second axis, bit for bit.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "../../src/engine/add_at_rows.h"

namespace pathkernel {
namespace {

/// Both ways from the same start; equal bits expected.
void expect_as_index_add(torch::Tensor target, const torch::Tensor& index, const torch::Tensor& source) {
  torch::Tensor reference = target.clone();
  reference.index_add_(1, index, source);
  add_at_rows(target, index, source);
  EXPECT_TRUE(torch::equal(target, reference)) << "max difference "
                                               << (target - reference).abs().max().item<double>();
}

TEST(AddAtRows, AddsRowsInOrderAsIndexAdd) {
  torch::manual_seed(3);
  const torch::Tensor start = torch::randn({5, 40, 3}, torch::kFloat64);
  // Repeated rows: their sums depend on the order of the adds.
  const torch::Tensor index = torch::tensor(std::vector<int64_t>{7, 0, 39, 7, 12, 7, 0}, torch::kLong);
  const torch::Tensor source = torch::randn({5, 7, 3}, torch::kFloat64) * 1e8;
  expect_as_index_add(start.clone(), index, source);
}

TEST(AddAtRows, TakesNarrowedTargetsAndRowsOfSeveralAxes) {
  torch::manual_seed(4);
  const torch::Tensor whole = torch::randn({9, 30, 4, 2}, torch::kFloat64);
  const torch::Tensor index = torch::randint(0, 30, {50}, torch::kLong);
  const torch::Tensor source = torch::randn({4, 50, 4, 2}, torch::kFloat64);
  torch::Tensor expected = whole.clone();
  expected.narrow(0, 3, 4).index_add_(1, index, source);
  torch::Tensor got = whole.clone();
  add_at_rows(got.narrow(0, 3, 4), index, source);  // the narrowed view writes into got
  EXPECT_TRUE(torch::equal(got, expected));
}

TEST(AddAtRows, OtherLayoutsAndDtypesAsIndexAdd) {
  torch::manual_seed(5);
  const torch::Tensor index = torch::tensor(std::vector<int64_t>{2, 1, 2}, torch::kLong);
  // A transposed source (rows not contiguous), and float32.
  expect_as_index_add(torch::randn({3, 4, 6}, torch::kFloat64), index,
                      torch::randn({3, 6, 3}, torch::kFloat64).transpose(1, 2));
  expect_as_index_add(torch::randn({3, 4, 6}, torch::kFloat32), index, torch::randn({3, 3, 6}, torch::kFloat32));
}

TEST(AddAtRows, RefusesRowsOutOfRange) {
  torch::Tensor target = torch::zeros({2, 4, 3}, torch::kFloat64);
  const torch::Tensor before = target.clone();
  const torch::Tensor index = torch::tensor(std::vector<int64_t>{1, 4}, torch::kLong);
  try {
    add_at_rows(target, index, torch::ones({2, 2, 3}, torch::kFloat64));
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("row 4 at index position 1 is out of range: the target has 4 rows"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(torch::equal(target, before));  // nothing added before the error
  EXPECT_THROW(add_at_rows(target, index.narrow(0, 0, 1), torch::ones({2, 2, 3}, torch::kFloat64)), std::exception);
}

}  // namespace
}  // namespace pathkernel
