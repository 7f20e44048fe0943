// Tests of the replay run ahead on a thread of its own (PathReader::
// set_replay_ahead): the same steps, bit for bit and in the same order, as
// the replay in turn; its failures reach the caller as they did; a caller
// that leaves early stops it; and the decomposition it feeds is the same.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <stdexcept>

#include "../test_util.h"
#include "pathkernel/context.h"
#include "pathkernel/decomposition.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/npy.h"
#include "pathkernel/path.h"
#include "pathkernel/trainer.h"

namespace pathkernel {
namespace {

using testing::error_message;
using testing::rewrite_checkpoint;
using testing::same_bits;
using testing::small_run;
using testing::TempDir;

void expect_same_steps(const std::vector<PathStep>& a, const std::vector<PathStep>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].step, b[i].step) << what;
    EXPECT_TRUE(same_bits(a[i].w, b[i].w)) << what << " step " << a[i].step;
    EXPECT_TRUE(same_bits(a[i].delta, b[i].delta)) << what << " step " << a[i].step;
    EXPECT_TRUE(same_bits(a[i].batch, b[i].batch)) << what << " step " << a[i].step;
    EXPECT_EQ(a[i].lr, b[i].lr) << what;
    ASSERT_EQ(a[i].state.buffers.size(), b[i].state.buffers.size()) << what;
    for (const auto& [name, buf] : a[i].state.buffers) {
      EXPECT_TRUE(same_bits(buf, b[i].state.buffers.at(name))) << what << " " << name << " step " << a[i].step;
    }
  }
}

/// A run of `steps` steps, checkpoints every 3, trained on one thread (the
/// runs a replay ahead serves).
std::string one_thread_run(const TempDir& dir, const std::string& optimizer, int64_t steps,
                           const std::string& model = "mlp:6") {
  std::string name = "run_" + optimizer + "_" + model;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  RunOptions r = small_run(dir / name, optimizer, steps, 3);
  r.model = model;
  ThreadScope one(1);
  train_run(r);
  return r.out;
}

std::vector<PathStep> forward_steps(PathReader& reader, bool ahead, int64_t begin, int64_t end) {
  std::vector<PathStep> out;
  reader.set_replay_ahead(ahead);
  reader.forward([&](const PathStep& st) { out.push_back(st); }, begin, end);
  reader.set_replay_ahead(false);
  return out;
}

std::vector<PathStep> reverse_steps(PathReader& reader, bool ahead) {
  std::vector<PathStep> out;
  reader.set_replay_ahead(ahead);
  reader.reverse([&](const PathStep& st) { out.push_back(st); });
  reader.set_replay_ahead(false);
  return out;
}

// Own networks, and a TorchScript module whose replay loses a bit where
// TorchScript optimises its graph (its tanh's backward): the replay's
// thread takes the caller's settings.
TEST(ReplayAhead, GivesTheStepsInTurnBitForBitForwardAndInReverse) {
  TempDir dir("replay_ahead_steps");
  ThreadScope two(2);
  for (const auto& [opt, model] : std::vector<std::pair<std::string, std::string>>{
           {"gd", "mlp:6"}, {"sgd", "mlp:6"}, {"adam", "mlp:6"}, {"sgd", "layers:linear(5),tanh"}}) {
    PathReader reader(one_thread_run(dir, opt, 10, model));
    reader.set_replay_ahead(true);
    ASSERT_TRUE(reader.replays_ahead()) << opt;
    for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{{0, 10}, {4, 8}, {9, 10}, {5, 5}}) {
      const std::string what = opt + " " + model + " [" + std::to_string(begin) + ", " + std::to_string(end) + ")";
      const std::vector<PathStep> in_turn = forward_steps(reader, false, begin, end);
      EXPECT_EQ(reader.replay_ahead_seconds(), 0) << what;
      expect_same_steps(forward_steps(reader, true, begin, end), in_turn, what);
      if (end > begin) EXPECT_GT(reader.replay_ahead_seconds(), 0) << what;
    }
    const std::vector<PathStep> in_turn = reverse_steps(reader, false);
    ASSERT_EQ(in_turn.size(), 10u);
    expect_same_steps(reverse_steps(reader, true), in_turn, opt + " reverse");
    EXPECT_GT(reader.replay_ahead_seconds(), 0) << opt;
  }
}

// A caller of one thread replays in turn: the replay's thread would be a
// second.
TEST(ReplayAhead, ACallerOfOneThreadReplaysInTurn) {
  TempDir dir("replay_ahead_one");
  PathReader reader(one_thread_run(dir, "sgd", 4));
  reader.set_replay_ahead(true);
  ThreadScope one(1);
  EXPECT_FALSE(reader.replays_ahead());
  EXPECT_CONTAINS(reader.replay_in_turn_reason(), "one thread (--threads 1)");
  ThreadScope two(2);
  EXPECT_TRUE(reader.replays_ahead());
  EXPECT_EQ(reader.replay_in_turn_reason(), "");
  reader.set_replay_ahead(false);
  EXPECT_FALSE(reader.replays_ahead());
  EXPECT_EQ(reader.replay_in_turn_reason(), "asked for (--replay in-turn)");
}

/// A run of 10 steps, checkpoints at 0, 3, 6, 9 and 10 (its shortest
/// segment is the last, 3), trained on two threads: a module's layers, whose
/// Linear products are not split into pieces (pathkernel's own MLP's are,
/// and replay in turn).
std::string two_thread_run(const TempDir& dir, const std::string& optimizer) {
  RunOptions r = small_run(dir / ("run_two_" + optimizer), optimizer, 10, 3);
  r.model = "layers:linear(6),relu";
  ThreadScope two(2);
  train_run(r);
  return r.out;
}

// A run of two threads replays ahead on one thread (OpenBLAS's count, the
// process's, then stays at one for it and the caller alike) where one
// thread reproduces it: this run's tensors are too small for any operation
// to split its work by threads, so one does. The same steps, bit for bit.
TEST(ReplayAhead, ARunOfTwoThreadsReplaysAheadOnOneWhereOneReproducesIt) {
  TempDir dir("replay_ahead_two");
  for (const std::string opt : {"sgd", "adam"}) {
    PathReader reader(two_thread_run(dir, opt));
    ASSERT_EQ(reader.manifest().threads, 2);
    ThreadScope two(2);
    reader.set_replay_ahead(true);
    ASSERT_TRUE(reader.replays_ahead()) << opt;
    const std::vector<PathStep> in_turn = forward_steps(reader, false, 0, 10);
    expect_same_steps(forward_steps(reader, true, 0, 10), in_turn, opt + " forward");
    EXPECT_GT(reader.replay_ahead_seconds(), 0) << opt;
    expect_same_steps(reverse_steps(reader, true), reverse_steps(reader, false), opt + " reverse");
  }
}

// pathkernel's own MLP trained on two threads splits its Linear products
// into two pieces, each on one OpenBLAS thread (pieced_linear.h): it
// replays in turn, its pieces on both threads, and one thread reproduces
// it (the check a replay ahead makes), though its products are large
// enough that OpenBLAS's threads would split them (a full-batch run of
// 3,000 points: trained with OpenBLAS on two threads, one did not).
TEST(ReplayAhead, AnMlpTrainedOnTwoThreadsInPiecesReplaysInTurn) {
  TempDir dir("replay_ahead_pieces");
  RunOptions r = small_run(dir / "mlp", "gd", 8, 3);
  r.data.train_size = 3000;
  r.model = "mlp:256";
  ThreadScope two(2);
  train_run(r);
  PathReader reader(r.out);
  ASSERT_EQ(reader.manifest().environment.linear_pieces, 2);
  reader.set_replay_ahead(true);
  EXPECT_FALSE(reader.replays_ahead());
  EXPECT_CONTAINS(reader.replay_in_turn_reason(), "Linear products are in 2 pieces");
  EXPECT_TRUE(reader.check().bitwise_equal);
  EXPECT_TRUE(reader.one_thread_reproduces());
}

// One thread not reproducing the run's shortest segment: it replays in
// turn, at its own count.
TEST(ReplayAhead, ARunOfTwoThreadsThatOneDoesNotReproduceReplaysInTurn) {
  TempDir dir("replay_ahead_two_in_turn");
  PathReader reader(two_thread_run(dir, "sgd"));
  reader.set_one_thread_differs_at(3);  // steps [9, 10), the shortest
  reader.set_replay_ahead(true);
  ThreadScope two(2);
  EXPECT_FALSE(reader.replays_ahead());
  EXPECT_EQ(reader.replay_in_turn_reason(),
            "the run was trained on 2 torch thread(s) and 2 OpenBLAS thread(s), and one thread does not reproduce "
            "its shortest checkpoint segment bit for bit");
  int64_t seen = 0;
  reader.forward([&](const PathStep&) { ++seen; });
  EXPECT_EQ(seen, 10);
  EXPECT_EQ(reader.replay_ahead_seconds(), 0);
}

// One thread reproducing the shortest segment but not a later one (steps 3
// to 5): forward hands that segment's steps on unverified, then throws
// ReplayOnOneThreadDiffers; reverse replays the segments from there down in
// turn, and gives the steps in turn; the decomposition, forward (sgd) and
// in reverse (adam), walks again in turn and is the one in turn, bit for bit.
TEST(ReplayAhead, ASegmentOneThreadDoesNotReproduceIsReplayedInTurn) {
  TempDir dir("replay_ahead_two_later");
  for (const std::string opt : {"sgd", "adam"}) {
    PathReader reader(two_thread_run(dir, opt));
    ThreadScope two(2);
    BlasThreads one(1);  // the count the replay ahead holds, for the steps in turn to compare with
    const std::vector<PathStep> in_turn = forward_steps(reader, false, 0, 10);
    const std::vector<PathStep> in_reverse = reverse_steps(reader, false);
    reader.set_one_thread_differs_at(1);
    reader.set_replay_ahead(true);
    std::vector<int64_t> seen, unverified;
    EXPECT_THROW(reader.forward([&](const PathStep& st) {
      seen.push_back(st.step);
      if (!reader.step_verified(st.step)) unverified.push_back(st.step);
    }), ReplayOnOneThreadDiffers) << opt;
    EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3, 4, 5})) << opt;
    for (int64_t s : {3, 4, 5}) EXPECT_NE(std::find(unverified.begin(), unverified.end(), s), unverified.end()) << opt;
    expect_same_steps(reverse_steps(reader, true), in_reverse, opt + " reverse");
    reader.set_replay_ahead(false);
    expect_same_steps(forward_steps(reader, false, 0, 10), in_turn, opt + " after");
    // A forward walk that met it walks again in turn, and says why.
    EXPECT_EQ(reader.replay_in_turn_reason(),
              "one thread does not reproduce checkpoint step 6 of the run's 2 threads bit for bit")
        << opt;

    const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 3);
    DecompositionOptions o;
    o.progress = false;
    o.replay_ahead = false;
    const Decomposition expected = decompose(reader, x, o);
    o.replay_ahead = true;
    const Decomposition got = decompose(reader, x, o);
    EXPECT_TRUE(same_bits(got.contributions, expected.contributions)) << opt;
    EXPECT_TRUE(same_bits(got.rounding, expected.rounding)) << opt;
  }
}

/// A run of 10 steps trained on one thread, checkpoints at 0, 3, 6, 9 and
/// 10, marked as a loop recorded with torch on one thread and OpenBLAS on
/// two (torch.set_num_threads(1) leaves OpenBLAS on every core): its
/// segment of one step is read, not replayed, so its shortest replayed
/// segment is the first.
std::string loop_of_two_blas_threads(const TempDir& dir, const std::string& optimizer) {
  const std::string run = one_thread_run(dir, optimizer, 10);
  Manifest m = Manifest::load(run);
  m.recorded = true;
  m.environment.blas_threads = 2;
  m.save(run);
  return run;
}

// A recorded loop whose OpenBLAS ran on two threads replays ahead on one
// where one thread reproduces it (this run's products are too small to
// split), as a run of pathkernel's does; where one thread does not
// reproduce its shortest replayed segment, it replays in turn and says so.
TEST(ReplayAhead, ALoopOfTwoBlasThreadsReplaysAheadOnOneWhereOneReproducesIt) {
  TempDir dir("replay_ahead_loop");
  for (const std::string opt : {"sgd", "adam"}) {
    const std::string run = loop_of_two_blas_threads(dir, opt);
    PathReader reader(run);
    ASSERT_EQ(reader.manifest().threads, 1);
    ThreadScope two(2);
    reader.set_replay_ahead(true);
    ASSERT_TRUE(reader.replays_ahead()) << opt << ": " << reader.replay_in_turn_reason();
    const std::vector<PathStep> in_turn = forward_steps(reader, false, 0, 10);
    expect_same_steps(forward_steps(reader, true, 0, 10), in_turn, opt + " forward");
    EXPECT_GT(reader.replay_ahead_seconds(), 0) << opt;
    expect_same_steps(reverse_steps(reader, true), reverse_steps(reader, false), opt + " reverse");
    for (bool bitwise : reader.replay_drift().bitwise_equal) EXPECT_TRUE(bitwise) << opt;

    PathReader differs(run);
    differs.set_one_thread_differs_at(0);  // steps [0, 3): the shortest replayed
    differs.set_replay_ahead(true);
    EXPECT_FALSE(differs.replays_ahead()) << opt;
    EXPECT_EQ(differs.replay_in_turn_reason(),
              "the loop ran on 1 torch thread(s) and 2 OpenBLAS thread(s), and one thread does not reproduce its "
              "shortest replayed segment bit for bit; a loop that calls pathkernel.record.set_threads(1) first "
              "(torch.set_num_threads(1) leaves OpenBLAS's count) replays ahead")
        << opt;
    expect_same_steps(forward_steps(differs, true, 0, 10), in_turn, opt + " in turn");
    EXPECT_EQ(differs.replay_ahead_seconds(), 0) << opt;
  }
}

// Such a loop drifting from a checkpoint (here: step 6's weights changed
// after the loop, as a loop that did something undeclared would leave
// them): one thread reproduces the shortest replayed segment, so the walk
// starts on one thread, meets the drift and walks again in turn (forward,
// sgd) or replays the rest in turn (reverse, adam); the decomposition is
// the one in turn, bit for bit, and the drift is the one in turn.
TEST(ReplayAhead, ALoopOfTwoBlasThreadsThatDriftsDecomposesAsInTurn) {
  TempDir dir("replay_ahead_loop_drift");
  for (const std::string opt : {"sgd", "adam"}) {
    const std::string run = loop_of_two_blas_threads(dir, opt);
    ASSERT_EQ(PathReader(run).manifest().checkpoints[2].step, 6);
    torch::Tensor w = PathReader(run).checkpoint(2).clone();
    w.data_ptr<double>()[3] += 1e-3;
    rewrite_checkpoint(run, 6, w);

    ThreadScope two(2);
    DecompositionOptions o;
    o.progress = false;
    Decomposition expected, got;
    {
      PathReader reader(run);
      ASSERT_TRUE(reader.one_thread_reproduces()) << opt;
      const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 3);
      o.replay_ahead = true;
      got = decompose(reader, x, o);
      // w_3 bit for bit, w_6 off by the change, w_9 replayed from the
      // changed w_6, w_10 a step read, not replayed.
      const ReplayDrift drift = reader.replay_drift();
      ASSERT_EQ(drift.steps, (std::vector<int64_t>{3, 6, 9, 10})) << opt;
      EXPECT_EQ(drift.bitwise_equal, (std::vector<bool>{true, false, false, true})) << opt;
      EXPECT_NEAR(drift.max_abs_diff[1], 1e-3, 1e-15) << opt;
    }
    {
      PathReader reader(run);
      const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 3);
      o.replay_ahead = false;
      expected = decompose(reader, x, o);
    }
    EXPECT_TRUE(same_bits(got.contributions, expected.contributions)) << opt;
    EXPECT_TRUE(same_bits(got.rounding, expected.rounding)) << opt;
    EXPECT_GT(expected.rounding.abs().max().item<double>(), 1e-6) << opt;  // E carries the drift
  }
}

// A checkpoint changed by 0.5 after training: the replay ahead hands out the
// steps before it, then the error the replay in turn throws, forward and in
// reverse.
TEST(ReplayAhead, AReplayThatFailsFailsAsInTurn) {
  TempDir dir("replay_ahead_fail");
  const std::string run = one_thread_run(dir, "sgd", 9);
  torch::Tensor w = PathReader(run).checkpoint(2).clone();  // step 6
  w.data_ptr<double>()[5] += 0.5;
  rewrite_checkpoint(run, 6, w);

  PathReader reader(run);
  ThreadScope two(2);
  for (bool ahead : {false, true}) {
    reader.set_replay_ahead(ahead);
    std::vector<int64_t> seen;
    const std::string msg = error_message([&] { reader.forward([&](const PathStep& st) { seen.push_back(st.step); }); });
    EXPECT_CONTAINS(msg, "does not reproduce checkpoint step 6 bit for bit");
    EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3, 4, 5})) << (ahead ? "ahead" : "in turn");
    const std::string rmsg = error_message([&] { reader.reverse([](const PathStep&) {}); });
    EXPECT_CONTAINS(rmsg, "does not reproduce checkpoint step 9 bit for bit");
  }
}

// A caller that throws from its work stops the replay (no step is handed
// out after it) and gets its own error; the reader replays again after.
TEST(ReplayAhead, ACallerThatLeavesEarlyStopsTheReplay) {
  TempDir dir("replay_ahead_leave");
  PathReader reader(one_thread_run(dir, "adam", 12));
  ThreadScope two(2);
  const std::vector<PathStep> all = forward_steps(reader, false, 0, 12);
  reader.set_replay_ahead(true);
  int64_t calls = 0;
  EXPECT_THROW(reader.forward([&](const PathStep& st) {
    ++calls;
    if (st.step == 4) throw std::runtime_error("the caller's own failure");
  }), std::runtime_error);
  EXPECT_EQ(calls, 5);
  calls = 0;
  EXPECT_THROW(reader.reverse([&](const PathStep& st) {
    ++calls;
    if (st.step == 7) throw std::runtime_error("the caller's own failure");
  }), std::runtime_error);
  EXPECT_EQ(calls, 5);  // 11 .. 7
  expect_same_steps(forward_steps(reader, true, 0, 12), all, "after");
}

// The decomposition with the replay ahead and in turn, forward (sgd) and in
// reverse (adam), by a caller of two threads with OpenBLAS at one either
// way (ahead holds it there): the same contributions, bit for bit.
TEST(ReplayAhead, TheDecompositionIsTheSameBitForBit) {
  TempDir dir("replay_ahead_decompose");
  for (const std::string opt : {"sgd", "adam"}) {
    PathReader reader(one_thread_run(dir, opt, 9));
    ThreadScope two(2);
    const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 3);
    DecompositionOptions o;
    o.progress = false;
    o.replay_ahead = false;
    // An observer of the steps keeps sgd's walk one walk (not its blocks of
    // steps on threads, step_range_test.cpp), whose replay runs ahead.
    o.on_step = [](const StepObservation&) {};
    const Decomposition in_turn = [&] {
      BlasThreads one(1);
      return decompose(reader, x, o);
    }();
    o.replay_ahead = true;
    const Decomposition ahead = decompose(reader, x, o);
    EXPECT_TRUE(same_bits(ahead.contributions, in_turn.contributions)) << opt;
    EXPECT_TRUE(same_bits(ahead.rounding, in_turn.rounding)) << opt;
    EXPECT_TRUE(same_bits(ahead.fN, in_turn.fN)) << opt;
    EXPECT_EQ(in_turn.time_split.replay_ahead, 0) << opt;
    EXPECT_GT(ahead.time_split.replay_ahead, 0) << opt;
  }
}

}  // namespace
}  // namespace pathkernel
