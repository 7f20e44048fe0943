// Small text parsing shared by the spec and file readers, and the joining of
// name lists for messages.
#pragma once

#include <string>
#include <vector>

namespace pathkernel {

/// Splits `s` at every `sep`, keeping empty parts ("a::b" -> a, "", b; a
/// trailing separator gives a trailing "").
std::vector<std::string> split(const std::string& s, char sep);

/// `parts` joined by `sep` ("a, b, c"), for lists of valid names in messages.
std::string join(const std::vector<std::string>& parts, const char* sep = ", ");

/// `s` without the leading and trailing characters listed in `space`.
std::string trim(const std::string& s, const char* space = " \t");

/// Parses the whole of `text` as a number ("1", "-2.5e3", "+.5"),
/// locale-free; false when anything is left over or nothing is there.
bool parse_number(const std::string& text, double& value);

}  // namespace pathkernel
