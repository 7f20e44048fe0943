// Decomposing a range of steps alone (DecompositionOptions::first_step,
// end_step): for gd and sgd the ranges of a split add up to the whole
// decomposition, to rounding; optimizers with a buffer refuse a range.
#include <gtest/gtest.h>

#include "../test_util.h"
#include "pathkernel/decomposition.h"

namespace pathkernel {
namespace {

/// max |a − b| / max |a|.
double relative_gap(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(1e-300, a.abs().max().item<double>());
}

TEST(StepRange, RangesOfGdAndSgdAddUpToTheWhole) {
  for (const std::string opt : {"gd", "sgd"}) {
    testing::TempDir dir(opt);
    RunOptions r = testing::small_run(dir / "run", opt, 9, 3);
    r.train.optimizer.weight_decay = 1e-2;
    train_run(r);
    PathReader reader(r.out);
    const torch::Tensor x = reader.dataset().x_test.narrow(0, 0, 3);
    DecompositionOptions options;
    options.progress = false;
    options.kernel = true;
    const Decomposition all = decompose(reader, x, options);
    torch::Tensor c = torch::zeros_like(all.contributions), reg = torch::zeros_like(all.regularization),
                  rnd = torch::zeros_like(all.rounding), k = torch::zeros_like(all.kernel);
    int64_t evaluations = 0;
    for (const auto& [first, end] : std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {4, 4}, {4, 9}}) {
      DecompositionOptions part = options;
      part.first_step = first;
      part.end_step = end;
      const Decomposition d = decompose(reader, x, part);
      EXPECT_TRUE(torch::equal(d.f0, all.f0) && torch::equal(d.fN, all.fN)) << opt;
      c += d.contributions;
      reg += d.regularization;
      rnd += d.rounding;
      k += d.kernel;
      evaluations += d.evaluations;
    }
    EXPECT_LE(relative_gap(all.contributions, c), 1e-14) << opt;
    EXPECT_LE(relative_gap(all.regularization, reg), 1e-14) << opt;
    EXPECT_LE(relative_gap(all.kernel, k), 1e-14) << opt;
    EXPECT_LE((all.rounding - rnd).abs().max().item<double>(), 1e-15) << opt;
    EXPECT_EQ(evaluations, all.evaluations) << opt;
    // The first range alone is not the whole: the test can tell.
    DecompositionOptions head = options;
    head.end_step = 4;
    EXPECT_GT(relative_gap(all.contributions, decompose(reader, x, head).contributions), 1e-6) << opt;
  }
}

TEST(StepRange, RefusedForBufferedOptimizersAndOutsideThePath) {
  testing::TempDir dir;
  RunOptions r = testing::small_run(dir / "run", "momentum", 4, 2);
  train_run(r);
  PathReader reader(r.out);
  const torch::Tensor x = reader.dataset().x_test.narrow(0, 0, 1);
  DecompositionOptions options;
  options.progress = false;
  options.first_step = 2;
  EXPECT_CONTAINS(testing::error_message([&] { decompose(reader, x, options); }),
                  "a range of steps is decomposed alone for gd and sgd runs only");
  options.first_step = 0;
  options.end_step = 9;
  EXPECT_CONTAINS(testing::error_message([&] { decompose(reader, x, options); }),
                  "the steps to decompose must be a range within [0, 4] (got [0, 9))");
}

}  // namespace
}  // namespace pathkernel
