// Kinks along a segment: every ReLU flip and max-pool switch that a scan
// brackets is located to a few ulp, checked against direct evaluation and a
// fine brute-force grid.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "pathkernel/error.h"
#include "pathkernel/kinks.h"
#include "pathkernel/model.h"
#include "pathkernel/quadrature.h"
#include "pathkernel/segment.h"

namespace pathkernel {
namespace {

constexpr double kEps = 2.220446049250313e-16;

/// Pre-activation of a kink's unit (or pool pair) at t for test point i;
/// with `scale`, also the largest pre-activation of that layer.
double kink_value(const SegmentEvaluator& ev, const torch::Tensor& x, int64_t i, double t, const Kink& k,
                  double* scale = nullptr) {
  SegmentPass p = ev.forward(x.narrow(0, i, 1), torch::tensor({t}, torch::kFloat64), false);
  torch::Tensor y = p.preacts[k.layer].flatten(1)[0];
  if (scale) *scale = y.abs().max().item<double>();
  return y[k.plus].item<double>() - (k.minus >= 0 ? y[k.minus].item<double>() : 0.0);
}

struct Scan {
  std::vector<int64_t> point;
  std::vector<double> t;
  std::vector<KinkBracket> brackets;
  SegmentPass pass;
};

Scan scan(const SegmentEvaluator& ev, const torch::Tensor& x, int64_t intervals) {
  Scan s;
  for (int64_t i = 0; i < x.size(0); ++i) {
    for (int64_t j = 0; j <= intervals; ++j) {
      s.point.push_back(i);
      s.t.push_back(static_cast<double>(j) / static_cast<double>(intervals));
      if (j < intervals) {
        const int64_t r = static_cast<int64_t>(s.t.size()) - 1;
        s.brackets.push_back({r, r + 1});
      }
    }
  }
  s.pass = ev.forward(x.index_select(0, torch::tensor(s.point, torch::kLong)), torch::tensor(s.t, torch::kFloat64),
                      false);
  return s;
}

/// A 3-class network of `spec`, inputs x [points, *shape], the segment
/// w_0 + t·0.8·randn (seeded by `direction_seed`), and its 16-interval scan.
struct Scanned {
  Network net = nullptr;
  torch::Tensor x;
  std::unique_ptr<SegmentEvaluator> ev;
  Scan sc;

  Scanned(const std::string& spec, std::vector<int64_t> shape, int64_t points, uint64_t direction_seed) {
    NetworkOptions o;
    o.spec = ModelSpec::parse(spec);
    o.input_shape = shape;
    o.num_classes = 3;
    o.seed = 3;
    net = build_network(o);
    torch::manual_seed(17);
    shape.insert(shape.begin(), points);
    x = torch::randn(shape, torch::kFloat64);
    torch::Tensor w = flatten_parameters(net);
    torch::manual_seed(direction_seed);
    ev = std::make_unique<SegmentEvaluator>(net);
    ev->set_segment(w, 0.8 * torch::randn_like(w));
    sc = scan(*ev, x, 16);
  }

  KinkSearch search(bool skip_first_layer, bool fit = true) const {
    return find_kinks(*ev, x, sc.pass.preacts, sc.point, sc.t, sc.brackets, skip_first_layer, fit);
  }
};

// Each located kink is a sign change of its unit within a few ulp of t, or
// a point where the unit is zero to rounding (where it is that flat, the
// rounding of the pre-activation hides the sign).
void expect_located(const SegmentEvaluator& ev, const torch::Tensor& x, const Scan& s, const KinkSearch& ks,
                    bool want_pool) {
  ASSERT_FALSE(ks.kinks.empty());
  bool saw_pool = false;
  for (const Kink& k : ks.kinks) {
    const int64_t i = s.point[s.brackets[k.bracket].row_a];
    ASSERT_GT(k.t, s.t[s.brackets[k.bracket].row_a]);
    ASSERT_LT(k.t, s.t[s.brackets[k.bracket].row_b]);
    const double d = 4 * kEps * std::max(k.t, 1e-300);
    double scale = 0;
    const double lo = kink_value(ev, x, i, k.t - d, k, &scale), hi = kink_value(ev, x, i, k.t + d, k);
    EXPECT_TRUE(lo == 0 || hi == 0 || (lo > 0) != (hi > 0) || std::max(std::abs(lo), std::abs(hi)) <= 16 * kEps * scale)
        << "layer " << k.layer << " unit " << k.plus << "/" << k.minus << " at t = " << k.t << ": " << lo << ", " << hi;
    saw_pool |= k.minus >= 0;
  }
  EXPECT_EQ(saw_pool, want_pool);
}

/// The bracket step both kink finders share closes on the root of functions
/// that stall plain false position (a near-step, a flat cubic): the root
/// stays inside, every four rounds at least halve the bracket, and it ends
/// within 4 ulp of t.
TEST(SignBracket, ClosesOnTheRootHalvingAtLeastEveryFourRounds) {
  const double root = 0.3141592653589793;
  const std::vector<std::function<double(double)>> functions = {
      [&](double t) { return t - root; },
      [&](double t) { return std::tanh(1e6 * (t - root)); },
      [&](double t) { return std::pow(t - root, 3) + 1e-9 * (t - root); },
      [&](double t) { return std::exp(40 * (t - root)) - 1; },
  };
  for (size_t i = 0; i < functions.size(); ++i) {
    const auto& f = functions[i];
    SignBracket br;
    br.lo = 0;
    br.hi = 1;
    br.glo = f(0);
    br.ghi = f(1);
    // The function records the bracket each round's point is drawn from.
    std::vector<double> widths;
    const int rounds = br.locate(
        [&](double s) {
          EXPECT_TRUE(s > br.lo && s < br.hi) << "function " << i << ", round " << widths.size();
          EXPECT_LE(br.lo, root * (1 + 1e-15)) << "function " << i;
          EXPECT_GE(br.hi, root * (1 - 1e-15)) << "function " << i;
          widths.push_back(br.hi - br.lo);
          return f(s);
        },
        400);
    widths.push_back(br.hi - br.lo);
    EXPECT_EQ(rounds + 1, static_cast<int>(widths.size())) << "function " << i;
    EXPECT_LT(rounds, 400) << "function " << i << " did not close";
    EXPECT_TRUE(br.closed() || br.lo == br.hi) << "function " << i;
    EXPECT_LE(br.lo, root * (1 + 1e-15)) << "function " << i;
    EXPECT_GE(br.hi, root * (1 - 1e-15)) << "function " << i;
    for (size_t r = 4; r < widths.size(); ++r) {
      EXPECT_LE(widths[r], 0.5 * widths[r - 4]) << "function " << i << ", round " << r;
    }
    EXPECT_NEAR(br.midpoint(), root, 1e-15) << "function " << i;
  }
}

TEST(FindKinks, LocatesDeepReluFlipsToAFewUlp) {
  // Two hidden layers: the second pre-activation is not affine in t, so its
  // kinks need root finding.
  Scanned s("mlp:12,10", {4}, 5, 2);
  const SegmentEvaluator& ev = *s.ev;
  const Scan& sc = s.sc;
  KinkSearch ks = s.search(/*skip_first_layer=*/false);
  expect_located(ev, s.x, sc, ks, false);
  EXPECT_GT(ks.forward_evaluations, 0);

  // Against a brute-force grid 64 times finer: every unit that changes sign
  // between grid points has a located kink within one grid cell, unless it
  // flips an even number of times inside one scan bracket (invisible at the
  // bracket's ends).
  const int64_t fine = 16 * 64;
  Scan grid = scan(ev, s.x, fine);
  int64_t matched = 0;
  for (size_t l = 0; l < 2; ++l) {
    torch::Tensor y = grid.pass.preacts[l].view({s.x.size(0), fine + 1, -1});
    for (int64_t i = 0; i < s.x.size(0); ++i) {
      for (int64_t u = 0; u < y.size(2); ++u) {
        torch::Tensor sign = y[i].select(1, u) > 0;
        for (int64_t c = 0; c < 16; ++c) {
          torch::Tensor part = sign.narrow(0, c * 64, 65);
          const int64_t flips = (part.narrow(0, 1, 64) != part.narrow(0, 0, 64)).sum().item<int64_t>();
          if (flips % 2 == 0) continue;
          for (int64_t j = 0; j < 64; ++j) {
            if (part[j].item<bool>() == part[j + 1].item<bool>()) continue;
            const double a = static_cast<double>(c * 64 + j) / fine, b = static_cast<double>(c * 64 + j + 1) / fine;
            bool found = false;
            for (const Kink& k : ks.kinks) {
              found |= sc.point[sc.brackets[k.bracket].row_a] == i && k.layer == static_cast<int64_t>(l) &&
                       k.plus == u && k.t >= a && k.t <= b;
            }
            EXPECT_TRUE(found) << "test point " << i << " layer " << l << " unit " << u << " flips in [" << a << ", "
                               << b << "]";
            matched += found;
          }
        }
      }
    }
  }
  EXPECT_GT(matched, 5);
}

TEST(FindKinks, SkipsTheClosedFormFirstLayer) {
  for (const char* spec : {"mlp:12,10", "cnn:3,4"}) {
    Scanned s(spec, spec[0] == 'm' ? std::vector<int64_t>{4} : std::vector<int64_t>{1, 8, 8}, 3, 2);
    KinkSearch ks = s.search(/*skip_first_layer=*/true);
    ASSERT_FALSE(ks.kinks.empty()) << spec;
    for (const Kink& k : ks.kinks) EXPECT_EQ(k.layer, 1) << spec;
  }
}

TEST(FindKinks, FittedPolynomialsLocateTheSameKinksAsFalsePositionInFewerRows) {
  // On a piece the second layer's pre-activation is a quadratic in t: a scan
  // row beyond the bracket on the same piece, or else one false-position
  // step, gives the third sample, the fitted quadratic's root
  // is the kink, and a pair of rows either side of it closes the bracket.
  // The reference is Illinois false position alone, on the same brackets.
  for (const char* spec : {"mlp:12,10", "cnn:3,4"}) {
    Scanned s(spec, spec[0] == 'm' ? std::vector<int64_t>{4} : std::vector<int64_t>{1, 8, 8}, 6, 2);
    for (const bool skip_first : {true, false}) {
      const KinkSearch fit = s.search(skip_first, true), ref = s.search(skip_first, false);
      expect_located(*s.ev, s.x, s.sc, fit, spec[0] == 'c');
      expect_located(*s.ev, s.x, s.sc, ref, spec[0] == 'c');
      // The same kinks (one per unit and bracket), to within the rounding
      // noise of the unit's sign near its root.
      ASSERT_EQ(fit.kinks.size(), ref.kinks.size()) << spec;
      for (size_t i = 0; i < fit.kinks.size(); ++i) {
        const Kink &a = fit.kinks[i], &b = ref.kinks[i];
        EXPECT_EQ(a.bracket, b.bracket) << spec;
        EXPECT_EQ(a.layer, b.layer) << spec;
        EXPECT_NEAR(a.t, b.t, 1e-12) << spec << " kink " << i << " layer " << a.layer << " unit " << a.plus;
      }
      EXPECT_LE(static_cast<double>(fit.forward_evaluations), 0.6 * static_cast<double>(ref.forward_evaluations))
          << spec << (skip_first ? ", first layer skipped" : "") << ": " << fit.forward_evaluations << " rows against "
          << ref.forward_evaluations << " for " << fit.kinks.size() << " kinks";
    }
  }
}

TEST(FindKinks, StartsItsFitsFromTheRowsBeyondABracketOnTheSamePiece) {
  // A scan's rows beyond a bracket's ends, on the same piece, are samples of
  // the unit's polynomial too: with them the fit is there before the first
  // round, and only the pair around the root is evaluated. The reference is
  // the same brackets, each searched alone (a test point of its own, so it
  // has no rows beyond its ends).
  for (const char* spec : {"mlp:12,10", "cnn:3,4"}) {
    Scanned s(spec, spec[0] == 'm' ? std::vector<int64_t>{4} : std::vector<int64_t>{1, 8, 8}, 6, 2);
    const KinkSearch together = s.search(/*skip_first_layer=*/true);
    std::vector<int64_t> source_row, source_point, point;
    std::vector<double> t;
    std::vector<KinkBracket> alone_brackets;
    for (size_t b = 0; b < s.sc.brackets.size(); ++b) {
      for (const int64_t r : {s.sc.brackets[b].row_a, s.sc.brackets[b].row_b}) {
        source_row.push_back(r);
        point.push_back(static_cast<int64_t>(b));
        t.push_back(s.sc.t[r]);
      }
      source_point.push_back(s.sc.point[s.sc.brackets[b].row_a]);
      alone_brackets.push_back({static_cast<int64_t>(2 * b), static_cast<int64_t>(2 * b + 1)});
    }
    const torch::Tensor rows = torch::tensor(source_row, torch::kLong);
    std::vector<torch::Tensor> pre;
    for (const torch::Tensor& y : s.sc.pass.preacts) pre.push_back(y.index_select(0, rows));
    const torch::Tensor x_alone = s.x.index_select(0, torch::tensor(source_point, torch::kLong));
    const KinkSearch alone = find_kinks(*s.ev, x_alone, pre, point, t, alone_brackets, true, true);
    ASSERT_EQ(together.kinks.size(), alone.kinks.size()) << spec;
    for (size_t i = 0; i < together.kinks.size(); ++i) {
      EXPECT_EQ(together.kinks[i].bracket, alone.kinks[i].bracket) << spec;
      EXPECT_NEAR(together.kinks[i].t, alone.kinks[i].t, 1e-12) << spec << " kink " << i;
    }
    // The CNN's segment crosses many first-layer kinks, so fewer of its
    // brackets have a neighbouring row on their own piece.
    const double at_most = spec[0] == 'm' ? 0.85 : 0.99;
    EXPECT_LE(static_cast<double>(together.forward_evaluations),
              at_most * static_cast<double>(alone.forward_evaluations))
        << spec << ": " << together.forward_evaluations << " rows against " << alone.forward_evaluations << " for "
        << together.kinks.size() << " kinks";
  }
}

/// Per max-pool window of a ReLU + max-pool layer's pre-activation y
/// [C, H, W]: the flat index of the unit the window passes on, or −1 when its
/// output is 0. Two t with the same states have the same integrand pattern.
std::vector<int64_t> window_states(const torch::Tensor& y, int64_t k) {
  auto [m, ind] = torch::max_pool2d_with_indices(y.unsqueeze(0), k);
  torch::Tensor plane = torch::arange(y.size(0)).view({1, -1, 1, 1}) * (y.size(1) * y.size(2));
  torch::Tensor state = torch::where(m > 0, ind + plane, torch::full_like(ind, -1)).flatten().contiguous();
  return std::vector<int64_t>(state.data_ptr<int64_t>(), state.data_ptr<int64_t>() + state.numel());
}

std::vector<int64_t> states_at(const SegmentEvaluator& ev, const torch::Tensor& x, int64_t i, double t, size_t layer) {
  SegmentPass p = ev.forward(x.narrow(0, i, 1), torch::tensor({t}, torch::kFloat64), false);
  return window_states(p.preacts[layer][0], ev.pool_after()[layer]);
}

TEST(FindKinks, LocatesMaxPoolSwitches) {
  Scanned s("cnn:3", {1, 6, 6}, 4, 4);
  expect_located(*s.ev, s.x, s.sc, s.search(/*skip_first_layer=*/false), true);
}

TEST(FindKinks, LeavesOutFlipsAMaxPoolHides) {
  // cnn:3,4: the second conv layer's ReLU feeds a max-pool, so only its
  // windows' maxima matter.
  Scanned s("cnn:3,4", {1, 8, 8}, 4, 4);
  const SegmentEvaluator& ev = *s.ev;
  KinkSearch ks = s.search(/*skip_first_layer=*/true);
  expect_located(ev, s.x, s.sc, ks, true);

  // Nearly every kink is one the network sees: a window's state differs
  // just before and just after it. (One unit of a window that switches
  // twice inside a bracket can still be located where it no longer matters.)
  int64_t real = 0, relu_flips_hidden = 0;
  for (const Kink& k : ks.kinks) {
    const int64_t i = s.sc.point[s.sc.brackets[k.bracket].row_a];
    const double d = 1e-9;
    const bool seen = states_at(ev, s.x, i, k.t - d, 1) != states_at(ev, s.x, i, k.t + d, 1);
    real += seen;
  }
  EXPECT_GE(static_cast<double>(real), 0.9 * static_cast<double>(ks.kinks.size())) << real << " of " << ks.kinks.size();

  // Against the raw sign flips at the scan's bracket ends: some are hidden.
  torch::Tensor y = s.sc.pass.preacts[1].flatten(1);
  for (const KinkBracket& b : s.sc.brackets) {
    relu_flips_hidden += ((y[b.row_a] > 0) != (y[b.row_b] > 0)).sum().item<int64_t>();
  }
  int64_t relu_kinks = 0;
  for (const Kink& k : ks.kinks) relu_kinks += k.minus < 0;
  EXPECT_LT(relu_kinks, relu_flips_hidden);

  // Every window whose state differs at a bracket's ends has a kink of one
  // of its units located in that bracket.
  const int64_t pool = ev.pool_after()[1];
  const int64_t h = y.size(0) > 0 ? s.sc.pass.preacts[1].size(2) : 0, w = s.sc.pass.preacts[1].size(3);
  auto window_of = [&](int64_t unit) {
    const int64_t c = unit / (h * w), r = unit % (h * w);
    return (c * (h / pool) + (r / w) / pool) * (w / pool) + (r % w) / pool;
  };
  for (size_t b = 0; b < s.sc.brackets.size(); ++b) {
    std::vector<int64_t> sa = window_states(s.sc.pass.preacts[1][s.sc.brackets[b].row_a], pool);
    std::vector<int64_t> sb = window_states(s.sc.pass.preacts[1][s.sc.brackets[b].row_b], pool);
    for (size_t win = 0; win < sa.size(); ++win) {
      if (sa[win] == sb[win]) continue;
      bool found = false;
      for (const Kink& k : ks.kinks) found |= k.bracket == static_cast<int64_t>(b) && window_of(k.plus) == static_cast<int64_t>(win);
      EXPECT_TRUE(found) << "bracket " << b << " window " << win;
    }
  }
}

// ---------------------------------------------------------------- first_layer_kinks

TEST(FirstLayerKinks, WithoutPoolingAreTheReluCrossings) {
  Scanned s("mlp:12,10", {4}, 3, 2);
  SegmentPass p0 = s.ev->forward(s.x, torch::zeros({3}, torch::kFloat64), false);
  SegmentPass p1 = s.ev->forward(s.x, torch::ones({3}, torch::kFloat64), false);
  for (int64_t i = 0; i < 3; ++i) {
    torch::Tensor a = p0.preacts[0][i].contiguous(), b = p1.preacts[0][i].contiguous();
    std::vector<double> va(a.data_ptr<double>(), a.data_ptr<double>() + a.numel());
    std::vector<double> vb(b.data_ptr<double>(), b.data_ptr<double>() + b.numel());
    EXPECT_EQ(first_layer_kinks(*s.ev, p0.preacts[0][i], p1.preacts[0][i]), affine_crossings(va, vb));
  }
}

TEST(FirstLayerKinks, WithPoolingAreTheWindowBreaks) {
  // Against a fine grid: each window-state change between grid points has a
  // closed-form kink within that cell, and each kink changes some window's
  // state across it.
  Scanned s("cnn:3", {1, 8, 8}, 3, 4);
  const SegmentEvaluator& ev = *s.ev;
  const int64_t fine = 2048;
  SegmentPass p0 = ev.forward(s.x, torch::zeros({3}, torch::kFloat64), false);
  SegmentPass p1 = ev.forward(s.x, torch::ones({3}, torch::kFloat64), false);
  int64_t changes = 0;
  for (int64_t i = 0; i < 3; ++i) {
    std::vector<double> kinks = first_layer_kinks(ev, p0.preacts[0][i], p1.preacts[0][i]);
    ASSERT_TRUE(std::is_sorted(kinks.begin(), kinks.end()));
    for (double t : kinks) {
      ASSERT_GT(t, 0.0);
      ASSERT_LT(t, 1.0);
      EXPECT_NE(states_at(ev, s.x, i, t - 1e-9, 0), states_at(ev, s.x, i, t + 1e-9, 0)) << "point " << i << " t " << t;
    }
    std::vector<double> grid(fine + 1);
    for (int64_t j = 0; j <= fine; ++j) grid[j] = static_cast<double>(j) / fine;
    SegmentPass g = ev.forward(s.x.narrow(0, i, 1).expand({fine + 1, 1, 8, 8}), torch::tensor(grid, torch::kFloat64),
                               false);
    std::vector<int64_t> prev = window_states(g.preacts[0][0], ev.pool_after()[0]);
    for (int64_t j = 1; j <= fine; ++j) {
      std::vector<int64_t> now = window_states(g.preacts[0][j], ev.pool_after()[0]);
      if (now != prev) {
        ++changes;
        EXPECT_TRUE(std::any_of(kinks.begin(), kinks.end(), [&](double t) { return t >= grid[j - 1] && t <= grid[j]; }))
            << "point " << i << ": a window changes in [" << grid[j - 1] << ", " << grid[j] << "]";
      }
      prev = now;
    }
  }
  EXPECT_GT(changes, 5);
}

TEST(FirstLayerKinks, RejectsMismatchedShapes) {
  Scanned s("cnn:3", {1, 8, 8}, 1, 4);
  try {
    first_layer_kinks(*s.ev, torch::zeros({3, 8, 8}, torch::kFloat64), torch::zeros({3, 8, 4}, torch::kFloat64));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("differ in shape"), std::string::npos) << e.what();
  }
}

/// Sites given as values: a site 0 without a ReLU, and a site 1 (degree 2
/// on a piece) with a ReLU and, if `pool`, a max-pool of that window.
class GivenSites final : public KinkSites {
 public:
  /// `leaky`: site 1's ReLU is a leaky one (its pool passes negative maxima on).
  explicit GivenSites(int64_t pool, bool leaky = false) : pool_{0, pool}, leaky_{false, leaky} {}
  const std::vector<bool>& relu_after() const override { return relu_; }
  const std::vector<int64_t>& pool_after() const override { return pool_; }
  const std::vector<bool>& leaky_after() const override { return leaky_; }
  std::vector<torch::Tensor> sites_at(const torch::Tensor&, const torch::Tensor&) const override { return {}; }

 private:
  std::vector<bool> relu_{false, true};
  std::vector<int64_t> pool_;
  std::vector<bool> leaky_;
};

/// One site (a ReLU or leaky ReLU and a pool of window `pool`) given as
/// values, for first_layer_kinks.
class FirstSite final : public KinkSites {
 public:
  FirstSite(int64_t pool, bool leaky) : pool_{pool}, leaky_{leaky} {}
  const std::vector<bool>& relu_after() const override { return relu_; }
  const std::vector<int64_t>& pool_after() const override { return pool_; }
  const std::vector<bool>& leaky_after() const override { return leaky_; }
  std::vector<torch::Tensor> sites_at(const torch::Tensor&, const torch::Tensor&) const override { return {}; }

 private:
  std::vector<bool> relu_{true};
  std::vector<int64_t> pool_;
  std::vector<bool> leaky_;
};

/// One piece [0, 1] evaluated at its ends and two Gauss nodes, site 1 from
/// `unit` (the value of every unit at t, [rows, ...]).
std::vector<double> hidden_on_one_piece(const GivenSites& ev, const std::function<torch::Tensor(double)>& unit) {
  const std::vector<double> t{0.0, 0.5 - 0.5 / std::sqrt(3.0), 0.5 + 0.5 / std::sqrt(3.0), 1.0};
  std::vector<torch::Tensor> rows;
  for (double s : t) rows.push_back(unit(s).unsqueeze(0));
  const torch::Tensor y = torch::cat(rows);
  return hidden_switches(ev, {torch::zeros({4, 1}, torch::kFloat64), y}, {{0, 1, 2, 3}}, t);
}

TEST(HiddenSwitches, FindsAReluUnitThatFlipsAndFlipsBackBetweenRows) {
  // −(t − 0.45)² + 0.001: negative at every row, positive on (0.418, 0.482).
  const GivenSites ev(0);
  auto unit = [](double s) { return torch::tensor({-1.0, -(s - 0.45) * (s - 0.45) + 1e-3}, torch::kFloat64); };
  const std::vector<double> h = hidden_on_one_piece(ev, unit);
  ASSERT_EQ(h.size(), 1u);
  EXPECT_NEAR(h[0], 0.45, 1e-12);
  // Shifted down it never crosses: none.
  auto below = [](double s) { return torch::tensor({-1.0, -(s - 0.45) * (s - 0.45) - 1e-3}, torch::kFloat64); };
  EXPECT_TRUE(std::isnan(hidden_on_one_piece(ev, below)[0]));
}

TEST(HiddenSwitches, FindsAPoolArgmaxThatSwitchesAndSwitchesBackButNotInRowsTheWindowsLeaveOut) {
  // A 3 × 3 map under 2 × 2 windows: one window, its winner unit 0 at 1;
  // unit 1 overtakes it on (0.418, 0.482) only. Units of the last row and
  // column (left out by the window) rise far above both, and do not count.
  const GivenSites ev(2);
  auto map = [](double s, double left_out) {
    torch::Tensor y = torch::full({1, 3, 3}, -1.0, torch::kFloat64);
    y[0][0][0] = 1.0;
    y[0][0][1] = 1.0 - (s - 0.45) * (s - 0.45) + 1e-3;
    y[0][2][0] = y[0][0][2] = left_out - (s - 0.5) * (s - 0.5);
    return y;
  };
  const std::vector<double> h = hidden_on_one_piece(ev, [&](double s) { return map(s, -1.0); });
  EXPECT_NEAR(h[0], 0.45, 1e-12);
  auto only_left_out = [&](double s) {
    torch::Tensor y = map(s, 5.0);
    y[0][0][1] = -1.0;
    return y;
  };
  EXPECT_TRUE(std::isnan(hidden_on_one_piece(ev, only_left_out)[0]));
}

// ---------------------------------------------------------------- leaky ReLU sites

/// Per 2 × 2 window of y [C, H, W]: its argmax in the plane and, after a
/// leaky ReLU, its maximum's sign; after a ReLU, −1 for a window ≤ 0.
std::vector<int64_t> leaky_states(const torch::Tensor& y, bool leaky) {
  auto [m, ind] = torch::max_pool2d_with_indices(y.unsqueeze(0), 2);
  const torch::Tensor negative = leaky ? -2 - ind : torch::full_like(ind, -1);
  const torch::Tensor state = torch::where(m > 0, ind, negative).flatten().contiguous();
  return std::vector<int64_t>(state.data_ptr<int64_t>(), state.data_ptr<int64_t>() + state.numel());
}

TEST(PooledSwitches, AfterALeakyReLUCountEverySwitchAndTheMaximumsFlips) {
  // Two rows of one 2 × 2 window: every unit negative, the argmax moving
  // from unit 0 to unit 3 (a switch only for a leaky ReLU); then unit 3
  // crossing 0 while it is the maximum (a flip either way).
  const torch::Tensor y = torch::tensor({-1.0, -3.0, -3.0, -2.0, -2.0, -3.0, -3.0, -1.0, -2.0, -3.0, -3.0, 0.5},
                                        torch::kFloat64)
                              .view({3, 1, 2, 2});
  const torch::Tensor a = torch::tensor({0, 1}, torch::kLong), b = torch::tensor({1, 2}, torch::kLong);
  const PooledSwitches relu = pooled_switches(y, a, b, 2), leaky = pooled_switches(y, a, b, 2, true);
  EXPECT_FALSE(relu.switches[0][0].item<bool>());
  EXPECT_TRUE(leaky.switches[0][0].item<bool>());
  EXPECT_EQ(leaky.from[0][0].item<int64_t>(), 0);
  EXPECT_EQ(leaky.to[0][0].item<int64_t>(), 3);
  EXPECT_EQ(relu.flips[0].sum().item<int64_t>(), 0);
  EXPECT_EQ(leaky.flips[0].sum().item<int64_t>(), 0);
  for (const PooledSwitches& sw : {relu, leaky}) {
    EXPECT_TRUE(sw.flips[1][3].item<bool>());
    EXPECT_EQ(sw.flips[1].sum().item<int64_t>(), 1);
    EXPECT_FALSE(sw.switches[1][0].item<bool>());
  }
  // The patterns: a negative window's argmax is part of the leaky one's.
  const GivenSites relu_sites(2), leaky_sites(2, true);
  const torch::Tensor zeros = torch::zeros({3, 1}, torch::kFloat64);
  const torch::Tensor pr = activation_patterns(relu_sites, {zeros, y})[1];
  const torch::Tensor pl = activation_patterns(leaky_sites, {zeros, y})[1];
  EXPECT_TRUE(torch::equal(pr.flatten(), torch::tensor({-1, -1, 3}, torch::kLong)));
  EXPECT_TRUE(torch::equal(pl.flatten(), torch::tensor({-2, -5, 3}, torch::kLong)));
}

TEST(HiddenSwitches, AfterALeakyReLUFindNegativeArgmaxSwitchesAndTheWinnersZeroCrossing) {
  // One 2 × 2 window, all its units negative at every row. Unit 1
  // overtakes unit 0 on (0.418, 0.482) only: hidden for a leaky ReLU, none
  // after a ReLU (the window passes 0 on throughout).
  auto below = [](double s) {
    torch::Tensor y = torch::full({1, 2, 2}, -3.0, torch::kFloat64);
    y[0][0][0] = -1.0;
    y[0][0][1] = -1.0 - (s - 0.45) * (s - 0.45) + 1e-3;
    return y;
  };
  EXPECT_TRUE(std::isnan(hidden_on_one_piece(GivenSites(2), below)[0]));
  EXPECT_NEAR(hidden_on_one_piece(GivenSites(2, true), below)[0], 0.45, 1e-12);
  // The winner, unit 0, rising above 0 on (0.418, 0.482) only: a flip and
  // a flip back, hidden either way.
  auto crossing = [](double s) {
    torch::Tensor y = torch::full({1, 2, 2}, -3.0, torch::kFloat64);
    y[0][0][0] = -(s - 0.45) * (s - 0.45) + 1e-3;
    return y;
  };
  EXPECT_NEAR(hidden_on_one_piece(GivenSites(2), crossing)[0], 0.45, 1e-12);
  EXPECT_NEAR(hidden_on_one_piece(GivenSites(2, true), crossing)[0], 0.45, 1e-12);
}

TEST(FirstLayerKinks, AfterALeakyReLUAreEveryArgmaxSwitchAndTheMaximumsZeroCrossings) {
  // Random lines on 3 channels of 6 × 6 units, windows of 2 × 2, against a
  // fine grid of window states: each change between grid points has a
  // closed-form kink within that cell, and each kink changes a state across
  // it. Lowered, so that many windows are negative.
  torch::manual_seed(5);
  const torch::Tensor y0 = torch::randn({3, 6, 6}, torch::kFloat64) - 0.8;
  const torch::Tensor y1 = torch::randn({3, 6, 6}, torch::kFloat64) - 0.8;
  int64_t only_leaky = 0;
  for (const bool leaky : {false, true}) {
    const FirstSite ev(2, leaky);
    const std::vector<double> kinks = first_layer_kinks(ev, y0, y1);
    ASSERT_TRUE(std::is_sorted(kinks.begin(), kinks.end()));
    auto at = [&](double t) { return leaky_states(y0 + t * (y1 - y0), leaky); };
    for (double t : kinks) {
      ASSERT_GT(t, 0.0);
      ASSERT_LT(t, 1.0);
      EXPECT_NE(at(t - 1e-9), at(t + 1e-9)) << "leaky " << leaky << " t " << t;
    }
    const int64_t fine = 4096;
    std::vector<int64_t> prev = at(0.0);
    int64_t changes = 0;
    for (int64_t j = 1; j <= fine; ++j) {
      const double a = static_cast<double>(j - 1) / fine, b = static_cast<double>(j) / fine;
      const std::vector<int64_t> now = at(b);
      if (now != prev) {
        ++changes;
        EXPECT_TRUE(std::any_of(kinks.begin(), kinks.end(), [&](double t) { return t >= a && t <= b; }))
            << "leaky " << leaky << ": a window changes in [" << a << ", " << b << "]";
      }
      prev = now;
    }
    EXPECT_GT(changes, 5);
    only_leaky += leaky ? static_cast<int64_t>(kinks.size()) : -static_cast<int64_t>(kinks.size());
  }
  EXPECT_GT(only_leaky, 5);  // the negative windows' switches
}

}  // namespace
}  // namespace pathkernel
