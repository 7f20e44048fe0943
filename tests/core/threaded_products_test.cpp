// OpenBLAS's products on two threads, added as there on one
// (threaded_products.h), against OpenBLAS itself on two threads: float32 and
// float64, on the kernels OpenBLAS chose and on Haswell's, Sandybridge's
// and Prescott's.
#include "pathkernel/threaded_products.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <tuple>
#include <vector>

#include "pathkernel/blas_kernels.h"
#include "pathkernel/blas_switch.h"
#include "pathkernel/context.h"

namespace pathkernel {
namespace {

/// OpenBLAS's own count now (0 without OpenBLAS).
int openblas_threads() {
  using GetFn = int (*)();
  static const auto fn = reinterpret_cast<GetFn>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return fn == nullptr ? 0 : fn();
}

/// Why this machine cannot check the rule, or "".
std::string cannot_check() {
  const std::string why = threaded_products_unavailable();
  if (!why.empty()) return why;
  const BlasThreads two(2);
  if (openblas_threads() != 2) return "OpenBLAS does not run on two threads here";
  return "";
}

/// Puts OpenBLAS's kernels back as they were.
class ThreadedProducts : public ::testing::TestWithParam<torch::ScalarType> {
 protected:
  void SetUp() override {
    start_ = active_blas_kernels();
    const std::string why = cannot_check();
    if (!why.empty()) GTEST_SKIP() << why;
  }
  void TearDown() override {
    if (!start_.empty()) switch_blas_kernels(start_);
  }
  std::string start_;
};

/// Products as LibTorch's Linear forward and backward call the BLAS (x
/// [m, k], w [n, k]), in every transpose, on `threads` threads, on one, and
/// on one inside the scope; each of the last two flagged where it differs
/// from `threads` threads'. Returns how many the scope ran by the threaded
/// driver.
long check_products(torch::ScalarType dtype, int* differ_on_one, int threads = 2) {
  // [rows, k, columns]: LeNet-5's first Linear layer on a batch of 128 (k =
  // 400, halved on Cooperlake's kernels), inner dimensions cut into blocks
  // and halves, rows fewer than four (the columns split instead), products
  // whose blocks alone the small-matrix kernels would take, and one
  // OpenBLAS runs alike on any count.
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {
      {128, 400, 120}, {120, 1335, 128}, {461, 700, 484}, {64, 900, 200}, {500, 799, 30}, {393, 1050, 6},
      {9, 1149, 134},  {161, 412, 19},   {6, 1050, 393},  {3, 700, 500},  {200, 300, 200}, {8, 40, 8}};
  torch::manual_seed(3);
  const auto opts = torch::TensorOptions().dtype(dtype);
  const long before = threaded_products_split();
  for (const auto& [m, k, n] : shapes) {
    const torch::Tensor x = torch::randn({m, k}, opts), w = torch::randn({n, k}, opts), bias = torch::randn({n}, opts);
    auto products = [&] {
      return std::vector<torch::Tensor>{torch::addmm(bias, x, w.t()), torch::mm(x, w.t()),
                                        torch::mm(w, x.t()), torch::mm(x.t().contiguous().t(), w.t()),
                                        torch::mm(x, w.t().contiguous()), torch::addmm(bias, x, w.t(), 0.5, 2.0)};
    };
    std::vector<torch::Tensor> two, one, as_threaded;
    {
      const BlasThreads at(threads);
      two = products();
    }
    {
      const BlasThreads at(1);
      one = products();
      const ThreadedProductsOnOneThread scope(threads);
      as_threaded = products();
    }
    for (size_t i = 0; i < two.size(); ++i) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " on " + std::to_string(threads) + " threads [" + std::to_string(m) + ", " + std::to_string(k) +
                   "] x [" + std::to_string(k) + ", " + std::to_string(n) + "], product " + std::to_string(i) +
                   ", kernels " + active_blas_kernels());
      EXPECT_TRUE(torch::equal(as_threaded[i], two[i]));
      *differ_on_one += torch::equal(one[i], two[i]) ? 0 : 1;
    }
  }
  return threaded_products_split() - before;
}

TEST_P(ThreadedProducts, ProductsOnOneThreadAddAsOpenBlasOnTwo) {
  int differ_on_one = 0;
  EXPECT_GT(check_products(GetParam(), &differ_on_one), 0);
  // The check has something to find: on one thread alone some products add
  // otherwise.
  EXPECT_GT(differ_on_one, 0);
}

TEST_P(ThreadedProducts, ProductsOnOneThreadAddAsOpenBlasOnMoreThreadsThanCores) {
  // OpenBLAS runs as many threads as it is told; a user's machine has more
  // cores than this one. Three threads split the rows unevenly, eight split
  // the columns too where the rows are few.
  for (const int threads : {3, 8}) {
    {
      const BlasThreads at(threads);
      if (openblas_threads() != threads) GTEST_SKIP() << "OpenBLAS does not run " << threads << " threads here";
    }
    int differ_on_one = 0;
    EXPECT_GT(check_products(GetParam(), &differ_on_one, threads), 0);
    EXPECT_GT(differ_on_one, 0);
  }
}

TEST_P(ThreadedProducts, ProductsOnOneThreadAddAsOpenBlasOnTwoOnOtherKernels) {
  // Haswell's: sums that depend on more than the inner dimension's blocks
  // (the rows at the end of each thread's range, the columns' widths);
  // Sandybridge's: panels loaded aligned (a panel off its page crashed);
  // Prescott's: one routine's code in two of the table's entries.
  int ran = 0;
  for (const std::string kernels : {"Haswell", "Sandybridge", "Prescott"}) {
    if (start_.empty() || !runs_blas_kernels(CpuFeatures::current(), kernels) || !switch_blas_kernels(kernels)) {
      continue;
    }
    SCOPED_TRACE(kernels);
    ASSERT_EQ(threaded_products_unavailable(), "");
    int differ_on_one = 0;
    EXPECT_GT(check_products(GetParam(), &differ_on_one), 0);
    EXPECT_GT(differ_on_one, 0);
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << "OpenBLAS cannot run Haswell's, Sandybridge's or Prescott's kernels here";
}

INSTANTIATE_TEST_SUITE_P(Precisions, ThreadedProducts, ::testing::Values(torch::kFloat32, torch::kFloat64),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

TEST(ThreadedProductsScope, LeavesProductsAloneOutsideItsScopeAndAtOneThread) {
  const std::string why = cannot_check();
  if (!why.empty()) GTEST_SKIP() << why;
  // k = 900 is cut into blocks and halves otherwise on two threads.
  const torch::Tensor x = torch::randn({128, 900}), w = torch::randn({120, 900});
  const BlasThreads at(1);
  const torch::Tensor plain = torch::mm(x, w.t());
  const long before = threaded_products_split();
  {
    const ThreadedProductsOnOneThread none(1);
    EXPECT_TRUE(torch::equal(torch::mm(x, w.t()), plain));
  }
  {
    const ThreadedProductsOnOneThread two(2);
    { const ThreadedProductsOnOneThread inner(1); }  // a nested count of one keeps the outer's
    (void)torch::mm(x, w.t());
  }
  EXPECT_TRUE(torch::equal(torch::mm(x, w.t()), plain));
  EXPECT_EQ(threaded_products_split(), before + 1);
}

}  // namespace
}  // namespace pathkernel
