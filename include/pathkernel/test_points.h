// Choosing the test points a decomposition, explanation or report works on:
// the first N, a list of indices, or a file of indices. One definition for
// every command that takes test points.
#pragma once

#include <cstdint>
#include <string>

#include <torch/torch.h>

namespace pathkernel {

/// At most one of count, balanced, indices and file is set; none set means
/// the default given to resolve().
struct TestPointSelection {
  int64_t count = 0;     ///< the first N test points (0: unset)
  int64_t balanced = 0;  ///< a class-balanced subset of N test points (0: unset), see balanced_subset()
  std::string indices;   ///< comma-separated indices and inclusive ranges, e.g. "0-7,12,20-23" (empty: unset)
  std::string file;      ///< a text file of indices and ranges separated by commas, spaces or newlines (empty: unset)
  uint64_t seed = 0;     ///< the class-balanced subset's seed

  /// The chosen indices into a test set of n_test points, int64 [n], in the
  /// order given (duplicates kept). The first min(count, n_test) when count is
  /// set, or with nothing set the first min(default_count, n_test). Throws
  /// Error naming the bad item and the valid range, or an empty selection,
  /// and for a class-balanced selection (which needs the labels).
  torch::Tensor resolve(int64_t n_test, int64_t default_count) const;
  /// The same for a test set with labels int64 [n_test], where `balanced`
  /// takes a class-balanced subset of min(balanced, n_test) points (sorted),
  /// and with nothing set, `default_balanced` chooses a class-balanced subset
  /// of default_count points instead of the first ones.
  torch::Tensor resolve(const torch::Tensor& labels, int64_t default_count, bool default_balanced = false) const;
};

/// Parses a list of test indices and inclusive ranges START-END (START <=
/// END), e.g. "0-7,12,20-23", separated by commas (and, with `whitespace`,
/// spaces, tabs and newlines; runs of separators are then one), each index
/// in [0, n_test). Items are expanded in the order given, duplicates kept.
/// `where` names the list's source in errors. Returns int64 [n]; throws
/// Error naming the first bad item and what was wrong: not an index, an
/// empty item, a range without a start or end, a reversed range, a negative
/// or out-of-range index, or nothing selected.
torch::Tensor parse_test_index_list(const std::string& list, int64_t n_test, const std::string& where,
                                    bool whitespace = false);

}  // namespace pathkernel
