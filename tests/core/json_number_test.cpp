// Tests of json_number: JSON numbers read as C++ arithmetic types, with every
// value the type cannot hold refused by an Error that names it.
#include "pathkernel/json_number.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../test_util.h"

namespace pathkernel {
namespace {

using nlohmann::json;
using testing::error_message;

TEST(JsonNumber, ReadsValuesInRangeExactly) {
  EXPECT_EQ(json_number<int64_t>(json::parse("-9223372036854775808"), "x"), INT64_MIN);
  EXPECT_EQ(json_number<uint64_t>(json::parse("18446744073709551615"), "x"), UINT64_MAX);
  EXPECT_EQ(json_number<uint32_t>(json::parse("4294967295"), "x"), 4294967295u);
  EXPECT_EQ(json_number<int32_t>(json::parse("-2147483648"), "x"), INT32_MIN);
  EXPECT_EQ(json_number<double>(json::parse("3"), "x"), 3.0);
  EXPECT_EQ(json_number<double>(json::parse("1e300"), "x"), 1e300);
  EXPECT_EQ(json_number<float>(json::parse("0.5"), "x"), 0.5f);
}

TEST(JsonNumber, RefusesWhatTheTypeCannotHold) {
  struct Case {
    std::string text, message;
    std::function<void(const json &)> read;
  };
  const std::vector<Case> cases = {
      {"1e300", "the count must be a whole number, got 1e+300",
       [](const json& v) { json_number<int64_t>(v, "the count"); }},
      {"2.5", "must be a whole number, got 2.5", [](const json& v) { json_number<int64_t>(v, "the count"); }},
      {"-1", "must not be negative, got -1", [](const json& v) { json_number<uint32_t>(v, "the count"); }},
      {"4294967296", "is 4294967296, more than the largest allowed, 4294967295",
       [](const json& v) { json_number<uint32_t>(v, "the count"); }},
      {"18446744073709551615", "more than the largest allowed, 9223372036854775807",
       [](const json& v) { json_number<int64_t>(v, "the count"); }},
      {"-2147483649", "outside the allowed range [-2147483648, 2147483647]",
       [](const json& v) { json_number<int32_t>(v, "the count"); }},
      {"1e300", "beyond the largest allowed", [](const json& v) { json_number<float>(v, "the rate"); }},
      {"\"12\"", "the count must be a number, got \"12\"", [](const json& v) { json_number<int64_t>(v, "the count"); }},
      {"true", "must be a number, got true", [](const json& v) { json_number<double>(v, "the rate"); }},
      {"null", "must be a number, got null", [](const json& v) { json_number<double>(v, "the rate"); }},
  };
  for (const Case& c : cases) {
    const json v = json::parse(c.text);
    const std::string message = error_message([&] { c.read(v); });
    EXPECT_NE(message.find(c.message), std::string::npos) << c.text << ": " << message;
  }
}

}  // namespace
}  // namespace pathkernel
