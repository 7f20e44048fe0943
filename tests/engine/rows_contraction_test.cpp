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

}  // namespace
}  // namespace pathkernel
