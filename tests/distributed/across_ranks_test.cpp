// explain, verify and gram under `mpirun -np 2` against one process (the
// reference): the same bytes for every optimizer, and an error on one rank
// that ends the job with one message instead of a hang.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "pathkernel/files.h"
#include "pathkernel/npy.h"
#include "pathkernel/path.h"

namespace pathkernel {
namespace {

namespace fs = std::filesystem;
using Output = testing::CommandOutput;

#ifdef PATHKERNEL_MPIEXEC
#define SKIP_WITHOUT_MPI() (void)0
/// Two ranks on this machine, however many cores it has; `timeout` turns a
/// hang into a failure. Under the sanitizers (make test-sanitize) the ranks
/// run without LeakSanitizer: OpenMPI unloads its components at MPI_Finalize,
/// so the blocks its runtime keeps have no stack to attribute or suppress
/// (`<unknown module>`). The same code paths are leak-checked in one process.
const std::string kMpirun =
    std::string("timeout 300 env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                "ASAN_OPTIONS=\"$ASAN_OPTIONS:detect_leaks=0\" ") +
    PATHKERNEL_MPIEXEC + " --oversubscribe";
#else
#define SKIP_WITHOUT_MPI() GTEST_SKIP() << "built without MPI (-DPATHKERNEL_WITH_MPI=OFF)"
const std::string kMpirun;
#endif

const std::string kBinary = pathkernel::testing::binary_path() + " --threads 1 ";

Output one_process(const std::string& args) { return testing::run_shell(kBinary + args); }
Output two_ranks(const std::string& args) { return testing::run_shell(kMpirun + " -np 2 " + kBinary + args); }
Output three_ranks(const std::string& args) { return testing::run_shell(kMpirun + " -np 3 " + kBinary + args); }

/// Occurrences of `part` in `text`.
int count(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

/// The last line of the output parsed as JSON.
nlohmann::json last_json(const std::string& out) {
  std::string s = out;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return nlohmann::json::parse(s.substr(s.rfind('\n') == std::string::npos ? 0 : s.rfind('\n') + 1));
}

/// A tiny run of `optimizer` (gaussians3, 90 training points, mlp:8, 9 steps,
/// a checkpoint every `every` steps; "rmsprop-momentum": RMSprop with momentum 0.5).
std::string train(const testing::TempDir& dir, const std::string& optimizer, int every = 3) {
  const std::string r = dir / ("run-" + optimizer + (every == 3 ? "" : "-" + std::to_string(every)));
  const std::string batch = optimizer == "gd" ? "" : " --batch 30";
  const bool rmsprop_momentum = optimizer == "rmsprop-momentum";
  const std::string lr = optimizer == "adam" || rmsprop_momentum ? " --lr 0.01" : " --lr 0.1";
  const std::string kind = rmsprop_momentum ? "rmsprop --momentum 0.5" : optimizer;
  const Output t = one_process("train --data gaussians3 --train-size 90 --test-size 30 --model mlp:8 --optimizer " +
                               kind + batch + lr + " --weight-decay 0.001 --steps 9 --checkpoint-every " +
                               std::to_string(every) + " --quiet --out " + r);
  EXPECT_EQ(t.status, 0) << t.out;
  return r;
}

class TwoRanks : public ::testing::TestWithParam<std::string> {};

TEST_P(TwoRanks, ExplainAndVerifyEqualOneProcessBitForBit) {
  SKIP_WITHOUT_MPI();
  testing::TempDir dir;
  const std::string r = train(dir, GetParam());
  // Blocks of 4 (not the automatic 32 of an MLP), so the 7 points are two
  // blocks and both ranks take a share.
  const std::string points = " --test-index 3,0,17,8,5,29,11 --point-block 4 --quiet --checkpoint-seconds 0 --out ";
  const Output one = one_process("explain " + r + points + (dir / "one"));
  ASSERT_EQ(one.status, 0) << one.out;
  const Output two = two_ranks("explain " + r + points + (dir / "two"));
  ASSERT_EQ(two.status, 0) << two.out;
  // Both ranks had a share (split by the points' estimated cost).
  EXPECT_CONTAINS(two.out, "2 ranks: rank 0: ");
  EXPECT_EQ(two.out.find("rank 0: 0 points"), std::string::npos) << two.out;
  EXPECT_EQ(two.out.find("rank 1: 0 points"), std::string::npos) << two.out;
  // The same bytes: contributions, the summed kernel of gd and sgd, explain.json.
  const bool kernel = GetParam() == "gd" || GetParam() == "sgd";
  EXPECT_EQ(fs::exists(dir / "two/kernel.npy"), kernel);
  for (const std::string file : {"contributions.npy", "explain.json", "kernel.npy"}) {
    if (file == "kernel.npy" && !kernel) continue;
    EXPECT_TRUE(read_file(dir / ("one/" + file)) == read_file(dir / ("two/" + file)))
        << file << " of 2 ranks differs from one process's (" << GetParam() << ")";
  }
  EXPECT_FALSE(fs::exists(dir / "two/.progress")) << "the saved progress goes once the outputs are written";
  const torch::Tensor c = read_npy(dir / "two/contributions.npy");
  EXPECT_EQ(c.sizes(), (std::vector<int64_t>{7, 90, 3}));
  EXPECT_GT(c.abs().max().item<double>(), 0);

  // verify: every figure but how the work ran (the time, and why rank 0's
  // replay ran in turn: ranks given a block of steps each replay theirs).
  nlohmann::json v1 = last_json(one_process("verify " + r + " --test 12 --quiet --json").out);
  nlohmann::json v2 = last_json(two_ranks("verify " + r + " --test 12 --quiet --json").out);
  for (const char* timing : {"seconds", "seconds_by_part", "replay_in_turn_reason"}) {
    v1.erase(timing);
    v2.erase(timing);
  }
  EXPECT_EQ(v1, v2);
  EXPECT_EQ(v2["test_points"], 12);
  EXPECT_LT(v2["max_rel_error"].get<double>(), 1e-10);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, TwoRanks,
                         ::testing::Values("gd", "sgd", "momentum", "adam", "rmsprop", "rmsprop-momentum"));

// With fewer blocks of test points than ranks, gd and sgd split the steps:
// every rank decomposes every point over its own blocks of steps (the
// checkpoint segments [0, 2), [2, 4) .. [8, 9)), and the blocks' sums are
// added to the running total in block order, passed from rank to rank, as
// one process adds them: contributions, kernel and explain.json are one
// process's bytes on 2 and on 3 ranks.
TEST(Distributed, FewTestPointsSplitTheStepsOfGdAndSgdWithOneProcesssBits) {
  SKIP_WITHOUT_MPI();
  testing::TempDir dir;
  for (const std::string opt : {"gd", "sgd"}) {
    const std::string r = train(dir, opt, 2);
    const std::string args = "explain " + r + " --test-index 5,11 --quiet --checkpoint-seconds 0 --out ";  // one block
    const Output one = one_process(args + (dir / (opt + "-one")));
    ASSERT_EQ(one.status, 0) << one.out;
    for (const int ranks : {2, 3}) {
      const std::string name = opt + "-" + std::to_string(ranks);
      const Output many = ranks == 2 ? two_ranks(args + (dir / name)) : three_ranks(args + (dir / name));
      ASSERT_EQ(many.status, 0) << many.out;
      for (int rank = 0; rank < ranks; ++rank) {  // every rank every point
        EXPECT_CONTAINS(many.out, "rank " + std::to_string(rank) + ": 2 points");
      }
      for (const std::string file : {"contributions.npy", "kernel.npy", "explain.json"}) {
        EXPECT_TRUE(read_file(dir / (opt + "-one/" + file)) == read_file(dir / (name + "/" + file)))
            << file << " of " << ranks << " ranks differs from one process's (" << opt << ")";
      }
      EXPECT_FALSE(fs::exists(dir / (name + "/.progress"))) << "the saved progress goes once the outputs are written";
    }
    const torch::Tensor c = read_npy(dir / (opt + "-one/contributions.npy"));
    EXPECT_EQ(c.sizes(), (std::vector<int64_t>{2, 90, 3}));
    EXPECT_GT(c.abs().max().item<double>(), 0);
    const nlohmann::json j = nlohmann::json::parse(read_file(dir / (opt + "-one/explain.json")));
    for (size_t p = 0; p < 2; ++p) EXPECT_LT(j["points"][p]["completeness_error"].get<double>(), 1e-12) << opt;
  }
}

// A recorded sgd run whose clip factors misdescribe steps 2 and 7, verified
// on 2 test points (one block): the ranks split the steps (blocks of one
// step, 0-4 and 5-8), each finds one unexplained step, and the merged
// residuals, counts, steps, E (which carries the unexplained updates) and
// the error figures are one process's exactly.
TEST(Distributed, AStepSplitMergesARecordedRunsResidualsAndCounts) {
  SKIP_WITHOUT_MPI();
  testing::TempDir dir;
  const std::string r = dir / "run";
  const Output t = one_process("train --data gaussians3 --train-size 90 --test-size 30 --model mlp:8 --optimizer sgd "
                               "--batch 30 --lr 0.1 --weight-decay 0.001 --steps 9 --checkpoint-every 1 --quiet --out " +
                               r);
  ASSERT_EQ(t.status, 0) << t.out;
  Manifest m = Manifest::load(r);
  m.recorded = true;
  torch::Tensor c = torch::ones({9}, torch::kFloat64);
  c[2] = 0.5;
  c[7] = 0.5;
  write_npy((fs::path(r) / "clip_factors.npy").string(), c);
  const std::string bytes = read_file((fs::path(r) / "clip_factors.npy").string());
  m.clip_factors = {"clip_factors.npy", static_cast<int64_t>(bytes.size()), crc32_of(bytes)};
  m.save(r);

  const std::string args = "verify " + r + " --test 2 --quiet --json";
  const Output one = one_process(args), two = two_ranks(args);
  ASSERT_EQ(one.status, 0) << one.out;
  ASSERT_EQ(two.status, 0) << two.out;
  const nlohmann::json v1 = last_json(one.out), v2 = last_json(two.out);
  EXPECT_EQ(v2["steps"], 9);
  EXPECT_EQ(v2["first_unexplained_step"], 2);
  EXPECT_CONTAINS(v2["warning"].get<std::string>(), " 2 step(s) differ");
  for (const std::string key : {"steps", "certificate_max_gap", "mean_evaluations_per_step",
                                "mean_forward_evaluations_per_step", "mean_moment_evaluations_per_step",
                                "mean_kinks_per_step", "updates_explained",
                                "max_update_residual_ratio", "first_unexplained_step", "warning"}) {
    EXPECT_EQ(v1[key], v2[key]) << key;
  }
  EXPECT_GT(v2["max_abs_rounding"].get<double>(), 1e-6);
  for (const std::string key : {"max_abs_rounding", "max_abs_regularization", "error_bound", "max_abs_error",
                                "max_rel_error", "completeness_error"}) {
    EXPECT_EQ(v1[key], v2[key]) << key;
  }
  EXPECT_LT(v2["max_rel_error"].get<double>(), 1e-10);
}

// evaluate: the root evaluates, every rank retrains a share of each set of
// jobs (the baseline, leave-one-out, LDS subsets, brittleness removals), and
// the outputs are gathered in job order: evaluate.json and the scores are one
// process's, byte for byte but for the times.
TEST(Distributed, EvaluateOnTwoRanksEqualsOneProcess) {
  SKIP_WITHOUT_MPI();
  testing::TempDir dir;
  const std::string r = train(dir, "sgd");
  const std::string args = "evaluate " + r + " --test-index 0-2,7 --methods grad-dot,random --metrics loo,lds,brittleness "
                           "--loo-extremes 2 --loo-random 3 --lds-subsets 5 --brittleness-grid 1,3 --workers 1 --out ";
  const Output one = one_process("--quiet " + args + (dir / "one"));
  ASSERT_EQ(one.status, 0) << one.out;
  const Output two = two_ranks("--quiet " + args + (dir / "two"));
  ASSERT_EQ(two.status, 0) << two.out;
  // The baseline, the leave-one-out sample, 5 LDS subsets, 16 brittleness removals: both ranks had some.
  EXPECT_CONTAINS(two.out, "2 ranks, retrainings: rank 0: ");
  EXPECT_EQ(two.out.find("rank 1: 0\n"), std::string::npos) << two.out;
  nlohmann::json j1 = nlohmann::json::parse(read_file(dir / "one/evaluate.json"));
  nlohmann::json j2 = nlohmann::json::parse(read_file(dir / "two/evaluate.json"));
  for (nlohmann::json* j : {&j1, &j2}) {
    j->erase("seconds");
    (*j)["retrain"].erase("seconds");
  }
  EXPECT_EQ(j1, j2);
  EXPECT_EQ(j2["retrain"]["baseline_reproduces_run"], true);
  EXPECT_EQ(j2["lds"]["per_test"]["grad-dot"].size(), 4u);
  for (const std::string file : {"scores_grad-dot.npy", "scores_random.npy"}) {
    EXPECT_TRUE(read_file(dir / ("one/" + file)) == read_file(dir / ("two/" + file))) << file;
  }
  EXPECT_FALSE(fs::exists(dir / "two/.work")) << "the work in progress goes once the outputs are written";
}

TEST(Distributed, GramOnTwoRanksEqualsOneProcessBitForBit) {
  SKIP_WITHOUT_MPI();
  testing::TempDir dir;
  const std::string r = train(dir, "sgd");
  // Test rows (split), training columns split the other way round, and test x test.
  for (const std::string sides : {"--rows test --cols train --test 5 --train 20",
                                  "--rows train --cols test --test 5 --train 20 --outputs trace",
                                  "--rows test --cols test --test 3"}) {
    const std::string args = "gram " + r + " --kernel epk " + sides + " --quiet --out ";
    const Output one = one_process(args + (dir / "one.npy"));
    ASSERT_EQ(one.status, 0) << one.out;
    const Output two = two_ranks(args + (dir / "two.npy"));
    ASSERT_EQ(two.status, 0) << two.out;
    EXPECT_TRUE(read_file(dir / "one.npy") == read_file(dir / "two.npy")) << sides;
    nlohmann::json s1 = nlohmann::json::parse(read_file(dir / "one.json"));
    nlohmann::json s2 = nlohmann::json::parse(read_file(dir / "two.json"));
    s1.erase("seconds");
    s2.erase("seconds");
    s1.erase("file");
    s2.erase("file");
    EXPECT_EQ(s1, s2) << sides;
  }
}

TEST(Distributed, AnErrorOnOneRankEndsEveryRankWithOneMessage) {
  SKIP_WITHOUT_MPI();
  testing::TempDir dir;
  const std::string r = train(dir, "sgd");
  const auto timed = [](const std::string& cmd) {
    const auto t0 = std::chrono::steady_clock::now();
    const Output o = testing::run_shell(cmd);
    return std::make_pair(o, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  };
  // A bad index on every rank: the job's error, said once.
  {
    auto [o, seconds] = timed(kMpirun + " -np 2 " + kBinary + "explain " + r + " --test-index 0,99999 --quiet");
    EXPECT_NE(o.status, 0);
    EXPECT_EQ(count(o.out, "pathkernel: error:"), 1) << o.out;
    EXPECT_CONTAINS(o.out, "test index 99999 is out of range [0, 30)");
    EXPECT_LT(seconds, 60) << o.out;
  }
  // A command that does not split its work is refused once, not run twice.
  {
    auto [o, seconds] = timed(kMpirun + " -np 2 " + kBinary + "info " + r);
    EXPECT_NE(o.status, 0);
    EXPECT_EQ(count(o.out, "pathkernel: error:"), 1) << o.out;
    EXPECT_CONTAINS(o.out, "'info' runs as one process, not under mpirun (2 ranks)");
    EXPECT_LT(seconds, 60) << o.out;
  }
  // Rank 1 alone started with a bad index: every rank ends, with rank 1's message once.
  {
    auto [o, seconds] = timed(kMpirun + " -np 1 " + kBinary + "explain " + r + " --test-index 0 --quiet : -np 1 " +
                              kBinary + "explain " + r + " --test-index 99999 --quiet");
    EXPECT_NE(o.status, 0);
    EXPECT_EQ(count(o.out, "pathkernel: error:"), 1) << o.out;
    EXPECT_CONTAINS(o.out, "rank 1 of 2: started with the arguments");
    EXPECT_CONTAINS(o.out, "--test-index 99999");
    EXPECT_LT(seconds, 60) << o.out;
  }
  // Rank 1's copy of the run directory is damaged (a cluster without a shared
  // file system): the same command, a different working directory.
  {
    fs::create_directories(dir / "a");
    fs::create_directories(dir / "b");
    fs::copy(r, dir / "a/R", fs::copy_options::recursive);
    fs::copy(r, dir / "b/R", fs::copy_options::recursive);
    dir.write("b/R/manifest.json", "{ not json");
    const std::string verify = kBinary + "verify R --test 4 --quiet";
    auto [o, seconds] = timed(kMpirun + " -np 1 --wdir " + (dir / "a") + " " + verify + " : -np 1 --wdir " +
                              (dir / "b") + " " + verify);
    EXPECT_NE(o.status, 0);
    EXPECT_EQ(count(o.out, "pathkernel: error:"), 1) << o.out;
    EXPECT_CONTAINS(o.out, "rank 1 of 2: ");
    EXPECT_CONTAINS(o.out, "manifest.json");
    EXPECT_LT(seconds, 60) << o.out;
  }
}

/// The pids of the processes whose environment holds `tag` (NAME=VALUE), and
/// whether each is stopped: mpirun's ranks, whatever their process group.
std::vector<std::pair<pid_t, bool>> tagged_processes(const std::string& tag) {
  std::vector<std::pair<pid_t, bool>> found;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string env, stat;
    try {
      env = read_file(e.path().string() + "/environ");
      stat = read_file(e.path().string() + "/stat");
    } catch (const std::exception&) {
      continue;  // gone, or not ours to read
    }
    env.push_back('\0');
    if (env.find(std::string(1, '\0') + tag + '\0') == std::string::npos && env.rfind(tag + '\0', 0) != 0) continue;
    const size_t close = stat.rfind(')');
    const bool stopped = close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'T';
    found.emplace_back(static_cast<pid_t>(std::stol(name)), stopped);
  }
  return found;
}

// A rank killed mid-job: rank 1 stops itself (the write hook of the resume
// tests) right after its 5th save, and the whole job is killed there; the
// same command run again continues each rank from its own saved progress and
// writes the bytes of an uninterrupted run. When the ranks split the steps
// (gd, 2 points), rank 1 decomposes the blocks [3, 6) and [6, 9), saving
// each after its steps 4, 5, 7 and 8 and once done: it stops in the middle
// of its second block, after the first's sums were saved.
TEST(Distributed, AKilledJobContinuesFromEachRanksSavedProgress) {
  SKIP_WITHOUT_MPI();
  testing::TempDir dir;
  struct Case {
    std::string opt, points, progress, save;
  };
  for (const Case& c : std::vector<Case>{{"sgd", "0-7", "rank-1-of-2", "5"},
                                         {"momentum", "0-7", "rank-1-of-2", "5"},
                                         {"gd", "5,11", "steps-6-9", "2"}}) {
    const std::string opt = c.opt;
    const std::string r = train(dir, opt);
    const std::string args =
        "explain " + r + " --test-index " + c.points + " --point-block 4 --quiet --checkpoint-seconds 0 --out ";
    const Output whole = two_ranks(args + (dir / (opt + "-whole")));
    ASSERT_EQ(whole.status, 0) << whole.out;

    const std::string out = dir / (opt + "-killed"), log = dir / (opt + "-log.txt");
    const std::string tag = "PATHKERNEL_TEST_JOB=" + out;
    const pid_t job = fork();
    if (job == 0) {
      ::setpgid(0, 0);
      const std::string cmd = "exec env " + tag + " PATHKERNEL_TEST_PAUSE_IN_WRITE=" + c.progress + "/state.json@" + c.save + ":after " +
                              kMpirun + " -np 2 " + kBinary + args + out + " > " + log + " 2>&1";
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    // Wait (at most two minutes) for rank 1 to stop, then kill every process of the job.
    bool stopped = false;
    for (int i = 0; i < 1200 && !stopped; ++i) {
      for (const auto& [pid, is_stopped] : tagged_processes(tag)) stopped = stopped || is_stopped;
      if (!stopped) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    for (const auto& [pid, is_stopped] : tagged_processes(tag)) ::kill(pid, SIGKILL);
    ::kill(-job, SIGKILL);
    int status = 0;
    ::waitpid(job, &status, 0);
    ASSERT_TRUE(stopped) << "rank 1 never stopped in save " << c.save << " (" << opt << "):\n" << read_file(log);
    ASSERT_TRUE(fs::exists(out + "/.progress/" + c.progress + "/state.json")) << opt;
    if (opt == "gd") ASSERT_TRUE(fs::exists(out + "/.progress/steps-3-6/state.json")) << "the first block's sums";
    EXPECT_FALSE(fs::exists(out + "/contributions.npy")) << opt;

    const Output again = two_ranks(args + out);
    ASSERT_EQ(again.status, 0) << again.out;
    EXPECT_CONTAINS(again.out, "rank 1: resuming from the saved progress");
    EXPECT_FALSE(fs::exists(out + "/.progress")) << opt;
    for (const std::string file : {"contributions.npy", "explain.json"}) {
      EXPECT_TRUE(read_file(dir / (opt + "-whole/" + file)) == read_file(out + "/" + file))
          << opt << ": the resumed " << file << " differs from the uninterrupted run's";
    }
  }
}

}  // namespace
}  // namespace pathkernel
