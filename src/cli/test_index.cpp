// --test-index LIST: the test points a command decomposes. Kept apart from
// common.cpp so the fuzz harness (fuzz/points_fuzz.cpp) links it alone.
#include <algorithm>
#include <sstream>

#include "commands.h"
#include "pathkernel/error.h"

namespace pathkernel::cli {

torch::Tensor parse_test_indices(int64_t count, const std::string& list, int64_t n_test) {
  std::vector<int64_t> idx;
  if (!list.empty()) {
    std::stringstream ss(list);
    std::string item;
    while (std::getline(ss, item, ',')) {
      int64_t i = -1;
      size_t used = 0;
      try {
        i = std::stoll(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      PK_CHECK(used != 0 && used == item.size(),
               "--test-index: '" << item << "' is not an integer (expected e.g. 0,5,17)");
      PK_CHECK(i >= 0 && i < n_test, "--test-index " << i << " is out of range [0, " << n_test << ")");
      idx.push_back(i);
    }
  } else {
    PK_CHECK(count >= 1, "--test must be >= 1 (got " << count << ")");
    for (int64_t i = 0; i < std::min(count, n_test); ++i) idx.push_back(i);
  }
  PK_CHECK(!idx.empty(), "no test points selected");
  return torch::tensor(idx, torch::kLong);
}

}  // namespace pathkernel::cli
