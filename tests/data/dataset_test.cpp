// Tests of a split's inputs as held (dataset.h's HeldInputs and the
// accessors built on it): the same rows, bit for bit, whether the split is
// held whole or as codes, against the rows of the whole split taken directly.
#include "pathkernel/dataset.h"

#include <gtest/gtest.h>

#include "../test_util.h"

namespace pathkernel {
namespace {

using testing::same_bits;

/// A split of 6 inputs of shape [2, 3], held whole in `data` and as codes in
/// `coded`, the codes' table in float64.
struct Splits {
  Dataset data, coded;
  torch::Tensor whole;
};

Splits splits() {
  torch::manual_seed(5);
  const torch::Tensor codes = torch::randint(0, 256, {6, 2, 3}, torch::kUInt8);
  const torch::Tensor values = torch::randn({256}, torch::kFloat64);
  Splits s;
  s.whole = values.index_select(0, codes.flatten().to(torch::kLong)).view(codes.sizes());
  s.data.x_train = s.whole;
  s.data.x_test = s.whole;
  s.coded.x_train_coded = coded_inputs(codes, values);
  s.coded.x_test_coded = coded_inputs(codes, values);
  return s;
}

TEST(HeldInputs, RowsAndRangesAreTheSplitsRowsHeldWholeOrAsCodes) {
  const Splits s = splits();
  const torch::Tensor index = torch::tensor({4, 1, 4}, torch::kLong);
  for (const Dataset* data : {&s.data, &s.coded}) {
    for (const HeldInputs& held : {held_train_inputs(*data), held_test_inputs(*data)}) {
      const bool coded = data == &s.coded;
      EXPECT_EQ(held.coded(), coded);
      EXPECT_EQ(held.count(), 6);
      EXPECT_EQ(held.held().scalar_type(), coded ? torch::kUInt8 : torch::kFloat64);
      EXPECT_EQ(held.values().scalar_type(), torch::kFloat64);
      EXPECT_TRUE(same_bits(held.rows(index), s.whole.index_select(0, index))) << coded;
      EXPECT_TRUE(same_bits(held.rows({}), s.whole)) << coded;
      EXPECT_TRUE(same_bits(held.range(1, 4), s.whole.narrow(0, 1, 4))) << coded;
      EXPECT_EQ(held.range(6, 0).size(0), 0);
    }
    EXPECT_EQ(train_count(*data), 6);
    EXPECT_EQ(test_count(*data), 6);
    EXPECT_EQ(input_dtype(*data), torch::kFloat64);
    EXPECT_TRUE(same_bits(train_input(*data, 3), s.whole[3]));
    EXPECT_TRUE(same_bits(test_inputs(*data, index), s.whole.index_select(0, index)));
  }
}

TEST(HeldInputs, ASplitHeldWholeIsReadWhereItIs) {
  const Splits s = splits();
  const HeldInputs held = held_train_inputs(s.data);
  EXPECT_TRUE(held.rows({}).is_same(s.whole));
  EXPECT_EQ(held.range(2, 3).data_ptr(), s.whole[2].data_ptr()) << "a copy where a view would do";
}

}  // namespace
}  // namespace pathkernel
