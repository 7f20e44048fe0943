// Small text parsing shared by the spec and file readers.
#pragma once

#include <string>
#include <vector>

namespace pathkernel {

/// Splits `s` at every `sep`, keeping empty parts ("a::b" -> a, "", b; a
/// trailing separator gives a trailing "").
std::vector<std::string> split(const std::string& s, char sep);

/// `s` without the leading and trailing characters listed in `space`.
std::string trim(const std::string& s, const char* space = " \t");

/// Parses the whole of `text` as a number ("1", "-2.5e3", "+.5"),
/// locale-free; false when anything is left over or nothing is there.
bool parse_number(const std::string& text, double& value);

}  // namespace pathkernel
