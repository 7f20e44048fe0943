// Synthetic datasets: three isotropic Gaussian classes, in 100-D
// ("gaussians3", the paper's setting) and in 2-D ("toy2d", for figures).
//
// Seeding: with DataOptions.seed = s, the train split is drawn from a torch
// CPU generator seeded with 2*s and the test split from one seeded with
// 2*s + 1 (mod 2^64), so the splits are independent and each is a pure
// function of s. Examples are grouped by class (class 0 first).
#include <ATen/CPUGeneratorImpl.h>

#include "pathkernel/dataset.h"
#include "pathkernel/error.h"
#include "loaders.h"

namespace pathkernel {
namespace detail {

namespace {

// Class means in the first two coordinates; the remaining ones are 0.
constexpr double kMeans[3][2] = {{1.0, 4.0}, {4.0, 1.0}, {5.0, 5.0}};
constexpr int64_t kNumClasses = 3;

/// `per_class` points of each class, x ~ N(mean_c, I_dim), float64.
std::pair<torch::Tensor, torch::Tensor> sample_gaussians(int64_t dim, int64_t per_class,
                                                         uint64_t seed) {
  torch::Tensor means = torch::zeros({kNumClasses, dim}, torch::kFloat64);
  for (int64_t c = 0; c < kNumClasses; ++c) {
    means[c][0] = kMeans[c][0];
    means[c][1] = kMeans[c][1];
  }
  const torch::Tensor y =
      torch::arange(kNumClasses, torch::kLong).repeat_interleave(per_class);
  at::Generator generator = at::detail::createCPUGenerator(seed);
  const torch::Tensor noise =
      torch::randn({kNumClasses * per_class, dim}, generator, torch::kFloat64);
  return {noise + means.index_select(0, y), y};
}

Dataset make_gaussians(const char* name, int64_t dim, int64_t train_per_class,
                       int64_t test_per_class, uint64_t seed) {
  const uint64_t train_seed = seed * 2;
  const uint64_t test_seed = seed * 2 + 1;
  Dataset data;
  std::tie(data.x_train, data.y_train) = sample_gaussians(dim, train_per_class, train_seed);
  std::tie(data.x_test, data.y_test) = sample_gaussians(dim, test_per_class, test_seed);
  data.input_shape = {dim};
  data.num_classes = kNumClasses;
  data.normalization = {{"kind", "none"}};
  data.source = {{"generator", name},
                 {"seed", seed},
                 {"train_seed", train_seed},
                 {"test_seed", test_seed},
                 {"dim", dim},
                 {"means_first_two_coords", {{1, 4}, {4, 1}, {5, 5}}},
                 {"sd", 1.0},
                 {"train_per_class", train_per_class},
                 {"test_per_class", test_per_class}};
  return data;
}

}  // namespace

Dataset load_gaussians3(const std::string& /*argument*/, uint64_t seed) {
  return make_gaussians("gaussians3", 100, 1000, 300, seed);
}

Dataset load_toy2d(const std::string& /*argument*/, uint64_t seed) {
  return make_gaussians("toy2d", 2, 100, 100, seed);
}

}  // namespace detail
}  // namespace pathkernel
