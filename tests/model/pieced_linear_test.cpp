// A Linear layer's products in pieces (pieced_linear.h) against
// torch::linear and autograd through it: the same values and gradients to
// rounding, first and second order; and the same bits whatever the number
// of threads that run the pieces.
#include <gtest/gtest.h>

#include "pathkernel/context.h"
#include "pathkernel/pieced_linear.h"
#include "../test_util.h"

namespace pathkernel {
namespace {

using testing::same_bits;

struct LinearCase {
  torch::Tensor x, w, b;
};

/// x [rows, in], w [out, in], b [out] (or none), float64, needing gradients.
LinearCase linear_case(int64_t rows, int64_t in, int64_t out, bool bias) {
  torch::manual_seed(rows * 1000 + out);
  const auto o = torch::TensorOptions().dtype(torch::kFloat64);
  LinearCase c;
  c.x = torch::randn({rows, in}, o).requires_grad_();
  c.w = torch::randn({out, in}, o).requires_grad_();
  if (bias) c.b = torch::randn({out}, o).requires_grad_();
  return c;
}

/// y and the gradients of Σ y³ (a loss not linear in y) in x, w and b.
std::vector<torch::Tensor> value_and_gradients(const LinearCase& c, int64_t pieces) {
  const torch::Tensor y = pieces == 0 ? torch::linear(c.x, c.w, c.b) : pieced_linear(c.x, c.w, c.b, pieces);
  std::vector<torch::Tensor> inputs{c.x, c.w};
  if (c.b.defined()) inputs.push_back(c.b);
  std::vector<torch::Tensor> out{y.detach()};
  for (const torch::Tensor& g : torch::autograd::grad({(y * y * y).sum()}, inputs)) out.push_back(g);
  return out;
}

/// Whether y's graph holds the pieces' autograd Function (torch::linear's
/// does not): a fallback to torch::linear computes the same values, so only
/// the graph tells that the pieces ran.
bool ran_in_pieces(const torch::Tensor& y) {
  std::vector<std::shared_ptr<torch::autograd::Node>> todo{y.grad_fn()};
  while (!todo.empty()) {
    const std::shared_ptr<torch::autograd::Node> node = todo.back();
    todo.pop_back();
    if (!node) continue;
    if (node->name().find("PiecedLinear") != std::string::npos) return true;
    for (const torch::autograd::Edge& e : node->next_edges()) todo.push_back(e.function);
  }
  return false;
}

void expect_close(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    const double scale = std::max(1.0, b[i].abs().max().item<double>());
    EXPECT_LE((a[i] - b[i]).abs().max().item<double>(), 1e-13 * scale) << what << ", output " << i;
  }
}

TEST(PiecedLinear, PiecesSplitRowsEvenlyAndCoverThem) {
  for (int64_t size : {0, 1, 2, 5, 256, 3000}) {
    for (int64_t pieces : {1, 2, 3, 7}) {
      int64_t next = 0;
      for (int64_t p = 0; p < pieces; ++p) {
        const PieceRange r = piece_range(size, pieces, p);
        EXPECT_EQ(r.first, next) << size << " in " << pieces;
        EXPECT_LE(r.count, size / pieces + 1);
        EXPECT_GE(r.count, size / pieces);
        next += r.count;
      }
      EXPECT_EQ(next, size) << size << " in " << pieces;
    }
  }
}

// Rows and output units fewer than the pieces included (empty pieces).
TEST(PiecedLinear, ValuesAndGradientsAreLinears) {
  for (bool bias : {true, false}) {
    for (auto [rows, out] : std::vector<std::pair<int64_t, int64_t>>{{40, 9}, {1, 5}, {7, 1}, {300, 64}}) {
      const LinearCase c = linear_case(rows, 6, out, bias);
      const auto reference = value_and_gradients(c, 0);
      for (int64_t pieces : {2, 3, 8}) {
        expect_close(value_and_gradients(c, pieces), reference,
                     std::to_string(rows) + " rows, " + std::to_string(out) + " units, " + std::to_string(pieces) +
                         " pieces, bias " + std::to_string(bias));
      }
    }
  }
}

// A gradient of a gradient (create_graph) goes through the recorded pieces.
TEST(PiecedLinear, SecondOrderGradientsAreLinears) {
  const LinearCase c = linear_case(30, 5, 7, true);
  const auto second = [&](int64_t pieces) {
    const torch::Tensor y = pieces == 0 ? torch::linear(c.x, c.w, c.b) : pieced_linear(c.x, c.w, c.b, pieces);
    const auto g = torch::autograd::grad({(y * y * y).sum()}, {c.x, c.w, c.b}, {}, true, true);
    const torch::Tensor h = g[0].pow(2).sum() + g[1].pow(2).sum() + g[2].pow(2).sum();
    return torch::autograd::grad({h}, {c.x, c.w, c.b});
  };
  const auto reference = second(0);
  for (int64_t pieces : {2, 3}) expect_close(second(pieces), reference, std::to_string(pieces) + " pieces");
}

// The bits depend on the pieces, never on the threads that run them (with
// OpenBLAS at one thread, as a run that splits its products trains it).
TEST(PiecedLinear, BitsDoNotDependOnTheThreads) {
  const LinearCase c = linear_case(501, 100, 65, true);
  std::vector<torch::Tensor> one, two;
  {
    ThreadScope scope(1);
    const BlasPin blas(1);
    one = value_and_gradients(c, 2);
  }
  {
    ThreadScope scope(2);
    const BlasPin blas(1);
    two = value_and_gradients(c, 2);
  }
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(same_bits(one[i], two[i])) << "output " << i;
}

TEST(PiecedLinear, OnePieceOrAVectorIsLinear) {
  const LinearCase c = linear_case(12, 4, 3, true);
  EXPECT_TRUE(same_bits(pieced_linear(c.x, c.w, c.b, 1), torch::linear(c.x, c.w, c.b)));
  EXPECT_FALSE(ran_in_pieces(pieced_linear(c.x, c.w, c.b, 1)));
  EXPECT_TRUE(ran_in_pieces(pieced_linear(c.x, c.w, c.b, 2)));
  const torch::Tensor v = torch::randn({4}, torch::kFloat64);
  EXPECT_TRUE(same_bits(pieced_linear(v, c.w, c.b, 2), torch::linear(v, c.w, c.b)));
}

// A sequence's Linear input [B, T, in]: its B·T rows in pieces, the values
// and gradients those of torch::linear, the output [B, T, out].
TEST(PiecedLinear, LeadingDimensionsAreRowsOfTheProduct) {
  for (bool bias : {true, false}) {
    LinearCase c = linear_case(1, 6, 5, bias);
    c.x = torch::randn({3, 7, 6}, torch::kFloat64).requires_grad_();
    const auto reference = value_and_gradients(c, 0);
    const auto pieced = value_and_gradients(c, 2);
    EXPECT_EQ(pieced[0].sizes(), (std::vector<int64_t>{3, 7, 5}));
    EXPECT_TRUE(ran_in_pieces(pieced_linear(c.x, c.w, c.b, 2)));
    expect_close(pieced, reference, "[3, 7, 6] in 2 pieces, bias " + std::to_string(bias));
  }
}

}  // namespace
}  // namespace pathkernel
