// The choice of OpenBLAS's kernels: the CPU's best, a run's own kernels when
// it is replayed, and the user's OPENBLAS_CORETYPE kept.
#include "pathkernel/blas_kernels.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace pathkernel {
namespace {

namespace fs = std::filesystem;

CpuFeatures cpu(bool avx512, bool avx2_fma, bool avx) {
  CpuFeatures c;
  c.avx512 = avx512;
  c.avx2_fma = avx2_fma;
  c.avx = avx;
  return c;
}

/// A directory holding a manifest.json with `text`, removed at the end.
struct RunDir {
  explicit RunDir(const std::string& text) {
    std::string tmpl = (fs::temp_directory_path() / "pk_blas_XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
    std::ofstream(path + "/manifest.json") << text;
  }
  ~RunDir() { fs::remove_all(path); }
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

TEST(BlasKernels, RunsOnlyKernelsTheCpuHas) {
  EXPECT_TRUE(runs_blas_kernels(cpu(false, false, false), "Prescott"));
  EXPECT_TRUE(runs_blas_kernels(cpu(false, true, true), "Haswell"));
  EXPECT_FALSE(runs_blas_kernels(cpu(false, true, true), "SkylakeX"));
  EXPECT_TRUE(runs_blas_kernels(cpu(true, true, true), "SkylakeX"));
  EXPECT_FALSE(runs_blas_kernels(cpu(false, false, true), "Haswell"));
  EXPECT_FALSE(runs_blas_kernels(cpu(true, true, true), "unknown"));
  EXPECT_FALSE(runs_blas_kernels(cpu(true, true, true), ""));
}

TEST(BlasKernels, ReadsTheKernelsARunRecorded) {
  RunDir run(R"({"steps": 3, "environment": {"blas": "OpenBLAS", "blas_kernels": "Prescott"}})");
  EXPECT_EQ(recorded_blas_kernels(run.path), "Prescott");
  RunDir none(R"({"steps": 3})");
  EXPECT_EQ(recorded_blas_kernels(none.path), "");
  RunDir broken("{\"environment\": ");
  EXPECT_EQ(recorded_blas_kernels(broken.path), "");
  RunDir wrong_type(R"({"environment": {"blas_kernels": 7}})");
  EXPECT_EQ(recorded_blas_kernels(wrong_type.path), "");
  EXPECT_EQ(recorded_blas_kernels(run.path + "/manifest.json"), "");  // a file, not a run
  EXPECT_EQ(recorded_blas_kernels(run.path + "/missing"), "");
}

TEST(BlasKernels, ARunIsReplayedWithItsOwnKernels) {
  RunDir old_run(R"({"environment": {"blas_kernels": "Prescott"}})");
  RunDir wide_run(R"({"environment": {"blas_kernels": "SkylakeX"}})");
  const CpuFeatures avx512 = cpu(true, true, true), avx2 = cpu(false, true, true);
  EXPECT_EQ(kernels_for({"verify", old_run.path, "--test", "5"}, avx512), "Prescott");
  EXPECT_EQ(kernels_for({"train", "--steps", "5"}, avx512), "SkylakeX");
  EXPECT_EQ(kernels_for({"verify", wide_run.path}, avx512), "SkylakeX");
  // Kernels this CPU cannot run: its best (replay then names the difference).
  EXPECT_EQ(kernels_for({"verify", wide_run.path}, avx2), "Haswell");
  // The first run named decides.
  EXPECT_EQ(kernels_for({"compare", old_run.path, wide_run.path}, avx512), "Prescott");
}

TEST(BlasKernels, KeepsTheUsersChoice) {
  const char* saved = std::getenv("OPENBLAS_CORETYPE");
  const std::string before = saved != nullptr ? saved : "";
  ::setenv("OPENBLAS_CORETYPE", "Nehalem", 1);
  char arg0[] = "pathkernel";
  char* argv[] = {arg0, nullptr};
  EXPECT_FALSE(choose_blas_kernels(1, argv));
  EXPECT_STREQ(std::getenv("OPENBLAS_CORETYPE"), "Nehalem");
  if (saved != nullptr) {
    ::setenv("OPENBLAS_CORETYPE", before.c_str(), 1);
  } else {
    ::unsetenv("OPENBLAS_CORETYPE");
  }
}

}  // namespace
}  // namespace pathkernel
