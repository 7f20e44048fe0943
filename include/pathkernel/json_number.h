// Reading a number from a JSON file as a C++ arithmetic type, refusing what
// the type cannot hold.
//
// nlohmann's get<T>() converts with a static_cast, which is undefined for a
// float outside the target's range (get<int64_t>() of 1e300) and silently
// wraps or truncates otherwise (get<uint32_t>() of -1, get<int>() of 2.5).
// The run's files are input like any other: a hand-edited or damaged value
// gets a clear Error naming it, never a wrapped number.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "pathkernel/error.h"

namespace pathkernel {

/// `v` as T. For an integer T the value must be a JSON integer (no fraction,
/// no exponent form) within T's range; for a floating T any number, within
/// T's range when T is narrower than double. `what` names the value in the
/// error ("field 'steps' of the manifest").
template <typename T, typename Json>
T json_number(const Json& v, const std::string& what) {
  static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>, "json_number reads numbers");
  PK_CHECK(v.is_number(), what << " must be a number, got " << v.dump());
  if constexpr (std::is_integral_v<T>) {
    using Lim = std::numeric_limits<T>;
    PK_CHECK(v.is_number_integer(), what << " must be a whole number, got " << v.dump());
    uint64_t u = 0;
    if (v.is_number_unsigned()) {
      u = v.template get<uint64_t>();
    } else {  // a JSON integer that may be negative
      const int64_t i = v.template get<int64_t>();
      if (i < 0) {
        PK_CHECK(std::is_signed_v<T>, what << " must not be negative, got " << i);
        PK_CHECK(i >= static_cast<int64_t>(Lim::min()),
                 what << " is " << i << ", outside the allowed range [" << +Lim::min() << ", " << +Lim::max() << "]");
        return static_cast<T>(i);
      }
      u = static_cast<uint64_t>(i);
    }
    // Non-negative from here, so one comparison in uint64 covers every T.
    PK_CHECK(u <= static_cast<uint64_t>(Lim::max()),
             what << " is " << u << ", more than the largest allowed, " << +Lim::max());
    return static_cast<T>(u);
  } else {
    const double d = v.template get<double>();  // any JSON number converts to double
    if constexpr (sizeof(T) < sizeof(double)) {
      PK_CHECK(!std::isfinite(d) || std::fabs(d) <= static_cast<double>(std::numeric_limits<T>::max()),
               what << " is " << d << ", beyond the largest allowed, " << std::numeric_limits<T>::max());
    }
    return static_cast<T>(d);
  }
}

/// `v`, a JSON array of numbers, as a vector of T, each element read by
/// json_number ("`what` element").
template <typename T, typename Json>
std::vector<T> json_numbers(const Json& v, const std::string& what) {
  PK_CHECK(v.is_array(), what << " must be an array of numbers, got " << v.dump());
  std::vector<T> out;
  out.reserve(v.size());
  for (const auto& e : v) out.push_back(json_number<T>(e, what + " element"));
  return out;
}

}  // namespace pathkernel
