// OpenBLAS's kernels switched inside one process: to a named set and back,
// an unknown name refused with nothing changed, and the engine's scope.
#include "pathkernel/blas_switch.h"

#include <gtest/gtest.h>
#include <strings.h>
#include <torch/torch.h>

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../test_util.h"
#include "pathkernel/blas_kernels.h"
#include "pathkernel/environment.h"

namespace pathkernel {
namespace {

using testing::ScopedEnv;

bool same_name(const std::string& a, const std::string& b) { return ::strcasecmp(a.c_str(), b.c_str()) == 0; }

/// Restores the kernels the test started with.
class BlasSwitch : public ::testing::Test {
 protected:
  void SetUp() override {
    start_ = active_blas_kernels();
    best_ = best_blas_kernels(CpuFeatures::current());
    if (start_.empty()) GTEST_SKIP() << "this BLAS does not switch its kernels (not OpenBLAS with DYNAMIC_ARCH)";
  }
  void TearDown() override {
    if (!start_.empty()) switch_blas_kernels(start_);
  }
  /// A float64 matrix product through the BLAS.
  static torch::Tensor product() {
    torch::manual_seed(3);
    const torch::Tensor a = torch::randn({67, 45}, torch::kFloat64), b = torch::randn({45, 53}, torch::kFloat64);
    return torch::mm(a, b);
  }
  std::string start_, best_;
};

TEST_F(BlasSwitch, SwitchesToNamedKernelsAndBack) {
  ASSERT_TRUE(switch_blas_kernels("Prescott"));  // every x86-64 CPU runs them
  EXPECT_TRUE(same_name(active_blas_kernels(), "Prescott")) << active_blas_kernels();
  const torch::Tensor old_kernels = product();
  if (best_.empty()) return;
  ASSERT_TRUE(switch_blas_kernels(best_));
  EXPECT_TRUE(same_name(active_blas_kernels(), best_)) << active_blas_kernels();
  // Other kernels round otherwise, but compute the same product.
  EXPECT_TRUE(torch::allclose(product(), old_kernels, 1e-12, 1e-12));
  ASSERT_TRUE(switch_blas_kernels("Prescott"));
  EXPECT_TRUE(torch::equal(product(), old_kernels));  // the same kernels again: the same bits
}

TEST_F(BlasSwitch, UnknownNameChangesNothing) {
  ASSERT_TRUE(switch_blas_kernels("Prescott"));
  const char* before = std::getenv("OPENBLAS_CORETYPE");
  const std::string variable = before ? before : "";
  EXPECT_FALSE(switch_blas_kernels("NoSuchKernels"));
  EXPECT_TRUE(same_name(active_blas_kernels(), "Prescott")) << active_blas_kernels();
  const char* after = std::getenv("OPENBLAS_CORETYPE");
  EXPECT_EQ(after ? after : "", variable);
}

TEST_F(BlasSwitch, EngineScopeRunsTheBestKernelsWhenPathkernelChose) {
  if (best_.empty()) GTEST_SKIP() << "this CPU has no kernels better than OpenBLAS's own choice";
  ASSERT_TRUE(switch_blas_kernels("Prescott"));
  {
    const ScopedEnv chosen(kBlasKernelsChosenVariable, "1");
    const EngineBlasKernels engine;
    EXPECT_TRUE(same_name(active_blas_kernels(), best_)) << active_blas_kernels();
  }
  EXPECT_TRUE(same_name(active_blas_kernels(), "Prescott")) << active_blas_kernels();
  {
    const ScopedEnv users_own(kBlasKernelsChosenVariable, nullptr);  // the user set OPENBLAS_CORETYPE
    const EngineBlasKernels engine;
    EXPECT_TRUE(same_name(active_blas_kernels(), "Prescott")) << active_blas_kernels();
  }
  if (same_name(best_, "Haswell") && switch_blas_kernels("Zen")) {
    // A loop recorded on an AMD CPU runs Zen's kernels: the same arithmetic
    // as Haswell's, so nothing is switched (and the replay may go ahead).
    const ScopedEnv chosen(kBlasKernelsChosenVariable, "1");
    EXPECT_EQ(engine_blas_kernels(), "");
    const EngineBlasKernels engine;
    EXPECT_TRUE(same_name(active_blas_kernels(), "Zen")) << active_blas_kernels();
  }
  if (same_name(best_, "SkylakeX") && switch_blas_kernels("Cooperlake")) {
    // What OpenBLAS picks itself on a CPU with AVX-512 BF16 (a loop recorded
    // in Python there): SkylakeX's float64 arithmetic, so nothing is switched.
    const ScopedEnv chosen(kBlasKernelsChosenVariable, "1");
    EXPECT_EQ(engine_blas_kernels(), "");
    const EngineBlasKernels engine;
    EXPECT_TRUE(same_name(active_blas_kernels(), "Cooperlake")) << active_blas_kernels();
  }
}

/// Products of `dtype` through the BLAS: matrix products of several shapes
/// and orientations, a matrix-vector product and a convolution.
std::vector<torch::Tensor> products_of(torch::Dtype dtype) {
  torch::manual_seed(7);
  std::vector<torch::Tensor> out;
  const torch::TensorOptions o = torch::TensorOptions().dtype(dtype);
  for (const auto& [m, k, n] : std::vector<std::array<int64_t, 3>>{{300, 500, 200}, {37, 1000, 53}, {128, 1152, 196}}) {
    const torch::Tensor a = torch::randn({m, k}, o), b = torch::randn({k, n}, o);
    out.push_back(torch::mm(a, b));
    out.push_back(torch::mm(b.t(), a.t()));
    out.push_back(torch::mv(a, b.select(1, 0)));
  }
  out.push_back(torch::conv2d(torch::randn({16, 8, 28, 28}, o), torch::randn({16, 8, 3, 3}, o), {}, 1, 1));
  return out;
}

void expect_same_bits(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::equal(got[i], want[i])) << what << ", product " << i;
}

// A mixed table runs the float64 products with the wider kernels, bit for
// bit as those alone, and every float32 product with the run's kernels, bit
// for bit as those alone; a switch ends the mix.
TEST_F(BlasSwitch, MixedKernelsRunFloat64ProductsWideAndFloat32OnesAsTheRun) {
  if (best_.empty()) GTEST_SKIP() << "this CPU has no kernels better than OpenBLAS's own choice";
  ASSERT_TRUE(switch_blas_kernels(best_));
  const std::vector<torch::Tensor> wide32 = products_of(torch::kFloat32), wide64 = products_of(torch::kFloat64);
  ASSERT_TRUE(switch_blas_kernels("Prescott"));
  const std::vector<torch::Tensor> run32 = products_of(torch::kFloat32), run64 = products_of(torch::kFloat64);
  const ReplayEnvironment run_environment = ReplayEnvironment::current(1);
  // The two kernels round differently, or this test could not tell them apart.
  ASSERT_FALSE(torch::equal(run32[0], wide32[0]));
  ASSERT_FALSE(torch::equal(run64[0], wide64[0]));

  ASSERT_TRUE(mix_blas_kernels(best_));
  EXPECT_TRUE(same_name(active_blas_kernels(), "Prescott")) << active_blas_kernels();
  EXPECT_TRUE(same_name(mixed_float64_kernels(), best_)) << mixed_float64_kernels();
  // A run's environment is what a replay calls: the run's kernels, named as OpenBLAS names them alone.
  EXPECT_EQ(ReplayEnvironment::current(1).blas, run_environment.blas);
  EXPECT_EQ(ReplayEnvironment::current(1).blas_kernels, run_environment.blas_kernels);
  {
    const ScopedEnv chosen(kBlasKernelsChosenVariable, "1");
    EXPECT_EQ(engine_blas_kernels(), "");  // nothing left to switch for the engine's float64 work
  }
  expect_same_bits(products_of(torch::kFloat32), run32, "float32, mixed");
  expect_same_bits(products_of(torch::kFloat64), wide64, "float64, mixed");
  EXPECT_TRUE(mix_blas_kernels(best_));  // mixed already: nothing changes
  expect_same_bits(products_of(torch::kFloat64), wide64, "float64, mixed twice");

  ASSERT_TRUE(switch_blas_kernels("Prescott"));
  EXPECT_EQ(mixed_float64_kernels(), "");
  expect_same_bits(products_of(torch::kFloat64), run64, "float64, the mix ended");
}

// A run's replay: float32 mixes the widest float64 kernels in, whoever chose
// the run's; any other run's ends the mix.
TEST_F(BlasSwitch, AFloat32ReplayMixesTheWidestFloat64KernelsInAndAnotherEndsTheMix) {
  if (best_.empty()) GTEST_SKIP() << "this CPU has no kernels better than OpenBLAS's own choice";
  ASSERT_TRUE(switch_blas_kernels("Prescott"));
  const ScopedEnv users_own(kBlasKernelsChosenVariable, nullptr);
  blas_kernels_for_replay(true);
  EXPECT_TRUE(same_name(mixed_float64_kernels(), best_)) << mixed_float64_kernels();
  EXPECT_TRUE(same_name(active_blas_kernels(), "Prescott")) << active_blas_kernels();
  blas_kernels_for_replay(false);
  EXPECT_EQ(mixed_float64_kernels(), "");
  EXPECT_TRUE(same_name(active_blas_kernels(), "Prescott")) << active_blas_kernels();
  ASSERT_TRUE(switch_blas_kernels(best_));
  blas_kernels_for_replay(true);  // the widest already: nothing to mix
  EXPECT_EQ(mixed_float64_kernels(), "");
}

// The pairs same_blas_arithmetic calls the same give the same float64 bits,
// on every shape tried and a convolution (where this CPU runs both of a pair).
TEST_F(BlasSwitch, KernelsOfTheSameArithmeticGiveTheSameBits) {
  const auto products = [] {
    torch::manual_seed(5);
    std::vector<torch::Tensor> out;
    for (const auto& [m, k, n] : std::vector<std::array<int64_t, 3>>{
             {37, 1000, 53}, {500, 257, 300}, {128, 1152, 196}, {3, 10000, 5}, {1, 64, 1}}) {
      const torch::Tensor a = torch::randn({m, k}, torch::kFloat64), b = torch::randn({k, n}, torch::kFloat64);
      out.push_back(torch::mm(a, b));
      out.push_back(torch::mm(b.t(), a.t()));
    }
    const torch::Tensor x = torch::randn({16, 8, 28, 28}, torch::kFloat64);
    out.push_back(torch::conv2d(x, torch::randn({16, 8, 3, 3}, torch::kFloat64), {}, 1, 1));
    return out;
  };
  int pairs = 0;
  for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{{"Zen", "Haswell"},
                                                                             {"Cooperlake", "SkylakeX"}}) {
    ASSERT_TRUE(same_blas_arithmetic(a, b));
    if (!runs_blas_kernels(CpuFeatures::current(), a) || !switch_blas_kernels(a)) continue;
    const std::vector<torch::Tensor> first = products();
    ASSERT_TRUE(switch_blas_kernels(b));
    const std::vector<torch::Tensor> second = products();
    for (size_t i = 0; i < first.size(); ++i) EXPECT_TRUE(torch::equal(first[i], second[i])) << a << " and " << b << ", product " << i;
    ++pairs;
  }
  if (pairs == 0) GTEST_SKIP() << "this CPU runs neither pair's kernels";
}

TEST_F(BlasSwitch, WaitsForWorkHoldingTheKernels) {
  // A switch does not meet a BLAS call in flight on another thread, nor
  // change the kernels under work handed on with them: it waits until the
  // work lets them go.
  if (best_.empty()) GTEST_SKIP() << "this CPU has no kernels better than OpenBLAS's own choice";
  ASSERT_TRUE(switch_blas_kernels("Prescott"));
  auto held = std::make_unique<BlasKernelsHeld>();
  EXPECT_EQ(blas_kernels_held(), 1);
  std::atomic<bool> switched{false};
  std::thread other([&] {
    switch_blas_kernels(best_);
    switched = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(switched.load()) << "the kernels were switched under work that held them";
  EXPECT_TRUE(same_name(active_blas_kernels(), "Prescott")) << active_blas_kernels();
  held.reset();
  other.join();
  EXPECT_TRUE(switched.load());
  EXPECT_EQ(blas_kernels_held(), 0);
  EXPECT_TRUE(same_name(active_blas_kernels(), best_)) << active_blas_kernels();
}

TEST(BlasAlone, WaitsForWorkHandedOnAndKeepsNewWorkOut) {
  // A replayed step that sets OpenBLAS's thread count (the process's) starts
  // once the work handed to other threads has let the BLAS go, and work
  // handed on meanwhile waits until the step is done.
  auto held = std::make_unique<BlasKernelsHeld>();
  std::atomic<bool> alone{false}, step_done{false};
  std::thread step([&] {
    const BlasAlone scope;
    alone = true;
    while (!step_done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(alone.load()) << "the step began while work handed on held the BLAS";
  held.reset();
  while (!alone.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::atomic<bool> handed{false};
  std::thread work([&] {
    const BlasKernelsHeld h;
    handed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(handed.load()) << "work was handed on in the middle of the step";
  step_done = true;
  step.join();
  work.join();
  EXPECT_TRUE(handed.load());
  EXPECT_EQ(blas_kernels_held(), 0);
}

}  // namespace
}  // namespace pathkernel
