// Crash safety of `pathkernel train`: a run killed with SIGKILL at any moment
// (in the middle of a checkpoint, optimizer-state, batch-log or manifest
// write among them) reads as valid up to its last complete checkpoint, and
// `train --resume` finishes it byte for byte as an uninterrupted run; a full
// disk gives a clear error and leaves the previous state intact; a killed
// `explain` rerun with the same arguments continues from its saved
// accumulators to the same bytes.
//
// The exact kill points use the test hook PATHKERNEL_TEST_PAUSE_IN_WRITE
// (files.h): the binary stops itself (SIGSTOP) halfway through writing the
// named file's temporary copy, or just after renaming it into place, and the
// test kills it there. No kill depends on timing.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>

#include "../test_util.h"
#include "pathkernel/files.h"
#include "pathkernel/manifest.h"

namespace pathkernel {
namespace {

namespace fs = std::filesystem;

const std::string kRunArgs =
    "--data gaussians3 --train-size 120 --test-size 60 --model mlp:8 --optimizer momentum "
    "--batch 16 --steps 200 --checkpoint-every 10 --seed 3 --quiet";

std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> w;
  std::string cur;
  for (char c : s) {
    if (c == ' ') {
      if (!cur.empty()) w.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) w.push_back(cur);
  return w;
}

/// Starts `pathkernel --threads THREADS ARGS` with its output in `log`;
/// `pause` sets PATHKERNEL_TEST_PAUSE_IN_WRITE.
pid_t spawn(const std::string& args, const std::string& log, const std::string& pause = "",
            const std::string& threads = "1") {
  std::vector<std::string> argv = {pathkernel::testing::binary_path(), "--threads", threads};
  for (auto& w : words(args)) argv.push_back(w);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    if (pause.empty()) {
      ::unsetenv("PATHKERNEL_TEST_PAUSE_IN_WRITE");
    } else {
      ::setenv("PATHKERNEL_TEST_PAUSE_IN_WRITE", pause.c_str(), 1);
    }
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    ::execv(cargv[0], cargv.data());
    ::_exit(127);
  }
  return pid;
}

/// Waits for pid to exit; its exit status, or -1 if it was stopped or killed.
int wait_exit(pid_t pid) {
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/// Waits until pid stops itself in the test hook, then kills it with SIGKILL.
/// Returns false (and reaps it) if it exited instead.
bool kill_when_paused(pid_t pid) {
  int st = 0;
  ::waitpid(pid, &st, WUNTRACED);
  if (!WIFSTOPPED(st)) return false;
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &st, 0);
  return WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
}

std::string log_of(const std::string& log) { return fs::exists(log) ? read_file(log) : ""; }

/// Every regular file under dir, by relative path, with its bytes.
std::map<std::string, std::string> files_of(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) files[fs::relative(e.path(), dir).string()] = read_file(e.path().string());
  }
  return files;
}

std::vector<std::string> temporaries(const std::string& dir) {
  std::vector<std::string> tmp;
  for (const auto& [name, _] : files_of(dir)) {
    if (name.find(".tmp.") != std::string::npos) tmp.push_back(name);
  }
  return tmp;
}

/// What a reader of the killed run sees: a manifest that loads, lists only
/// complete files (sizes and CRC-32s match) and ends at a checkpoint.
Manifest expect_valid_interrupted(const std::string& run, int64_t min_steps) {
  Manifest m = Manifest::load(run);
  EXPECT_NO_THROW(validate_run(run, m));
  EXPECT_EQ(m.status, "running");
  EXPECT_GE(m.steps, min_steps);
  EXPECT_EQ(m.checkpoints.back().step, m.steps);
  return m;
}

/// Resumes run; if `pause` is given, kills it there and returns false.
bool resume(const std::string& run, const std::string& log, const std::string& pause) {
  pid_t pid = spawn("train --resume " + run + " --quiet", log, pause);
  if (pause.empty()) {
    EXPECT_EQ(wait_exit(pid), 0) << log_of(log);
    return true;
  }
  EXPECT_TRUE(kill_when_paused(pid)) << "no pause at '" << pause << "': " << log_of(log);
  return false;
}

TEST(Resume, KilledRunsResumeByteForByte) {
  testing::TempDir dir("kill");
  const std::string ref = dir.file("ref"), run = dir.file("run"), log = dir.file("log.txt");
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(wait_exit(spawn("train " + kRunArgs + " --out " + ref, log)), 0) << log_of(log);

  // 1. Killed halfway through writing checkpoint w_50: the half-written
  // temporary is on disk, the final name is not, the manifest ends at 40.
  pid_t pid = spawn("train " + kRunArgs + " --out " + run, log, "checkpoints/w_00000050.npy");
  ASSERT_TRUE(kill_when_paused(pid)) << log_of(log);
  EXPECT_FALSE(fs::exists(run + "/checkpoints/w_00000050.npy"));
  EXPECT_EQ(temporaries(run).size(), 1u);
  EXPECT_EQ(expect_valid_interrupted(run, 40).steps, 40);

  // 2. Killed writing the optimizer state of step 90, after w_90 was complete
  // but before the manifest listed it.
  resume(run, log, "optimizer/momentum_buffer_00000090.npy");
  EXPECT_TRUE(fs::exists(run + "/checkpoints/w_00000090.npy"));
  EXPECT_EQ(expect_valid_interrupted(run, 80).steps, 80);

  // 3. Killed writing the third manifest since resuming (the one of step
  // 110): the previous manifest (step 100) stays in place and valid.
  resume(run, log, "manifest.json@3");
  ASSERT_EQ(temporaries(run).size(), 1u);
  EXPECT_EQ(temporaries(run)[0].rfind("manifest.json.tmp.", 0), 0u) << temporaries(run)[0];
  EXPECT_EQ(expect_valid_interrupted(run, 100).steps, 100);

  // 4. Killed writing the batch log that starts at step 130.
  resume(run, log, "batches/b_00000130.npy");
  EXPECT_EQ(expect_valid_interrupted(run, 130).steps, 130);

  // 5. Killed between writes: right after the manifest of step 150 (the
  // second since resuming at 130) is in place.
  resume(run, log, "manifest.json@2:after");
  EXPECT_TRUE(temporaries(run).empty());
  EXPECT_EQ(expect_valid_interrupted(run, 150).steps, 150);

  // 6. Killed writing the final manifest (status complete): the one before it
  // (step 200, status running) stays valid. Resumed at 150, the manifests of
  // 160 .. 200 come first.
  resume(run, log, "manifest.json@6");
  EXPECT_EQ(expect_valid_interrupted(run, 200).steps, 200);

  // The last resume: from step 200 it only finishes the manifest.
  if (Manifest::load(run).status == "running") resume(run, log, "");
  EXPECT_TRUE(temporaries(run).empty());

  // Every file but timing.json equals the uninterrupted run's, byte for byte.
  auto a = files_of(ref), b = files_of(run);
  a.erase("timing.json");
  b.erase("timing.json");
  std::vector<std::string> names_a, names_b;
  for (auto& [n, _] : a) names_a.push_back(n);
  for (auto& [n, _] : b) names_b.push_back(n);
  ASSERT_EQ(names_a, names_b);
  for (auto& [name, bytes] : a) EXPECT_TRUE(bytes == b[name]) << name << " differs from the uninterrupted run's";
  EXPECT_EQ(Manifest::load(run).status, "complete");

  // check-path replays the resumed path and finds every checkpoint bit for bit.
  pid = spawn("check-path --quiet " + run, log);
  EXPECT_EQ(wait_exit(pid), 0) << log_of(log);
  EXPECT_NE(log_of(log).find("bit for bit"), std::string::npos) << log_of(log);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("kill-and-resume test: %.1f s\n", seconds);
}

// A network with a convolution trains with OpenBLAS on one thread whatever
// LibTorch's count (training_blas_threads) and records it; a resumed run
// must train at that count too, or its steps after the resume (the Linear
// head's products, 100 rows by 1,568, split by OpenBLAS's threads) are
// other bits than the uninterrupted run's.
TEST(Resume, AConvolutionsRunResumesWithItsBlasCount) {
  testing::TempDir dir("kill_cnn");
  const std::string ref = dir.file("ref"), run = dir.file("run"), log = dir.file("log.txt");
  const std::string args =
      "train --data mnist --train-size 400 --test-size 10 --model cnn:8 --optimizer sgd --batch 100 "
      "--steps 12 --checkpoint-every 4 --seed 3 --quiet --out ";
  ASSERT_EQ(wait_exit(spawn(args + ref, log, "", "2")), 0) << log_of(log);
  const Manifest m = Manifest::load(ref);
  EXPECT_EQ(m.threads, 2);
  EXPECT_EQ(m.environment.blas_threads, 1);

  ASSERT_TRUE(kill_when_paused(spawn(args + run, log, "checkpoints/w_00000008.npy", "2"))) << log_of(log);
  EXPECT_EQ(expect_valid_interrupted(run, 4).steps, 4);
  ASSERT_EQ(wait_exit(spawn("train --resume " + run + " --quiet", log, "", "2")), 0) << log_of(log);

  auto a = files_of(ref), b = files_of(run);
  a.erase("timing.json");
  b.erase("timing.json");
  ASSERT_EQ(a.size(), b.size());
  for (auto& [name, bytes] : a) EXPECT_TRUE(bytes == b[name]) << name << " differs from the uninterrupted run's";
}

using Output = testing::CommandOutput;

Output run_cli(const std::string& args, const std::string& globals = "--threads 1") {
  return testing::run_shell(pathkernel::testing::binary_path() + " " + globals + " " + args);
}

TEST(Resume, RefusesWhatItCannotResume) {
  testing::TempDir dir("refuse");
  const std::string run = dir.file("run");
  struct Case {
    std::string args, message;
  };
  // Before the run exists.
  for (const Case& c : std::vector<Case>{
           {"train --resume " + dir.file("missing"), "is not a directory"},
           {"train --resume " + dir.str(), "has no manifest.json"},
           {"train --out " + run, "--data is required"},
           {"train --data gaussians3", "--out is required"},
       }) {
    Output o = run_cli(c.args);
    EXPECT_NE(o.status, 0) << c.args;
    EXPECT_NE(o.out.find(c.message), std::string::npos) << c.args << "\n" << o.out;
  }
  Output t = run_cli("train --data gaussians3 --train-size 60 --test-size 30 --model mlp:4 --steps 20 "
                     "--checkpoint-every 5 --quiet --out " + run);
  ASSERT_EQ(t.status, 0) << t.out;
  for (const Case& c : std::vector<Case>{
           {"train --resume " + run, "the run is complete"},
           {"train --resume " + run + " --lr 0.5", "--lr cannot be combined with --resume"},
           {"train --resume " + run + " --data toy2d", "--data cannot be combined with --resume"},
           {"train --resume " + run + " --out " + run, "--out cannot be combined with --resume"},
       }) {
    Output o = run_cli(c.args);
    EXPECT_NE(o.status, 0) << c.args;
    EXPECT_NE(o.out.find(c.message), std::string::npos) << c.args << "\n" << o.out;
  }
  {
    Output o = run_cli("train --resume " + run, "--threads 2");
    EXPECT_NE(o.status, 0);
    EXPECT_NE(o.out.find("--threads 2 conflicts with --resume"), std::string::npos) << o.out;
  }
  // A diverged run is refused too: resuming would diverge again.
  {
    Manifest m = Manifest::load(run);
    m.status = "diverged";
    m.message = "training diverged at step 20";
    m.save(run);
    Output o = run_cli("train --resume " + run);
    EXPECT_NE(o.status, 0);
    EXPECT_NE(o.out.find("its status is 'diverged'"), std::string::npos) << o.out;
  }
}

/// A tmpfs of `size` mounted at `dir` for the lifetime of the object.
class TinyDisk {
 public:
  TinyDisk(const std::string& dir, const std::string& size) : dir_(dir) {
    fs::create_directories(dir);
    mounted_ = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0;
  }
  ~TinyDisk() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

TEST(Resume, FullDiskGivesAClearErrorAndKeepsTheRunValid) {
  testing::TempDir dir("full");
  TinyDisk disk(dir.file("tiny"), "192k");
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  const std::string args =
      "--data gaussians3 --train-size 120 --test-size 60 --model mlp:32 --optimizer momentum "
      "--batch 16 --steps 100 --checkpoint-every 10 --seed 5 --quiet";
  const std::string run = dir.file("tiny/run"), ref = dir.file("ref"), moved = dir.file("moved");
  Output o = run_cli("train " + args + " --out " + run);
  // Each checkpoint is 2 x 26 kB (weights and momentum): the disk fills up.
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_NE(o.out.find("cannot write '" + run + "/"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("No space left on device"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("is unchanged"), std::string::npos) << o.out;
  // The previous state is intact: a valid run up to its last checkpoint, no temporaries.
  Manifest m = expect_valid_interrupted(run, 10);
  EXPECT_LT(m.steps, 100);
  EXPECT_TRUE(temporaries(run).empty());
  // Resuming on the full disk fails the same way and changes nothing.
  auto before = files_of(run);
  o = run_cli("train --resume " + run + " --quiet");
  EXPECT_EQ(o.status, 1) << o.out;
  EXPECT_NE(o.out.find("No space left on device"), std::string::npos) << o.out;
  EXPECT_TRUE(files_of(run) == before);
  // Moved to a disk with room, it resumes to the uninterrupted run.
  fs::copy(run, moved, fs::copy_options::recursive);
  o = run_cli("train --resume " + moved + " --quiet");
  ASSERT_EQ(o.status, 0) << o.out;
  ASSERT_EQ(run_cli("train " + args + " --out " + ref).status, 0);
  auto a = files_of(ref), b = files_of(moved);
  a.erase("timing.json");
  b.erase("timing.json");
  EXPECT_TRUE(a == b) << "the resumed run differs from the uninterrupted one";
}

// explain saves its accumulators (--checkpoint-seconds 0: after every step);
// killed in the middle of saving them, a rerun with the same arguments
// continues from the last complete save and writes the same bytes as an
// uninterrupted run. Forward (sgd) and reverse (momentum) walks.
TEST(Resume, KilledExplainContinuesFromItsSavedProgress) {
  testing::TempDir dir("explain");
  const std::string log = dir.file("log.txt");
  for (const std::string opt : {"sgd", "momentum"}) {
    const std::string run = dir.file(opt);
    Output t = run_cli("train --data gaussians3 --train-size 120 --test-size 60 --model mlp:8 --optimizer " + opt +
                       " --batch 16 --steps 30 --checkpoint-every 10 --quiet --out " + run);
    ASSERT_EQ(t.status, 0) << t.out;
    const std::string ref = dir.file(opt + "_ref"), out = dir.file(opt + "_out");
    const std::string args = "explain " + run + " --test-index 0,1 --quiet --checkpoint-seconds 0 --out ";
    Output r = run_cli(args + ref);
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_FALSE(fs::exists(ref + "/.progress"));

    // Killed while writing its 10th save: the 9th is the last complete one.
    ASSERT_TRUE(kill_when_paused(spawn(args + out, log, ".progress/state.json@10"))) << log_of(log);
    ASSERT_TRUE(fs::exists(out + "/.progress/state.json"));
    // Other arguments do not reuse it.
    Output other = run_cli("explain " + run + " --test-index 0 --quiet --out " + out);
    EXPECT_EQ(other.status, 0) << other.out;
    EXPECT_NE(other.out.find("other arguments; starting over"), std::string::npos) << other.out;

    ASSERT_TRUE(kill_when_paused(spawn(args + out, log, ".progress/state.json@10"))) << log_of(log);
    Output again = run_cli(args + out);
    ASSERT_EQ(again.status, 0) << again.out;
    EXPECT_NE(again.out.find("resuming from the saved progress"), std::string::npos) << again.out;
    EXPECT_NE(again.out.find(", 9 steps of that chunk done"), std::string::npos) << again.out;
    EXPECT_FALSE(fs::exists(out + "/.progress"));
    auto a = files_of(ref), b = files_of(out);
    EXPECT_TRUE(a.count("contributions.npy") && a.count("explain.json")) << opt;
    EXPECT_TRUE(a == b) << opt << ": the resumed explain differs from the uninterrupted one";
  }
}

}  // namespace
}  // namespace pathkernel
