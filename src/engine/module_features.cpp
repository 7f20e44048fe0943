// Test features on the generic route (a TorchScript module differentiated
// by autograd alone) as an integrand of the certified integrator: the
// Jacobian rows come from autograd, row by row, and are summed into one
// dense block J̄ [K, n, P]; gauss splits [0,1] at the crossings of the
// module's kink sites, then refines each piece until its certificate holds:
// at kinks found by a finer search of the piece, else at its midpoint.
#include <algorithm>

#include "autograd_route.h"
#include "feature_parts.h"
#include "pathkernel/error.h"
#include "pathkernel/integrator.h"
#include "pathkernel/kinks.h"

namespace pathkernel {

namespace {

/// The kinks of a Module for one test point x [1, ...] inside [a, b]: the
/// points where one of its ReLU inputs (kink sites) crosses 0 and, at a
/// site fused with a max-pool, where a window's argmax switches, counting
/// only what the pool sees (pooled_switches). Changes between `intervals`
/// + 1 evenly spaced samples are located by the same rounds as find_kinks'
/// (SignBracket: Illinois false position, a bisection every fourth round,
/// down to 4 ulp of t) on the unit, or on the difference of the two units
/// a window switches between; each evaluation is one forward pass. An even
/// number of changes of one unit or window inside one interval is not seen,
/// and the certificate does not see it either when no node falls between
/// the two (docs/math.md, the generic route's kinks). Sorted, in (a, b).
std::vector<double> module_kinks(const AutogradRoute& ev, const torch::Tensor& x, double a, double b,
                                 int intervals, int64_t& forward_evaluations) {
  const std::vector<int64_t>& windows = ev.site_windows();
  std::vector<double> ts(intervals + 1);
  std::vector<std::vector<torch::Tensor>> values(intervals + 1);
  for (int j = 0; j <= intervals; ++j) {
    ts[j] = j == intervals ? b : a + (b - a) * j / intervals;
    values[j] = ev.sites_at(x, ts[j]);
  }
  forward_evaluations += intervals + 1;
  std::vector<double> kinks;
  // Locates, inside interval j, the sign change of y_plus − y_minus (y_plus
  // alone when minus < 0) at site i.
  auto locate = [&](int64_t j, size_t i, int64_t plus, int64_t minus) {
    auto g = [&](const std::vector<torch::Tensor>& sites) {
      const torch::Tensor y = sites[i].reshape({-1});
      return y[plus].item<double>() - (minus >= 0 ? y[minus].item<double>() : 0.0);
    };
    SignBracket br;
    br.lo = ts[j];
    br.hi = ts[j + 1];
    br.glo = g(values[j]);
    br.ghi = g(values[j + 1]);
    forward_evaluations += br.locate([&](double m) { return g(ev.sites_at(x, m)); }, 400);
    kinks.push_back(br.midpoint());
  };
  // Per site, its samples as rows; interval j lies between rows j and j + 1.
  const torch::Tensor at_a = torch::arange(intervals), at_b = at_a + 1;
  for (size_t i = 0; i < windows.size(); ++i) {
    std::vector<torch::Tensor> samples;
    for (const auto& v : values) samples.push_back(v[i]);
    const torch::Tensor y = torch::cat(samples);  // [intervals + 1, ...]
    torch::Tensor flips;                          // [intervals, units]
    if (windows[i] > 0) {
      const PooledSwitches sw = pooled_switches(y, at_a, at_b, windows[i], ev.site_leaky()[i]);
      const torch::Tensor hits = sw.switches.nonzero();  // [F, 2]: interval, window
      auto h = hits.accessor<int64_t, 2>();
      auto to = sw.to.accessor<int64_t, 2>(), from = sw.from.accessor<int64_t, 2>();
      for (int64_t n = 0; n < hits.size(0); ++n) locate(h[n][0], i, to[h[n][0]][h[n][1]], from[h[n][0]][h[n][1]]);
      flips = sw.flips;
    } else {
      flips = (y.index_select(0, at_a) > 0) != (y.index_select(0, at_b) > 0);
    }
    const torch::Tensor units = flips.nonzero();  // [F, 2]: interval, unit
    auto u = units.accessor<int64_t, 2>();
    for (int64_t n = 0; n < units.size(0); ++n) locate(u[n][0], i, u[n][1], -1);
  }
  std::sort(kinks.begin(), kinks.end());
  return kinks;
}

/// The integrand: test features of points x [n, ...] on the segment set in ev.
class ModuleFeatures final : public Integrand {
 public:
  ModuleFeatures(const SegmentEvaluator& ev, const AutogradRoute& route, const torch::Tensor& x,
                 const QuadratureOptions& q, TestFeatures& f);

  int64_t points() const override { return n_; }
  void integrate_fixed(const QuadratureRule& rule) override;
  std::vector<double> scales() override;
  std::vector<std::vector<double>> initial_kinks() override;
  int64_t max_rows() const override { return max_rows_; }
  std::vector<double> certificate_gaps(const PieceRound& rd) override;
  std::vector<std::vector<double>> kinks_in(const PieceRound& rd, const std::vector<int64_t>& failed) override;
  void accept(const PieceRound& rd, const std::vector<int64_t>& accepted) override;

  /// Joins the kept rows and measures the certificate.
  void assemble();

 private:
  void keep(const torch::Tensor& jac, const torch::Tensor& rows, const torch::Tensor& point,
            const torch::Tensor& weight);

  const SegmentEvaluator& ev_;
  const AutogradRoute& route_;
  const torch::Tensor& x_;
  const QuadratureOptions& q_;
  TestFeatures& f_;
  const int64_t n_, K_, P_;
  const torch::TensorOptions opts_;
  int64_t max_rows_ = 0;
  bool sites_ = false;  ///< whether the module has kink sites
  std::vector<torch::Tensor> kept_point_, kept_weight_;
  torch::Tensor jac_, point_t_, w_t_;  ///< the current round's Jacobians [R, K, P], points and weights
};

ModuleFeatures::ModuleFeatures(const SegmentEvaluator& ev, const AutogradRoute& route, const torch::Tensor& x,
                               const QuadratureOptions& q, TestFeatures& f)
    : ev_(ev), route_(route), x_(x), q_(q), f_(f), n_(x.size(0)), K_(ev.num_outputs()), P_(ev.parameter_count()),
      opts_(x.options()) {
  f.num_points = n_;
  f.f0 = ev.forward(x, torch::zeros({n_}, opts_), false).out;
  f.f1 = ev.forward(x, torch::ones({n_}, opts_), false).out;
  f.layers.resize(1);  // the module's whole parameter vector, one Dense block
  f.layers[0].block = torch::zeros({K_, n_, P_}, opts_);
  // Jacobian rows per round: at most max_rows, and at most 2^24 doubles.
  max_rows_ = std::clamp<int64_t>((int64_t(1) << 24) / std::max<int64_t>(1, K_ * P_), 1, q.max_rows);
  sites_ = route.has_sites();
}

/// Adds rows' weighted Jacobians J [r, K, P] to their test points' blocks.
void ModuleFeatures::keep(const torch::Tensor& jac, const torch::Tensor& rows, const torch::Tensor& point,
                          const torch::Tensor& weight) {
  torch::Tensor pr = point.index_select(0, rows), wr = weight.index_select(0, rows);
  f_.layers[0].block.index_add_(1, pr, (jac.index_select(0, rows) * wr.view({-1, 1, 1})).transpose(0, 1));
  kept_point_.push_back(pr);
  kept_weight_.push_back(wr);
}

void ModuleFeatures::integrate_fixed(const QuadratureRule& rule) {
  const int64_t nodes = static_cast<int64_t>(rule.nodes.size());
  const torch::Tensor t_all = torch::tensor(rule.nodes, opts_), w_all = torch::tensor(rule.weights, opts_);
  for (int64_t i = 0; i < n_; ++i) {
    for (int64_t j0 = 0; j0 < nodes; j0 += max_rows_) {
      const int64_t nj = std::min(max_rows_, nodes - j0);
      torch::Tensor point = torch::full({nj}, i, torch::kLong);
      torch::Tensor jac = route_.row_jacobians(x_.index_select(0, point), t_all.narrow(0, j0, nj));
      keep(jac, torch::arange(nj), point, w_all.narrow(0, j0, nj));
      f_.evaluations += nj;
    }
  }
}

std::vector<double> ModuleFeatures::scales() {
  const torch::Tensor scale = f_.f0.abs().amax(1).clamp_min(1.0);  // [n]
  return std::vector<double>(scale.data_ptr<double>(), scale.data_ptr<double>() + scale.numel());
}

std::vector<std::vector<double>> ModuleFeatures::initial_kinks() {
  // [0, 1] split at the kinks of the module's ReLUs.
  std::vector<std::vector<double>> cuts(n_);
  for (int64_t i = 0; i < n_ && sites_; ++i) {
    cuts[i] = module_kinks(route_, x_.narrow(0, i, 1), 0.0, 1.0, q_.scan_intervals, f_.forward_evaluations);
    f_.kinks += static_cast<int64_t>(cuts[i].size());
  }
  return cuts;
}

std::vector<double> ModuleFeatures::certificate_gaps(const PieceRound& rd) {
  jac_ = torch::Tensor();  // the last round's, freed first
  point_t_ = torch::tensor(rd.point, torch::kLong);
  w_t_ = torch::tensor(rd.w, opts_);
  jac_ = route_.row_jacobians(x_.index_select(0, point_t_), torch::tensor(rd.t, opts_));
  f_.evaluations += rd.rows;
  // Per-piece certificate: Σ_nodes ω J dw against f(b) − f(a).
  const torch::Tensor jdw = torch::matmul(jac_, ev_.direction());  // [R, K]
  const torch::Tensor integral = torch::zeros({rd.np, K_}, opts_).index_add_(
      0, torch::tensor(rd.piece_of, torch::kLong), jdw * w_t_.unsqueeze(1));  // [np, K]
  const torch::Tensor fe = ev_.forward(x_.index_select(0, torch::tensor(rd.end_point, torch::kLong)),
                                       torch::tensor(rd.ends, opts_), false)
                               .out.view({rd.np, 2, K_});
  f_.forward_evaluations += 2 * rd.np;
  const torch::Tensor gap = (integral - (fe.select(1, 1) - fe.select(1, 0))).abs().amax(1).contiguous();  // [np]
  return std::vector<double>(gap.data_ptr<double>(), gap.data_ptr<double>() + gap.numel());
}

std::vector<std::vector<double>> ModuleFeatures::kinks_in(const PieceRound& rd, const std::vector<int64_t>& failed) {
  // Kinks the first scan missed (two crossings of one unit between
  // samples): search the piece more finely.
  std::vector<std::vector<double>> cuts(failed.size());
  for (size_t i = 0; i < failed.size() && sites_; ++i) {
    const int64_t p = failed[i];
    cuts[i] = module_kinks(route_, x_.narrow(0, rd.end_point[2 * p], 1), rd.ends[2 * p], rd.ends[2 * p + 1], 4,
                           f_.forward_evaluations);
    f_.kinks += static_cast<int64_t>(cuts[i].size());
  }
  return cuts;
}

void ModuleFeatures::accept(const PieceRound& rd, const std::vector<int64_t>& accepted) {
  std::vector<int64_t> rows;
  for (int64_t p : accepted) {
    for (int64_t r = rd.first[p]; r < rd.first[p + 1]; ++r) rows.push_back(r);
  }
  if (!rows.empty()) keep(jac_, torch::tensor(rows, torch::kLong), point_t_, w_t_);
}

void ModuleFeatures::assemble() {
  f_.point = torch::cat(kept_point_);
  f_.weight = torch::cat(kept_weight_);
  measure_certificate(ev_, f_, ev_.direction());
}

}  // namespace

TestFeatures module_test_features(const SegmentEvaluator& ev, const AutogradRoute& route, const torch::Tensor& x,
                                  const QuadratureOptions& q) {
  TestFeatures f;
  ModuleFeatures integrand(ev, route, x, q, f);
  f.breaks = integrate(integrand, q);
  integrand.assemble();
  return f;
}

}  // namespace pathkernel
