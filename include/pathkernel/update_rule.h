// Updates as linear maps of per-sample gradients (docs/math.md §3).
//
// Every supported optimizer's step is written, in PyTorch's conventions, as
//
//   d_s  = G_s + λ_c w_s                          (G_s: mean batch gradient at w_s)
//   b_s  = β b_{s−1} + γ_s Q_s d_s,  b_{−1} = 0  (the optimizer's buffer)
//   Δw_s = P_s (α_s d_s + κ_s b_s) + ρ_s + e_s
//
// | optimizer     | β  | γ_s                 | Q_s | α_s    | κ_s            | P_s | ρ_s       | λ_c |
// | gd, sgd       | 0  | 0                   | I   | −η_s   | 0              | I   | 0         | λ   |
// | momentum      | μ  | 1 at s = 0, else 1−τ| I   | 0      | −η_s           | I   | 0         | λ   |
// | nesterov      | μ  | 1 at s = 0, else 1  | I   | −η_s   | −η_s μ         | I   | 0         | λ   |
// | adam          | β1 | 1−β1                | I   | 0      | −η_s/(1−β1^t)  | D_s | 0         | λ   |
// | adamw         | β1 | 1−β1                | I   | 0      | −η_s/(1−β1^t)  | D_s | −η_s λ w_s| 0   |
// | rmsprop       | 0  | 0                   | I   | −η_s   | 0              | R_s | 0         | λ   |
// | rmsprop, μ > 0| μ  | 1                   | R_s | 0      | −η_s           | I   | 0         | λ   |
// | adagrad       | 0  | 0                   | I   | −η_s/(1+(t−1)δ) | 0     | A_s | 0         | λ   |
//
// with t = s+1 the optimizer's step count, D_s = 1/(√v_s/√(1−β2^t) + ε) from
// Adam's second-moment state after step s, R_s = 1/(√v_s + ε) from RMSprop's
// (1/(√(v_s − m_s²) + ε) centered, m_s its average gradient) and
// A_s = 1/(√Σ_s + ε) from Adagrad's sum of squares (δ its lr_decay): once
// the step is taken, each is a known fixed metric. e_s is the
// floating-point residual of the recorded update against this
// reconstruction. RMSprop with momentum keeps R_s inside its buffer (Q_s):
// its metric is applied to each step's gradient as it enters the sum.
#pragma once

#include <string>

#include <torch/torch.h>

#include "pathkernel/optimizer.h"

namespace pathkernel {

/// The coefficients of one step (see the table above).
struct StepCoefficients {
  double alpha = 0, kappa = 0, gamma = 0;
  torch::Tensor metric;         ///< P_s [P]; undefined means the identity
  torch::Tensor buffer_metric;  ///< Q_s [P], the buffer's metric; undefined means the identity
  torch::Tensor rho;     ///< ρ_s [P]; undefined means 0
};

class UpdateRule {
 public:
  /// Throws Error for an optimizer it does not know.
  explicit UpdateRule(const OptimizerOptions& options);

  /// β: how much of b_{s−1} carries into b_s (0 without a buffer).
  double beta() const { return beta_; }
  /// λ_c: the L2 decay coupled into the gradient.
  double coupled_decay() const { return coupled_decay_; }
  /// Whether the optimizer keeps a buffer b_s.
  bool has_buffer() const { return beta_ != 0; }
  /// Whether its steps have a metric P_s or Q_s other than the identity (adam,
  /// adamw, rmsprop, adagrad): such a path is walked in reverse (decomposition.h).
  bool has_metric() const { return has_metric_; }
  /// Whether the decomposition walks the path in reverse: a buffer or a metric
  /// (the forward walk takes neither).
  bool walks_in_reverse() const { return has_buffer() || has_metric_; }

  /// b_s read from the optimizer state after step s, float64 [P]; undefined
  /// without a buffer. Throws Error when the state lacks it.
  torch::Tensor buffer(const OptimizerState& after) const;

  /// Coefficients of step s, taken with rate lr from weights w_s [P], given
  /// the optimizer state after the step.
  StepCoefficients step(int64_t s, double lr, const torch::Tensor& w, const OptimizerState& after) const;

  /// The reconstruction P_s (α_s d_s + κ_s b_s) + ρ_s (b undefined: no buffer).
  static torch::Tensor update(const StepCoefficients& c, const torch::Tensor& d, const torch::Tensor& b);
  /// What step s adds to the buffer, γ_s Q_s d_s (d [..., P]).
  static torch::Tensor buffer_input(const StepCoefficients& c, const torch::Tensor& d);

 private:
  /// The buffer `key` of the state after a step; throws Error naming it when missing.
  const torch::Tensor& state_buffer(const OptimizerState& after, const char* key) const;
  /// The optimizer's step count after step s (≥ 1); throws Error otherwise.
  int64_t step_count(int64_t s, const OptimizerState& after) const;

  OptimizerOptions options_;
  double beta_ = 0, coupled_decay_ = 0;
  bool has_metric_ = false;
};

}  // namespace pathkernel
