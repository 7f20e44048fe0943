// Compact recorded runs: a recorded run (Manifest::recorded) with checkpoints
// only every few steps, whose steps between are replayed. A run trained by
// pathkernel with sparse checkpoints, marked recorded, is the reference: its
// replay reproduces every checkpoint bit for bit (no drift), as the own run's
// replay does. A checkpoint changed by hand is drift at exactly that
// checkpoint, which the path rejoins and the decomposition carries into E.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "../test_util.h"
#include "pathkernel/decomposition.h"
#include "pathkernel/files.h"
#include "pathkernel/npy.h"
#include "pathkernel/path.h"

namespace pathkernel {
namespace {

namespace fs = std::filesystem;
using testing::rewrite_checkpoint;
using testing::same_bits;
using testing::small_run;
using testing::TempDir;

/// Trains `optimizer` (with weight decay and a cosine schedule) with a
/// checkpoint every `every` steps into dir/own, and copies it to dir/compact marked
/// as recorded. Returns the two directories.
std::pair<std::string, std::string> compact_twin(const TempDir& dir, const std::string& optimizer, int64_t steps,
                                                 torch::Dtype dtype = torch::kFloat64, int64_t every = 3) {
  RunOptions r = small_run(dir / "own", optimizer, steps, every);
  r.train.optimizer.weight_decay = optimizer == "adamw" ? 1e-2 : 1e-3;
  r.train.schedule = "cosine";
  r.data.dtype = dtype;
  train_run(r);
  fs::copy(r.out, dir / "compact", fs::copy_options::recursive);
  Manifest m = Manifest::load(dir / "compact");
  m.recorded = true;
  m.save(dir / "compact");
  return {r.out, dir / "compact"};
}

DecompositionOptions quiet_options() {
  DecompositionOptions o;
  o.progress = false;
  o.replay_signals = false;
  return o;
}

TEST(CompactRecordedRun, ReplaysEveryOptimizerBitForBit) {
  for (const torch::Dtype dtype : {torch::kFloat64, torch::kFloat32}) {
    for (const std::string opt : {"sgd", "momentum", "nesterov", "adam", "adamw", "rmsprop", "rmsprop-momentum", "adagrad"}) {
      TempDir dir(opt);
      auto [own, compact] = compact_twin(dir, opt, 8, dtype);
      PathReader reference(own), reader(compact);
      ASSERT_TRUE(reader.replays_recorded());
      ASSERT_EQ(reader.manifest().checkpoints.size(), 4u);  // 0, 3, 6, 8
      std::vector<PathStep> expect;
      reference.forward([&](const PathStep& st) { expect.push_back(st); });
      int64_t next = 0;
      reader.forward([&](const PathStep& st) {
        ASSERT_LT(next, static_cast<int64_t>(expect.size()));
        const PathStep& e = expect[next++];
        EXPECT_TRUE(same_bits(st.w, e.w)) << opt << " step " << st.step;
        EXPECT_TRUE(same_bits(st.delta, e.delta)) << opt << " step " << st.step;
      });
      EXPECT_EQ(next, 8);
      const ReplayDrift drift = reader.replay_drift();
      EXPECT_EQ(drift.steps, (std::vector<int64_t>{3, 6, 8}));
      EXPECT_EQ(drift.max(), 0) << opt;
      EXPECT_EQ(drift.bit_for_bit(), 3) << opt;
      EXPECT_EQ(drift.worst_step(), -1) << opt;
      const ReplayReport report = reader.check();
      EXPECT_TRUE(report.recorded);
      EXPECT_EQ(report.steps_replayed, 8);
      EXPECT_EQ(report.mismatches, 0);
    }
  }
}

TEST(CompactRecordedRun, DecomposesAsTheOwnRun) {
  for (const std::string opt : {"sgd", "momentum", "adam"}) {
    TempDir dir(opt);
    auto [own, compact] = compact_twin(dir, opt, 7);
    PathReader reference(own), reader(compact);
    const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 3);
    const Decomposition a = decompose(reference, x, quiet_options());
    const Decomposition b = decompose(reader, x, quiet_options());
    EXPECT_TRUE(torch::equal(a.contributions, b.contributions)) << opt;
    EXPECT_TRUE(torch::equal(a.rounding, b.rounding)) << opt;
    EXPECT_LT(summarize(b).max_rel_error, 1e-12) << opt;
  }
}

// A checkpoint that is not what replay gives (as when a Python loop's
// arithmetic differs from LibTorch's): drift at that checkpoint, and only
// there; the path rejoins the stored weights, so the steps stay contiguous
// and f(w_N) is still reached exactly, the difference in E.
TEST(CompactRecordedRun, DriftIsReportedAtItsCheckpointAndCarriedIntoE) {
  for (const std::string opt : {"momentum", "adamw"}) {
    TempDir dir(opt);
    auto [own, compact] = compact_twin(dir, opt, 8);
    torch::Tensor w6 = PathReader(compact).checkpoint(2).clone();
    ASSERT_EQ(PathReader(compact).manifest().checkpoints[2].step, 6);
    w6[1] += 1e-3;
    rewrite_checkpoint(compact, 6, w6);
    PathReader reader(compact);
    // Each step starts where the one before ended (w_s + Δw_s, up to the
    // rounding of that sum); step 5 ends at the changed w_6, 1e-3 away from
    // where its replay went.
    torch::Tensor prev;
    auto gap = [](const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); };
    reader.forward([&](const PathStep& st) {
      if (prev.defined()) EXPECT_LT(gap(prev, st.w), 1e-14) << opt << " step " << st.step;
      prev = st.w + st.delta;
      if (st.step == 5) EXPECT_LT(gap(prev, w6), 1e-14) << opt << ": step 5 ends at the stored w_6";
    });
    const ReplayDrift drift = reader.replay_drift();
    // w_3 bit for bit, w_6 off by the change exactly, w_8 replayed from the changed w_6.
    EXPECT_EQ(drift.max_abs_diff[0], 0) << opt;
    EXPECT_NEAR(drift.max_abs_diff[1], 1e-3, 1e-15) << opt;
    EXPECT_GT(drift.max_abs_diff[2], 0) << opt;
    EXPECT_EQ(drift.bit_for_bit(), 1) << opt;
    const int64_t worst = drift.max_abs_diff[1] >= drift.max_abs_diff[2] ? 6 : 8;
    EXPECT_EQ(drift.worst_step(), worst) << opt;
    EXPECT_EQ(drift.max(), std::max(drift.max_abs_diff[1], drift.max_abs_diff[2])) << opt;
    const std::string message = replay_drift_message(drift, 1.0);
    EXPECT_NE(message.find("checkpoint of step " + std::to_string(worst)), std::string::npos) << message;
    EXPECT_NE(message.find("carrying the difference into E"), std::string::npos) << message;
    const Decomposition d = decompose(reader, reader.decoded_dataset().x_test.narrow(0, 0, 3), quiet_options());
    EXPECT_LT(summarize(d).max_rel_error, 1e-12) << opt;
    EXPECT_GT(summarize(d).max_abs_rounding, 1e-8) << opt;  // E holds the drift
    // Step 5 ends at the changed w_6: far over its bound, in a segment the
    // replay did not reproduce, so not a rounding branch.
    EXPECT_EQ(d.residuals.first_step, 5) << opt;
    EXPECT_FALSE(d.residuals.rounding_branches) << opt;
    EXPECT_FALSE(d.residuals.explained()) << opt;
    EXPECT_NE(unexplained_update_message(d.residuals).find("from step 5"), std::string::npos) << opt;
    EXPECT_EQ(rounding_branch_message(d.residuals), "") << opt;
  }
}

/// Residuals with `steps` over their bound (each 2 against a bound of 1).
StepResiduals over_bound(const std::vector<int64_t>& steps) {
  StepResiduals r;
  for (int64_t s : steps) r.add(s, 2.0, 1.0);
  return r;
}

// A step over its rounding bound in a segment the replay reproduced bit for
// bit is the run's rounding taking a branch the float64 network did not (the
// declared loss and optimizer gave the loop's update); one in a drifted
// segment or a list that does not name every step over is not.
TEST(CompactRecordedRun, StepsOverTheirBoundInSegmentsReproducedAreRoundingBranches) {
  TempDir dir;
  auto [own, compact] = compact_twin(dir, "momentum", 8);
  torch::Tensor w6 = PathReader(compact).checkpoint(2).clone();
  w6[1] += 1e-3;
  rewrite_checkpoint(compact, 6, w6);  // segments 0..3 bit for bit, 3..6 and 6..8 drift
  PathReader fresh(compact);
  StepResiduals before = over_bound({1});
  read_residuals_against_replay(fresh, before);  // replays segment 0..3 to see
  EXPECT_TRUE(before.rounding_branches);
  PathReader reader(compact);
  ASSERT_EQ(reader.replay_drift().bit_for_bit(), 1);
  EXPECT_TRUE(reader.step_reproduced(0));
  EXPECT_TRUE(reader.step_reproduced(2));
  EXPECT_FALSE(reader.step_reproduced(3));
  EXPECT_FALSE(reader.step_reproduced(7));
  EXPECT_FALSE(reader.step_reproduced(8)) << "past the last step";

  StepResiduals in_reproduced = over_bound({1, 2});
  read_residuals_against_replay(reader, in_reproduced);
  EXPECT_TRUE(in_reproduced.rounding_branches);
  EXPECT_TRUE(in_reproduced.explained());
  EXPECT_EQ(unexplained_update_message(in_reproduced), "");
  const std::string note = rounding_branch_message(in_reproduced);
  EXPECT_NE(note.find("2 step(s) from step 1 on"), std::string::npos) << note;
  EXPECT_NE(note.find("bit for bit"), std::string::npos) << note;

  for (const std::vector<int64_t>& steps : {std::vector<int64_t>{1, 4}, std::vector<int64_t>{7}}) {
    StepResiduals drifted = over_bound(steps);
    read_residuals_against_replay(reader, drifted);
    EXPECT_FALSE(drifted.rounding_branches) << steps.back();
    EXPECT_FALSE(drifted.explained());
    EXPECT_EQ(rounding_branch_message(drifted), "");
  }
  StepResiduals unlisted = over_bound({1, 2});
  unlisted.over_steps.pop_back();  // as when more than kListedSteps were over
  read_residuals_against_replay(reader, unlisted);
  EXPECT_FALSE(unlisted.rounding_branches);

  StepResiduals none;
  read_residuals_against_replay(reader, none);
  EXPECT_FALSE(none.rounding_branches);
  EXPECT_TRUE(none.explained());

}

// pathkernel's own run: its segments replay bit for bit with the training it
// declares, so a step over its bound is its rounding's branch too; a segment
// whose checkpoint was changed by hand is not reproduced, and reading it
// does not throw.
TEST(CompactRecordedRun, AnOwnRunsStepsOverTheirBoundAreRoundingBranchesWhereItsReplayAgrees) {
  TempDir dir;
  auto [own, compact] = compact_twin(dir, "adam", 8, torch::kFloat32);
  StepResiduals of_own = over_bound({1, 4});
  PathReader trained(own);
  read_residuals_against_replay(trained, of_own);
  EXPECT_TRUE(of_own.rounding_branches);
  EXPECT_TRUE(of_own.explained());

  torch::Tensor w6 = PathReader(own).checkpoint(2).clone();
  w6[1] += 1e-3;
  rewrite_checkpoint(own, 6, w6);
  PathReader changed(own);
  EXPECT_TRUE(changed.step_reproduced(1));
  EXPECT_FALSE(changed.step_reproduced(4)) << "ends at the changed w_6";
  EXPECT_FALSE(changed.step_reproduced(6)) << "starts from the changed w_6";
  StepResiduals in_changed = over_bound({1, 4});
  read_residuals_against_replay(changed, in_changed);
  EXPECT_FALSE(in_changed.rounding_branches);
  EXPECT_NE(unexplained_update_message(in_changed), "");
}

// Every step stored: a step is replayed alone from its stored weights and
// state, and reproduces the next stored weights bit for bit unless those (or
// its own) were changed.
TEST(CompactRecordedRun, AStoredStepIsReplayedFromItsOwnWeightsAndState) {
  for (const std::string opt : {"momentum", "adam"}) {
    TempDir dir(opt);
    auto [own, recorded] = compact_twin(dir, opt, 6, torch::kFloat64, 1);
    ASSERT_FALSE(PathReader(recorded).replays_recorded());
    ASSERT_EQ(PathReader(recorded).manifest().checkpoints.size(), 7u);  // every step stored
    torch::Tensor w3 = PathReader(recorded).checkpoint(3).clone();
    w3[1] += 1e-3;
    rewrite_checkpoint(recorded, 3, w3);
    PathReader reader(recorded);
    EXPECT_TRUE(reader.step_reproduced(1)) << opt;
    EXPECT_FALSE(reader.step_reproduced(2)) << opt << ": ends at the changed w_3";
    EXPECT_FALSE(reader.step_reproduced(3)) << opt << ": starts from the changed w_3";
    EXPECT_TRUE(reader.step_reproduced(5)) << opt;
    StepResiduals r = over_bound({5});
    read_residuals_against_replay(reader, r);
    EXPECT_TRUE(r.rounding_branches) << opt;
  }
}

TEST(StepResiduals, ListsTheStepsOverTheirBoundUpToItsLimit) {
  StepResiduals r;
  r.add(3, 0.5, 1.0);  // within its bound
  for (int64_t s = 10; s < 10 + StepResiduals::kListedSteps + 5; ++s) r.add(s, 2.0, 1.0);
  EXPECT_EQ(r.steps_over, StepResiduals::kListedSteps + 5);
  ASSERT_EQ(static_cast<int64_t>(r.over_steps.size()), StepResiduals::kListedSteps);
  EXPECT_EQ(r.over_steps.front(), 10);
  StepResiduals a = over_bound({4}), b = over_bound({2, 9});
  a.merge(b);
  EXPECT_EQ(a.over_steps, (std::vector<int64_t>{4, 2, 9}));
  EXPECT_EQ(a.first_step, 2);
  EXPECT_EQ(a.steps_over, 3);
  // Merged, steps over are rounding branches only if each part's are.
  StepResiduals branches = over_bound({4}), clean, other = over_bound({6});
  branches.rounding_branches = true;
  StepResiduals with_clean = branches;
  with_clean.merge(clean);
  EXPECT_TRUE(with_clean.rounding_branches);
  clean.merge(branches);
  EXPECT_TRUE(clean.rounding_branches);
  branches.merge(other);
  EXPECT_FALSE(branches.rounding_branches);
  EXPECT_FALSE(branches.explained());
}

// Replay applies the recorded clip factors: a run recorded with its learning
// rates doubled and every gradient halved is the own run's path (both
// scalings by powers of two are exact), so it replays with no drift.
TEST(CompactRecordedRun, ReplayAppliesTheClipFactors) {
  TempDir dir;
  RunOptions r = small_run(dir / "run", "sgd", 6, 3);
  r.train.schedule = "cosine";
  train_run(r);
  Manifest m = Manifest::load(r.out);
  for (double& lr : m.learning_rates) lr *= 2;
  m.recorded = true;
  write_npy((fs::path(r.out) / "clip_factors.npy").string(), torch::full({6}, 0.5, torch::kFloat64));
  const std::string bytes = read_file((fs::path(r.out) / "clip_factors.npy").string());
  m.clip_factors = {"clip_factors.npy", static_cast<int64_t>(bytes.size()), crc32_of(bytes)};
  m.save(r.out);
  PathReader reader(r.out);
  EXPECT_EQ(reader.replay_drift().max(), 0);
  int64_t steps = 0;
  reader.forward([&](const PathStep& st) {
    EXPECT_EQ(st.clip, 0.5);
    ++steps;
  });
  EXPECT_EQ(steps, 6);
}

}  // namespace
}  // namespace pathkernel
