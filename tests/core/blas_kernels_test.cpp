// The choice of OpenBLAS's kernels: the CPU's best, a run's own kernels when
// it is replayed, and the user's OPENBLAS_CORETYPE kept.
#include "pathkernel/blas_kernels.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "../test_util.h"

namespace pathkernel {
namespace {

using testing::ScopedEnv;

CpuFeatures cpu(bool avx512, bool avx2_fma, bool avx, bool bf16 = false) {
  CpuFeatures c;
  c.avx512 = avx512;
  c.avx512_bf16 = bf16;
  c.avx2_fma = avx2_fma;
  c.avx = avx;
  return c;
}

/// A directory holding a manifest.json with `text`, removed at the end.
struct RunDir {
  RunDir(const std::string& name, const std::string& text) : dir(name), path(dir.path()) {
    dir.write("manifest.json", text);
  }
  testing::TempDir dir;
  std::string path;
};

std::string kernels_for(const std::vector<std::string>& args, const CpuFeatures& c) {
  std::vector<char*> argv{const_cast<char*>("pathkernel")};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  return blas_kernels_for(static_cast<int>(argv.size()), argv.data(), c);
}

TEST(BlasKernels, BestFollowsTheCpusWidestVectors) {
  EXPECT_EQ(best_blas_kernels(cpu(true, true, true)), "SkylakeX");
  EXPECT_EQ(best_blas_kernels(cpu(false, true, true)), "Haswell");
  EXPECT_EQ(best_blas_kernels(cpu(false, false, true)), "");
  EXPECT_EQ(best_blas_kernels(cpu(false, false, false)), "");
}

TEST(BlasKernels, ZenAndHaswellCooperlakeAndSkylakeXAreTheSameArithmetic) {
  EXPECT_TRUE(same_blas_arithmetic("Zen", "Haswell"));
  EXPECT_TRUE(same_blas_arithmetic("HASWELL", "zen"));
  EXPECT_TRUE(same_blas_arithmetic("SkylakeX", "skylakex"));
  EXPECT_TRUE(same_blas_arithmetic("Cooperlake", "SkylakeX"));
  EXPECT_TRUE(same_blas_arithmetic("skylakex", "COOPERLAKE"));
  EXPECT_FALSE(same_blas_arithmetic("SkylakeX", "Haswell"));
  EXPECT_FALSE(same_blas_arithmetic("Cooperlake", "Haswell"));
  EXPECT_FALSE(same_blas_arithmetic("Zen", "Prescott"));
  EXPECT_FALSE(same_blas_arithmetic("Zen", "SkylakeX"));
}

// What a process on some kernels gives up: the CPU's best, unless they are
// the same float64 arithmetic (or the kernels in use are unknown).
TEST(BlasKernels, WiderKernelsAreTheBestOfAnotherArithmetic) {
  EXPECT_EQ(wider_blas_kernels("Haswell", cpu(true, true, true)), "SkylakeX");
  EXPECT_EQ(wider_blas_kernels("Prescott", cpu(false, true, true)), "Haswell");
  EXPECT_EQ(wider_blas_kernels("Cooperlake", cpu(true, true, true)), "");
  EXPECT_EQ(wider_blas_kernels("SkylakeX", cpu(true, true, true)), "");
  EXPECT_EQ(wider_blas_kernels("Zen", cpu(false, true, true)), "");
  EXPECT_EQ(wider_blas_kernels("Prescott", cpu(false, false, true)), "");  // no rule: OpenBLAS's own choice
  EXPECT_EQ(wider_blas_kernels("", cpu(true, true, true)), "");
}

TEST(BlasKernels, RunsOnlyKernelsTheCpuHas) {
  EXPECT_TRUE(runs_blas_kernels(cpu(false, false, false), "Prescott"));
  EXPECT_TRUE(runs_blas_kernels(cpu(false, true, true), "Haswell"));
  EXPECT_FALSE(runs_blas_kernels(cpu(false, true, true), "SkylakeX"));
  EXPECT_TRUE(runs_blas_kernels(cpu(true, true, true), "SkylakeX"));
  EXPECT_FALSE(runs_blas_kernels(cpu(false, false, true), "Haswell"));
  EXPECT_TRUE(runs_blas_kernels(cpu(true, true, true, true), "Cooperlake"));
  EXPECT_FALSE(runs_blas_kernels(cpu(true, true, true), "Cooperlake"));
  EXPECT_FALSE(runs_blas_kernels(cpu(true, true, true), "unknown"));
  EXPECT_FALSE(runs_blas_kernels(cpu(true, true, true), ""));
}

TEST(BlasKernels, ReadsTheKernelsARunRecorded) {
  RunDir run("run", R"({"steps": 3, "environment": {"blas": "OpenBLAS", "blas_kernels": "Prescott"}})");
  EXPECT_EQ(recorded_blas_kernels(run.path), "Prescott");
  RunDir none("none", R"({"steps": 3})");
  EXPECT_EQ(recorded_blas_kernels(none.path), "");
  RunDir broken("broken", "{\"environment\": ");
  EXPECT_EQ(recorded_blas_kernels(broken.path), "");
  RunDir wrong_type("wrong_type", R"({"environment": {"blas_kernels": 7}})");
  EXPECT_EQ(recorded_blas_kernels(wrong_type.path), "");
  EXPECT_EQ(recorded_blas_kernels(run.path + "/manifest.json"), "");  // a file, not a run
  EXPECT_EQ(recorded_blas_kernels(run.path + "/missing"), "");
}

TEST(BlasKernels, ARunIsReplayedWithItsOwnKernels) {
  RunDir old_run("old_run", R"({"environment": {"blas_kernels": "Prescott"}})");
  RunDir wide_run("wide_run", R"({"environment": {"blas_kernels": "SkylakeX"}})");
  const CpuFeatures avx512 = cpu(true, true, true), avx2 = cpu(false, true, true);
  EXPECT_EQ(kernels_for({"verify", old_run.path, "--test", "5"}, avx512), "Prescott");
  EXPECT_EQ(kernels_for({"train", "--steps", "5"}, avx512), "SkylakeX");
  EXPECT_EQ(kernels_for({"verify", wide_run.path}, avx512), "SkylakeX");
  // OpenBLAS's kernels for CPUs with AVX-512 BF16 (Cooper Lake, AMD Zen 4):
  // the replay takes them where the CPU has it.
  RunDir bf16_run("bf16_run", R"({"environment": {"blas_kernels": "Cooperlake"}})");
  EXPECT_EQ(kernels_for({"verify", bf16_run.path}, cpu(true, true, true, true)), "Cooperlake");
  EXPECT_EQ(kernels_for({"verify", bf16_run.path}, avx512), "SkylakeX");
  // Kernels this CPU cannot run: its best (replay then names the difference).
  EXPECT_EQ(kernels_for({"verify", wide_run.path}, avx2), "Haswell");
  // The first run named decides.
  EXPECT_EQ(kernels_for({"compare", old_run.path, wide_run.path}, avx512), "Prescott");
}

TEST(BlasKernels, KeepsTheUsersChoice) {
  ScopedEnv chosen("OPENBLAS_CORETYPE", "Nehalem");
  char arg0[] = "pathkernel";
  char* argv[] = {arg0, nullptr};
  EXPECT_FALSE(choose_blas_kernels(1, argv));
  EXPECT_STREQ(std::getenv("OPENBLAS_CORETYPE"), "Nehalem");
}

}  // namespace
}  // namespace pathkernel
