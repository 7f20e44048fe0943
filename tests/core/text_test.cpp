// The name lists of messages (text.h).
#include <gtest/gtest.h>

#include "pathkernel/text.h"

namespace pathkernel {
namespace {

TEST(Join, PutsTheSeparatorBetweenPartsOnly) {
  EXPECT_EQ(join({}), "");
  EXPECT_EQ(join({"gd"}), "gd");
  EXPECT_EQ(join({"gd", "sgd", "adam"}), "gd, sgd, adam");
  EXPECT_EQ(join({"", "b"}, "|"), "|b");  // an empty part keeps its place
}

}  // namespace
}  // namespace pathkernel
