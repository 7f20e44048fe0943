// The result of decompose() (decomposition_result.h).
#include "pathkernel/decomposition_result.h"

#include <limits>

namespace pathkernel {

torch::Tensor Decomposition::prediction() const {
  const torch::Tensor p = f0 + contributions.sum(1) + regularization + rounding;
  return statistics.defined() ? p + statistics : p;
}

torch::Tensor Decomposition::completeness_gap() const {
  const torch::Tensor gap = fN - f0 - contributions.sum(1) - regularization;
  return statistics.defined() ? gap - statistics : gap;
}

void StepResiduals::add(int64_t s, double r, double b) {
  const double ratio = r <= b ? (b > 0 ? r / b : 0.0) : (b > 0 ? r / b : std::numeric_limits<double>::infinity());
  if (ratio > max_ratio || worst_step < 0) {
    max_ratio = ratio;
    max_residual = r;
    bound = b;
    worst_step = s;
  }
  if (r > b) {
    ++steps_over;
    if (first_step < 0 || s < first_step) first_step = s;
    list_over(s);
  }
}

void StepResiduals::list_over(int64_t s) {
  if (static_cast<int64_t>(over_steps.size()) < kListedSteps) over_steps.push_back(s);
}

void StepResiduals::merge(const StepResiduals& o) {
  if (o.worst_step >= 0 && (o.max_ratio > max_ratio || worst_step < 0)) {
    max_ratio = o.max_ratio;
    max_residual = o.max_residual;
    bound = o.bound;
    worst_step = o.worst_step;
  }
  // The steps over of both are rounding branches only if each one's are.
  const bool branches = (steps_over == 0 || rounding_branches) && (o.steps_over == 0 || o.rounding_branches);
  steps_over += o.steps_over;
  rounding_branches = steps_over > 0 && branches;
  for (int64_t s : o.over_steps) list_over(s);
  if (o.first_step >= 0 && (first_step < 0 || o.first_step < first_step)) first_step = o.first_step;
}

}  // namespace pathkernel
