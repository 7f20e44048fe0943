// The reverse walk's accumulator step in one pass (accumulator_step.h):
// bit for bit against an explicit loop of fused multiply-adds, and within
// rounding of the tensor expressions it replaces.
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "../../src/engine/accumulator_step.h"
#include "pathkernel/error.h"

namespace pathkernel {
namespace {

/// The step written element by element, as documented.
void reference(torch::Tensor& a, const torch::Tensor& metric, torch::Tensor& acc, const AccumulatorScalars& c,
               const torch::Tensor& buffer_metric) {
  const int64_t P = a.size(2);
  double* av = a.data_ptr<double>();
  double* sv = acc.defined() ? acc.data_ptr<double>() : nullptr;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double j = metric.defined() ? av[i] * metric[i % P].item<double>() : av[i];
    if (sv) {
      sv[i] = std::fma(c.kappa, j, c.beta * sv[i]);
      const double q = buffer_metric.defined() ? buffer_metric[i % P].item<double>() : 1.0;
      av[i] = std::fma(c.gamma, sv[i] * q, c.alpha * j);
    } else {
      av[i] = c.alpha * j;
    }
  }
}

const AccumulatorScalars kAdam{-1.3e-3, 0.9, 0.1, 0.7};

TEST(AccumulatorStep, MatchesFusedMultiplyAddsBitForBit) {
  torch::manual_seed(3);
  // P odd and rows not a multiple of any vector width; one block past a
  // parallel task's grain.
  for (const std::vector<int64_t> shape : {std::vector<int64_t>{2, 3, 37}, std::vector<int64_t>{1, 2, 20011}}) {
    for (bool with_metric : {true, false}) {
      // 0: no buffer; 1: a buffer; 2: a buffer with its own metric (RMSprop's with momentum)
      for (int buffer : {0, 1, 2}) {
        const torch::Tensor jp = torch::randn(shape, torch::kFloat64);
        const torch::Tensor metric = with_metric ? torch::rand({shape[2]}, torch::kFloat64) + 0.5 : torch::Tensor();
        const torch::Tensor q = buffer == 2 ? torch::rand({shape[2]}, torch::kFloat64) + 0.5 : torch::Tensor();
        const torch::Tensor acc0 = buffer > 0 ? torch::randn(shape, torch::kFloat64) : torch::Tensor();
        torch::Tensor acc = buffer > 0 ? acc0.clone() : torch::Tensor();
        const torch::Tensor a = accumulator_step(jp.clone(), metric, acc, kAdam, q);
        torch::Tensor expect_a = jp.clone(), expect_acc = buffer > 0 ? acc0.clone() : torch::Tensor();
        reference(expect_a, metric, expect_acc, kAdam, q);
        EXPECT_TRUE(torch::equal(a, expect_a)) << "metric " << with_metric << ", buffer " << buffer;
        if (buffer > 0) EXPECT_TRUE(torch::equal(acc, expect_acc)) << "metric " << with_metric << ", buffer " << buffer;
      }
    }
  }
}

TEST(AccumulatorStep, WithinRoundingOfTheTensorExpressions) {
  torch::manual_seed(4);
  const torch::Tensor jp = torch::randn({3, 4, 1001}, torch::kFloat64);
  const torch::Tensor metric = torch::rand({1001}, torch::kFloat64) + 0.5;
  const torch::Tensor acc0 = torch::randn({3, 4, 1001}, torch::kFloat64);
  torch::Tensor acc = acc0.clone();
  const torch::Tensor a = accumulator_step(jp.clone(), metric, acc, kAdam);
  const torch::Tensor j = jp * metric;
  const torch::Tensor expect_acc = kAdam.beta * acc0 + kAdam.kappa * j;
  const torch::Tensor expect_a = kAdam.alpha * j + kAdam.gamma * expect_acc;
  const double eps = std::numeric_limits<double>::epsilon();
  EXPECT_LE((acc - expect_acc).abs().max().item<double>(), 4 * eps * expect_acc.abs().max().item<double>());
  EXPECT_LE((a - expect_a).abs().max().item<double>(), 8 * eps * expect_a.abs().max().item<double>());
  // With the buffer's metric: a = α j + γ Q Ã.
  const torch::Tensor q = torch::rand({1001}, torch::kFloat64) + 0.5;
  acc = acc0.clone();
  const torch::Tensor aq = accumulator_step(jp.clone(), metric, acc, kAdam, q);
  const torch::Tensor expect_aq = kAdam.alpha * j + kAdam.gamma * expect_acc * q;
  EXPECT_LE((aq - expect_aq).abs().max().item<double>(), 8 * eps * expect_aq.abs().max().item<double>());
}

TEST(AccumulatorStep, RefusesMismatchedBlocks) {
  const torch::Tensor jp = torch::zeros({1, 2, 5}, torch::kFloat64);
  EXPECT_THROW(accumulator_step(jp.clone(), torch::Tensor(), torch::zeros({1, 2, 4}, torch::kFloat64), kAdam), Error);
  EXPECT_THROW(accumulator_step(jp.clone(), torch::ones({4}, torch::kFloat64), torch::Tensor(), kAdam), Error);
  EXPECT_THROW(accumulator_step(torch::zeros({1, 5, 2}, torch::kFloat64).transpose(1, 2), torch::Tensor(),
                                torch::Tensor(), kAdam),
               Error);
  EXPECT_THROW(accumulator_step(jp.to(torch::kFloat32), torch::Tensor(), torch::Tensor(), kAdam), Error);
  const torch::Tensor acc = torch::zeros({1, 2, 5}, torch::kFloat64);
  EXPECT_THROW(accumulator_step(jp.clone(), torch::Tensor(), acc, kAdam, torch::ones({4}, torch::kFloat64)), Error);
  EXPECT_THROW(accumulator_step(jp.clone(), torch::Tensor(), torch::Tensor(), kAdam, torch::ones({5}, torch::kFloat64)),
               Error);
}

}  // namespace
}  // namespace pathkernel
