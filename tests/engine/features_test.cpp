// The structured contractions against per-sample autograd Jacobians, and the
// decomposition's completeness on small real runs.
#include <gtest/gtest.h>

#include "../test_util.h"
#include "pathkernel/context.h"
#include "pathkernel/decomposition.h"
#include "pathkernel/features.h"
#include "pathkernel/loss.h"

namespace pathkernel {
namespace {

using testing::flat_grad;

using Case = testing::NetworkCase;

const std::vector<Case> kCases = {
    {"mlp:7", {5}, OutputMap::LogSoftmax},      {"mlp:6,4:tanh", {5}, OutputMap::Logits},
    {"mlp:5:gelu", {1, 3, 3}, OutputMap::LogSoftmax}, {"cnn:2,3", {1, 8, 8}, OutputMap::LogSoftmax},
    {"cnn:3", {2, 6, 6}, OutputMap::Logits},
    // 10 × 10 images: the second pool's windows (5 × 5 → 2 × 2) leave the
    // last row and column out (the own route's scattered max-pool backward).
    {"cnn:2,3", {1, 10, 10}, OutputMap::Logits},
    // 9 × 9 images: the first pool's windows (9 × 9 → 4 × 4) leave the last
    // row and column out, and the second's (4 × 4 → 2 × 2) tile.
    {"cnn:2,3", {1, 9, 9}, OutputMap::Logits}, {"cnn:2,3", {1, 9, 9}, OutputMap::LogSoftmax},
    // A wide second layer: contract() takes the row-wise route there (the
    // narrow layers above take the dense block).
    {"mlp:40,40", {4}, OutputMap::LogSoftmax},
};

/// A 3-class network of the case's architecture.
NetworkOptions options_for(const Case& c, uint64_t seed) { return c.options(3, seed); }

/// got equals expect in shape, and within 1e-12 of max(1, |expect|).
void expect_close(const torch::Tensor& got, const torch::Tensor& expect, const std::string& what) {
  ASSERT_EQ(got.sizes(), expect.sizes()) << what;
  EXPECT_LE((got - expect).abs().max().item<double>(), 1e-12 * std::max(1.0, expect.abs().max().item<double>()))
      << what;
}

/// A network of the case, a segment w, w + dw of it, 4 test and 5 training inputs.
struct Segment {
  NetworkOptions options;
  Network net{nullptr};
  int64_t p = 0;
  torch::Tensor w, dw, x_test, x_train;
};

Segment segment_for(const Case& c, uint64_t net_seed, uint64_t draw_seed) {
  Segment s;
  s.options = options_for(c, net_seed);
  s.net = build_network(s.options);
  s.p = parameter_count(s.net);
  torch::manual_seed(draw_seed);
  s.w = flatten_parameters(s.net);
  s.dw = 0.2 * torch::randn({s.p}, torch::kFloat64);
  std::vector<int64_t> xs{4}, xt{5};
  xs.insert(xs.end(), c.shape.begin(), c.shape.end());
  xt.insert(xt.end(), c.shape.begin(), c.shape.end());
  s.x_test = torch::randn(xs, torch::kFloat64);
  s.x_train = torch::randn(xt, torch::kFloat64);
  return s;
}

/// J̄_k(x) of a riemann:3 rule on the segment, by autograd: [P].
torch::Tensor riemann3_feature(Network& ref, const Segment& s, const torch::Tensor& x, int64_t k) {
  torch::Tensor jbar = torch::zeros({s.p}, torch::kFloat64);
  for (double t : {0.0, 1.0 / 3, 2.0 / 3}) {
    jbar += flat_grad(ref, s.w + t * s.dw, x, [&](const torch::Tensor& f) { return f[0][k]; }) / 3;
  }
  return jbar;
}

// <J̄_k(x_n), g_i> with a riemann:3 rule, against per-sample autograd Jacobians;
// also J̄ itself in dense form, and the dense contraction. The contraction
// against signals whose per-sample gradients were formed beforehand
// (form_sample_gradients, as a decomposition keeps them across blocks of
// test points) too, and those gradients themselves.
TEST(Features, ContractionMatchesPerSampleAutograd) {
  for (const Case& c : kCases) {
    Segment sg = segment_for(c, 11, 5);
    Network& net = sg.net;
    const NetworkOptions& o = sg.options;
    const int64_t p = sg.p;
    const torch::Tensor &w = sg.w, &dw = sg.dw, &x_test = sg.x_test, &x_train = sg.x_train;
    torch::Tensor y_train = torch::tensor({0, 2, 1, 1, 0}, torch::kLong);

    SegmentEvaluator ev(net);
    ev.set_segment(w, dw);
    QuadratureOptions q;
    q.spec = QuadratureSpec::parse("riemann:3");
    TestFeatures f = test_features(ev, x_test, q);
    torch::Tensor got = contract(ev, f, train_signals(ev, x_train, y_train, c.map));  // [4, 5, 3]
    torch::Tensor v = torch::randn({p}, torch::kFloat64);
    torch::Tensor got_apply = apply_features(ev, f, v);                                // [4, 3]
    torch::Tensor dense = dense_features(ev, f);                                       // [4, 3, P]
    torch::Tensor got_dense = contract_dense(ev, dense, train_signals(ev, x_train, y_train, c.map));
    TrainSignals formed = train_signals(ev, x_train, y_train, c.map);
    auto numel_of = [](const std::vector<torch::Tensor>& ts) {
      int64_t numel = 0;
      for (const torch::Tensor& g : ts) numel += g.defined() ? g.numel() : 0;
      return numel;
    };
    // Convolutions keep their forward pass's patches, their per-sample
    // gradients not formed yet; forming them lets the patches go.
    const int64_t from_the_pass = numel_of(formed.gradients), patches = numel_of(formed.patches);
    EXPECT_EQ(from_the_pass, 0) << c.name();
    EXPECT_EQ(patches > 0, c.spec.rfind("cnn", 0) == 0) << c.name();
    const int64_t before = signal_doubles(formed);
    const int64_t formed_doubles = form_sample_gradients(ev, formed);
    const torch::Tensor got_formed = contract(ev, f, formed);
    const torch::Tensor got_formed_dense = contract_dense(ev, dense, formed);
    const int64_t formed_numel = numel_of(formed.gradients);
    EXPECT_EQ(formed_doubles, formed_numel - patches) << c.name();
    EXPECT_EQ(numel_of(formed.patches), 0) << c.name();
    EXPECT_EQ(signal_doubles(formed), before + formed_doubles) << c.name();
    // Convolutions' per-sample gradients are formed; Linear layers on flat rows stay factored.
    EXPECT_EQ(formed_numel > 0, c.spec.rfind("cnn", 0) == 0) << c.name();

    Network ref = build_network(o);
    for (int64_t n = 0; n < 4; ++n) {
      for (int64_t k = 0; k < 3; ++k) {
        const torch::Tensor jbar = riemann3_feature(ref, sg, x_test.narrow(0, n, 1), k);
        for (int64_t i = 0; i < 5; ++i) {
          torch::Tensor g = flat_grad(ref, w, x_train.narrow(0, i, 1), [&](const torch::Tensor& f) {
            return training_loss(f, y_train.narrow(0, i, 1), c.map);
          });
          double expect = jbar.dot(g).item<double>(), actual = got[n][i][k].item<double>();
          EXPECT_NEAR(actual, expect, 1e-12 * std::max(1.0, std::abs(expect)))
              << c.name() << " test " << n << " train " << i << " output " << k;
          EXPECT_NEAR(got_formed[n][i][k].item<double>(), expect, 1e-12 * std::max(1.0, std::abs(expect)))
              << c.name() << " formed gradients, test " << n << " train " << i << " output " << k;
          EXPECT_NEAR(got_formed_dense[n][i][k].item<double>(), expect, 1e-12 * std::max(1.0, std::abs(expect)))
              << c.name() << " formed gradients, dense, test " << n << " train " << i << " output " << k;
          if (n > 0 || k > 0) continue;
          for (size_t l = 0; l < formed.gradients.size(); ++l) {  // g_i itself, layer by layer
            if (!formed.gradients[l].defined()) continue;
            const ParamLayer& pl = ev.param_layers()[l];
            const torch::Tensor gl =
                torch::cat({g.narrow(0, pl.weight_offset, pl.weight_numel), g.narrow(0, pl.bias_offset, pl.bias_numel)});
            EXPECT_LE((formed.gradients[l][i] - gl).abs().max().item<double>(), 1e-12 * std::max(1.0, gl.abs().max().item<double>()))
                << c.name() << " formed per-sample gradient, layer " << l << " train " << i;
          }
        }
        double expect = jbar.dot(v).item<double>();
        EXPECT_NEAR(got_apply[n][k].item<double>(), expect, 1e-12 * std::max(1.0, std::abs(expect)))
            << c.name() << " J̄v, test " << n << " output " << k;
        EXPECT_LE((dense[n][k] - jbar).abs().max().item<double>(), 1e-12 * std::max(1.0, jbar.abs().max().item<double>()))
            << c.name() << " dense J̄, test " << n << " output " << k;
      }
    }
    EXPECT_LE((got_dense - got).abs().max().item<double>(), 1e-12 * std::max(1.0, got.abs().max().item<double>()))
        << c.name() << " contract_dense";
  }
}

// The kernel blocks J̄_k(x_n) · ∇f_k'(w, x_i) of every output pair, formed for
// all K' training outputs at once (the Summed, both Rows and the Dense
// forms), against per-sample autograd Jacobians.
TEST(Features, OutputKernelMatchesPerSampleAutograd) {
  for (const Case& c : kCases) {
    Segment sg = segment_for(c, 13, 7);
    SegmentEvaluator ev(sg.net);
    ev.set_segment(sg.w, sg.dw);
    QuadratureOptions q;
    q.spec = QuadratureSpec::parse("riemann:3");
    TestFeatures f = test_features(ev, sg.x_test, q);
    const torch::Tensor got = output_kernel(ev, f, sg.x_train);  // [4, 5, 3, 3]
    ASSERT_EQ(got.sizes(), (std::vector<int64_t>{4, 5, 3, 3})) << c.name();

    Network ref = build_network(sg.options);
    const double scale = std::max(1.0, got.abs().max().item<double>());
    for (int64_t n = 0; n < 4; ++n) {
      for (int64_t k = 0; k < 3; ++k) {
        const torch::Tensor jbar = riemann3_feature(ref, sg, sg.x_test.narrow(0, n, 1), k);
        for (int64_t i = 0; i < 5; ++i) {
          for (int64_t k2 = 0; k2 < 3; ++k2) {
            const torch::Tensor ji =
                flat_grad(ref, sg.w, sg.x_train.narrow(0, i, 1), [&](const torch::Tensor& f) { return f[0][k2]; });
            EXPECT_NEAR(got[n][i][k][k2].item<double>(), jbar.dot(ji).item<double>(), 1e-12 * scale)
                << c.name() << " test " << n << " train " << i << " outputs " << k << ", " << k2;
          }
        }
      }
    }
  }
}

// Gauss quadrature certifies J̄ dw = f(w + dw) − f(w) to tolerance.
TEST(Features, GaussSatisfiesTheCertificate) {
  for (const Case& c : kCases) {
    Network net = build_network(options_for(c, 0));
    torch::manual_seed(9);
    torch::Tensor w = flatten_parameters(net), dw = 0.3 * torch::randn_like(w);
    std::vector<int64_t> xs{6};
    xs.insert(xs.end(), c.shape.begin(), c.shape.end());
    SegmentEvaluator ev(net);
    ev.set_segment(w, dw);
    QuadratureOptions q;
    TestFeatures f = test_features(ev, torch::randn(xs, torch::kFloat64), q);
    EXPECT_LE(f.certificate_gap, 1e-13) << c.name();
    // With adaptive rows (several rounds, rows out of point order) the
    // contraction still equals J̄ g_i for the autograd per-sample gradient g_i.
    std::vector<int64_t> ts{2};
    ts.insert(ts.end(), c.shape.begin(), c.shape.end());
    torch::Tensor x_train = torch::randn(ts, torch::kFloat64), y_train = torch::tensor({1, 2}, torch::kLong);
    torch::Tensor got = contract(ev, f, train_signals(ev, x_train, y_train, c.map));  // [6, 2, 3]
    Network ref = build_network(options_for(c, 0));
    for (int64_t i = 0; i < 2; ++i) {
      torch::Tensor g = flat_grad(ref, w, x_train.narrow(0, i, 1), [&](const torch::Tensor& out) {
        return training_loss(out, y_train.narrow(0, i, 1), c.map);
      });
      torch::Tensor expect = apply_features(ev, f, g);  // [6, 3]
      EXPECT_LT((got.select(1, i) - expect).abs().max().item<double>(),
                1e-12 * std::max(1.0, expect.abs().max().item<double>()))
          << c.name() << " train " << i;
    }
    // Riemann with few nodes does not: the certificate is able to fail.
    q.spec = QuadratureSpec::parse("riemann:2");
    EXPECT_GT(test_features(ev, torch::randn(xs, torch::kFloat64), q).certificate_gap, 1e-8) << c.name();
  }
}

// A piecewise-linear network's pieces are integrated exactly, with ⌈L/2⌉
// Gauss nodes for logits, and for log-softmax those nodes plus ⌊L/2⌋
// (L odd) or L/2 + 1 (L even) moment nodes that walk back the softmax
// factor alone (L param layers). The reference is plain: on each of the
// same pieces a 12-node Gauss rule, and at each node the gradient of each
// output by autograd.
TEST(Features, ExactPiecesMatchAutogradOnTheirPieces) {
  std::vector<Case> cases = kCases;
  cases.push_back({"mlp:6,5", {4}, OutputMap::Logits});
  cases.push_back({"mlp:6,5,4", {4}, OutputMap::LogSoftmax});  // L = 4: moment nodes of the higher order
  // L = 4 with convolutions: the pieces' first two layers from their pairs
  // (QuadratureOptions::piece_pairs), layer 1's block a convolution's.
  cases.push_back({"cnn:2,3,3", {1, 16, 16}, OutputMap::LogSoftmax});
  cases.push_back({"cnn:2,3,3", {1, 16, 16}, OutputMap::Logits});
  for (const Case& c : cases) {
    Network net = build_network(options_for(c, 3));
    torch::manual_seed(21);
    const torch::Tensor w = flatten_parameters(net), dw = 0.3 * torch::randn_like(w);
    std::vector<int64_t> xs{3};
    xs.insert(xs.end(), c.shape.begin(), c.shape.end());
    const torch::Tensor x = torch::randn(xs, torch::kFloat64);
    SegmentEvaluator ev(net);
    ev.set_segment(w, dw);
    const int64_t L = ev.polynomial_degree();
    const bool smooth = c.spec.find("tanh") != std::string::npos || c.spec.find("gelu") != std::string::npos;
    if (smooth) {
      EXPECT_EQ(L, 0) << c.name();
      continue;
    }
    ASSERT_EQ(L, static_cast<int64_t>(ev.param_layers().size())) << c.name();
    QuadratureOptions q;
    q.max_depth = 6;  // a wrong rule fails every piece: stop its splitting early
    q.min_nodes = std::max<int>(q.min_nodes, static_cast<int>(L));  // every piece takes the exact rule's nodes
    const TestFeatures f = test_features(ev, x, q);
    EXPECT_LE(f.certificate_gap, 1e-13) << c.name();
    // Every piece evaluated took the exact rule's nodes, and no more rows
    // than the adaptive rule.
    // Log-softmax pieces are split where that saves work (a forward pass
    // and a cotangent walked back count one each): with 3 outputs, not for
    // L = 2 (2 whole nodes cost 8, 1 Gauss node and 2 moment nodes 8 too).
    // A held last site (last_site_test.cpp; by default where L = 3) takes
    // L − 1 nodes a piece and no moment nodes, and its switches are breaks
    // but not pieces; a site held through a hidden layer (by default where
    // L = 4, 5) L − 2.
    const bool held_last = ev.last_site_local() && L == 3;
    const bool held_hidden = !held_last && ev.hidden_site_local() && (L == 4 || L == 5);
    const bool held = held_last || held_hidden;
    const bool split = c.map == OutputMap::LogSoftmax && L > 2;
    const int64_t nodes = held_last     ? L - 1
                          : held_hidden ? L - 2
                          : c.map == OutputMap::Logits || split ? (L + 1) / 2
                                                                : L;
    const int64_t moments = !split || held ? 0 : L % 2 ? L / 2 : L / 2 + 1;
    int64_t pieces = 0;
    for (const std::vector<double>& b : f.breaks) pieces += static_cast<int64_t>(b.size()) - 1;
    EXPECT_EQ(f.evaluations % nodes, 0) << c.name();
    if (!held) EXPECT_GE(f.evaluations, nodes * pieces) << c.name();
    EXPECT_EQ(f.moment_evaluations * nodes, f.evaluations * moments) << c.name();
    q.exact_pieces = false;
    EXPECT_LE(f.evaluations, test_features(ev, x, q).evaluations) << c.name();

    const torch::Tensor dense = dense_features(ev, f);  // [3, K, P]
    Network ref = build_network(options_for(c, 3));
    for (int64_t n = 0; n < 3; ++n) {
      const QuadratureRule rule = composite_gauss_legendre(12, f.breaks[n]);
      for (int64_t k = 0; k < 3; ++k) {
        torch::Tensor jbar = torch::zeros_like(w);
        for (size_t j = 0; j < rule.nodes.size(); ++j) {
          jbar += rule.weights[j] * flat_grad(ref, w + rule.nodes[j] * dw, x.narrow(0, n, 1),
                                              [&](const torch::Tensor& out) { return out[0][k]; });
        }
        EXPECT_LE((dense[n][k] - jbar).abs().max().item<double>(),
                  1e-12 * std::max(1.0, jbar.abs().max().item<double>()))
            << c.name() << " test " << n << " output " << k << ", " << f.breaks[n].size() - 1 << " pieces";
      }
    }
  }
}

/// A long step (dw = 0.5 randn) of the case's network from seed `seed`, set
/// on its evaluator, with 4 test points, 6 training points and their signals,
/// and a direction v: a segment that crosses many kinks.
struct LongStep {
  LongStep(const Case& c, uint64_t seed) : net(build_network(options_for(c, 9))), ev(net) {
    torch::manual_seed(seed);
    const torch::Tensor w = flatten_parameters(net), dw = 0.5 * torch::randn_like(w);
    v = torch::randn_like(w);
    std::vector<int64_t> xs{4}, ts{6};
    xs.insert(xs.end(), c.shape.begin(), c.shape.end());
    ts.insert(ts.end(), c.shape.begin(), c.shape.end());
    x = torch::randn(xs, torch::kFloat64);
    x_train = torch::randn(ts, torch::kFloat64);
    ev.set_segment(w, dw);
    t = train_signals(ev, x_train, torch::tensor({0, 2, 1, 1, 0, 2}, torch::kLong), c.map);
  }
  Network net;
  SegmentEvaluator ev;
  torch::Tensor v, x, x_train;
  TrainSignals t;
};

/// `got` and `expect`, features of one step, agree through what consumers
/// take: the dense J̄, J̄ v, the contraction with the training signals and
/// the output kernel. The certificate's gaps round differently, so a piece
/// at rounding level may be split in one and accepted in the other: about
/// the same rows, and the assembled certificate (the sum of many pieces'
/// gaps on a long segment) as close.
void expect_same_features(const LongStep& s, const TestFeatures& got, const TestFeatures& expect,
                          const std::string& what) {
  EXPECT_NEAR(got.evaluations, expect.evaluations, 0.05 * static_cast<double>(expect.evaluations)) << what;
  EXPECT_GT(expect.evaluations, 4 * 4) << what << ": the segment should cross kinks";
  EXPECT_LE(got.certificate_gap, std::max(1e-13, 2 * expect.certificate_gap)) << what;
  expect_close(dense_features(s.ev, got), dense_features(s.ev, expect), what + " dense J");
  expect_close(apply_features(s.ev, got, s.v), apply_features(s.ev, expect, s.v), what + " J v");
  expect_close(contract(s.ev, got, s.t), contract(s.ev, expect, s.t), what + " contraction");
  expect_close(output_kernel(s.ev, got, s.x_train), output_kernel(s.ev, expect, s.x_train), what + " output kernel");
}

// A piece's rows walk back to param layer 1 alone, and the first two
// layers' parts come from each piece's pair of summed signals, once per test
// point and step (QuadratureOptions::piece_pairs; docs/math.md §7): the same
// features as every row walked back to the first layer, whatever selects
// between the first two layers (ReLU, max-pools tiling or not, a Linear
// layer 1 kept by rows or a convolution's dense block), on pathkernel's own
// networks (the scripted chain: last_site_test.cpp). Compared through what
// consumers take.
TEST(Features, PiecePairsGiveTheFeaturesOfEveryRowWalked) {
  const std::vector<Case> cases = {
      {"cnn:2,3", {1, 8, 8}, OutputMap::LogSoftmax},     {"cnn:2,3", {1, 9, 9}, OutputMap::Logits},
      {"cnn:2,3,3", {1, 16, 16}, OutputMap::LogSoftmax}, {"cnn:2,3,3", {1, 18, 18}, OutputMap::Logits},
      {"mlp:6,5", {4}, OutputMap::LogSoftmax},           {"mlp:6,5,4", {4}, OutputMap::Logits},
  };
  for (const Case& c : cases) {
    const LongStep s(c, 41);
    QuadratureOptions q;
    q.last_site = QuadratureOptions::LastSite::Pieces;  // every piece's rows walked
    q.max_depth = 8;  // a wrong rule fails every piece: stop its splitting early
    const TestFeatures pairs = test_features(s.ev, s.x, q);
    q.piece_pairs = false;
    expect_same_features(s, pairs, test_features(s.ev, s.x, q), c.name());
  }
}

// A step's pieces are evaluated in rounds of at most max_rows rows (a round's
// K cotangents' activations bounded besides: layered_features.cpp,
// round_rows), so a step of many kinks takes several rounds: the same
// features as one round, on the held last site (cnn:2,3 at L = 3), held
// through a hidden layer (mlp:6,5,4), and every kink a piece.
TEST(Features, RoundsOfAFewRowsGiveTheFeaturesOfOneRound) {
  const std::vector<Case> cases = {
      {"cnn:2,3", {1, 8, 8}, OutputMap::LogSoftmax}, {"cnn:2,3", {1, 9, 9}, OutputMap::Logits},
      {"mlp:6,5,4", {4}, OutputMap::LogSoftmax},     {"mlp:6,5", {4}, OutputMap::Logits},
  };
  for (const Case& c : cases) {
    const LongStep s(c, 43);
    for (auto site : {QuadratureOptions::LastSite::Auto, QuadratureOptions::LastSite::Pieces}) {
      QuadratureOptions q;
      q.last_site = site;
      const TestFeatures one = test_features(s.ev, s.x, q);
      q.max_rows = 1;  // a piece a round
      const TestFeatures few = test_features(s.ev, s.x, q);
      const std::string at = c.name() + (site == QuadratureOptions::LastSite::Auto ? " auto" : " pieces");
      expect_same_features(s, few, one, at);
      expect_close(few.f0, one.f0, at + " f0");
      expect_close(few.f1, one.f1, at + " f1");
    }
  }
}

// A fixed rule's rows go in rounds of whole test points, as many as the
// round's rows allow and at least one (layered_features.cpp,
// integrate_fixed), so a block of points with many nodes each takes more
// rounds rather than more memory: a point a round gives the features of
// one round, and every point still gets every node.
TEST(Features, FixedRuleRoundsOfWholePointsGiveTheFeaturesOfOneRound) {
  const std::vector<Case> cases = {{"cnn:2,3", {1, 8, 8}, OutputMap::LogSoftmax}, {"mlp:6,5", {4}, OutputMap::Logits}};
  for (const Case& c : cases) {
    const LongStep s(c, 43);
    QuadratureOptions q;
    q.spec = QuadratureSpec::parse("riemann:7");
    const TestFeatures one = test_features(s.ev, s.x, q);
    q.max_rows = 1;  // a point a round (7 rows: a round is never less than a point)
    const TestFeatures few = test_features(s.ev, s.x, q);
    EXPECT_EQ(one.evaluations, 7 * s.x.size(0)) << c.name();
    EXPECT_EQ(few.evaluations, one.evaluations) << c.name();
    expect_same_features(s, few, one, c.name() + " riemann:7");
  }
}

// With several threads own networks give each of a call's test points a
// group of its own, each computed on one thread, and join the groups'
// features. The joined
// features must act as one thread's: every row keeps its test point, every
// block and sum its place. Compared through what consumers take: J̄ v for a
// random v, the dense J̄, the contraction with training signals, the ends.
TEST(Features, ThreadGroupsGiveTheFeaturesOfOneThread) {
  for (const Case& c : kCases) {
    Network net = build_network(options_for(c, 5));
    torch::manual_seed(31);
    const torch::Tensor w = flatten_parameters(net), dw = 0.3 * torch::randn_like(w), v = torch::randn_like(w);
    std::vector<int64_t> xs{5}, ts{3};
    xs.insert(xs.end(), c.shape.begin(), c.shape.end());
    ts.insert(ts.end(), c.shape.begin(), c.shape.end());
    const torch::Tensor x = torch::randn(xs, torch::kFloat64), x_train = torch::randn(ts, torch::kFloat64);
    const torch::Tensor y_train = torch::tensor({0, 2, 1}, torch::kLong);
    SegmentEvaluator ev(net);
    ev.set_segment(w, dw);
    const QuadratureOptions q;
    auto close = [&](const torch::Tensor& got, const torch::Tensor& expect, const std::string& what) {
      expect_close(got, expect, c.name() + " " + what);
    };
    TestFeatures one;
    {
      ThreadScope threads(1);
      one = test_features(ev, x, q);
    }
    const TrainSignals t = train_signals(ev, x_train, y_train, c.map);
    for (int threads : {2, 3}) {  // a group per point, taken by 2 and 3 threads
      TestFeatures split;
      {
        ThreadScope scope(threads);
        split = test_features(ev, x, q);
      }
      const std::string at = std::to_string(threads) + " threads";
      EXPECT_EQ(split.num_points, 5) << c.name() << " " << at;
      EXPECT_EQ(split.breaks.size(), 5u) << c.name() << " " << at;
      EXPECT_EQ(split.point.size(0), split.weight.size(0)) << c.name() << " " << at;
      EXPECT_LE(split.certificate_gap, 1e-13) << c.name() << " " << at;
      close(split.f0, one.f0, at + ": f0");
      close(split.f1, one.f1, at + ": f1");
      close(apply_features(ev, split, v), apply_features(ev, one, v), at + ": J v");
      close(dense_features(ev, split), dense_features(ev, one), at + ": dense J");
      close(contract(ev, split, t), contract(ev, one, t), at + ": contraction");
    }
  }
}

// f(w_N) = f(w_0) + Σ_i C_i + R + E on real runs, for GD and minibatch SGD.
TEST(Decomposition, CompletenessHoldsToMachinePrecision) {
  for (const std::string opt : {"gd", "sgd"}) {
    testing::TempDir dir(opt);
    RunOptions r = testing::small_run(dir / "run", opt, 12, 5);
    r.train.optimizer.weight_decay = 1e-2;
    r.train.optimizer.lr = 0.3;
    train_run(r);
    PathReader reader(r.out);
    DecompositionOptions options;
    options.progress = false;
    torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 10);
    Decomposition d = decompose(reader, x, options);
    double rel = ((d.prediction() - d.fN).abs() / d.fN.abs().clamp_min(1)).max().item<double>();
    double completeness = (d.fN - d.f0 - d.contributions.sum(1) - d.regularization).abs().max().item<double>();
    EXPECT_LE(rel, 1e-12) << opt;
    EXPECT_LE(completeness, 1e-12) << opt;
    EXPECT_GT(d.regularization.abs().max().item<double>(), 1e-6) << opt;  // weight decay was felt
    EXPECT_GT((d.fN - d.f0).abs().max().item<double>(), 1e-2) << opt;     // and training moved f
    // Minibatch: points never in a batch contribute exactly nothing.
    EXPECT_EQ(d.contributions.sizes(), (std::vector<int64_t>{10, 60, 3}));
    // One hidden ReLU layer: every kink is closed-form, so no forward-only
    // scan of the segment (which alone costs scan_intervals + 1 per point).
    EXPECT_LT(d.forward_evaluations, 10 * d.steps * (options.quadrature.scan_intervals + 1)) << opt;
  }
}

// dpk is TracIn at every step: Σ_s Σ_{i∈B_s} −(η_s/|B_s|) J(w_s, x) g_{i,s}, brute force.
TEST(Decomposition, DpkEqualsBruteForceTracIn) {
  testing::TempDir dir;
  RunOptions r = testing::small_run(dir / "run", "sgd", 4, 2);
  train_run(r);
  PathReader reader(r.out);
  torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 3);
  DecompositionOptions options;
  options.progress = false;
  options.quadrature.spec = QuadratureSpec::parse("dpk");
  Decomposition d = decompose(reader, x, options);

  Network ref = build_network(reader.manifest().network_options());
  const torch::Tensor& xt = reader.decoded_dataset().x_train;
  const torch::Tensor& yt = reader.decoded_dataset().y_train;
  torch::Tensor expect = torch::zeros({3, 60, 3}, torch::kFloat64);
  reader.forward([&](const PathStep& st) {
    const int64_t b = st.batch.size(0);
    for (int64_t n = 0; n < 3; ++n) {
      for (int64_t k = 0; k < 3; ++k) {
        torch::Tensor j = flat_grad(ref, st.w, x.narrow(0, n, 1), [&](const torch::Tensor& f) { return f[0][k]; });
        for (int64_t bi = 0; bi < b; ++bi) {
          int64_t i = st.batch[bi].item<int64_t>();
          torch::Tensor g = flat_grad(ref, st.w, xt.narrow(0, i, 1), [&](const torch::Tensor& f) {
            return training_loss(f, yt.narrow(0, i, 1), OutputMap::LogSoftmax);
          });
          expect[n][i][k] += -st.lr / b * j.dot(g).item<double>();
        }
      }
    }
  });
  EXPECT_LT((d.contributions - expect).abs().max().item<double>(), 1e-13);
  // And the DPK is not exact: its certificate gap is visible.
  EXPECT_GT(d.certificate_max_gap, 1e-8);
}

// The summed kernel against per-sample autograd: with dpk,
// kernel[n, i, k, k'] = Σ_{s: i∈B_s} ∇f_k(w_s, x_n) · ∇f_k'(w_s, x_i).
TEST(Decomposition, KernelEqualsBruteForceSums) {
  testing::TempDir dir;
  RunOptions r = testing::small_run(dir / "run", "sgd", 3, 2);
  r.output = OutputMap::Logits;
  train_run(r);
  PathReader reader(r.out);
  torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 2);
  DecompositionOptions options;
  options.progress = false;
  options.kernel = true;
  options.quadrature.spec = QuadratureSpec::parse("dpk");
  Decomposition d = decompose(reader, x, options);
  ASSERT_EQ(d.kernel.sizes(), (std::vector<int64_t>{2, 60, 3, 3}));

  Network ref = build_network(reader.manifest().network_options());
  const torch::Tensor& xt = reader.decoded_dataset().x_train;
  torch::Tensor expect = torch::zeros({2, 60, 3, 3}, torch::kFloat64);
  reader.forward([&](const PathStep& st) {
    for (int64_t bi = 0; bi < st.batch.size(0); ++bi) {
      const int64_t i = st.batch[bi].item<int64_t>();
      for (int64_t k2 = 0; k2 < 3; ++k2) {
        torch::Tensor ji = flat_grad(ref, st.w, xt.narrow(0, i, 1), [&](const torch::Tensor& f) { return f[0][k2]; });
        for (int64_t n = 0; n < 2; ++n) {
          for (int64_t k = 0; k < 3; ++k) {
            torch::Tensor j = flat_grad(ref, st.w, x.narrow(0, n, 1), [&](const torch::Tensor& f) { return f[0][k]; });
            expect[n][i][k][k2] += j.dot(ji).item<double>();
          }
        }
      }
    }
  });
  EXPECT_GT(expect.abs().max().item<double>(), 1e-3);
  EXPECT_LT((d.kernel - expect).abs().max().item<double>(), 1e-12 * expect.abs().max().item<double>());
}

// Thm. 3.7 on full-batch GD with log-softmax: every contribution is one
// kernel machine term, C_i(x) = (η/M) K(x, x_i) e_{y_i}, to machine precision.
TEST(Decomposition, KernelGivesTheSingleKernelMachine) {
  testing::TempDir dir;
  RunOptions r = testing::small_run(dir / "run", "gd", 6, 3);
  train_run(r);
  PathReader reader(r.out);
  torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 4);
  DecompositionOptions options;
  options.progress = false;
  options.kernel = true;
  Decomposition d = decompose(reader, x, options);
  const torch::Tensor& y = reader.decoded_dataset().y_train;  // [60]
  torch::Tensor picked = d.kernel.gather(3, y.view({1, -1, 1, 1}).expand({4, 60, 3, 1})).squeeze(3);  // [4, 60, 3]
  torch::Tensor single = picked * (r.train.optimizer.lr / 60.0);
  const double scale = d.contributions.abs().max().item<double>();
  EXPECT_GT(scale, 1e-6);
  EXPECT_LT((single - d.contributions).abs().max().item<double>(), 1e-12 * scale);
  // The other columns of the kernel are not the contributions: the check can fail.
  torch::Tensor other = d.kernel.gather(3, ((y + 1) % 3).view({1, -1, 1, 1}).expand({4, 60, 3, 1})).squeeze(3);
  EXPECT_GT((other * (r.train.optimizer.lr / 60.0) - d.contributions).abs().max().item<double>(), 1e-6 * scale);
}

}  // namespace
}  // namespace pathkernel
