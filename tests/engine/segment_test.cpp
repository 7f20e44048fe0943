// The hand-written backward walk of pathkernel's own networks against
// autograd through the same pass, for every layer kind they have.
#include <gtest/gtest.h>

#include "pathkernel/segment.h"
#include "../test_util.h"

namespace pathkernel {
namespace {

using Case = testing::NetworkCase;

// ReLU, Tanh and GELU MLPs (one on an image, so a Flatten comes first), and
// CNNs with max-pool and padding, under both output maps.
const std::vector<Case> kCases = {
    {"mlp:7", {5}, OutputMap::LogSoftmax},
    {"mlp:6,4:tanh", {5}, OutputMap::Logits},
    {"mlp:5:gelu", {1, 3, 3}, OutputMap::LogSoftmax},
    {"cnn:2,3", {1, 8, 8}, OutputMap::LogSoftmax},
    {"cnn:3", {2, 6, 6}, OutputMap::Logits},
};

/// Case c's network (initialised from `seed`), with a random segment from its
/// weights and `rows` random inputs, drawn after torch::manual_seed(seed + 4).
struct SegmentCase {
  NetworkOptions options;
  Network net = nullptr;
  torch::Tensor w, dw, x;
};

SegmentCase segment_case(const Case& c, int64_t rows, uint64_t seed) {
  SegmentCase s;
  s.options = c.options(3, seed);
  s.net = engine_network(s.options);
  torch::manual_seed(seed + 4);
  s.w = flatten_parameters(s.net);
  s.dw = 0.4 * torch::randn_like(s.w);
  std::vector<int64_t> xs{rows};
  xs.insert(xs.end(), c.shape.begin(), c.shape.end());
  s.x = torch::randn(xs, torch::kFloat64);
  return s;
}

TEST(Segment, HandSignalsMatchAutogradThroughThePass) {
  for (const Case& c : kCases) {
    const int64_t R = 7, K = 4;
    SegmentCase s = segment_case(c, R, 4);
    SegmentEvaluator ev(s.net);
    ev.set_segment(s.w, s.dw);
    ASSERT_EQ(ev.route(), "own") << c.spec;
    const torch::Tensor& x = s.x;
    const torch::Tensor t = torch::rand({R}, torch::kFloat64);
    // Any cotangents, one set of R per k (not only the unit vectors).
    const torch::Tensor cot = torch::randn({K, R, 3}, torch::kFloat64);
    const SegmentPass tracked = ev.forward(x, t, true), untracked = ev.forward(x, t, false);
    for (bool of_logits : {false, true}) {
      const std::vector<torch::Tensor> got = ev.batched_signals(untracked, cot, of_logits);
      ASSERT_EQ(got.size(), ev.param_layers().size()) << c.spec;
      for (int64_t k = 0; k < K; ++k) {
        const std::vector<torch::Tensor> expect = ev.signals(tracked, cot[k], of_logits);
        for (size_t l = 0; l < got.size(); ++l) {
          ASSERT_EQ(got[l][k].sizes(), expect[l].sizes()) << c.spec << " layer " << l;
          const double scale = std::max(1.0, expect[l].abs().max().item<double>());
          EXPECT_LE((got[l][k] - expect[l]).abs().max().item<double>(), 1e-13 * scale)
              << c.spec << "/" << output_map_name(c.map) << (of_logits ? " of logits" : " of outputs") << ", layer "
              << l << ", k " << k;
        }
      }
    }
  }
}

// A pass's directions are its layers' output changes along the segment, so
// Σ_l <δ_l, directions_l> is the outputs' derivative in t, here against a
// central difference of the network's outputs at the formed weights. Rows
// all at t = 0 keep none.
TEST(Segment, DirectionsGiveTheOutputsDerivativeAlongTheSegment) {
  for (const Case& c : kCases) {
    const int64_t R = 6, K = 3;
    SegmentCase s = segment_case(c, R, 5);
    SegmentEvaluator ev(s.net);
    ev.set_segment(s.w, s.dw);
    const torch::Tensor& x = s.x;
    const torch::Tensor t = 0.1 + 0.8 * torch::rand({R}, torch::kFloat64);
    const SegmentPass pass = ev.forward(x, t, false);
    ASSERT_EQ(pass.directions.size(), pass.inputs.size()) << c.spec;
    const std::vector<torch::Tensor> sig =
        ev.batched_signals(pass, torch::eye(K, x.options()).unsqueeze(1).expand({K, R, K}));
    torch::Tensor dfdt = torch::zeros({R, K}, x.options());
    for (size_t l = 0; l < sig.size(); ++l) {
      ASSERT_EQ(pass.directions[l].sizes(), pass.preacts[l].sizes()) << c.spec << " layer " << l;
      dfdt += (sig[l] * pass.directions[l].unsqueeze(0)).flatten(2).sum(2).t();
    }
    // The network itself at the formed weights w + t dw, row by row.
    Network ref = engine_network(s.options);
    auto at = [&](const torch::Tensor& at_t) {
      std::vector<torch::Tensor> rows;
      for (int64_t r = 0; r < R; ++r) {
        set_flat_parameters(ref, s.w + at_t[r].item<double>() * s.dw);
        rows.push_back(ref->forward(x.narrow(0, r, 1)).detach());
      }
      return torch::cat(rows);
    };
    const double h = 1e-6;
    const torch::Tensor fd = (at(t + h) - at(t - h)) / (2 * h);
    EXPECT_LE((dfdt - fd).abs().max().item<double>(), 1e-6 * std::max(1.0, fd.abs().max().item<double>())) << c.spec;
    EXPECT_TRUE(ev.forward(x, torch::zeros({R}, x.options()), false).directions.empty()) << c.spec;
  }
}

// One input's rows along the segment, passed as a view of it repeated
// (stride 0 along rows, as a group of one test point passes them), give the
// pass of its copies bit for bit: the route forms their first convolution
// once.
TEST(Segment, RowsOfOneInputRepeatedGiveThePassOfItsCopies) {
  for (const Case& c : kCases) {
    const int64_t R = 5;
    SegmentCase s = segment_case(c, 1, 6);
    SegmentEvaluator ev(s.net);
    ev.set_segment(s.w, s.dw);
    const torch::Tensor t = torch::rand({R}, torch::kFloat64);
    std::vector<int64_t> rows = s.x.sizes().vec();
    rows[0] = R;
    const torch::Tensor repeated = s.x.expand(rows);
    ASSERT_EQ(repeated.stride(0), 0);
    const SegmentPass a = ev.forward(repeated, t, false), b = ev.forward(s.x.repeat_interleave(R, 0), t, false);
    ASSERT_EQ(a.preacts.size(), b.preacts.size()) << c.spec;
    for (size_t l = 0; l < a.preacts.size(); ++l) {
      EXPECT_TRUE(torch::equal(a.preacts[l], b.preacts[l])) << c.spec << " layer " << l;
      EXPECT_TRUE(torch::equal(a.directions[l], b.directions[l])) << c.spec << " layer " << l;
    }
    EXPECT_TRUE(torch::equal(a.out, b.out)) << c.spec;
  }
}

// Rows of test points passed by point (forward_points) take their first
// layer from the points' products at W_s and dW_s, formed once a segment
// (segment_points): the pass of the rows themselves, to rounding (a product
// of the points and one of the rows may round differently), rows at t = 0
// among them and a pass of rows all at t = 0 too.
TEST(Segment, RowsOfPointsTakeTheFirstLayerFromThePointsProducts) {
  for (const Case& c : kCases) {
    for (int64_t points : {1, 3}) {
      const int64_t R = 8;
      SegmentCase s = segment_case(c, points, 7);
      SegmentEvaluator ev(s.net);
      ev.set_segment(s.w, s.dw);
      const SegmentPoints sp = ev.segment_points(s.x);
      ASSERT_TRUE(sp.start.defined() && sp.direction.defined()) << c.spec;
      const torch::Tensor point = torch::randint(points, {R}, torch::kLong);
      torch::Tensor t = torch::rand({R}, torch::kFloat64);
      t[2] = 0.0;
      for (const torch::Tensor& at : {t, torch::zeros({R}, torch::kFloat64)}) {
        const SegmentPass a = ev.forward_points(sp, point, at, false);
        const SegmentPass b = ev.forward(s.x.index_select(0, point), at, false);
        ASSERT_EQ(a.preacts.size(), b.preacts.size()) << c.spec;
        ASSERT_EQ(a.directions.size(), b.directions.size()) << c.spec;
        for (size_t l = 0; l < a.preacts.size(); ++l) {
          testing::expect_close(a.preacts[l], b.preacts[l], 1e-13, c.spec + " preact " + std::to_string(l));
          testing::expect_close(a.inputs[l], b.inputs[l], 1e-13, c.spec + " input " + std::to_string(l));
        }
        for (size_t l = 0; l < a.directions.size(); ++l) {
          testing::expect_close(a.directions[l], b.directions[l], 1e-13, c.spec + " direction " + std::to_string(l));
        }
        testing::expect_close(a.out, b.out, 1e-13, c.spec + " out");
        // The hand walk back takes the pass as it takes forward()'s.
        const torch::Tensor cot = torch::randn({2, R, 3}, torch::kFloat64);
        const std::vector<torch::Tensor> ga = ev.batched_signals(a, cot, false), gb = ev.batched_signals(b, cot, false);
        for (size_t l = 0; l < ga.size(); ++l) {
          testing::expect_close(ga[l], gb[l], 1e-13, c.spec + " signals " + std::to_string(l));
        }
      }
    }
  }
}

// A pair of cotangents on layer 1 (the held site's sums over a piece's
// nodes): its first-layer part of J dw taken forward, and its first-layer
// signals summed per group of rows (one walk through layer 1 per group,
// mended where a row's masks differ from its group's first row's), against
// one walk per row. Rows of a group share a test point at different t, so
// their masks mostly agree, or are drawn at random; one group is empty.
// Tanh and GELU layers are no selection: those take the walk itself.
TEST(Segment, PairsOfLayerOneSummedAndDottedAsOneWalkPerRow) {
  for (const Case& c : kCases) {
    const int64_t points = 3, R = 12, K = 3;
    SegmentCase s = segment_case(c, points, 6);
    SegmentEvaluator ev(s.net);
    ev.set_segment(s.w, 2.0 * s.dw);  // a long step: masks differ along it
    const torch::Tensor point = torch::tensor(std::vector<int64_t>{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2});
    const SegmentPass pass = ev.forward(s.x.index_select(0, point), torch::rand({R}, torch::kFloat64), false);
    const torch::Tensor rows = torch::tensor(std::vector<int64_t>{0, 1, 3, 4, 5, 7, 8, 9, 10, 11});
    const int64_t n = rows.size(0);
    std::vector<int64_t> shape = pass.preacts[1].sizes().vec();
    shape[0] = n;
    shape.insert(shape.begin(), K);
    const torch::Tensor g = torch::randn(shape, torch::kFloat64), g_dw = torch::randn(shape, torch::kFloat64);
    const SegmentPass picked = rows_of(pass, rows);
    const torch::Tensor walked = ev.first_signals_of_pair(picked, g, g_dw);  // [K, n, ...]
    const double scale = std::max(1.0, walked.abs().max().item<double>());
    const torch::Tensor dot = (walked * picked.directions[0].unsqueeze(0)).flatten(2).sum(2);
    const torch::Tensor selection = ev.first_selection(pass, rows);  // undefined for Tanh and GELU
    EXPECT_LE((ev.first_dot_of_pair(pass, rows, selection, g, g_dw) - dot).abs().max().item<double>(),
              1e-12 * std::max(1.0, dot.abs().max().item<double>()))
        << c.name();
    for (const torch::Tensor& group : {point.index_select(0, rows), torch::randint(0, 4, {n}, torch::kLong)}) {
      std::vector<int64_t> sizes = walked.sizes().vec();
      sizes[1] = 4;
      const torch::Tensor expect = torch::zeros(sizes, walked.options()).index_add_(1, group, walked);
      const torch::Tensor got = ev.first_signals_of_pairs_summed(pass, rows, selection, g, g_dw, group, 4);
      ASSERT_EQ(got.sizes(), expect.sizes()) << c.name();
      EXPECT_LE((got - expect).abs().max().item<double>(), 1e-12 * scale) << c.name();
    }
  }
}

// The engine's network is float64 and in one piece, whatever the run's
// Linear pieces (which only the replay's network, reproducing the training's
// bits, keeps).
TEST(Segment, EngineNetworkIsFloat64InOnePiece) {
  NetworkOptions options = Case{"mlp:7", {5}, OutputMap::LogSoftmax}.options(3, 1);
  options.dtype = torch::kFloat32;
  options.linear_pieces = 2;
  const Network net = engine_network(options);
  EXPECT_EQ(net->options().dtype, torch::kFloat64);
  EXPECT_EQ(net->options().linear_pieces, 1);
  EXPECT_EQ(build_network(options)->options().linear_pieces, 2);
}

}  // namespace
}  // namespace pathkernel
