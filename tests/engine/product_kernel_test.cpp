// The tangent kernel against autograd Jacobians, and the test–test EPK of a
// segment against a reference integrated on the exact kink positions.
#include <gtest/gtest.h>

#include "../test_util.h"
#include "pathkernel/product_kernel.h"

namespace pathkernel {
namespace {

using testing::flat_grad;

NetworkOptions three_class(const std::string& spec, std::vector<int64_t> shape, OutputMap map, uint64_t seed) {
  NetworkOptions o;
  o.spec = ModelSpec::parse(spec);
  o.input_shape = std::move(shape);
  o.num_classes = 3;
  o.output = map;
  o.seed = seed;
  return o;
}

/// J(w, x) [K, P] for one input, by autograd.
torch::Tensor jacobian(Network& net, const torch::Tensor& w, const torch::Tensor& x) {
  std::vector<torch::Tensor> rows;
  for (int64_t k = 0; k < 3; ++k) {
    rows.push_back(flat_grad(net, w, x.unsqueeze(0), [&](const torch::Tensor& f) { return f[0][k]; }));
  }
  return torch::stack(rows);
}

TEST(TangentKernel, EqualsAutogradJacobiansAtEachRowsPosition) {
  const std::vector<std::pair<std::string, std::vector<int64_t>>> cases = {
      {"mlp:7", {5}}, {"mlp:6,4:tanh", {5}}, {"cnn:2,3", {1, 8, 8}}};
  for (const auto& [spec, shape] : cases) {
    NetworkOptions o = three_class(spec, shape, OutputMap::LogSoftmax, 3);
    Network net = build_network(o), ref = build_network(o);
    torch::manual_seed(4);
    torch::Tensor w = flatten_parameters(net), dw = 0.3 * torch::randn_like(w);
    std::vector<int64_t> xs{4}, ys{3};
    xs.insert(xs.end(), shape.begin(), shape.end());
    ys.insert(ys.end(), shape.begin(), shape.end());
    torch::Tensor x = torch::randn(xs, torch::kFloat64), y = torch::randn(ys, torch::kFloat64);
    torch::Tensor tx = torch::rand({4}, torch::kFloat64), ty = torch::rand({3}, torch::kFloat64);
    SegmentEvaluator ev(net);
    ev.set_segment(w, dw);
    const std::vector<TrainSignals> a = train_output_signals(ev, x, tx), b = train_output_signals(ev, y, ty);
    torch::Tensor got = tangent_kernel(ev, a, b), rows = tangent_kernel_rows(ev, a);
    for (int64_t i = 0; i < 4; ++i) {
      torch::Tensor ji = jacobian(ref, w + tx[i].item<double>() * dw, x[i]);
      torch::Tensor self = torch::matmul(ji, ji.t());
      EXPECT_LE((rows[i] - self).abs().max().item<double>(), 1e-12 * self.abs().max().item<double>()) << spec;
      for (int64_t j = 0; j < 3; ++j) {
        torch::Tensor expect = torch::matmul(ji, jacobian(ref, w + ty[j].item<double>() * dw, y[j]).t());
        EXPECT_LE((got[i][j] - expect).abs().max().item<double>(), 1e-12 * expect.abs().max().item<double>())
            << spec << " " << i << "," << j;
      }
    }
  }
}

// One hidden ReLU layer: the kinks of both points are where an affine
// pre-activation crosses 0, known exactly; between them a 24-node
// Gauss–Legendre rule of autograd Jacobians is the reference.
TEST(ProductKernel, GaussEqualsTheIntegralOnExactKinks) {
  for (OutputMap map : {OutputMap::LogSoftmax, OutputMap::Logits}) {
    NetworkOptions o = three_class("mlp:7", {5}, map, 8);
    Network net = build_network(o), ref = build_network(o);
    torch::manual_seed(12);
    torch::Tensor w = flatten_parameters(net), dw = 0.8 * torch::randn_like(w);
    torch::Tensor x = torch::randn({3, 5}, torch::kFloat64), y = torch::randn({2, 5}, torch::kFloat64);
    SegmentEvaluator ev(net);
    ev.set_segment(w, dw);
    const torch::Tensor z = torch::cat({x, y});
    torch::Tensor y0 = ev.forward(z, torch::zeros({5}, torch::kFloat64), false).preacts[0];
    torch::Tensor y1 = ev.forward(z, torch::ones({5}, torch::kFloat64), false).preacts[0];
    std::vector<double> cuts{0.0, 1.0};
    int kinks = 0;
    for (int64_t r = 0; r < 5; ++r) {
      for (int64_t u = 0; u < 7; ++u) {
        const double a = y0[r][u].item<double>(), b = y1[r][u].item<double>();
        if ((a < 0) != (b < 0)) {
          cuts.push_back(a / (a - b));
          ++kinks;
        }
      }
    }
    ASSERT_GE(kinks, 3) << "the segment must cross kinks for the test to mean something";
    std::sort(cuts.begin(), cuts.end());
    torch::Tensor expect = torch::zeros({3, 2, 3, 3}, torch::kFloat64);
    for (size_t p = 0; p + 1 < cuts.size(); ++p) {
      const QuadratureRule rule = gauss_legendre(24, cuts[p], cuts[p + 1]);
      for (size_t j = 0; j < rule.nodes.size(); ++j) {
        const torch::Tensor wt = w + rule.nodes[j] * dw;
        std::vector<torch::Tensor> jy{jacobian(ref, wt, y[0]), jacobian(ref, wt, y[1])};
        for (int64_t i = 0; i < 3; ++i) {
          torch::Tensor jx = jacobian(ref, wt, x[i]);
          for (int64_t c = 0; c < 2; ++c) expect[i][c] += rule.weights[j] * torch::matmul(jx, jy[c].t());
        }
      }
    }
    QuadratureOptions q;
    const double scale = expect.abs().max().item<double>();
    torch::Tensor got = segment_product_kernel(ev, x, y, q);
    EXPECT_LE((got - expect).abs().max().item<double>(), 1e-12 * scale) << output_map_name(map);
    // The product of the averages is a different thing, measurably.
    TestFeatures fx = test_features(ev, x, q);
    torch::Tensor jbar_x = dense_features(ev, fx), jbar_y = dense_features(ev, test_features(ev, y, q));
    torch::Tensor averages = torch::einsum("ikp,jlp->ijkl", {jbar_x, jbar_y});
    EXPECT_GT((averages - expect).abs().max().item<double>(), 1e-6 * scale) << output_map_name(map);
    // A coarse fixed rule is measurably off: the comparison can fail.
    q.spec = QuadratureSpec::parse("riemann:3");
    EXPECT_GT((segment_product_kernel(ev, x, y, q) - expect).abs().max().item<double>(), 1e-6 * scale);
  }
}

// With max-pools and deeper kinks: the diagonal on each point's own pieces
// equals the diagonal of the block on the union of pieces, and the block is
// symmetric positive semi-definite.
TEST(ProductKernel, DiagonalAgreesWithTheBlockOnACnn) {
  NetworkOptions o = three_class("cnn:2,3", {1, 8, 8}, OutputMap::LogSoftmax, 5);
  Network net = build_network(o);
  torch::manual_seed(2);
  torch::Tensor w = flatten_parameters(net), dw = 0.5 * torch::randn_like(w);
  torch::Tensor x = torch::randn({4, 1, 8, 8}, torch::kFloat64);
  SegmentEvaluator ev(net);
  ev.set_segment(w, dw);
  QuadratureOptions q;
  q.max_rows = 64;  // several passes
  torch::Tensor block = segment_product_kernel(ev, x, x, q);          // [4, 4, 3, 3]
  torch::Tensor diag = segment_product_diagonal(ev, x, q);            // [4, 3, 3]
  const double scale = block.abs().max().item<double>();
  EXPECT_LE((diag - block.diagonal(0, 0, 1).permute({2, 0, 1})).abs().max().item<double>(), 1e-11 * scale);
  torch::Tensor flat = block.permute({0, 2, 1, 3}).reshape({12, 12});
  EXPECT_LE((flat - flat.t()).abs().max().item<double>(), 1e-12 * scale);
  EXPECT_GE(torch::linalg::eigvalsh(0.5 * (flat + flat.t()), "L").min().item<double>(), -1e-10 * scale);
}

}  // namespace
}  // namespace pathkernel
