// Sequence outputs at one position (sequence.h): the position chosen, its
// checks, and a sequence's text.
#include <gtest/gtest.h>

#include "../test_util.h"
#include "pathkernel/sequence.h"

namespace pathkernel {
namespace {

using testing::error_message;

TEST(Sequence, SelectsOnePositionOfOutputsAndLabels) {
  const torch::Tensor f = torch::arange(2 * 3 * 4, torch::kFloat64).view({2, 3, 4});
  EXPECT_TRUE(torch::equal(at_position(f, -1), f.select(1, 2)));
  EXPECT_TRUE(torch::equal(at_position(f, 1), f.select(1, 1)));
  const torch::Tensor classifier = torch::ones({2, 4}, torch::kFloat64);
  EXPECT_TRUE(at_position(classifier, -1).is_same(classifier));  // not a sequence model's: as it is
  const torch::Tensor y = torch::tensor({{1, 2, 3}, {4, 5, 6}}, torch::kLong);
  EXPECT_TRUE(torch::equal(labels_at_position(y, -1), torch::tensor({3, 6}, torch::kLong)));
  EXPECT_TRUE(torch::equal(labels_at_position(y, 0), torch::tensor({1, 4}, torch::kLong)));
  EXPECT_TRUE(is_sequence_labels(y));
  EXPECT_FALSE(is_sequence_labels(torch::zeros({2, 3}, torch::kFloat64)));  // regression targets
  EXPECT_FALSE(is_sequence_labels(torch::zeros({2}, torch::kLong)));
}

TEST(Sequence, RefusesPositionsOutOfRangeOrWithoutSequences) {
  EXPECT_EQ(resolve_position(-1, 16), 15);
  EXPECT_EQ(resolve_position(0, 16), 0);
  EXPECT_CONTAINS(error_message([] { resolve_position(16, 16); }),
                  "--position 16 is out of range: the sequences have 16 positions, expected 0 .. 15 (or -1: the last)");
  EXPECT_CONTAINS(error_message([] { resolve_position(-2, 16); }), "--position -2 is out of range");
  EXPECT_CONTAINS(error_message([] { resolve_position(3, 0); }), "--position 3: the data are not sequences");
  EXPECT_CONTAINS(error_message([] { at_position(torch::zeros({1, 2, 3}), 2); }), "position 2 is out of range");
}

TEST(Sequence, WritesASequencesText) {
  const std::vector<std::string> vocabulary = {"a", "b", " ", "é"};
  EXPECT_EQ(sequence_text(torch::tensor({0.0, 1.0, 2.0, 3.0, 7.0}, torch::kFloat64), vocabulary), "ab é?");
  EXPECT_EQ(sequence_text(torch::tensor({0, 1}, torch::kLong), {}), "");
}

}  // namespace
}  // namespace pathkernel
