// Small text parsing shared by the spec and file readers.
#include "pathkernel/text.h"

#include <charconv>
#include <sstream>

namespace pathkernel {

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) s += (i == 0 ? "" : sep) + parts[i];
  return s;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, sep)) parts.push_back(part);
  if (!s.empty() && s.back() == sep) parts.push_back("");
  return parts;
}

std::string trim(const std::string& s, const char* space) {
  const size_t begin = s.find_first_not_of(space);
  if (begin == std::string::npos) return "";
  const size_t end = s.find_last_not_of(space);
  return s.substr(begin, end - begin + 1);
}

bool parse_number(const std::string& text, double& value) {
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  if (begin != end && *begin == '+') {
    ++begin;  // from_chars rejects a leading '+'
    if (begin != end && *begin == '-') return false;
  }
  if (begin == end) return false;
  const auto [ptr, ec] = std::from_chars(begin, end, value);
  return ec == std::errc() && ptr == end;
}

}  // namespace pathkernel
