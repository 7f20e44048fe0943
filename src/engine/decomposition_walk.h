// What the decomposition's two walks of the path share (decomposition.h):
// the test points in float64, the training set, with the networks that
// evaluate them (Walk), the decomposition's outputs before any step, saved
// progress restored and saved, the step residuals' bound and how many test
// points are computed together. The forward walk (gd, sgd) is in
// decomposition_forward.cpp, the reverse walk (optimizers with a buffer) in
// decomposition_reverse.cpp.
//
// Internal to the engine (decomposition*.cpp).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include <torch/torch.h>

#include "pathkernel/decomposition.h"
#include "pathkernel/decomposition_checkpoint.h"
#include "pathkernel/dropout.h"
#include "pathkernel/features.h"
#include "pathkernel/layer_split.h"
#include "pathkernel/loss.h"
#include "pathkernel/path.h"
#include "pathkernel/update_rule.h"

namespace pathkernel::decomposition_walk {

/// max |t|, 0 for an undefined or empty t.
double max_abs(const torch::Tensor& t);

/// How far above machine epsilon rounding may take a step's residual (StepResiduals).
constexpr double kRoundingSlack = 1000;

/// The run dtype's machine epsilon.
double run_epsilon(const Manifest& m);

/// The rounding bound of step s's update residual (StepResiduals).
double update_bound(const Manifest& m, const PathStep& st);

/// A gd or sgd step's update residual e_s = Δw_s + η_s (G_s + λ w_s) [P],
/// what training's rounding left of the update (docs/math.md §4), with
/// max |e_s| and update_bound(m, st): one pass over w_s, Δw_s and G_s, the
/// same bits as the tensor expressions (each product and sum rounded in
/// that order).
struct UpdateResidual {
  torch::Tensor e;
  double max_abs = 0, bound = 0;
};
UpdateResidual update_residual(const Manifest& m, const PathStep& st, const torch::Tensor& gradient, double lambda);

/// Turns the reader's capture on for a scope. Each captured step's
/// per-sample gradients (form_sample_gradients on ev's layers) are formed
/// where it is replayed, on the replay's own thread when it runs ahead, so
/// that the walk's threads find them formed (they waited for one another's
/// before: the first to need a step's training rows formed them).
class CaptureScope {
 public:
  CaptureScope(PathReader& reader, bool on, const SegmentEvaluator& ev);
  ~CaptureScope() { reader_.set_capture(false); }

 private:
  PathReader& reader_;
};

/// PathReader::set_replay_ahead for a scope.
class ReplayAheadScope {
 public:
  ReplayAheadScope(PathReader& reader, bool on) : reader_(reader) { reader_.set_replay_ahead(on); }
  ~ReplayAheadScope() { reader_.set_replay_ahead(false); }
  ReplayAheadScope(const ReplayAheadScope&) = delete;
  ReplayAheadScope& operator=(const ReplayAheadScope&) = delete;

 private:
  PathReader& reader_;
};

/// Where a walk's time goes (TimeSplit). Its parts are timed by Scope on
/// whichever thread does them (their seconds add up across threads); the
/// replay is the time the path reader takes outside the walk's steps.
class WalkClock {
 public:
  enum Part { kTestFeatures, kTrainingSignals, kContraction, kParts };

  /// Adds the seconds from its construction to its end to one part.
  class Scope {
   public:
    Scope(WalkClock& clock, Part part) : clock_(clock), part_(part), t0_(std::chrono::steady_clock::now()) {}
    ~Scope() { clock_.add(part_, std::chrono::steady_clock::now() - t0_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    WalkClock& clock_;
    Part part_;
    std::chrono::steady_clock::time_point t0_;
  };

  /// Runs one step of the walk (inside the reader's replay), timed.
  template <typename F>
  void step(F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    in_steps_ += std::chrono::steady_clock::now() - t0;
  }

  /// The parts so far, with the replay: `reader_seconds`, the time the
  /// reader's walk took, less the time in the steps it called.
  TimeSplit split(double reader_seconds) const;

 private:
  void add(Part part, std::chrono::steady_clock::duration d) {
    nanoseconds_[part] += std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  }

  std::array<std::atomic<int64_t>, kParts> nanoseconds_{};
  std::chrono::steady_clock::duration in_steps_{};
};

/// What both walks of the path share: the test points in float64, the
/// training set (a batch's rows taken to float64 as needed), two float64
/// networks of the run's own (the reader's is busy replaying the path: one
/// for the batch gradient, one for the evaluator; a third, made on demand,
/// for the training side formed ahead) and whether the replay's captured
/// signals serve the contractions.
struct Walk {
  Walk(PathReader& reader, const torch::Tensor& x_in, const DecompositionOptions& options);

  /// Step st's batch: its training rows, their loss weights (undefined: all
  /// 1), the rows themselves where signals are recomputed (and where
  /// `need_x`) and c_s G_s, the batch gradient as the optimizer received it
  /// (clipped in a recorded run).
  struct Batch {
    torch::Tensor idx, xb, yb, wb, gradient;
    int64_t b = 0;
    /// The gradient is (or, from batch_signals, will be) summed from the
    /// training signals in chunks of signal_chunk rows, kept for the step.
    bool from_signals = false;
  };
  /// With `signal_chunk` > 0, c_s G_s is summed from the batch's training
  /// signals in chunks of that many rows where the route allows
  /// (signals_gradient), and those chunks are kept for the step's contractions.
  /// `at` evaluates the training rows: an evaluator whose segment starts at
  /// w_s (ev unless given: the training side formed ahead takes
  /// ahead_evaluator()).
  Batch batch(PathReader& reader, const PathStep& st, bool need_x, int64_t signal_chunk = 0,
              const SegmentEvaluator* at = nullptr);

  /// The same batch where c_s G_s is summed from its training signals
  /// (gradient_from_signals), with only its chunks' signals formed and kept,
  /// not their per-sample gradients nor c_s G_s (left undefined):
  /// finish_batch forms those, on another thread. Where c_s G_s is not
  /// summed from signals, batch()'s.
  Batch batch_signals(PathReader& reader, const PathStep& st, int64_t signal_chunk, const SegmentEvaluator& at);

  /// Forms c_s G_s of a batch from batch_signals (nothing if it has it):
  /// its chunks' per-sample gradients formed in place where they are kept,
  /// then summed, on one thread as batch() does it where the training side
  /// is formed ahead (the same bits).
  void finish_batch(const PathStep& st, Batch& bt, int64_t signal_chunk) const;

  /// c_s G_s as the sum of the batch's per-sample gradients, layer by layer,
  /// from the training rows' signals in chunks of `chunk` rows (the chunks
  /// the contractions then take, formed once): no forward and backward pass
  /// of its own. Its float64 rounding differs from autograd's, which the
  /// rounding term E holds. Only where gradient_from_signals.
  torch::Tensor signals_gradient(const PathStep& st, const Batch& bt, int64_t chunk, const SegmentEvaluator& at) const;

  /// Holds step st's running statistics μ_s in the test side's network
  /// (batch_statistics.h): its segment is g(w_s + t Δw_s, μ_s; x). Nothing
  /// without BatchNorm in training mode.
  void hold_statistics(const PathStep& st);

  /// The batch's training rows in chunks of `chunk`, each chunk's signals
  /// contracted by `contract_with` (TrainSignals -> [points, rows, K]) and
  /// scaled to the mean loss's (the captured signals are already divided by
  /// |B_s|) times the clip factor and `factor`; `use(r0, nr, part)` takes
  /// them. Under the step's dropout masks, which the training rows' signals
  /// (and the kernel's training side) must see.
  template <typename Contract, typename Use>
  void train_chunks(const PathStep& st, const Batch& bt, int64_t chunk, double factor, Contract&& contract_with,
                    Use&& use) const {
    const double scale = captured ? factor : factor * st.clip / static_cast<double>(bt.b);
    if (ev.path_route().couples_batch()) chunk = bt.b;  // the batch's statistics couple its rows
    for (int64_t r0 = 0; r0 < bt.b; r0 += chunk) {
      const int64_t nr = std::min(chunk, bt.b - r0);
      const DropoutStep dropout(m.init_seed, st.step);
      const TrainSignals signals = chunk_signals(st, bt, r0, nr, ev);
      torch::Tensor part;
      {
        WalkClock::Scope timed(clock, WalkClock::kContraction);
        part = contract_with(signals);
        if (scale != 1) part = part * scale;
      }
      use(r0, nr, part);
    }
  }

  /// Training rows r0 .. r0+nr of step st's batch (under the step's dropout
  /// masks, which the caller sets), with the per-sample gradients their
  /// contractions need formed (without `gradients`, not yet: a kept chunk
  /// has them formed by the first call that asks). A step's chunks are kept
  /// while they fit in `keep_doubles`, so that the step's other blocks of
  /// test points contract against them without forming them again (a
  /// convolution's per-sample gradients; every signal when they are not the
  /// replay's). `at`: an evaluator whose segment starts at w_s.
  TrainSignals chunk_signals(const PathStep& st, const Batch& bt, int64_t r0, int64_t nr,
                             const SegmentEvaluator& at, bool gradients = true) const;

  /// A second evaluator of the run's network, for a step's training side
  /// formed on another thread while ev holds the segment of the step whose
  /// test points are worked on (the reverse walk's training ahead). Made on
  /// first use; its segment is the caller's to set.
  SegmentEvaluator& ahead_evaluator();

  /// A third evaluator, for the test side of a step formed on another thread
  /// while ev works on the step after it (the reverse walk's features
  /// ahead): its segment set to st's and st's statistics held. Made on first
  /// use (call it once on the walk's thread first).
  SegmentEvaluator& features_evaluator(const PathStep& st);

  /// Keeps the training rows of two steps at once (the step being
  /// contracted and the one formed ahead), each within keep_doubles;
  /// otherwise a step's rows go when its walk ends (release_kept). Turned
  /// off, both steps' rows go.
  void keep_two_steps(bool on);
  /// The kept training rows of step `step` go, once its walk is done with them: they
  /// hold views of the replay's layer inputs and signals, which would
  /// otherwise live through the next step's replay (not with two steps
  /// kept, whose other step is formed ahead).
  void release_kept(int64_t step) const;

  const Manifest& m;
  const torch::Tensor x;
  const torch::Tensor& y_train;
  const int64_t n, M, K;
  /// What the networks and evaluators are made from.
  const NetworkOptions network_options;
  const ModuleRoute route;
  Network grad64, net64;
  SegmentEvaluator ev;
  const OutputMap map;
  const LossKind loss;
  const bool captured;
  /// Whether c_s G_s may be summed from the training rows' signals: they are
  /// recomputed (not captured), one row's do not depend on the others'
  /// (no batch statistics), and every parameter belongs to a layer with a
  /// gradient rule.
  const bool gradient_from_signals;
  /// The parameter tensors the contributions by layer are split over (layer_split.h).
  const std::vector<ParamInfo> layout;
  /// Memory for the training rows kept across a step's blocks of test points.
  int64_t keep_doubles = 0;
  /// A step's kept training rows: the step, its chunks by (first row, rows)
  /// and their doubles. The chunks are formed under its mutex.
  struct KeptStep {
    std::mutex mutex;
    int64_t step = -1;
    std::map<std::pair<int64_t, int64_t>, TrainSignals> chunks;
    int64_t doubles = 0;
    /// Holds step s from now on (its chunks emptied if it held another).
    void hold(int64_t s);
  };
  /// By the parity of the step: the step contracted and the one formed
  /// ahead never share one.
  mutable std::array<KeptStep, 2> kept;
  bool two_steps = false;
  Network ahead64{nullptr};
  std::unique_ptr<SegmentEvaluator> ahead_ev;
  Network features64{nullptr};
  std::unique_ptr<SegmentEvaluator> features_ev;
  /// Where the walk's time goes.
  mutable WalkClock clock;

 private:
  /// batch(), or batch_signals() without `gradient`.
  Batch batch_of(PathReader& reader, const PathStep& st, bool need_x, int64_t signal_chunk,
                 const SegmentEvaluator* at, bool gradient);
};

/// Adds the test features' counts and certificate to d's.
void tally(Decomposition& d, const TestFeatures& f);

/// A group of consecutive test points [first, first + count) (of all the
/// walk's points) in the chunk starting at `chunk` (point_groups.h), with its
/// test features and, for an observer, its share of the step's
/// contributions [count, b, K].
struct PointGroup {
  int64_t chunk = 0, first = 0, count = 0;
  TestFeatures f;
  torch::Tensor step_c;
};

/// Group g's counts added to d's and, with an observer, shown to it for
/// step `step` whose training rows are `train_index`; then its features go.
/// Called in point order, after the groups ran.
void take_group(Decomposition& d, const DecompositionOptions& options, const Walk& w, int64_t step,
                const torch::Tensor& train_index, PointGroup& g);

/// Keeps f's counts and certificate (what tally() takes) and frees the rest.
void keep_counts(TestFeatures& f);

/// The progress bar's status: the certificate and the integrand evaluations
/// per test point and step over the `point_steps` walked so far.
std::string status_line(const Decomposition& d, int64_t point_steps);

/// The decomposition's outputs before any step: f(w_0), f(w_N) in float64
/// (by net64, an engine_network of the run), f(w_N) as the run's own network
/// computes it, and zeros.
Decomposition start(PathReader& reader, Network& net64, const torch::Tensor& x, int64_t block);

/// Continues from saved progress: its accumulators replace d's. Returns the
/// progress, or null when there is none.
const DecompositionProgress* restore(DecompositionCheckpoint* checkpoint, Decomposition& d, int64_t chunk,
                                     bool kernel, Decomposition* block = nullptr);

/// Whether a walk saves its progress now: it has a checkpoint, steps remain
/// (`more`) and the checkpoint says a save is due.
inline bool save_due(DecompositionCheckpoint* checkpoint, bool more) {
  return checkpoint && more && checkpoint->due();
}

/// Saves where a walk stands (DecompositionProgress): the totals d after
/// `steps_done` steps of the chunk of test points starting at `chunk_start`,
/// chunks of `chunk` points; a forward walk inside a block of steps also
/// saves that block's sums (`block`), a reverse walk its accumulator Ã
/// (`acc`); undefined otherwise.
void save_progress(DecompositionCheckpoint& checkpoint, const Decomposition& d, int64_t chunk, int64_t chunk_start,
                   int64_t steps_done, const Decomposition& block, const torch::Tensor& acc);

/// What one test point costs in memory, and how many are computed together.
struct PointBudget {
  /// Doubles per test point: its test features (a guess at its rows) and,
  /// in the reverse walk, the accumulators Ã, A and J̄ P (three K x P
  /// matrices).
  int64_t per_point = 0;
  /// Doubles a test point holds for a whole walk of the path: in the reverse
  /// walk its accumulator Ã (one K x P matrix), kept while the chunk's other
  /// blocks take their turns; 0 in the forward walk.
  int64_t held_per_point = 0;
  /// Test points computed together: options.point_block, or when it is 0
  /// (automatic) 32 for a network whose test features are all factored (its
  /// decomposition is mostly thin GEMMs of the block's features against the
  /// training rows, which wider blocks make fewer and wider) and 4 otherwise
  /// (convolutions, sequences, modules: the test features are most of the
  /// work, and small blocks were measured faster; `git show
  /// bfd5e78:BENCHMARKS.md`); fewer
  /// when per_point doubles each would not fit in the budget. It does not
  /// depend on n, so a point's block (and its numbers) are the same in any
  /// split at block boundaries.
  int64_t block = 1;
  /// Whether every param layer's test features are factored (FeatureLayout):
  /// several threads then take groups of up to kFactoredGroupPoints, not one
  /// point each (point_groups).
  bool factored = false;
  /// The workers a block's groups are formed for (point_groups); 0: the
  /// caller's threads.
  int64_t group_workers = 0;
};

PointBudget point_budget(SegmentEvaluator& ev, PathReader& reader, const torch::Tensor& x,
                         const DecompositionOptions& options, bool reverse);

/// The groups of the test points [c0, c0 + nc) of a chunk, in point order:
/// each block of budget.block points (from c0) split as point_groups says
/// (the whole block with one worker; with several, a point a group, or up
/// to kFactoredGroupPoints for factored features), evenly.
std::vector<PointGroup> chunk_groups(const SegmentEvaluator& ev, int64_t c0, int64_t nc, const PointBudget& budget);

/// S(x) = Σ_s g(w_{s+1}, μ_{s+1}; x) − g(w_{s+1}, μ_s; x) over steps
/// [first, end): the test outputs' moves as BatchNorm's running statistics
/// jump at each step (docs/math.md §15), by two forward passes a step in
/// blocks of `block` test points, [n, K] float64. Undefined for a network
/// without BatchNorm in training mode.
torch::Tensor statistics_term(PathReader& reader, Network& net64, const torch::Tensor& x, int64_t first, int64_t end,
                              int64_t block);

/// The forward walk (gd, sgd) over steps [options.first_step, end_step)
/// (decomposition_forward.cpp).
Decomposition decompose_forward(PathReader& reader, const torch::Tensor& x_in, const DecompositionOptions& options,
                                int64_t end_step, DecompositionCheckpoint* checkpoint);

/// The reverse walk (optimizers with a buffer, or options.reverse) over the
/// whole path (decomposition_reverse.cpp).
Decomposition decompose_reverse(PathReader& reader, const torch::Tensor& x_in, const DecompositionOptions& options,
                                const UpdateRule& rule, DecompositionCheckpoint* checkpoint);

}  // namespace pathkernel::decomposition_walk
