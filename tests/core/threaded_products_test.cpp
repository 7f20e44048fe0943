// OpenBLAS's float32 products on two threads, added as there on one
// (threaded_products.h), against OpenBLAS itself on two threads.
#include "pathkernel/threaded_products.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <tuple>
#include <vector>

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

/// Why this machine cannot check the rule, or "": it is OpenBLAS 0.3.21's on
/// its AVX-512 kernels (threaded_products.h); on others a product on two
/// threads may differ from one in more than its k-blocks.
std::string cannot_check() {
  const std::string why = threaded_products_unavailable();
  if (!why.empty()) return why;
  const std::string kernels = active_blas_kernels();
  if (kernels != "SkylakeX" && kernels != "Cooperlake") return "the rule is not known for OpenBLAS's " + kernels;
  const BlasThreads two(2);
  if (openblas_threads() != 2) return "OpenBLAS does not run on two threads here";
  return "";
}

TEST(ThreadedProducts, FloatProductsOnOneThreadAddAsOpenBlasOnTwo) {
  const std::string why = cannot_check();
  if (!why.empty()) GTEST_SKIP() << why;
  // [rows, k, columns]: LeNet-5's first Linear layer on a batch of 128 (k =
  // 400: halved on Cooperlake), inner dimensions cut into Q-blocks and
  // halves on either kernel set, products whose blocks alone OpenBLAS's
  // small-matrix kernels would take (run wider), and one OpenBLAS runs
  // alike on any count.
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {
      {128, 400, 120}, {120, 1335, 128}, {461, 700, 484}, {64, 900, 200}, {500, 799, 30},
      {393, 1050, 6},  {9, 1149, 134},  {161, 412, 19},  {6, 1050, 393}, {8, 40, 8}};
  torch::manual_seed(3);
  const long split_before = threaded_products_split();
  int differ_on_one = 0;
  for (const auto& [m, k, n] : shapes) {
    const torch::Tensor x = torch::randn({m, k}), w = torch::randn({n, k}), bias = torch::randn({n});
    auto products = [&] {  // as LibTorch's Linear forward and backward call the BLAS
      return std::vector<torch::Tensor>{torch::addmm(bias, x, w.t()), torch::mm(x, w.t()),
                                        torch::mm(w, x.t()), torch::mm(x.t().contiguous().t(), w.t()),
                                        torch::mm(x, w.t().contiguous())};
    };
    std::vector<torch::Tensor> two, one, as_threaded;
    {
      const BlasThreads at(2);
      two = products();
    }
    {
      const BlasThreads at(1);
      one = products();
      const ThreadedProductsOnOneThread scope(2);
      as_threaded = products();
    }
    for (size_t i = 0; i < two.size(); ++i) {
      SCOPED_TRACE("[" + std::to_string(m) + ", " + std::to_string(k) + "] x [" + std::to_string(k) + ", " +
                   std::to_string(n) + "], product " + std::to_string(i));
      EXPECT_TRUE(torch::equal(as_threaded[i], two[i]));
      differ_on_one += torch::equal(one[i], two[i]) ? 0 : 1;
    }
  }
  // The check has something to find: on one thread alone some products add
  // otherwise, and the scope ran them in blocks.
  EXPECT_GT(differ_on_one, 0);
  EXPECT_GT(threaded_products_split(), split_before);
}

TEST(ThreadedProducts, LeavesProductsAloneOutsideItsScopeAndAtOneThread) {
  const std::string why = cannot_check();
  if (!why.empty()) GTEST_SKIP() << why;
  // k = 900 is cut into Q-blocks and halves otherwise on two threads on
  // either kernel set.
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
