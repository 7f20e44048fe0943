// Tests of the registry and the synthetic datasets: names, unknown names,
// subset sizes, dtype, and the Gaussian generators' shape, means and seeding.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pathkernel/context.h"
#include "pathkernel/dataset.h"
#include "pathkernel/error.h"
#include "../test_util.h"

namespace {

using pathkernel::DataOptions;
using pathkernel::Dataset;
using pathkernel::load_dataset;

using pathkernel::testing::error_message;

DataOptions options_for(const std::string& spec, uint64_t seed = 0) {
  DataOptions options;
  options.spec = spec;
  options.seed = seed;
  return options;
}

int64_t count_label(const torch::Tensor& y, int64_t label) {
  return y.eq(label).sum().item<int64_t>();
}

TEST(DatasetRegistry, ListsTheNames) {
  const std::vector<std::string> expected = {"gaussians3", "toy2d", "mnist", "fashion-mnist",
                                             "csv:PATH", "npy:DIR"};
  EXPECT_EQ(pathkernel::dataset_names(), expected);
}

TEST(DatasetRegistry, UnknownNameListsValidNames) {
  const std::string message = error_message([] { load_dataset(options_for("foo")); });
  EXPECT_EQ(message,
            "unknown dataset 'foo': expected one of gaussians3, toy2d, mnist, fashion-mnist, "
            "csv:PATH, npy:DIR");
  // Near misses are unknown too: names match exactly.
  EXPECT_CONTAINS(error_message([] { load_dataset(options_for("Gaussians3")); }),
                  "unknown dataset 'Gaussians3'");
  EXPECT_CONTAINS(error_message([] { load_dataset(options_for("mnist:x")); }),
                  "unknown dataset 'mnist:x'");
}

TEST(DatasetRegistry, CsvNeedsAPath) {
  EXPECT_CONTAINS(error_message([] { load_dataset(options_for("csv")); }), "csv:PATH");
  EXPECT_CONTAINS(error_message([] { load_dataset(options_for("csv:")); }), "csv:PATH");
}

TEST(DatasetRegistry, TrainSizeOutOfRangeNamesValueAndRange) {
  for (int64_t bad : {int64_t{0}, int64_t{3001}, int64_t{-2}}) {
    DataOptions options = options_for("gaussians3");
    options.train_size = bad;
    const std::string message = error_message([&] { load_dataset(options); });
    EXPECT_CONTAINS(message, "train_size " + std::to_string(bad));
    EXPECT_CONTAINS(message, "[1, 3000]");
  }
  DataOptions options = options_for("gaussians3");
  options.test_size = 901;
  const std::string message = error_message([&] { load_dataset(options); });
  EXPECT_CONTAINS(message, "test_size 901");
  EXPECT_CONTAINS(message, "[1, 900]");
}

TEST(DatasetRegistry, RejectsNonFloatingDtype) {
  DataOptions options = options_for("toy2d");
  options.dtype = torch::kInt32;
  EXPECT_CONTAINS(error_message([&] { load_dataset(options); }), "dtype");
}

TEST(Gaussians3, ShapesLabelsAndRecords) {
  const Dataset data = load_dataset(options_for("gaussians3", 4));
  EXPECT_EQ(data.spec, "gaussians3");
  EXPECT_EQ(data.x_train.sizes(), torch::IntArrayRef({3000, 100}));
  EXPECT_EQ(data.x_test.sizes(), torch::IntArrayRef({900, 100}));
  EXPECT_EQ(data.y_train.sizes(), torch::IntArrayRef({3000}));
  EXPECT_EQ(data.y_test.sizes(), torch::IntArrayRef({900}));
  EXPECT_EQ(data.x_train.scalar_type(), torch::kFloat64);
  EXPECT_EQ(data.y_train.scalar_type(), torch::kLong);
  EXPECT_EQ(data.y_test.scalar_type(), torch::kLong);
  EXPECT_TRUE(data.x_train.is_contiguous());
  EXPECT_TRUE(data.x_test.is_contiguous());
  EXPECT_EQ(data.input_shape, std::vector<int64_t>({100}));
  EXPECT_EQ(data.num_classes, 3);
  for (int64_t c = 0; c < 3; ++c) {
    EXPECT_EQ(count_label(data.y_train, c), 1000);
    EXPECT_EQ(count_label(data.y_test, c), 300);
  }
  EXPECT_EQ(data.normalization, nlohmann::json({{"kind", "none"}}));
  EXPECT_EQ(data.source.at("generator"), "gaussians3");
  EXPECT_EQ(data.source.at("seed"), 4);
  EXPECT_EQ(data.source.at("train_seed"), 8);
  EXPECT_EQ(data.source.at("test_seed"), 9);
}

/// Largest absolute difference between each class's sample mean and its
/// true mean (first two coordinates from `means`, the rest 0).
double max_mean_error(const torch::Tensor& x, const torch::Tensor& y, const double means[3][2]) {
  double worst = 0.0;
  for (int64_t c = 0; c < 3; ++c) {
    torch::Tensor truth = torch::zeros({x.size(1)}, torch::kFloat64);
    truth[0] = means[c][0];
    truth[1] = means[c][1];
    const torch::Tensor sample_mean = x.index({y.eq(c)}).mean(0);
    worst = std::max(worst, (sample_mean - truth).abs().max().item<double>());
  }
  return worst;
}

const double kTrueMeans[3][2] = {{1, 4}, {4, 1}, {5, 5}};

TEST(Gaussians3, ClassMeansNearTrueMeans) {
  for (uint64_t seed : {0, 7}) {
    const Dataset data = load_dataset(options_for("gaussians3", seed));
    EXPECT_LT(max_mean_error(data.x_train, data.y_train, kTrueMeans), 0.15) << "seed " << seed;
    // 300 per class: standard error 0.058 per coordinate.
    EXPECT_LT(max_mean_error(data.x_test, data.y_test, kTrueMeans), 0.3) << "seed " << seed;
    // Unit standard deviation around the class means.
    const double sd = (data.x_train.index({data.y_train.eq(0)}) -
                       data.x_train.index({data.y_train.eq(0)}).mean(0))
                          .std()
                          .item<double>();
    EXPECT_NEAR(sd, 1.0, 0.02);
  }
}

TEST(Gaussians3, SameSeedSameDataDifferentSeedDifferentData) {
  const Dataset a = load_dataset(options_for("gaussians3", 1));
  const Dataset b = load_dataset(options_for("gaussians3", 1));
  const Dataset c = load_dataset(options_for("gaussians3", 2));
  EXPECT_TRUE(torch::equal(a.x_train, b.x_train));
  EXPECT_TRUE(torch::equal(a.x_test, b.x_test));
  EXPECT_TRUE(torch::equal(a.y_train, b.y_train));
  EXPECT_FALSE(torch::equal(a.x_train, c.x_train));
  EXPECT_FALSE(torch::equal(a.x_test, c.x_test));
}

TEST(Gaussians3, TrainAndTestAreIndependentDraws) {
  const Dataset data = load_dataset(options_for("gaussians3", 0));
  // Same class layout, so equal noise would show up as equal leading rows.
  EXPECT_FALSE(torch::equal(data.x_train.slice(0, 0, 300), data.x_test.slice(0, 0, 300)));
}

TEST(Toy2d, ShapesAndMeans) {
  const Dataset data = load_dataset(options_for("toy2d", 3));
  EXPECT_EQ(data.x_train.sizes(), torch::IntArrayRef({300, 2}));
  EXPECT_EQ(data.x_test.sizes(), torch::IntArrayRef({300, 2}));
  EXPECT_EQ(data.input_shape, std::vector<int64_t>({2}));
  EXPECT_EQ(data.num_classes, 3);
  for (int64_t c = 0; c < 3; ++c) {
    EXPECT_EQ(count_label(data.y_train, c), 100);
    EXPECT_EQ(count_label(data.y_test, c), 100);
  }
  // 100 per class: standard error 0.1 per coordinate.
  EXPECT_LT(max_mean_error(data.x_train, data.y_train, kTrueMeans), 0.4);
  EXPECT_LT(max_mean_error(data.x_test, data.y_test, kTrueMeans), 0.4);
  EXPECT_TRUE(torch::equal(data.x_train, load_dataset(options_for("toy2d", 3)).x_train));
}

TEST(DatasetSubsets, TrainAndTestSizesTakeBalancedSubsetsOfTheFullSplits) {
  const uint64_t seed = 5;
  const Dataset full = load_dataset(options_for("gaussians3", seed));
  DataOptions options = options_for("gaussians3", seed);
  options.train_size = 30;
  options.test_size = 12;
  const Dataset sub = load_dataset(options);
  ASSERT_EQ(sub.x_train.size(0), 30);
  ASSERT_EQ(sub.x_test.size(0), 12);
  for (int64_t c = 0; c < 3; ++c) {
    EXPECT_EQ(count_label(sub.y_train, c), 10);
    EXPECT_EQ(count_label(sub.y_test, c), 4);
  }
  // Train subset drawn with the seed, test subset with seed + 1.
  const torch::Tensor train_index = pathkernel::balanced_subset(full.y_train, 30, seed);
  const torch::Tensor test_index = pathkernel::balanced_subset(full.y_test, 12, seed + 1);
  EXPECT_TRUE(torch::equal(sub.x_train, full.x_train.index_select(0, train_index)));
  EXPECT_TRUE(torch::equal(sub.y_train, full.y_train.index_select(0, train_index)));
  EXPECT_TRUE(torch::equal(sub.x_test, full.x_test.index_select(0, test_index)));
  EXPECT_TRUE(torch::equal(sub.y_test, full.y_test.index_select(0, test_index)));
  EXPECT_TRUE(sub.x_train.is_contiguous());
}

TEST(DatasetDtype, Float32OptionGivesFloat32Inputs) {
  DataOptions options = options_for("gaussians3", 2);
  options.dtype = torch::kFloat32;
  const Dataset data32 = load_dataset(options);
  EXPECT_EQ(data32.x_train.scalar_type(), torch::kFloat32);
  EXPECT_EQ(data32.x_test.scalar_type(), torch::kFloat32);
  EXPECT_EQ(data32.y_train.scalar_type(), torch::kLong);
  const Dataset data64 = load_dataset(options_for("gaussians3", 2));
  EXPECT_TRUE(torch::allclose(data32.x_train.to(torch::kFloat64), data64.x_train, 1e-6, 1e-6));
}

}  // namespace

// A run is validated by the CRC of its training inputs, so loading must give
// the same bits under any thread count (standardisation included).
TEST(DatasetRegistry, MnistLoadsTheSameBitsUnderAnyThreadCount) {
  torch::Tensor one, two;
  {
    pathkernel::ThreadScope threads(1);
    one = load_dataset(options_for("mnist")).x_train;
  }
  {
    pathkernel::ThreadScope threads(2);
    two = load_dataset(options_for("mnist")).x_train;
  }
  EXPECT_TRUE(torch::equal(one, two));
}
