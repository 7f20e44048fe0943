// Test-point selection: the first N, an index list, or a file of indices.
#include "pathkernel/test_points.h"

#include <algorithm>
#include <string>
#include <vector>

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

torch::Tensor TestPointSelection::resolve(int64_t n_test, int64_t default_count) const {
  const int set = (count != 0) + !indices.empty() + !file.empty();
  PK_CHECK(set <= 1, "choose the test points one way: a count, an index list or a file (got " << set << ")");
  if (!indices.empty()) return parse_test_index_list(indices, n_test, "test index list");
  if (!file.empty()) return parse_test_index_list(read_file(file), n_test, "test index file '" + file + "'", true);
  const int64_t n = count != 0 ? count : default_count;
  PK_CHECK(n >= 1, "the number of test points must be >= 1 (got " << n << ")");
  PK_CHECK(n_test >= 1, "the data has no test points to choose from");
  return torch::arange(std::min(n, n_test), torch::kLong);
}

}  // namespace pathkernel
