// Test-point selection: the first N, an index list, or a file of indices.
#include "pathkernel/test_points.h"

#include <algorithm>
#include <string>
#include <vector>

#include "pathkernel/dataset.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/text.h"

namespace pathkernel {

torch::Tensor parse_test_index_list(const std::string& list, int64_t n_test, const std::string& where,
                                    bool whitespace) {
  std::string text = list;
  if (whitespace) {
    for (char& c : text) c = (c == ' ' || c == '\t' || c == '\n' || c == '\r') ? ',' : c;
  }
  std::vector<int64_t> idx;
  for (const std::string& item : split(text, ',')) {
    if (item.empty() && whitespace) continue;  // runs of separators in a file
    int64_t i = -1;
    size_t used = 0;
    try {
      i = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    PK_CHECK(used != 0 && used == item.size(),
             where << ": '" << item << "' is not a test index (expected integers, e.g. 0,5,17)");
    PK_CHECK(i >= 0 && i < n_test, where << ": test index " << i << " is out of range [0, " << n_test << ")");
    idx.push_back(i);
  }
  PK_CHECK(!idx.empty(), where << ": no test points selected");
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
