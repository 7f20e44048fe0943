// The optimizers' updates as linear maps of per-sample gradients.
#include "pathkernel/update_rule.h"

#include <algorithm>
#include <cmath>

#include "pathkernel/error.h"
#include "pathkernel/text.h"

namespace pathkernel {

namespace {

/// The options with their defaults filled in; an unknown optimizer has no update rule.
OptimizerOptions checked(const OptimizerOptions& options) {
  const std::vector<std::string> names = optimizer_names();
  PK_CHECK(std::find(names.begin(), names.end(), options.name) != names.end(),
           "no update rule for optimizer '" << options.name << "': expected one of " << join(names));
  return options.resolved();
}

}  // namespace

UpdateRule::UpdateRule(const OptimizerOptions& options) : options_(checked(options)) {
  const OptimizerTraits& t = options_.traits();
  beta_ = t.momentum_family || t.kind == OptimizerKind::RMSprop ? options_.momentum
           : t.adam_family                                      ? options_.beta1
                                                                : 0.0;
  coupled_decay_ = t.kind == OptimizerKind::AdamW ? 0.0 : options.weight_decay;
  has_metric_ = t.adam_family || t.kind == OptimizerKind::RMSprop || t.kind == OptimizerKind::Adagrad;
}

torch::Tensor UpdateRule::buffer(const OptimizerState& after) const {
  if (!has_buffer()) return {};
  return state_buffer(after, options_.traits().adam_family ? "exp_avg" : "momentum_buffer").to(torch::kFloat64);
}

const torch::Tensor& UpdateRule::state_buffer(const OptimizerState& after, const char* key) const {
  auto it = after.buffers.find(key);
  PK_CHECK(it != after.buffers.end(), "optimizer state of '" << options_.name << "' has no '" << key << "' buffer");
  return it->second;
}

int64_t UpdateRule::step_count(int64_t s, const OptimizerState& after) const {
  PK_CHECK(after.step >= 1, "optimizer state of step " << s << " has step count " << after.step << ": expected >= 1");
  return after.step;
}

StepCoefficients UpdateRule::step(int64_t s, double lr, const torch::Tensor& w, const OptimizerState& after) const {
  StepCoefficients c;
  const OptimizerTraits& traits = options_.traits();
  if (traits.kind == OptimizerKind::RMSprop) {
    // As LibTorch computes it: avg = √v + ε (√(v − m²) + ε centered), the
    // update −η d / avg, or with momentum b = μ b + d / avg and the update −η b.
    torch::Tensor v = state_buffer(after, "square_avg").to(torch::kFloat64);
    if (options_.centered) v = v - state_buffer(after, "grad_avg").to(torch::kFloat64).square();
    torch::Tensor metric = 1.0 / (v.sqrt() + options_.eps);
    if (!has_buffer()) {
      c.metric = metric;
      c.alpha = -lr;
      return c;
    }
    c.buffer_metric = metric;
    c.gamma = 1.0;
    c.kappa = -lr;
    return c;
  }
  if (traits.kind == OptimizerKind::Adagrad) {
    // As LibTorch computes it: std = √Σ + ε, the rate η / (1 + (t − 1) δ).
    const int64_t t = step_count(s, after);
    c.metric = 1.0 / (state_buffer(after, "sum").to(torch::kFloat64).sqrt() + options_.eps);
    c.alpha = -lr / (1 + static_cast<double>(t - 1) * options_.lr_decay);
    return c;
  }
  if (!traits.has_buffer) {
    c.alpha = -lr;
  } else if (traits.momentum_family) {
    c.gamma = s == 0 ? 1.0 : 1.0 - options_.dampening;
    c.alpha = traits.kind == OptimizerKind::Nesterov ? -lr : 0.0;
    c.kappa = traits.kind == OptimizerKind::Nesterov ? -lr * options_.momentum : -lr;
  } else {
    const int64_t t = step_count(s, after);
    // As LibTorch computes it: denom = √v / √(1 − β2^t) + ε, step size η / (1 − β1^t).
    const double bc1 = 1 - std::pow(options_.beta1, static_cast<double>(t));
    const double bc2 = 1 - std::pow(options_.beta2, static_cast<double>(t));
    c.metric = 1.0 / (state_buffer(after, "exp_avg_sq").to(torch::kFloat64).sqrt() / std::sqrt(bc2) + options_.eps);
    c.gamma = 1.0 - options_.beta1;
    c.kappa = -lr / bc1;
    if (traits.kind == OptimizerKind::AdamW && options_.weight_decay != 0) c.rho = -lr * options_.weight_decay * w;
  }
  return c;
}

torch::Tensor UpdateRule::buffer_input(const StepCoefficients& c, const torch::Tensor& d) {
  return c.buffer_metric.defined() ? c.gamma * (d * c.buffer_metric) : c.gamma * d;
}

torch::Tensor UpdateRule::update(const StepCoefficients& c, const torch::Tensor& d, const torch::Tensor& b) {
  torch::Tensor u = c.alpha * d;
  if (b.defined() && c.kappa != 0) u = u + c.kappa * b;
  if (c.metric.defined()) u = u * c.metric;
  if (c.rho.defined()) u = u + c.rho;
  return u;
}

}  // namespace pathkernel
