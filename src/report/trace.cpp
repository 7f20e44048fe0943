// The report's per-step view of a decomposition: one decompose() pass that
// keeps each step's terms, certificate gap, evaluations and DPK angle.
#include <algorithm>

#include "pathkernel/error.h"
#include "pathkernel/report.h"

namespace pathkernel {

StepTrace trace_steps(PathReader& reader, const torch::Tensor& x, const torch::Tensor& tracked,
                      const DecompositionOptions& options) {
  const Manifest& m = reader.manifest();
  const int64_t n = x.size(0), N = m.steps, K = m.num_classes, M = reader.train_count();
  const torch::Tensor t_idx = tracked.to(torch::kInt64).reshape({-1});
  const int64_t T = t_idx.size(0);
  if (T > 0) {
    PK_CHECK(t_idx.min().item<int64_t>() >= 0 && t_idx.max().item<int64_t>() < M,
             "tracked training indices must be in [0, " << M << ") (got " << t_idx.min().item<int64_t>() << " .. "
                                                       << t_idx.max().item<int64_t>() << ")");
  }
  // slot[i]: the position of training point i among the tracked ones, or −1.
  torch::Tensor slot = torch::full({M}, -1, torch::kInt64);
  if (T > 0) slot.index_put_({t_idx}, torch::arange(T));
  StepTrace t;
  t.tracked = t_idx;
  t.per_step = torch::zeros({n, N, T, K}, torch::kFloat64);
  t.step_sum = torch::zeros({n, N, K}, torch::kFloat64);
  t.step_abs = torch::zeros({n, N, K}, torch::kFloat64);
  t.certificate_gap = torch::zeros({N}, torch::kFloat64);
  t.evaluations = torch::zeros({N}, torch::kFloat64);
  t.dpk_angle = torch::zeros({n, N}, torch::kFloat64);
  QuadratureOptions dpk = options.quadrature;
  dpk.spec = QuadratureSpec::parse("dpk");
  DecompositionOptions o = options;
  o.on_step = [&](const StepObservation& ob) {
    const int64_t s = ob.step, nc = ob.contributions.size(0);
    const torch::Tensor c = ob.contributions;  // [nc, b, K]
    t.step_sum.narrow(0, ob.first_point, nc).select(1, s).add_(c.sum(1));
    t.step_abs.narrow(0, ob.first_point, nc).select(1, s).add_(c.abs().sum(1));
    if (T > 0) {
      const torch::Tensor where = slot.index_select(0, ob.train_index);  // [b]
      const torch::Tensor hit = (where >= 0).nonzero().reshape({-1});
      if (hit.size(0) > 0) {
        // A training point may occur in a batch more than once: add, never assign.
        t.per_step.narrow(0, ob.first_point, nc).select(1, s).index_add_(1, where.index_select(0, hit),
                                                                         c.index_select(1, hit));
      }
    }
    t.certificate_gap[s].clamp_min_(ob.features->certificate_gap);
    t.evaluations[s].add_(static_cast<double>(ob.features->evaluations) / static_cast<double>(n));
    const TestFeatures d = test_features(*ob.evaluator, *ob.x, dpk);
    t.dpk_angle.narrow(0, ob.first_point, nc).select(1, s).copy_(feature_angle(*ob.evaluator, *ob.features, d));
  };
  t.decomposition = decompose(reader, x, o);
  return t;
}

}  // namespace pathkernel
