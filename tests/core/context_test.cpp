// Tests of thread control, the BLAS check and dtype names.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include "pathkernel/context.h"
#include "pathkernel/error.h"

namespace pathkernel {
namespace {

TEST(Context, ThreadScopeSetsAndRestores) {
  set_threads(1);
  {
    ThreadScope scope(2);
    EXPECT_EQ(current_threads(), 2);
  }
  EXPECT_EQ(current_threads(), 1);
  EXPECT_THROW(set_threads(0), Error);
  EXPECT_GE(hardware_threads(), 1);
}

// OpenBLAS's own count, where OpenBLAS serves this process (0 otherwise).
int openblas_threads() {
  using Get = int (*)();
  auto get = reinterpret_cast<Get>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return get != nullptr ? get() : 0;
}

TEST(Context, OpenMpThreadsSetsTheCountsForABlockAndRestoresThem) {
  ThreadScope outer(2);
  const int blas = openblas_threads();
  {
    OpenMpThreads one(1);
    EXPECT_EQ(current_threads(), 1);
    if (blas > 0) EXPECT_EQ(openblas_threads(), 1);
    {
      OpenMpThreads two(2);
      EXPECT_EQ(current_threads(), 2);
      if (blas > 0) EXPECT_EQ(openblas_threads(), 2);
    }
    EXPECT_EQ(current_threads(), 1);
  }
  EXPECT_EQ(current_threads(), 2);
  EXPECT_EQ(openblas_threads(), blas);
  EXPECT_THROW(OpenMpThreads(0), Error);
}

TEST(Context, TheActiveBlasIsOpenBlas) {
  // make deps installs libopenblas0-pthread; without it this process would
  // call reference BLAS, about 30x slower, and pathkernel warns at start-up.
  BlasInfo blas = active_blas();
  EXPECT_TRUE(blas.optimized) << "dgemm_ comes from " << blas.library;
  EXPECT_NE(blas.library.find("openblas"), std::string::npos) << blas.library;
}

TEST(Context, DtypeNames) {
  EXPECT_EQ(parse_dtype("float64"), torch::kFloat64);
  EXPECT_EQ(parse_dtype("float32"), torch::kFloat32);
  EXPECT_EQ(dtype_name(torch::kFloat64), "float64");
  try {
    parse_dtype("float16");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown dtype 'float16': expected float64 or float32"), std::string::npos);
  }
}

}  // namespace
}  // namespace pathkernel
