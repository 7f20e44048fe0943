// The result of decompose() (decomposition.h): the terms of the exact
// decomposition f(w_N, x) = f(w_0, x) + Σ_i C_i(x) + R(x) + E(x), with the
// quadrature's counts and the steps' residuals. Its own header so that what
// stores a decomposition (decomposition_checkpoint.h) does not depend on what
// computes it.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "pathkernel/features.h"

namespace pathkernel {

/// How well each step's recorded update is explained by the declared loss,
/// optimizer and clip factors: the update's residual e_s (and, for optimizers
/// with a buffer, the buffer's b_s − β b_{s−1} − γ_s d_s) against a bound on
/// rounding, 1000 ε (‖w_s‖_∞ + ‖w_{s+1}‖_∞) for the update and 1000 ε
/// (‖b_s‖_∞ + β‖b_{s−1}‖_∞ + γ_s‖d_s‖_∞) for the buffer, ε the run dtype's
/// machine epsilon. A step above its bound did something the run does not
/// describe (an undeclared loss term, a clip factor not recorded, another
/// optimizer); the rounding term E then carries the difference, so the
/// kernel machine still matches the network, but E is not attributed to
/// training points.
///
/// The residual is taken against the engine's float64 gradient at the run's
/// weights, and the run's rounding (float32's above all) can take a branch
/// the engine's does not: a ReLU input, or a max-pool window's two largest
/// entries, within rounding of a tie. One unit's gradient then goes
/// elsewhere, far above the bound. Where every step over its bound of a
/// recorded loop, replayed with the declared loss and optimizer from the
/// checkpoint before it (a compact recording's segment, or a stored step's
/// own weights and state), reproduces the checkpoint after it bit for bit,
/// those updates are the loop's own, so the steps are such branches
/// (`rounding_branches`), not something the loop did.
struct StepResiduals {
  /// Steps over their bound listed in `over_steps`, at most.
  static constexpr int64_t kListedSteps = 256;

  double max_ratio = 0;      ///< max over steps of residual / bound
  double max_residual = 0;   ///< the residual (max |.|) of the step with max_ratio
  double bound = 0;          ///< that step's bound
  int64_t worst_step = -1;   ///< the step with max_ratio
  int64_t first_step = -1;   ///< the first step whose residual exceeds its bound (-1: none)
  int64_t steps_over = 0;    ///< steps whose residual exceeds their bound
  /// The steps over their bound, up to kListedSteps of them (all of them
  /// when its size is steps_over).
  std::vector<int64_t> over_steps;
  /// Every step over its bound was reproduced bit for bit by the replay
  /// (set by decompose(); see above).
  bool rounding_branches = false;

  /// Whether every update is what the declared loss and optimizer give:
  /// none over its bound, or all of them the run's rounding branches.
  bool explained() const { return first_step < 0 || rounding_branches; }

  /// Adds step s's residual r against its bound.
  void add(int64_t s, double r, double bound);
  /// Lists step s in over_steps while it holds fewer than kListedSteps.
  void list_over(int64_t s);
  /// Merges another walk's findings (e.g. saved progress).
  void merge(const StepResiduals& o);
};

/// Where a decomposition's time went, in seconds summed over the threads
/// (and ranks) that did the work, so their sum may exceed the wall time.
struct TimeSplit {
  double test_features = 0;     ///< the test points' integrand evaluations along each step's segment
  double training_signals = 0;  ///< the batch's gradient and per-sample signals, each step
  double contraction = 0;       ///< test features against training signals (and the reverse walk's accumulator)
  /// The path replayed (checkpoints read, steps between them retrained), as
  /// the walk waited for it: all of the replay when it ran in turn with the
  /// walk, what was left to wait for when it ran ahead on its own thread.
  double replay = 0;
  double replay_ahead = 0;  ///< the replay's seconds on its own thread, ahead of the walk (0: in turn)

  void add(const TimeSplit& o) {
    test_features += o.test_features;
    training_signals += o.training_signals;
    contraction += o.contraction;
    replay += o.replay;
    replay_ahead += o.replay_ahead;
  }
};

/// Shapes: n test points, M training points, K outputs. The counts
/// (QuadratureCounts) are summed over test points and steps.
struct Decomposition : QuadratureCounts {
  /// The network's outputs, evaluated in float64 at the recorded weights
  /// (a float32 run's weights and inputs are exactly representable in
  /// float64, so for such a run these are the float64 network at the float32
  /// path, the function the decomposition is exact for).
  torch::Tensor f0;              ///< [n, K] f(w_0, x)
  torch::Tensor fN;              ///< [n, K] f(w_N, x)
  /// [n, K] f(w_N, x) as the run's own network computes it, in the run's
  /// dtype (equal to fN for a float64 run; a float32 run's differs from fN
  /// by float32 rounding).
  torch::Tensor fN_run;
  torch::Tensor contributions;   ///< [n, M, K] C_i(x)
  torch::Tensor regularization;  ///< [n, K] R(x)
  torch::Tensor rounding;        ///< [n, K] E(x)
  /// [n, K] S(x): BatchNorm in training mode only (batch_statistics.h), the
  /// test outputs' moves as the running statistics jump at each step,
  /// Σ_s g(w_{s+1}, μ_{s+1}; x) − g(w_{s+1}, μ_s; x) (docs/math.md §15).
  /// Undefined for every other network.
  torch::Tensor statistics;
  /// [n, M, K, K] when requested: Σ_{s: i∈B_s} K_s(x, x_i), K_s = J̄_s(x) J(w_s, x_i)^T.
  /// With log-softmax + NLL and constant η/|B_s| (Thm. 3.7):
  /// C_i(x) = (η/|B|) kernel[x, i, :, y_i], a single kernel machine.
  torch::Tensor kernel;
  /// [n, M, K, L] with DecompositionOptions::by_layer: C_i(x) split over the
  /// network's L parameter tensors (layer_split.h); sums over its last axis
  /// to contributions up to rounding. Undefined otherwise.
  torch::Tensor layer_contributions;
  double certificate_max_gap = 0;
  /// [n, K]: Σ_s |J̄_s Δw_s − (f(w_{s+1}) − f(w_s))|, the steps' certificate
  /// gaps in absolute value. The prediction's error against f(w_N) is the sum
  /// of the signed gaps (up to the rounding of the sums), so this bounds it.
  torch::Tensor gap_abs;
  int64_t steps = 0;
  double seconds = 0;
  TimeSplit time_split;          ///< where the seconds went (not kept in saved progress)
  /// Threads that walked blocks of steps at once, each a block on one thread
  /// (the steps on threads, docs/math.md §12); 1: one walk of the steps.
  int64_t step_threads = 1;
  StepResiduals residuals;       ///< how well the declared updates explain the recorded ones

  /// f(w_0) + Σ_i C_i + R + E (+ S with BatchNorm): the kernel machine's prediction, [n, K].
  torch::Tensor prediction() const;
  /// f(w_N) − f(w_0) − Σ_i C_i − R (− S), which completeness says is E up to
  /// quadrature error: [n, K].
  torch::Tensor completeness_gap() const;
};

}  // namespace pathkernel
