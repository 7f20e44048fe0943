// Decomposing a range of steps alone (DecompositionOptions::first_step,
// end_step): for gd and sgd the ranges of a split add up to the whole
// decomposition, to rounding, in everything the forward walk carries (C_i,
// R, E, the kernel, the certificate gaps, the counts and the step
// residuals), for trained and recorded runs, and bit for bit when the ranges
// are the run's blocks of steps (step_blocks) added to zeros in block order;
// optimizers with a buffer refuse a range.
#include <gtest/gtest.h>

#include <filesystem>

#include "../test_util.h"
#include "pathkernel/context.h"
#include "pathkernel/decomposition.h"
#include "pathkernel/files.h"
#include "pathkernel/npy.h"

namespace pathkernel {
namespace {

namespace fs = std::filesystem;

/// max |a − b| / max |a|.
double relative_gap(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(1e-300, a.abs().max().item<double>());
}

/// The ranges of steps a split of N = 9 steps takes: an empty one, ranges
/// starting and ending inside checkpoint segments, one step alone.
const std::vector<std::pair<int64_t, int64_t>> kRanges = {{0, 4}, {4, 4}, {4, 7}, {7, 8}, {8, 9}};

/// Decomposes every range of kRanges alone and adds them up, slowly and
/// plainly: tensors summed in range order, counts summed, the residuals'
/// worst step and first step over recomputed from their definitions.
Decomposition sum_of_ranges(PathReader& reader, const torch::Tensor& x, const DecompositionOptions& options,
                            const Decomposition& all, const std::string& what) {
  Decomposition sum;
  sum.contributions = torch::zeros_like(all.contributions);
  sum.regularization = torch::zeros_like(all.regularization);
  sum.rounding = torch::zeros_like(all.rounding);
  sum.gap_abs = torch::zeros_like(all.gap_abs);
  if (all.kernel.defined()) sum.kernel = torch::zeros_like(all.kernel);
  for (const auto& [first, end] : kRanges) {
    DecompositionOptions part = options;
    part.first_step = first;
    part.end_step = end;
    const Decomposition d = decompose(reader, x, part);
    EXPECT_TRUE(torch::equal(d.f0, all.f0) && torch::equal(d.fN, all.fN)) << what;
    EXPECT_EQ(d.steps, end - first) << what;
    sum.contributions += d.contributions;
    sum.regularization += d.regularization;
    sum.rounding += d.rounding;
    sum.gap_abs += d.gap_abs;
    if (all.kernel.defined()) sum.kernel += d.kernel;
    sum.certificate_max_gap = std::max(sum.certificate_max_gap, d.certificate_max_gap);
    sum.evaluations += d.evaluations;
    sum.forward_evaluations += d.forward_evaluations;
    sum.moment_evaluations += d.moment_evaluations;
    sum.kinks += d.kinks;
    sum.steps += d.steps;
    // An empty range has no residuals; each other its own steps'.
    if (first == end) EXPECT_EQ(d.residuals.worst_step, -1) << what;
    else EXPECT_TRUE(d.residuals.worst_step >= first && d.residuals.worst_step < end) << what;
    sum.residuals.merge(d.residuals);
  }
  return sum;
}

/// Expects the sum of the ranges to be the whole walk: tensors to 1e-14 of
/// their size (the order of the sums differs), everything else exactly.
void expect_whole(const Decomposition& all, const Decomposition& sum, const std::string& what) {
  EXPECT_LE(relative_gap(all.contributions, sum.contributions), 1e-14) << what;
  EXPECT_LE(relative_gap(all.regularization, sum.regularization), 1e-14) << what;
  EXPECT_LE(relative_gap(all.gap_abs, sum.gap_abs), 1e-14) << what;
  if (all.kernel.defined()) EXPECT_LE(relative_gap(all.kernel, sum.kernel), 1e-14) << what;
  // E is rounding-sized in a described run: compare against f's scale.
  EXPECT_LE((all.rounding - sum.rounding).abs().max().item<double>(),
            1e-14 * std::max(1.0, all.rounding.abs().max().item<double>()))
      << what;
  EXPECT_EQ(all.certificate_max_gap, sum.certificate_max_gap) << what;
  EXPECT_EQ(all.evaluations, sum.evaluations) << what;
  EXPECT_EQ(all.forward_evaluations, sum.forward_evaluations) << what;
  EXPECT_EQ(all.moment_evaluations, sum.moment_evaluations) << what;
  EXPECT_EQ(all.kinks, sum.kinks) << what;
  EXPECT_EQ(all.steps, sum.steps) << what;
  EXPECT_EQ(all.residuals.max_ratio, sum.residuals.max_ratio) << what;
  EXPECT_EQ(all.residuals.max_residual, sum.residuals.max_residual) << what;
  EXPECT_EQ(all.residuals.bound, sum.residuals.bound) << what;
  EXPECT_EQ(all.residuals.worst_step, sum.residuals.worst_step) << what;
  EXPECT_EQ(all.residuals.first_step, sum.residuals.first_step) << what;
  EXPECT_EQ(all.residuals.steps_over, sum.residuals.steps_over) << what;
}

TEST(StepRange, RangesOfGdAndSgdAddUpToTheWhole) {
  for (const std::string opt : {"gd", "sgd"}) {
    testing::TempDir dir(opt);
    RunOptions r = testing::small_run(dir / "run", opt, 9, 3);
    r.train.optimizer.weight_decay = 1e-2;
    train_run(r);
    PathReader reader(r.out);
    const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 3);
    DecompositionOptions options;
    options.progress = false;
    options.kernel = true;
    const Decomposition all = decompose(reader, x, options);
    ASSERT_EQ(all.steps, 9);
    ASSERT_GT(all.regularization.abs().max().item<double>(), 0) << opt;
    expect_whole(all, sum_of_ranges(reader, x, options, all, opt), opt);
    // The first range alone is not the whole: the test can tell.
    DecompositionOptions head = options;
    head.end_step = 4;
    EXPECT_GT(relative_gap(all.contributions, decompose(reader, x, head).contributions), 1e-6) << opt;
  }
}

/// How many blocks of steps (step_blocks) touch each training point, [M].
torch::Tensor blocks_touching(PathReader& reader) {
  const std::vector<int64_t> bounds = step_blocks(reader.manifest());
  const int64_t M = reader.decoded_dataset().x_train.size(0);
  torch::Tensor count = torch::zeros({M}, torch::kLong);
  for (size_t k = 0; k + 1 < bounds.size(); ++k) {
    torch::Tensor touched = torch::zeros({M}, torch::kBool);
    for (int64_t t = bounds[k]; t < bounds[k + 1]; ++t) {
      const torch::Tensor b = reader.batch(t);
      if (b.defined()) touched.index_fill_(0, b, true);
      else touched.fill_(true);
    }
    count += touched.to(torch::kLong);
  }
  return count;
}

// The blocks of steps (the checkpoint segments, [0, 2), [2, 4) .. [8, 9) of
// a 9-step run stored every 2 steps), each decomposed alone and added to
// zeros in block order by add_step_block: the whole walk's bits, which is
// what lets any number of processes split the steps (across_ranks.h). On one
// thread: on several, a block alone is walked by groups of test points, and
// the whole walk takes its blocks on threads, each as one thread walks it.
// The whole walk adds the rows of training points that only one block
// touches straight into its totals, and keeps the others in the block's
// sums; each block decomposed alone takes all its rows straight. The bits
// are the same either way.
TEST(StepRange, BlocksAddedInOrderAreTheWholeBitForBit) {
  const ThreadScope one(1);
  for (const std::string opt : {"gd", "sgd"}) {
    testing::TempDir dir(opt);
    RunOptions r = testing::small_run(dir / "run", opt, 9, 2);
    r.train.optimizer.weight_decay = 1e-2;
    if (opt == "sgd") r.data.train_size = 120;  // 144 samples: most points in one block, some in two
    train_run(r);
    PathReader reader(r.out);
    const std::vector<int64_t> bounds = step_blocks(reader.manifest());
    ASSERT_EQ(bounds, (std::vector<int64_t>{0, 2, 4, 6, 8, 9})) << opt;
    const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 3);
    DecompositionOptions options;
    options.progress = false;
    options.kernel = true;
    options.by_layer = true;
    if (opt == "sgd") {  // both kinds of rows, in the whole walk
      const torch::Tensor blocks = blocks_touching(reader);
      ASSERT_GT(blocks.eq(1).sum().item<int64_t>(), 0);
      ASSERT_GT(blocks.gt(1).sum().item<int64_t>(), 0);
    }
    const Decomposition all = decompose(reader, x, options);
    Decomposition sum;
    sum.layer_contributions = torch::zeros_like(all.layer_contributions);
    sum.contributions = torch::zeros_like(all.contributions);
    sum.regularization = torch::zeros_like(all.regularization);
    sum.rounding = torch::zeros_like(all.rounding);
    sum.gap_abs = torch::zeros_like(all.gap_abs);
    sum.kernel = torch::zeros_like(all.kernel);
    for (size_t k = 0; k + 1 < bounds.size(); ++k) {
      DecompositionOptions part = options;
      part.first_step = bounds[k];
      part.end_step = bounds[k + 1];
      add_step_block(sum, decompose(reader, x, part));
    }
    EXPECT_TRUE(torch::equal(all.contributions, sum.contributions)) << opt;
    EXPECT_TRUE(torch::equal(all.regularization, sum.regularization)) << opt;
    EXPECT_TRUE(torch::equal(all.rounding, sum.rounding)) << opt;
    EXPECT_TRUE(torch::equal(all.gap_abs, sum.gap_abs)) << opt;
    EXPECT_TRUE(torch::equal(all.kernel, sum.kernel)) << opt;
    EXPECT_TRUE(torch::equal(all.layer_contributions, sum.layer_contributions)) << opt;
    ASSERT_GT(all.regularization.abs().max().item<double>(), 0) << opt;
    // A range of several blocks is those blocks added to zeros in order.
    DecompositionOptions middle = options;
    middle.first_step = 2;
    middle.end_step = 8;
    Decomposition blocks;
    blocks.layer_contributions = torch::zeros_like(all.layer_contributions);
    blocks.contributions = torch::zeros_like(all.contributions);
    blocks.regularization = torch::zeros_like(all.regularization);
    blocks.rounding = torch::zeros_like(all.rounding);
    blocks.gap_abs = torch::zeros_like(all.gap_abs);
    blocks.kernel = torch::zeros_like(all.kernel);
    for (int64_t a : {2, 4, 6}) {
      DecompositionOptions part = options;
      part.first_step = a;
      part.end_step = a + 2;
      add_step_block(blocks, decompose(reader, x, part));
    }
    EXPECT_TRUE(torch::equal(decompose(reader, x, middle).contributions, blocks.contributions)) << opt;
  }
  // add_step_block refuses a kernel on one side only.
  Decomposition a, b;
  for (Decomposition* d : {&a, &b}) {
    d->contributions = torch::zeros({1, 2, 2}, torch::kFloat64);
    d->regularization = d->rounding = d->gap_abs = torch::zeros({1, 2}, torch::kFloat64);
  }
  b.kernel = torch::zeros({1, 2, 2, 2}, torch::kFloat64);
  EXPECT_CONTAINS(testing::error_message([&] { add_step_block(a, b); }),
                  "the kernel is in one decomposition and not in the other");
}

// A recorded sgd run whose clip factors say steps 3 and 6 were clipped when
// they were not: those steps' residuals exceed their bounds and E carries
// the difference. The ranges must find the same residuals, step by step,
// and their E must add up to the whole walk's.
TEST(StepRange, RangesOfARecordedRunAddUpToTheWholeWithItsClipFactorsAndResiduals) {
  testing::TempDir dir;
  RunOptions r = testing::small_run(dir / "run", "sgd", 9, 1);  // a recorded run stores every step
  r.train.optimizer.weight_decay = 1e-3;
  r.train.schedule = "cosine";
  train_run(r);
  Manifest m = Manifest::load(r.out);
  m.recorded = true;
  torch::Tensor c = torch::ones({9}, torch::kFloat64);
  c[3] = 0.5;
  c[6] = 0.25;
  write_npy((fs::path(r.out) / "clip_factors.npy").string(), c);
  const std::string bytes = read_file((fs::path(r.out) / "clip_factors.npy").string());
  m.clip_factors = {"clip_factors.npy", static_cast<int64_t>(bytes.size()), crc32_of(bytes)};
  m.save(r.out);

  PathReader reader(r.out);
  const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 3);
  DecompositionOptions options;
  options.progress = false;
  const Decomposition all = decompose(reader, x, options);
  ASSERT_EQ(all.residuals.first_step, 3);
  ASSERT_EQ(all.residuals.steps_over, 2);
  ASSERT_GT(all.rounding.abs().max().item<double>(), 1e-6);  // E carries the unexplained updates
  expect_whole(all, sum_of_ranges(reader, x, options, all, "recorded sgd"), "recorded sgd");
  // A range after both unexplained steps finds none.
  DecompositionOptions tail = options;
  tail.first_step = 7;
  EXPECT_EQ(decompose(reader, x, tail).residuals.first_step, -1);
}

/// Expects b to be a's bits: every tensor, count and residual.
void expect_same_bits(const Decomposition& a, const Decomposition& b, const std::string& what) {
  EXPECT_TRUE(torch::equal(a.contributions, b.contributions)) << what;
  EXPECT_TRUE(torch::equal(a.regularization, b.regularization)) << what;
  EXPECT_TRUE(torch::equal(a.rounding, b.rounding)) << what;
  EXPECT_TRUE(torch::equal(a.gap_abs, b.gap_abs)) << what;
  EXPECT_TRUE(torch::equal(a.f0, b.f0) && torch::equal(a.fN, b.fN)) << what;
  EXPECT_EQ(a.kernel.defined(), b.kernel.defined()) << what;
  if (a.kernel.defined()) EXPECT_TRUE(torch::equal(a.kernel, b.kernel)) << what;
  EXPECT_EQ(a.layer_contributions.defined(), b.layer_contributions.defined()) << what;
  if (a.layer_contributions.defined()) {
    EXPECT_TRUE(torch::equal(a.layer_contributions, b.layer_contributions)) << what;
  }
  EXPECT_EQ(a.certificate_max_gap, b.certificate_max_gap) << what;
  EXPECT_EQ(a.evaluations, b.evaluations) << what;
  EXPECT_EQ(a.forward_evaluations, b.forward_evaluations) << what;
  EXPECT_EQ(a.kinks, b.kinks) << what;
  EXPECT_EQ(a.steps, b.steps) << what;
  EXPECT_EQ(a.residuals.max_ratio, b.residuals.max_ratio) << what;
  EXPECT_EQ(a.residuals.worst_step, b.residuals.worst_step) << what;
  EXPECT_EQ(a.residuals.steps_over, b.residuals.steps_over) << what;
}

// With two threads or more and a replay on one thread allowed (--replay
// ahead), the forward walk (gd, sgd) takes its blocks of steps on threads at
// once, each worker with a reader of its own walking a block as one thread
// walks it, each block of points one group (decomposition_forward.cpp,
// StepsOnThreads). The decomposition is one thread's, bit for bit, on two
// threads and on three, for runs trained on one thread and on two (an MLP's
// Linear products then in pieces), an MLP and a CNN, the kernel and the
// contributions by layer included, from any first step. In turn it is one
// walk of the steps, by groups of points, to rounding. A run of two threads
// whose segment one thread does not reproduce walks again in turn, and says
// why.
TEST(StepsOnThreads, GiveTheDecompositionOfOneThread) {
  struct Case {
    std::string optimizer, data, model;
    int train_threads;
  };
  for (const Case& c : {Case{"gd", "gaussians3", "mlp:6,5", 1}, Case{"gd", "gaussians3", "mlp:6,5", 2},
                        Case{"sgd", "mnist", "cnn:2,3", 1}}) {
    const std::string what = c.optimizer + " " + c.model + " trained on " + std::to_string(c.train_threads);
    testing::TempDir dir(c.optimizer);
    RunOptions r = testing::small_run_of(dir / "run", c.optimizer, c.data, c.model, 9, 2, 7);
    r.train.optimizer.weight_decay = 1e-2;
    {
      ThreadScope scope(c.train_threads);
      train_run(r);
    }
    PathReader reader(r.out);
    ASSERT_EQ(step_blocks(reader.manifest()), (std::vector<int64_t>{0, 2, 4, 6, 8, 9})) << what;
    const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 7);
    DecompositionOptions options;
    options.progress = false;
    options.kernel = c.data == "gaussians3";
    options.point_block = 3;  // blocks of 3, 3 and 1 points
    DecompositionOptions in_turn = options;
    in_turn.replay_ahead = false;
    auto on = [&](int threads, const DecompositionOptions& o) {
      ThreadScope scope(threads);
      return decompose(reader, x, o);
    };
    const Decomposition one = on(1, options);
    EXPECT_EQ(one.step_threads, 1) << what;
    ASSERT_GT(one.contributions.abs().max().item<double>(), 1e-6) << what;
    EXPECT_LT(summarize(one).max_rel_error, 1e-12) << what;
    for (int threads : {2, 3}) {
      const Decomposition d = on(threads, options);
      EXPECT_EQ(d.step_threads, threads) << what;
      expect_same_bits(one, d, what + ", " + std::to_string(threads) + " threads");
    }
    DecompositionOptions from_3 = options;
    from_3.first_step = 3;
    expect_same_bits(on(1, from_3), on(2, from_3), what + ", from step 3");
    DecompositionOptions by_layer = options;
    by_layer.by_layer = true;
    expect_same_bits(on(1, by_layer), on(2, by_layer), what + ", by layer");
    const Decomposition walked = on(2, in_turn);
    EXPECT_EQ(walked.step_threads, 1) << what;
    EXPECT_LE(relative_gap(one.contributions, walked.contributions), 1e-13) << what;
    if (c.train_threads > 1) {
      reader.set_one_thread_differs_at(2);  // the segment of steps 4 and 5
      const Decomposition again = on(2, options);
      EXPECT_EQ(again.step_threads, 1) << what;
      EXPECT_LE(relative_gap(one.contributions, again.contributions), 1e-13) << what;
      EXPECT_LT(summarize(again).max_rel_error, 1e-12) << what;
      EXPECT_CONTAINS(reader.replay_in_turn_reason(), "one thread does not reproduce checkpoint step 6") << what;
    }
  }
}

TEST(StepRange, RefusedForBufferedOptimizersAndOutsideThePath) {
  testing::TempDir dir;
  RunOptions r = testing::small_run(dir / "run", "momentum", 4, 2);
  train_run(r);
  PathReader reader(r.out);
  const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 1);
  DecompositionOptions options;
  options.progress = false;
  options.first_step = 2;
  EXPECT_CONTAINS(testing::error_message([&] { decompose(reader, x, options); }),
                  "a range of steps is decomposed alone for gd and sgd runs only");
  options.first_step = 0;
  options.end_step = 9;
  EXPECT_CONTAINS(testing::error_message([&] { decompose(reader, x, options); }),
                  "the steps to decompose must be a range within [0, 4] (got [0, 9))");
  options.first_step = 3;
  options.end_step = 2;
  EXPECT_CONTAINS(testing::error_message([&] { decompose(reader, x, options); }),
                  "the steps to decompose must be a range within [0, 4] (got [3, 2))");
}

}  // namespace
}  // namespace pathkernel
