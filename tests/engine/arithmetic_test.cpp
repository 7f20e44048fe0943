// The test side's and the training side's arithmetic (arithmetic.h) against
// counts made by hand from the layers' shapes.
#include <gtest/gtest.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "pathkernel/arithmetic.h"
#include "pathkernel/model.h"

namespace pathkernel {
namespace {

/// The row arithmetic of a 3-class own network of `spec` on inputs of
/// `shape`; throws (the test fails) when it has none.
RowArithmetic arithmetic_of(const std::string& spec, const std::vector<int64_t>& shape) {
  NetworkOptions o;
  o.spec = ModelSpec::parse(spec);
  o.input_shape = shape;
  o.num_classes = 3;
  o.output = OutputMap::LogSoftmax;
  o.seed = 1;
  Network net = build_network(o);
  SegmentEvaluator ev(net);
  std::vector<int64_t> row{1};
  row.insert(row.end(), shape.begin(), shape.end());
  const std::optional<RowArithmetic> a = row_arithmetic(ev, torch::randn(row, torch::kFloat64));
  if (!a) throw std::runtime_error("no row arithmetic for " + spec);
  return *a;
}

TEST(Arithmetic, CountsEachProductsMultiplyAddsFromItsShape) {
  {
    // 5 → 7 → 3: 35 and 21 multiply-adds a row.
    const RowArithmetic a = arithmetic_of("mlp:7", {5});
    EXPECT_EQ(a.forward_flop, 4.0 * (35 + 21));      // each product at W_s and dW_s, 2 flop a multiply-add
    EXPECT_EQ(a.cotangent_flop, 2.0 * 35 + 6.0 * 21);  // weight gradients; the second's input gradient twice
    // A training row at W_s: forward and weight gradient of both, the second's input gradient.
    EXPECT_EQ(a.training_row_flop, 4.0 * (35 + 21) + 2.0 * 21);
    Manifest m;
    m.steps = 7;
    m.num_train = 50;
    m.batch_size = 16;
    EXPECT_EQ(a.training_side_flop(m), 7.0 * 16 * a.training_row_flop);
    m.batch_size = 0;  // full batch
    EXPECT_EQ(a.training_side_flop(m), 7.0 * 50 * a.training_row_flop);
  }
  {
    // A 3 × 3 convolution 1 → 2 channels on 6 × 6 (padding 1): 18 weights at
    // 36 positions; pooled to 2 × 3 × 3 = 18 features, then 18 → 3.
    const RowArithmetic a = arithmetic_of("cnn:2", {1, 6, 6});
    EXPECT_EQ(a.forward_flop, 4.0 * (18 * 36 + 54));
    EXPECT_EQ(a.cotangent_flop, 2.0 * 18 * 36 + 6.0 * 54);
  }
  {
    // Convolutions 1 → 2 and 2 → 3 channels on 8 × 8 and 4 × 4 (padding 1),
    // pooled to 3 × 2 × 2 = 12 features, then 12 → 3: 18 · 64, 54 · 16 and
    // 36 multiply-adds a row.
    const RowArithmetic a = arithmetic_of("cnn:2,3", {1, 8, 8});
    const double m0 = 18 * 64, m1 = 54 * 16, m2 = 36;
    EXPECT_EQ(a.cotangent_flop, 2 * m0 + 6 * m1 + 6 * m2);
    EXPECT_EQ(a.training_row_flop, 4 * (m0 + m1 + m2) + 2 * (m1 + m2));
    // Walked to layer 1 alone: the logits' layer, whose weight and input
    // gradients it takes; layer 1, a convolution, takes its products from
    // the pairs' sums: its input gradient at W_s and dW_s and its weight
    // gradient from two rows (A + t B); a pair's piece, layer 1 forward on
    // one row at W_s and dW_s.
    EXPECT_EQ(a.short_cotangent_flop, 6 * m2);
    EXPECT_EQ(a.pair_sum_flop, 4 * m1 + 4 * m1);
    EXPECT_EQ(a.pair_piece_flop, 4 * m1);
  }
  {
    // mlp 5 → 7 → 6 → 3: layer 1 Linear keeps its rows' weight gradients.
    const RowArithmetic a = arithmetic_of("mlp:7,6", {5});
    EXPECT_EQ(a.short_cotangent_flop, 6.0 * 18 + 2.0 * 42);
    EXPECT_EQ(a.pair_sum_flop, 4.0 * 42);
  }
}

TEST(Arithmetic, TestSideCountsIntegrandMomentAndForwardRows) {
  RowArithmetic a;
  a.forward_flop = 10;
  a.cotangent_flop = 3;
  QuadratureCounts c;
  c.evaluations = 2;
  c.moment_evaluations = 5;
  c.forward_evaluations = 7;
  // 2 rows of a forward pass and K = 4 cotangents, 5 of one, 7 of none.
  EXPECT_EQ(a.test_side_flop(c, 4), 2 * (10 + 4 * 3) + 5 * (10 + 3) + 7 * 10);
}

TEST(Arithmetic, TestSideCountsShortAndUnwalkedCotangentsAndPairs) {
  RowArithmetic a;
  a.forward_flop = 10;
  a.cotangent_flop = 3;
  a.short_cotangent_flop = 2;
  a.pair_piece_flop = 11;
  a.pair_sum_flop = 13;
  QuadratureCounts c;
  c.evaluations = 2;
  c.moment_evaluations = 5;
  c.forward_evaluations = 7;
  c.short_cotangents = 6;  // of the 2 · 4 + 5 = 13 cotangents, 6 short, 4 unwalked, 3 whole
  c.unwalked_cotangents = 4;
  c.pair_pieces = 3;
  c.pair_sums = 2;  // each K = 4 cotangents
  EXPECT_EQ(a.test_side_flop(c, 4), 14 * 10 + 3 * 3 + 6 * 2 + 3 * 11 + 2 * 4 * 13);
}

}  // namespace
}  // namespace pathkernel
