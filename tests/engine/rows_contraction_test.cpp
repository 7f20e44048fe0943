// A Rows layer contracted by rows and through its dense block (features.cpp,
// rows_contraction.h): the same numbers either way, against the explicit
// dense J̄ and per-sample gradients (contract_dense, which features_test.cpp
// compares with autograd), and the cheaper way chosen.
#include <gtest/gtest.h>

#include "pathkernel/features.h"
#include "pathkernel/loss.h"
#include "pathkernel/model.h"
#include "pathkernel/segment.h"
#include "../../src/engine/rows_contraction.h"
#include "../test_util.h"

namespace pathkernel {
namespace {

using Case = testing::NetworkCase;

TEST(RowsContraction, BothFormsGiveTheExplicitContraction) {
  const std::vector<Case> cases = {{"mlp:7", {5}, OutputMap::LogSoftmax},
                                   {"mlp:6,4:tanh", {5}, OutputMap::Logits},
                                   {"mlp:40,40", {4}, OutputMap::LogSoftmax}};
  for (const Case& c : cases) {
    Network net = build_network(c.options(3, 11));
    torch::manual_seed(5);
    const torch::Tensor w = flatten_parameters(net);
    const torch::Tensor dw = 0.2 * torch::randn_like(w);
    std::vector<int64_t> xs{4}, xt{6};
    xs.insert(xs.end(), c.shape.begin(), c.shape.end());
    xt.insert(xt.end(), c.shape.begin(), c.shape.end());
    const torch::Tensor x_test = torch::randn(xs, torch::kFloat64), x_train = torch::randn(xt, torch::kFloat64);
    const torch::Tensor y_train = torch::tensor({0, 2, 1, 1, 0, 2}, torch::kLong);
    SegmentEvaluator ev(net);
    ev.set_segment(w, dw);
    QuadratureOptions q;
    q.spec = QuadratureSpec::parse("riemann:3");
    const TestFeatures f = test_features(ev, x_test, q);
    const TrainSignals t = train_signals(ev, x_train, y_train, c.map);
    const torch::Tensor expect = contract_dense(ev, dense_features(ev, f), t);  // [4, 6, 3]
    const torch::Tensor expect_kernel = output_kernel(ev, f, x_train);
    for (const bool dense : {false, true}) {
      const RowsContractionScope as(dense);
      const std::string what = c.name() + (dense ? ", dense block" : ", by rows");
      testing::expect_close(contract(ev, f, t), expect, 1e-12, what);
      testing::expect_close(output_kernel(ev, f, x_train), expect_kernel, 1e-12, what + ", output kernel");
    }
  }
}

TEST(RowsContraction, TakesTheFormOfFewerMultiplyAdds) {
  // The real-size run's last layer (128 → 10), 16 test points with 17 rows
  // each, against a batch of 128: by rows costs about a quarter.
  const RowsLayerSizes wide_batch{10, 16, 272, 128, 10, 129, 128, 1};
  EXPECT_LT(by_rows_cost(wide_batch), dense_block_cost(wide_batch) / 3);
  EXPECT_FALSE(take_dense_block(wide_batch));
  // Hundreds of rows a point, two outputs, a small batch: the block.
  const RowsLayerSizes many_rows{2, 1, 500, 100, 2, 101, 8, 1};
  EXPECT_LT(dense_block_cost(many_rows), by_rows_cost(many_rows));
  EXPECT_TRUE(take_dense_block(many_rows));
  {
    const RowsContractionScope as(false);
    EXPECT_FALSE(take_dense_block(many_rows));
  }
  EXPECT_TRUE(take_dense_block(many_rows));  // the scope is gone
}

TEST(RowsContraction, PointSumsAreTheWeightedProductsSummedInRowOrder) {
  torch::manual_seed(7);
  const int64_t K = 3, R = 9, Kp = 2, B = 5, n = 4;
  const torch::Tensor dd = torch::randn({K, R, Kp, B}, torch::kFloat64) * 1e6;
  const torch::Tensor a = torch::randn({R, B}, torch::kFloat64), weight = torch::rand({R}, torch::kFloat64);
  // Points out of order and repeated (their sums depend on the order of the
  // adds), and point 2 without rows (zeros).
  const torch::Tensor point = torch::tensor(std::vector<int64_t>{3, 0, 3, 1, 0, 3, 1, 3, 0}, torch::kLong);
  const torch::Tensor products = dd * a.view({1, R, 1, B}) * weight.view({1, R, 1, 1});
  const torch::Tensor expect = torch::zeros({K, n, Kp, B}, torch::kFloat64).index_add_(1, point, products);
  const torch::Tensor got = rows_point_sums(dd, a, weight, point, n);
  EXPECT_TRUE(torch::equal(got, expect)) << "max difference " << (got - expect).abs().max().item<double>();
  // A transposed dd is read as its values.
  const torch::Tensor dd_t = dd.transpose(2, 3).contiguous().transpose(2, 3);
  EXPECT_TRUE(torch::equal(rows_point_sums(dd_t, a, weight, point, n), expect));
}

TEST(RowsContraction, PointSumsRefuseRowsOfNoPoint) {
  const torch::Tensor dd = torch::ones({1, 2, 1, 3}, torch::kFloat64), a = torch::ones({2, 3}, torch::kFloat64);
  const torch::Tensor weight = torch::ones({2}, torch::kFloat64);
  try {
    rows_point_sums(dd, a, weight, torch::tensor(std::vector<int64_t>{0, 2}, torch::kLong), 2);
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("row 1 belongs to point 2, outside the 2 test points"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(rows_point_sums(dd, a.t(), weight, torch::zeros({2}, torch::kLong), 1), std::exception);
}

}  // namespace
}  // namespace pathkernel
