// The optimizers' updates as linear maps of per-sample gradients.
#include "pathkernel/update_rule.h"

#include <cmath>

#include "pathkernel/error.h"

namespace pathkernel {

namespace {

bool is_adam(const std::string& name) { return name == "adam" || name == "adamw"; }
bool is_momentum(const std::string& name) { return name == "momentum" || name == "nesterov"; }

}  // namespace

UpdateRule::UpdateRule(const OptimizerOptions& options) : options_(options) {
  const std::string& name = options.name;
  PK_CHECK(name == "gd" || name == "sgd" || is_momentum(name) || is_adam(name),
           "no update rule for optimizer '" << name << "': expected one of gd, sgd, momentum, nesterov, adam, adamw");
  beta_ = is_momentum(name) ? options.momentum : is_adam(name) ? options.beta1 : 0.0;
  coupled_decay_ = name == "adamw" ? 0.0 : options.weight_decay;
}

torch::Tensor UpdateRule::buffer(const OptimizerState& after) const {
  if (!has_buffer()) return {};
  const char* key = is_adam(options_.name) ? "exp_avg" : "momentum_buffer";
  auto it = after.buffers.find(key);
  PK_CHECK(it != after.buffers.end(), "optimizer state of '" << options_.name << "' has no '" << key << "' buffer");
  return it->second.to(torch::kFloat64);
}

StepCoefficients UpdateRule::step(int64_t s, double lr, const torch::Tensor& w, const OptimizerState& after) const {
  StepCoefficients c;
  const std::string& name = options_.name;
  if (name == "gd" || name == "sgd") {
    c.alpha = -lr;
  } else if (is_momentum(name)) {
    c.gamma = s == 0 ? 1.0 : 1.0 - options_.dampening;
    c.alpha = name == "nesterov" ? -lr : 0.0;
    c.kappa = name == "nesterov" ? -lr * options_.momentum : -lr;
  } else {
    const int64_t t = after.step;
    PK_CHECK(t >= 1, "optimizer state of step " << s << " has step count " << t << ": expected >= 1");
    auto it = after.buffers.find("exp_avg_sq");
    PK_CHECK(it != after.buffers.end(), "optimizer state of '" << name << "' has no 'exp_avg_sq' buffer");
    // As LibTorch computes it: denom = √v / √(1 − β2^t) + ε, step size η / (1 − β1^t).
    const double bc1 = 1 - std::pow(options_.beta1, static_cast<double>(t));
    const double bc2 = 1 - std::pow(options_.beta2, static_cast<double>(t));
    c.metric = 1.0 / (it->second.to(torch::kFloat64).sqrt() / std::sqrt(bc2) + options_.eps);
    c.gamma = 1.0 - options_.beta1;
    c.kappa = -lr / bc1;
    if (name == "adamw" && options_.weight_decay != 0) c.rho = -lr * options_.weight_decay * w;
  }
  return c;
}

torch::Tensor UpdateRule::update(const StepCoefficients& c, const torch::Tensor& d, const torch::Tensor& b) {
  torch::Tensor u = c.alpha * d;
  if (b.defined() && c.kappa != 0) u = u + c.kappa * b;
  if (c.metric.defined()) u = u * c.metric;
  if (c.rho.defined()) u = u + c.rho;
  return u;
}

}  // namespace pathkernel
