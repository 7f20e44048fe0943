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
using testing::same_bits;
using testing::small_run;
using testing::TempDir;

/// Trains `optimizer` (with weight decay and a cosine schedule) with a
/// checkpoint every 3 steps into dir/own, and copies it to dir/compact marked
/// as recorded. Returns the two directories.
std::pair<std::string, std::string> compact_twin(const TempDir& dir, const std::string& optimizer, int64_t steps,
                                                 torch::Dtype dtype = torch::kFloat64) {
  RunOptions r = small_run(dir / "own", optimizer, steps, 3);
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

/// Rewrites the checkpoint file of step `step` with `w` and lists its new
/// size and CRC-32 in the manifest.
void rewrite_checkpoint(const std::string& run, int64_t step, const torch::Tensor& w) {
  Manifest m = Manifest::load(run);
  for (CheckpointRecord& c : m.checkpoints) {
    if (c.step != step) continue;
    const std::string path = (fs::path(run) / c.weights.file).string();
    write_npy(path, w);
    const std::string bytes = read_file(path);
    c.weights.bytes = static_cast<int64_t>(bytes.size());
    c.weights.crc32 = crc32_of(bytes);
  }
  m.save(run);
}

DecompositionOptions quiet_options() {
  DecompositionOptions o;
  o.progress = false;
  o.replay_signals = false;
  return o;
}

TEST(CompactRecordedRun, ReplaysEveryOptimizerBitForBit) {
  for (const torch::Dtype dtype : {torch::kFloat64, torch::kFloat32}) {
    for (const std::string opt : {"sgd", "momentum", "nesterov", "adam", "adamw"}) {
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
    const torch::Tensor x = reader.dataset().x_test.narrow(0, 0, 3);
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
    const Decomposition d = decompose(reader, reader.dataset().x_test.narrow(0, 0, 3), quiet_options());
    EXPECT_LT(summarize(d).max_rel_error, 1e-12) << opt;
    EXPECT_GT(summarize(d).max_abs_rounding, 1e-8) << opt;  // E holds the drift
  }
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
