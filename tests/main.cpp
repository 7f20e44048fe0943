// The test suite's entry point: OpenBLAS's kernels chosen as the pathkernel
// launcher chooses them (blas_kernels.h), so that a run the suite trains in
// its own process and one it trains through the command line replay each
// other bit for bit.
#include <gtest/gtest.h>
#include <unistd.h>

#include "pathkernel/blas_kernels.h"

int main(int argc, char** argv) {
  // OpenBLAS reads OPENBLAS_CORETYPE as it loads: start again with it set.
  if (pathkernel::choose_blas_kernels(argc, argv)) ::execv("/proc/self/exe", argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
