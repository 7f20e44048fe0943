// The hand-written max-pool and its gradient against LibTorch's pool and
// autograd through it: the same values, the same argmax (ties, NaNs,
// infinities, windows past the plane's end), bit for bit.
#include <gtest/gtest.h>

#include <limits>
#include <tuple>

#include "pathkernel/max_pool.h"

namespace pathkernel {
namespace {

/// Values from a small set, so that windows tie often, with a NaN, −∞ and +∞
/// placed among them.
torch::Tensor tied_values(std::vector<int64_t> shape, torch::ScalarType dtype) {
  torch::manual_seed(7);
  torch::Tensor x = torch::randint(-2, 3, shape, torch::kLong).to(dtype);
  torch::Tensor flat = x.view({-1});
  // Two NaNs in the first window (of 2 × 2 and of 3 × 3, in a plane 9 wide).
  flat[0] = std::numeric_limits<double>::quiet_NaN();
  flat[10] = std::numeric_limits<double>::quiet_NaN();
  flat[20] = -std::numeric_limits<double>::infinity();
  flat[30] = std::numeric_limits<double>::infinity();
  return x;
}

TEST(MaxPool, ValuesAndArgmaxAreLibTorchs) {
  for (torch::ScalarType dtype : {torch::kFloat64, torch::kFloat32}) {
    for (int64_t k : {1, 2, 3}) {
      const torch::Tensor x = tied_values({3, 4, 7, 9}, dtype);  // 7 and 9: windows past the end
      auto [m, i] = max_pool_with_indices(x, k);
      auto [mt, it] = torch::max_pool2d_with_indices(x, k);
      EXPECT_TRUE(torch::equal(i, it)) << "window " << k;
      EXPECT_TRUE(torch::allclose(m, mt, 0, 0, /*equal_nan=*/true)) << "window " << k;
      EXPECT_EQ(m.scalar_type(), dtype);
    }
  }
  const torch::Tensor all_minus_inf = torch::full({1, 1, 2, 2}, -std::numeric_limits<double>::infinity(), torch::kFloat64);
  EXPECT_TRUE(torch::equal(std::get<1>(max_pool_with_indices(all_minus_inf, 2)),
                           std::get<1>(torch::max_pool2d_with_indices(all_minus_inf, 2))));
}

/// 2 × 2 windows by lanes (two float64 or four float32 windows at a time)
/// and the windows left one at a time: planes 8 to 19 wide, ties, NaNs and
/// infinities in every lane, against LibTorch's pool.
TEST(MaxPool, EveryLaneAndTheRestAreLibTorchs) {
  for (torch::ScalarType dtype : {torch::kFloat64, torch::kFloat32}) {
    for (int64_t W = 8; W <= 19; ++W) {
      torch::manual_seed(W);
      torch::Tensor x = torch::randint(-2, 3, {2, 3, 6, W}, torch::kLong).to(dtype);
      const torch::Tensor u = torch::rand(x.sizes(), torch::kFloat64);
      x.masked_fill_(u < 0.08, std::numeric_limits<double>::quiet_NaN());
      x.masked_fill_((u >= 0.08) & (u < 0.12), std::numeric_limits<double>::infinity());
      x.masked_fill_((u >= 0.12) & (u < 0.16), -std::numeric_limits<double>::infinity());
      x.masked_fill_((u >= 0.16) & (u < 0.22), -0.0);
      auto [m, i] = max_pool_with_indices(x, 2);
      auto [mt, it] = torch::max_pool2d_with_indices(x, 2);
      EXPECT_TRUE(torch::equal(i, it)) << "width " << W << ", " << dtype;
      EXPECT_TRUE(torch::allclose(m, mt, 0, 0, /*equal_nan=*/true)) << "width " << W << ", " << dtype;
      EXPECT_TRUE(torch::equal(torch::signbit(m), torch::signbit(mt))) << "width " << W << ", " << dtype;
    }
  }
}

TEST(MaxPool, ViewsAndOtherTypesGoThroughLibTorch) {
  const torch::Tensor x = tied_values({2, 3, 8, 8}, torch::kFloat64).transpose(2, 3);  // not contiguous
  auto [m, i] = max_pool_with_indices(x, 2);
  auto [mt, it] = torch::max_pool2d_with_indices(x, 2);
  EXPECT_TRUE(torch::equal(i, it));
  EXPECT_TRUE(torch::allclose(m, mt, 0, 0, true));
  EXPECT_THROW(max_pool_with_indices(x.flatten(2), 2), std::exception);
}

/// The unpool against autograd through LibTorch's pool (each output's
/// gradient in turn), with and without the mask of a ReLU before the pool:
/// 2 × 2 windows (their own loop, by lanes: float32 two windows at a time,
/// one left in a row of 3 or 5) with a column, a row, both or neither past
/// the last window, and 3 × 3 windows (the general loop); float64 and
/// float32.
TEST(MaxPool, UnpoolIsTheGradientThroughThePool) {
  torch::manual_seed(3);
  const int64_t K = 3;
  for (torch::ScalarType dtype : {torch::kFloat64, torch::kFloat32}) {
    for (auto [k, H, W] : {std::tuple<int64_t, int64_t, int64_t>{2, 6, 7}, {2, 7, 6}, {2, 7, 7}, {2, 6, 8}, {2, 4, 10},
                           {2, 5, 11}, {3, 7, 9}}) {
      const torch::Tensor y = torch::randn({2, 3, H, W}, dtype);
      const torch::Tensor h = torch::relu(y);
      auto [pooled, index] = max_pool_with_indices(h, k);
      const torch::Tensor g = torch::randn({K, 2, 3, H / k, W / k}, dtype);
      for (bool relu : {false, true}) {
        const torch::Tensor got = max_unpool(g, index, k, H, W, relu ? pooled : torch::Tensor());
        ASSERT_EQ(got.sizes(), (std::vector<int64_t>{K, 2, 3, H, W}));
        for (int64_t o = 0; o < K; ++o) {
          const torch::Tensor leaf = (relu ? y : h).clone().requires_grad_(true);
          const torch::Tensor out = torch::max_pool2d(relu ? torch::relu(leaf) : leaf, k);
          const torch::Tensor want = torch::autograd::grad({out}, {leaf}, {g[o]})[0];
          EXPECT_TRUE(torch::equal(got[o], want)) << "output " << o << (relu ? " after a ReLU" : "") << ", window " << k
                                                  << ", plane " << H << " x " << W << ", " << dtype;
        }
      }
    }
  }
}

/// A masked window's gradient is the gradient times 0, as the product with
/// the mask gives it: −0 for a negative gradient, NaN for an infinite one.
TEST(MaxPool, MaskedGradientKeepsTheProductsBits) {
  const torch::Tensor h = torch::zeros({1, 1, 2, 4}, torch::kFloat64);
  auto [pooled, index] = max_pool_with_indices(h, 2);
  const torch::Tensor g = torch::tensor({-1.0, std::numeric_limits<double>::infinity()}, torch::kFloat64).view({1, 1, 1, 1, 2});
  const torch::Tensor got = max_unpool(g, index, 2, 2, 4, pooled);
  const torch::Tensor want = torch::zeros({1, 1, 1, 8}, torch::kFloat64)
                                 .scatter_(3, index.flatten(2).unsqueeze(0), (g * (pooled > 0)).flatten(3))
                                 .view({1, 1, 1, 2, 4});
  EXPECT_TRUE(std::signbit(got[0][0][0][0][0].item<double>()));
  EXPECT_TRUE(std::isnan(got[0][0][0][0][2].item<double>()));
  EXPECT_TRUE(torch::allclose(got, want, 0, 0, true));
}

}  // namespace
}  // namespace pathkernel
