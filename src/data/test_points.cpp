// Test-point selection: the first N, an index list, or a file of indices.
#include "pathkernel/test_points.h"

#include <algorithm>
#include <charconv>
#include <string>
#include <vector>

#include "pathkernel/dataset.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/text.h"

namespace pathkernel {

namespace {

constexpr const char* kExpected = "expected an index such as 5 or an inclusive range such as 0-7";

/// One index of a list: optional '-', then decimal digits, nothing else.
/// Returns false when `text` is not such a number; `overflow` says it is one
/// too large for int64.
bool parse_index(const std::string& text, int64_t& value, bool& overflow) {
  overflow = false;
  const char* begin = text.data();
  const char* end = begin + text.size();
  if (begin == end || (*begin == '-' && begin + 1 == end)) return false;
  const auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ptr != end) return false;
  overflow = ec == std::errc::result_out_of_range;
  return ec == std::errc() || overflow;
}

/// Parses `text`, a lone index (range empty) or one end of `range`, and
/// checks that it lies in [0, n_test).
int64_t checked_index(const std::string& text, const std::string& range, int64_t n_test, const std::string& where) {
  int64_t i = 0;
  bool overflow = false;
  PK_CHECK(parse_index(text, i, overflow), where << ": '" << (range.empty() ? text : range)
                                                 << "' is not a test index or range (" << kExpected << ")");
  const std::string what = range.empty() ? "test index " + text : "range '" + range + "': index " + text;
  PK_CHECK(!(text[0] == '-' && (overflow || i < 0)),
           where << ": " << what << " is negative (expected indices in [0, " << n_test << "))");
  PK_CHECK(!overflow && i < n_test, where << ": " << what << " is out of range [0, " << n_test << ")");
  return i;
}

}  // namespace

torch::Tensor parse_test_index_list(const std::string& list, int64_t n_test, const std::string& where,
                                    bool whitespace) {
  std::string text = list;
  if (whitespace) {
    for (char& c : text) c = (c == ' ' || c == '\t' || c == '\n' || c == '\r') ? ',' : c;
  }
  std::vector<int64_t> idx;
  int64_t position = 0;
  for (const std::string& raw : split(text, ',')) {
    ++position;
    const std::string item = trim(raw, " \t\r\n");
    if (item.empty()) {
      if (whitespace) continue;  // runs of separators in a file
      PK_THROW(where << ": item " << position << " of '" << list << "' is empty (" << kExpected
                     << ", separated by commas)");
    }
    // A range is START-END: a '-' after the first character (a leading one is a sign).
    const size_t dash = item.find('-', 1);
    if (dash == std::string::npos) {
      idx.push_back(checked_index(item, "", n_test, where));
      continue;
    }
    const std::string first = trim(item.substr(0, dash), " \t"), last = trim(item.substr(dash + 1), " \t");
    PK_CHECK(!first.empty() && !last.empty(),
             where << ": range '" << item << "' has no " << (first.empty() ? "start" : "end") << " (" << kExpected
                   << ")");
    const int64_t a = checked_index(first, item, n_test, where), b = checked_index(last, item, n_test, where);
    PK_CHECK(a <= b, where << ": range '" << item << "' is reversed: it starts at " << a << ", after its end " << b
                           << " (expected START-END with START <= END, e.g. " << b << "-" << a << ")");
    for (int64_t i = a; i <= b; ++i) idx.push_back(i);
  }
  PK_CHECK(!idx.empty(), where << ": no test points selected (expected indices and ranges such as 0-7,12,20-23)");
  return torch::tensor(idx, torch::kLong);
}

namespace {

/// resolve() for both overloads; labels undefined when only n_test is known.
torch::Tensor resolve_selection(const TestPointSelection& s, int64_t n_test, const torch::Tensor& labels,
                                int64_t default_count, bool default_balanced) {
  const int set = (s.count != 0) + (s.balanced != 0) + !s.indices.empty() + !s.file.empty();
  PK_CHECK(set <= 1, "choose the test points one way: a count, a class-balanced count, an index list or a file (got "
                         << set << ")");
  if (!s.indices.empty()) return parse_test_index_list(s.indices, n_test, "test index list");
  if (!s.file.empty()) return parse_test_index_list(read_file(s.file), n_test, "test index file '" + s.file + "'", true);
  const bool balanced = s.balanced != 0 || (set == 0 && default_balanced);
  const int64_t n = s.count != 0 ? s.count : s.balanced != 0 ? s.balanced : default_count;
  PK_CHECK(n >= 1, "the number of test points must be >= 1 (got " << n << ")");
  PK_CHECK(n_test >= 1, "the data has no test points to choose from");
  if (!balanced) return torch::arange(std::min(n, n_test), torch::kLong);
  PK_CHECK(labels.defined(), "a class-balanced choice of test points needs the test labels");
  return balanced_subset(labels, std::min(n, n_test), s.seed);
}

}  // namespace

torch::Tensor TestPointSelection::resolve(int64_t n_test, int64_t default_count) const {
  return resolve_selection(*this, n_test, torch::Tensor(), default_count, false);
}

torch::Tensor TestPointSelection::resolve(const torch::Tensor& labels, int64_t default_count,
                                          bool default_balanced) const {
  PK_CHECK(labels.defined() && (labels.dim() == 1 || labels.dim() == 2),
           "test labels must be a vector [n_test] (or regression targets [n_test, K])");
  if (labels.dim() == 2) {  // regression targets: no classes to balance
    PK_CHECK(balanced == 0, "--test-balanced needs class labels; this data has regression targets of shape "
                                << labels.sizes() << " (use --test N)");
    return resolve_selection(*this, labels.size(0), torch::Tensor(), default_count, false);
  }
  return resolve_selection(*this, labels.size(0), labels, default_count, default_balanced);
}

}  // namespace pathkernel
