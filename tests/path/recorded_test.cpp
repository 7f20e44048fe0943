// Recorded runs (Manifest::recorded): a path whose every step is stored is
// read from its files, not replayed (compact ones: compact_recorded_test.cpp). A run trained by pathkernel with a
// checkpoint at every step, marked recorded, is the independent reference:
// reading it must give what replaying it gives, bit for bit, and so the same
// decomposition; a declared clip factor that training did not apply must be
// named at its step.
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
using testing::error_message;
using testing::same_bits;
using testing::small_run;
using testing::TempDir;

/// Trains `optimizer` with a checkpoint at every step into dir/replayed, and
/// copies it to dir/recorded marked as recorded. Returns the two directories.
std::pair<std::string, std::string> twin_runs(const TempDir& dir, const std::string& optimizer, int64_t steps) {
  RunOptions r = small_run(dir / "replayed", optimizer, steps, 1);
  r.train.optimizer.weight_decay = optimizer == "adamw" ? 1e-2 : 1e-3;
  r.train.schedule = "cosine";
  train_run(r);
  fs::copy(r.out, dir / "recorded", fs::copy_options::recursive);
  Manifest m = Manifest::load(dir / "recorded");
  m.recorded = true;
  m.save(dir / "recorded");
  return {r.out, dir / "recorded"};
}

/// Declares clip factors c (float64 [N]) in a recorded run.
void declare_clip_factors(const std::string& run, const torch::Tensor& c) {
  write_npy((fs::path(run) / "clip_factors.npy").string(), c);
  Manifest m = Manifest::load(run);
  const std::string bytes = read_file((fs::path(run) / "clip_factors.npy").string());
  m.clip_factors = {"clip_factors.npy", static_cast<int64_t>(bytes.size()), crc32_of(bytes)};
  m.save(run);
}

DecompositionOptions quiet_options() {
  DecompositionOptions o;
  o.progress = false;
  o.replay_signals = false;  // the replayed run then computes exactly as the recorded one
  return o;
}

TEST(RecordedRun, ReadsEveryStepAsReplayGivesIt) {
  for (const std::string opt : {"sgd", "momentum", "adam"}) {
    TempDir dir(opt);
    auto [replayed, recorded] = twin_runs(dir, opt, 6);
    PathReader reference(replayed), reader(recorded);
    std::vector<PathStep> expect;
    reference.forward([&](const PathStep& st) { expect.push_back(st); });
    int64_t next = 0;
    reader.forward([&](const PathStep& st) {
      ASSERT_LT(next, static_cast<int64_t>(expect.size()));
      const PathStep& e = expect[next++];
      EXPECT_EQ(st.step, e.step);
      EXPECT_TRUE(same_bits(st.w, e.w)) << opt << " step " << st.step;
      EXPECT_TRUE(same_bits(st.delta, e.delta)) << opt << " step " << st.step;
      EXPECT_TRUE(torch::equal(st.batch, e.batch)) << opt << " step " << st.step;
      EXPECT_EQ(st.lr, e.lr);
      EXPECT_EQ(st.clip, 1.0);
      EXPECT_EQ(st.state.step, e.state.step) << opt;
      ASSERT_EQ(st.state.buffers.size(), e.state.buffers.size()) << opt;
      for (const auto& [name, b] : e.state.buffers) {
        EXPECT_TRUE(same_bits(st.state.buffers.at(name), b.to(torch::kFloat64))) << opt << " " << name;
      }
    });
    EXPECT_EQ(next, 6);
    const ReplayReport report = reader.check();
    EXPECT_TRUE(report.recorded);
    EXPECT_EQ(report.steps_replayed, 0);
  }
}

TEST(RecordedRun, DecomposesAsTheReplayedRun) {
  for (const std::string opt : {"sgd", "nesterov", "adamw"}) {
    TempDir dir(opt);
    auto [replayed, recorded] = twin_runs(dir, opt, 5);
    PathReader reference(replayed), reader(recorded);
    const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 3);
    const Decomposition a = decompose(reference, x, quiet_options());
    const Decomposition b = decompose(reader, x, quiet_options());
    EXPECT_TRUE(torch::equal(a.contributions, b.contributions)) << opt;
    EXPECT_TRUE(torch::equal(a.rounding, b.rounding)) << opt;
    EXPECT_TRUE(torch::equal(a.regularization, b.regularization)) << opt;
    EXPECT_EQ(b.residuals.first_step, -1) << opt << ": " << unexplained_update_message(b.residuals);
    EXPECT_LT(summarize(b).max_rel_error, 1e-12) << opt;
  }
}

// A run that says step 3's gradient was halved when it was not: that step,
// and only that step, is unexplained; the kernel machine still equals the
// network (E carries the difference), and the message names the step.
TEST(RecordedRun, AClipFactorTrainingDidNotApplyIsNamedAtItsStep) {
  for (const std::string opt : {"sgd", "momentum"}) {
    TempDir dir(opt);
    auto [replayed, recorded] = twin_runs(dir, opt, 6);
    torch::Tensor c = torch::ones({6}, torch::kFloat64);
    declare_clip_factors(recorded, c);  // all ones: explained
    {
      PathReader reader(recorded);
      const Decomposition d = decompose(reader, reader.decoded_dataset().x_test.narrow(0, 0, 2), quiet_options());
      EXPECT_EQ(d.residuals.first_step, -1) << opt;
    }
    c[3] = 0.5;
    declare_clip_factors(recorded, c);
    PathReader reader(recorded);
    const Decomposition d = decompose(reader, reader.decoded_dataset().x_test.narrow(0, 0, 2), quiet_options());
    EXPECT_EQ(d.residuals.first_step, 3) << opt;
    EXPECT_EQ(d.residuals.steps_over, 1) << opt;
    EXPECT_GT(d.residuals.max_ratio, 1e6) << opt;
    EXPECT_CONTAINS(unexplained_update_message(d.residuals), "from step 3 on");
    EXPECT_LT(summarize(d).max_rel_error, 1e-12) << opt;
    EXPECT_GT(summarize(d).max_abs_rounding, 1e-6) << opt;
  }
}

// The decomposition with clip factors: training whose gradients really were
// scaled is explained once the factors are declared. A run trained with the
// learning rate halved at step 2 is the same path as one at full rate whose
// gradient at step 2 was clipped by one half (for sgd without weight decay).
TEST(RecordedRun, DeclaredClipFactorsExplainScaledSteps) {
  TempDir dir;
  RunOptions r = small_run(dir / "run", "sgd", 5, 1);
  train_run(r);
  Manifest m = Manifest::load(r.out);
  ASSERT_EQ(m.learning_rates.size(), 5u);
  // Recorded with the learning rates doubled and every clip factor one half:
  // the same updates, η c G = (2η)(G/2), up to the rounding of the product.
  for (double& lr : m.learning_rates) lr *= 2;
  m.recorded = true;
  m.save(r.out);
  declare_clip_factors(r.out, torch::full({5}, 0.5, torch::kFloat64));
  PathReader reader(r.out);
  const Decomposition d = decompose(reader, reader.decoded_dataset().x_test.narrow(0, 0, 2), quiet_options());
  EXPECT_EQ(d.residuals.first_step, -1) << unexplained_update_message(d.residuals);
  EXPECT_LT(summarize(d).max_rel_error, 1e-12);
  EXPECT_LT(summarize(d).completeness_error, 1e-12);
}

TEST(RecordedRun, RefusesBadClipFactors) {
  TempDir dir;
  auto [replayed, recorded] = twin_runs(dir, "sgd", 4);
  declare_clip_factors(recorded, torch::tensor({1.0, 0.0, 1.0, 1.0}, torch::kFloat64));
  EXPECT_CONTAINS(error_message([&] { PathReader reader(recorded); }), "the clip factor of step 1 is 0");
  declare_clip_factors(recorded, torch::ones({3}, torch::kFloat64));
  EXPECT_CONTAINS(error_message([&] { PathReader reader(recorded); }), "expected float64 of shape [4]");
  declare_clip_factors(replayed, torch::ones({4}, torch::kFloat64));  // not a recorded run
  EXPECT_CONTAINS(error_message([&] { Manifest::load(replayed); }), "belongs to a recorded run");
}

}  // namespace
}  // namespace pathkernel
