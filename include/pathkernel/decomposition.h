// The exact decomposition of a trained network's outputs (docs/math.md §4):
//
//   f(w_N, x) = f(w_0, x) + Σ_i C_i(x) + R(x) + E(x)
//
// With the updates written as in update_rule.h (Δw_s = P_s(α_s d_s + κ_s b_s)
// + ρ_s + e_s, d_s = G_s + λ_c w_s):
//   C_i(x) = Σ_{r: i ∈ B_r} A_r(x) g_{i,r} / |B_r|      contribution of training point i
//   R(x)   = Σ_r (λ_c A_r(x) w_r + J̄_r(x) ρ_r)         regularisation (weight decay)
//   E(x)   = the rounding of the recorded updates and buffers
// where A_r = Σ_{s ≥ r} J̄_s Q_{s,r} collects every later step a gradient of
// step r moves. For gd and sgd A_r = −η_r J̄_r and the path is walked forward;
// with a buffer (momentum, nesterov, adam, adamw) A_r is accumulated walking
// the path backwards (one K x P matrix per test point, never one buffer per
// training point).
// Ensemble form (Thm. 3.6, gd and sgd): C_i(x) = Σ_{s: i∈B_s} K_s(x, x_i) a_{i,s}
// with the K x K kernel K_s(x, x_i) = J̄_s(x) J(w_s, x_i)^T and
// a_{i,s} = −(η_s/|B_s|) u_{i,s}, u_{i,s} = ∂ℓ_i/∂f; the contraction computes
// K_s a_{i,s} without forming K_s. J̄_s is certified by quadrature
// (features.h). Streaming: one step, one chunk of test points and one chunk
// of training points at a time.
#pragma once

#include <functional>
#include <limits>
#include <vector>

#include <torch/torch.h>

#include "pathkernel/decomposition_result.h"
#include "pathkernel/features.h"
#include "pathkernel/path.h"

namespace pathkernel {

class DecompositionCheckpoint;  // decomposition_checkpoint.h

/// What decompose() shows an observer after each step and chunk of test
/// points: step s's share of every C_i(x), with the evaluator set to the
/// step's segment and the chunk's certified test features. Forward walks
/// (gd, sgd) visit s = 0 .. N−1; reverse walks visit N−1 .. 0 per chunk.
struct StepObservation {
  int64_t step = 0;                       ///< s
  int64_t first_point = 0;                ///< the chunk is test points [first_point, first_point + n_chunk)
  const SegmentEvaluator* evaluator = nullptr;  ///< set to w_s + t Δw_s
  const torch::Tensor* x = nullptr;       ///< the chunk's test inputs, float64 [n_chunk, ...]
  const TestFeatures* features = nullptr; ///< J̄_s of the chunk (certificate gap, evaluations)
  torch::Tensor train_index;              ///< int64 [b]: the training points of step s
  /// [n_chunk, b, K]: the terms of C_i(x) from step s's gradients, A_s g_{i,s} / |B_s|;
  /// summed over steps they give Decomposition::contributions.
  torch::Tensor contributions;
};

struct DecompositionOptions {
  QuadratureOptions quadrature;
  /// Sequence models (sequence.h): the position whose outputs are
  /// decomposed, −1 the last. Ignored for other models.
  int64_t position = -1;
  int64_t train_chunk = 1024;          ///< training rows per contraction
  /// Budget for one chunk of test features and accumulators (doubles): 2 GiB.
  /// A reverse walk replays the path once per chunk of test points that fits
  /// it (the user CNN's 100 points: 7 walks at 512 MiB, 2 at 2 GiB).
  int64_t memory_doubles = int64_t{256} << 20;
  bool progress = true;
  /// Also accumulate the kernel Σ_{s: i∈B_s} K_s(x, x_i) (K extra
  /// backprops per training point and step; n·M·K·K doubles).
  bool kernel = false;
  /// Also accumulate Decomposition::layer_contributions, C_i(x) split over
  /// the parameter tensors (a second contraction per training chunk).
  /// Not with a checkpoint (its progress is not saved).
  bool by_layer = false;
  /// Walk the path backwards with dense test-side accumulators (docs/math.md §4).
  /// Always so for optimizers with a buffer (momentum, nesterov, adam,
  /// adamw); for gd and sgd it is an independent second route to the same
  /// decomposition.
  bool reverse = false;
  // quadrature.run_tol, when > 0, is shared over the run's steps (QuadratureOptions::for_run).
  /// Contract with the training signals and gradient the path's replay
  /// computed anyway (PathReader::set_capture) instead of running every
  /// batch through the network twice more. Float64 runs only (others
  /// recompute in float64 regardless).
  bool replay_signals = true;
  /// Replay the path on a thread of its own, ahead of the walk, where the
  /// run allows it (PathReader::set_replay_ahead): the same steps, bit for
  /// bit, with the replay's time hidden behind the walk's.
  bool replay_ahead = true;
  /// The reverse walk forms step s−1's training side (the batch's signals,
  /// per-sample gradients and c_s G_s) on a thread of its own while it
  /// works on step s's test points, where it has two threads or more and
  /// the route takes points concurrently: the same values as formed in
  /// turn, with the training side's time behind the test side's.
  bool training_ahead = true;
  /// Test points computed together (fewer when the memory budget says so);
  /// 0: automatic, 32 for a network of Linear layers on flat inputs and 4
  /// for others (the fastest measured for each when chosen, `git show
  /// bfd5e78:BENCHMARKS.md`).
  /// A point's numbers depend only on the block it falls in (blocks start
  /// at multiples of decomposition_block()), so any split of the test points
  /// at block boundaries, across processes for instance, gives the same bits.
  int64_t point_block = 0;
  /// gd and sgd only: decompose steps [first_step, end_step) alone
  /// (end_step −1: up to N), giving their terms of C_i, R, E and gap_abs, and
  /// their counts and residuals: partial sums that add up, over a split of
  /// the steps, to the whole decomposition (certificate gap the maximum,
  /// residuals merged in step order: StepResiduals::merge); the tensors to
  /// the rounding of the order of the sum, and bit for bit when each range
  /// is one of step_blocks() and they are added to zeros in block order by
  /// add_step_block(). f(w_0) and f(w_N) stay the whole
  /// path's; Decomposition::steps is the range's length. Only the checkpoint
  /// segments that hold the range are replayed. The quadrature's run budget
  /// (QuadratureOptions::run_tol) is still shared over all N steps, so each
  /// step is computed as in the whole walk.
  int64_t first_step = 0;
  int64_t end_step = -1;
  /// Called after each step and chunk of test points (unset: not called).
  std::function<void(const StepObservation&)> on_step;
};

/// The kernel machine's error against the network, the headline figure of
/// every comparison: |kernel − network| / max(1, |network|), elementwise,
/// for outputs of the same shape (e.g. [n, K]).
torch::Tensor relative_error(const torch::Tensor& kernel, const torch::Tensor& network);

/// The blocks of steps whose sums a forward walk (gd, sgd) adds up: the
/// run's checkpoint segments, steps [c_k, c_{k+1}) for its checkpoint steps
/// c_0 = 0 < c_1 < ... < c_B = N (returned). decompose() sums each block's
/// terms of C_i, R, E, gap_abs and the kernel from zero, and adds the
/// block's sums to its totals at the block's end, in step order
/// (add_step_block). The blocks depend on the run alone, so a split of the
/// steps at block boundaries (across processes: across_ranks.h) that
/// adds each block's own decomposition (a range of one block) to the totals
/// in the same order gives the same bits as one walk.
std::vector<int64_t> step_blocks(const Manifest& m);

/// total += block for the sums whose rounding depends on their order:
/// contributions, regularization, rounding, gap_abs and the kernel (both
/// with or both without it). When `rows` is defined, the block's training
/// side holds only those training rows (int64, the block's row r is
/// training point rows[r]) and is added into them. The counters, the
/// certificate gap and the residuals are not touched.
void add_step_block(Decomposition& total, const Decomposition& block, const torch::Tensor& rows = {});

/// What `verify` reports of a decomposition, each computed once here.
struct DecompositionSummary {
  int64_t test_points = 0;
  int64_t steps = 0;
  double max_abs_error = 0;          ///< max |prediction − f(w_N)|
  double max_rel_error = 0;          ///< max of relative_error(prediction, f(w_N))
  /// The test point (row of the decomposed inputs) whose output has
  /// max_rel_error, and the certificate's bound on that point's error.
  int64_t worst_point = 0;
  double worst_point_error_bound = 0;
  double worst_point_cancellation = 0;  ///< `cancellation` of that point
  double completeness_error = 0;     ///< max |completeness_gap()|: includes E and the quadrature error
  double max_abs_rounding = 0;       ///< max |E|
  double max_abs_regularization = 0; ///< max |R|
  /// max |S|, the running-statistics term (BatchNorm in training mode); NaN
  /// for a network without one.
  double max_abs_statistics = std::numeric_limits<double>::quiet_NaN();
  double certificate_max_gap = 0;
  /// max of gap_abs / max(1, |f(w_N)|): the certificate's bound on max_rel_error
  /// (up to the rounding of forming f and the sums, a few ε).
  double error_bound = 0;
  /// The largest, over points and outputs, of the terms' magnitudes summed,
  /// (|f(w_0)| + Σ_i |C_i| + |R| + |E| + |S|) / max(1, |f(w_N)|): how much the
  /// terms cancel. Forming them and their sums rounds by about ε times it
  /// (at least: each C_i is itself a sum over steps), which error_bound
  /// leaves out.
  double cancellation = 0;
  double mean_evaluations_per_step = 0;          ///< integrand evaluations per test point and step
  double mean_forward_evaluations_per_step = 0;  ///< forward-only evaluations per test point and step
  double mean_moment_evaluations_per_step = 0;   ///< moment rows (one backprop each) per test point and step
  double mean_kinks_per_step = 0;                ///< kinks located per test point and step
  /// The same by site, laid out as QuadratureCounts::kinks_by_site; empty
  /// where the route does not know the sites.
  std::vector<double> mean_kinks_per_step_by_site;
  double max_abs_run_dtype_difference = 0;       ///< max |fN_run − fN|: 0 for float64 runs
  double seconds = 0;
  TimeSplit time_split;
  int64_t step_threads = 1;  ///< Decomposition::step_threads
  StepResiduals residuals;
};

/// When some step's update is not explained by the declared loss and
/// optimizer (StepResiduals::explained() false), a plain-words account
/// naming the step; empty otherwise.
std::string unexplained_update_message(const StepResiduals& r);

/// Sets r.rounding_branches: whether every step over its bound is listed and
/// was reproduced bit for bit by the reader's replay (PathReader::
/// step_reproduced), so the declared loss and optimizer gave the loop's own
/// update there. decompose() calls it once its walk is done.
void read_residuals_against_replay(PathReader& reader, StepResiduals& r);

/// When the steps over their bound are the run's rounding branches
/// (StepResiduals::rounding_branches), a plain-words account of them and of
/// what they leave in E; empty otherwise.
std::string rounding_branch_message(const StepResiduals& r);

/// Summarises d (any number of test points, at least one).
DecompositionSummary summarize(const Decomposition& d);

/// The test points decompose() computes together for test inputs like x
/// [n, *input_shape] with these options (options.point_block, its automatic
/// choice when 0, or fewer to fit the memory budget): blocks start at its
/// multiples.
int64_t decomposition_block(PathReader& reader, const torch::Tensor& x, const DecompositionOptions& options);

/// How the engine evaluates the run's network (SegmentEvaluator::route()):
/// "own", "structured" or "generic", and for a TorchScript module on the
/// generic route, why its graph has no structured form ("" otherwise).
struct EngineRoute {
  std::string route, reason;
};
EngineRoute engine_route(PathReader& reader, const DecompositionOptions& options);

/// Decomposes the run's final outputs on test inputs x [n, *input_shape].
/// Every optimizer of optimizer.h is supported (update_rule.h); the kernel
/// output only for gd and sgd.
Decomposition decompose(PathReader& reader, const torch::Tensor& x, const DecompositionOptions& options);

/// decompose() that saves its progress to `checkpoint` (null: none) and
/// continues from checkpoint->resume_point() (decomposition_checkpoint.h).
/// The result is bit for bit the uninterrupted one's: the same sums in the
/// same order.
Decomposition decompose(PathReader& reader, const torch::Tensor& x, const DecompositionOptions& options,
                        DecompositionCheckpoint* checkpoint);

}  // namespace pathkernel
