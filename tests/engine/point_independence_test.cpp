// A test point's decomposition depends only on the block of points it is
// computed with (DecompositionOptions::point_block, docs/math.md §12): split
// at block boundaries, the test points give the same bits as all at once.
// Splitting the test points across processes (across_ranks.h) relies on it.
#include <gtest/gtest.h>

#include "../test_util.h"
#include "pathkernel/decomposition.h"

namespace pathkernel {
namespace {

void expect_same_rows(const Decomposition& part, const Decomposition& all, int64_t first, const std::string& where) {
  const int64_t n = part.fN.size(0);
  EXPECT_TRUE(torch::equal(part.contributions, all.contributions.narrow(0, first, n))) << where;
  EXPECT_TRUE(torch::equal(part.rounding, all.rounding.narrow(0, first, n))) << where;
  EXPECT_TRUE(torch::equal(part.regularization, all.regularization.narrow(0, first, n))) << where;
  EXPECT_TRUE(torch::equal(part.f0, all.f0.narrow(0, first, n))) << where;
  EXPECT_TRUE(torch::equal(part.fN, all.fN.narrow(0, first, n))) << where;
  if (all.kernel.defined()) EXPECT_TRUE(torch::equal(part.kernel, all.kernel.narrow(0, first, n))) << where;
}

TEST(PointIndependence, SplitsAtBlockBoundariesGiveTheBitsOfTheWhole) {
  for (const std::string opt : {"gd", "sgd", "momentum", "adam"}) {
    testing::TempDir dir(opt);
    RunOptions r = testing::small_run(dir / "run", opt, 6, 2);
    r.model = "mlp:24,24";
    r.train.optimizer.weight_decay = 1e-2;
    train_run(r);
    PathReader reader(r.out);
    const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 10);
    DecompositionOptions options;
    options.progress = false;
    options.point_block = 3;
    options.kernel = opt == "gd" || opt == "sgd";
    ASSERT_EQ(decomposition_block(reader, x, options), 3);
    const Decomposition all = decompose(reader, x, options);
    // Shares of whole blocks, as ranks take them: [0, 3), [3, 9), [9, 10).
    for (const auto& [first, count] : std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 6}, {9, 1}}) {
      expect_same_rows(decompose(reader, x.narrow(0, first, count), options), all, first,
                       opt + ", points " + std::to_string(first) + " to " + std::to_string(first + count - 1));
    }
    // The reverse walk's chunks (one replay each) are whole blocks too: a
    // budget of a few blocks per chunk gives the same bits as one chunk.
    if (opt == "momentum" || opt == "adam") {
      DecompositionOptions small = options;
      small.memory_doubles = 1;
      ASSERT_EQ(decomposition_block(reader, x, small), 1);
      small.memory_doubles = 3 * (3 * 3 * reader.manifest().parameter_count) + 3 * 100000;
      expect_same_rows(decompose(reader, x, small), all, 0, opt + ", chunks of fewer blocks");
    }
    EXPECT_LT(summarize(all).max_rel_error, 1e-10) << opt;
  }
}

// MNIST-shaped products (784 inputs, 64 hidden units): there a BLAS may round
// a row of a product differently by how many rows it has (OpenBLAS on
// AVX-512 does, by 6e-14 on the demo run, for a split inside a block of 16),
// so only splits at block boundaries keep the bits; they do.
TEST(PointIndependence, HoldsForMnistShapedProducts) {
  testing::TempDir dir;
  RunOptions r = testing::small_run(dir / "run", "sgd", 3, 1);
  r.data.spec = "mnist";
  r.data.train_size = 300;
  r.data.test_size = 100;
  r.model = "mlp:64";
  r.train.batch = 100;
  train_run(r);
  PathReader reader(r.out);
  const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 16);
  DecompositionOptions options;
  options.progress = false;
  options.point_block = 8;
  options.kernel = true;
  const Decomposition all = decompose(reader, x, options);
  expect_same_rows(decompose(reader, x.narrow(0, 8, 8), options), all, 8, "mnist, points 8 to 15");
}

// The automatic block (point_block 0) is 32 for a network whose every
// layer's test features are factored (Linear on flat rows) and 4 otherwise;
// an explicit block is kept, and both shrink to fit the memory budget.
TEST(PointIndependence, TheAutomaticBlockIsWideForLinearNetworksOnly) {
  testing::TempDir dir;
  for (const auto& [model, automatic] : std::vector<std::pair<std::string, int64_t>>{{"mlp:8,8", 32}, {"cnn:2", 4}}) {
    RunOptions r = testing::small_run(dir / model, "sgd", 2, 1);
    r.data.spec = "mnist";
    r.data.train_size = 100;
    r.data.test_size = 20;
    r.model = model;
    train_run(r);
    PathReader reader(r.out);
    const torch::Tensor x = reader.decoded_dataset().x_test;
    DecompositionOptions options;
    options.progress = false;
    EXPECT_EQ(options.point_block, 0);
    EXPECT_EQ(decomposition_block(reader, x, options), automatic) << model;
    options.point_block = 7;
    EXPECT_EQ(decomposition_block(reader, x, options), 7) << model;
    options.memory_doubles = 1;
    EXPECT_EQ(decomposition_block(reader, x, options), 1) << model;
    options.point_block = -1;
    EXPECT_CONTAINS(testing::error_message([&] { decomposition_block(reader, x, options); }),
                    "must be >= 1, or 0 for automatic (got -1)");
  }
}

}  // namespace
}  // namespace pathkernel
