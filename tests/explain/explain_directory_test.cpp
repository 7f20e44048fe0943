// A point's label as explain.json spells it (src/explain/explain_directory.cpp):
// a class as a number, a regression target as numbers, a sequence's tokens
// as integers.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "pathkernel/explain_directory.h"

namespace pathkernel {
namespace {

TEST(Label, KeepsEachKindOfLabelInItsOwnType) {
  const Label cls = label_at(torch::tensor({4, 7}, torch::kLong), 1);
  EXPECT_TRUE(cls.is_class());
  EXPECT_EQ(cls.str(), "7");

  const Label target = label_at(torch::tensor({{0.5, -1.0}, {2.0, 3.0}}, torch::kFloat64), 0);
  EXPECT_FALSE(target.is_class());
  EXPECT_EQ(target.target, (std::vector<double>{0.5, -1.0}));
  EXPECT_EQ(target.str(), "[0.5,-1.0]");

  // A sequence's next tokens are integers, in every integer type a data set holds.
  for (const torch::ScalarType type : {torch::kLong, torch::kInt}) {
    const Label tokens = label_at(torch::tensor({{3, 5, 1}, {17, 4, 9}}, torch::kLong).to(type), 1);
    EXPECT_FALSE(tokens.is_class());
    EXPECT_TRUE(tokens.target.empty());
    EXPECT_EQ(tokens.tokens, (std::vector<int64_t>{17, 4, 9}));
    EXPECT_EQ(tokens.str(), "[17,4,9]");
  }
}

}  // namespace
}  // namespace pathkernel
