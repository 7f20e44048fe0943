// Kinks along a segment: every ReLU flip and max-pool switch that a scan
// brackets is located to a few ulp, checked against direct evaluation and a
// fine brute-force grid.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "pathkernel/kinks.h"

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

  KinkSearch search(bool skip_first_relu) const {
    return find_kinks(*ev, x, sc.pass.preacts, sc.point, sc.t, sc.brackets, skip_first_relu);
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

TEST(FindKinks, LocatesDeepReluFlipsToAFewUlp) {
  // Two hidden layers: the second pre-activation is not affine in t, so its
  // kinks need root finding.
  Scanned s("mlp:12,10", {4}, 5, 2);
  const SegmentEvaluator& ev = *s.ev;
  const Scan& sc = s.sc;
  KinkSearch ks = s.search(/*skip_first_relu=*/false);
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
  Scanned s("mlp:12,10", {4}, 3, 2);
  KinkSearch ks = s.search(/*skip_first_relu=*/true);
  ASSERT_FALSE(ks.kinks.empty());
  for (const Kink& k : ks.kinks) EXPECT_EQ(k.layer, 1);
}

TEST(FindKinks, LocatesMaxPoolSwitches) {
  Scanned s("cnn:3", {1, 6, 6}, 4, 4);
  expect_located(*s.ev, s.x, s.sc, s.search(/*skip_first_relu=*/true), true);
}

}  // namespace
}  // namespace pathkernel
