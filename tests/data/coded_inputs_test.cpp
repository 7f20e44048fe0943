// Tests of CodedInputs: rows and ranges of rows decoded against an explicit loop over the codes,
// and the errors for codes that are not bytes or a table of another size.
#include "pathkernel/coded_inputs.h"

#include <gtest/gtest.h>

#include "../test_util.h"

namespace pathkernel {
namespace {

using testing::error_message;
using testing::same_bits;

/// values[codes[i]] for every element, one at a time.
torch::Tensor decoded_by_loop(const torch::Tensor& codes, const torch::Tensor& values) {
  const torch::Tensor flat = codes.flatten();
  torch::Tensor out = torch::empty({flat.size(0)}, values.options());
  for (int64_t i = 0; i < flat.size(0); ++i) out[i] = values[flat[i].item<int64_t>()];
  return out.view(codes.sizes());
}

TEST(CodedInputs, RowsAreTheTableValuesOfTheirCodes) {
  torch::manual_seed(3);
  const torch::Tensor codes = torch::randint(0, 256, {7, 2, 3}, torch::kUInt8);
  for (const torch::Dtype dtype : {torch::kFloat64, torch::kFloat32}) {
    const torch::Tensor values = torch::randn({256}, torch::TensorOptions().dtype(dtype));
    const CodedInputs coded = coded_inputs(codes, values);
    EXPECT_EQ(coded.size(), 7);
    const torch::Tensor whole = decoded_by_loop(codes, values);
    EXPECT_TRUE(same_bits(coded.all(), whole));
    const torch::Tensor index = torch::tensor({5, 0, 5, 2}, torch::kLong);
    const torch::Tensor rows = coded.rows(index);
    EXPECT_EQ(rows.scalar_type(), dtype);
    EXPECT_TRUE(same_bits(rows, whole.index_select(0, index)));
    EXPECT_TRUE(same_bits(coded.range(2, 4), whole.narrow(0, 2, 4)));
    EXPECT_EQ(coded.range(7, 0).size(0), 0);
  }
}

TEST(CodedInputs, RefusesCodesThatAreNotBytesAndTablesOfAnotherSize) {
  const torch::Tensor values = torch::zeros({256}, torch::kFloat64);
  EXPECT_CONTAINS(error_message([&] { coded_inputs(torch::zeros({3, 2}, torch::kLong), values); }),
                  "codes of dtype Long and shape [3, 2], expected uint8");
  EXPECT_CONTAINS(error_message([&] { coded_inputs(torch::zeros({3, 2}, torch::kUInt8), torch::zeros({255})); }),
                  "a table of dtype Float and shape [255], expected 256 floating values");
}

}  // namespace
}  // namespace pathkernel
