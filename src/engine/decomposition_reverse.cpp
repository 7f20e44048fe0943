// The reverse walk of the decomposition (decomposition.h, docs/math.md §4),
// for optimizers with a buffer: chunk by chunk of test points, the path
// walked backwards with a dense test-side accumulator per point.
#include <algorithm>
#include <chrono>
#include <exception>
#include <future>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/Parallel.h>

#include "accumulator_step.h"
#include "add_at_rows.h"
#include "decomposition_walk.h"
#include "point_groups.h"
#include "pathkernel/blas_switch.h"
#include "pathkernel/context.h"
#include "pathkernel/error.h"
#include "pathkernel/progress.h"

namespace pathkernel::decomposition_walk {

namespace {

/// The residuals of a reverse walk's steps (StepResiduals). With a buffer,
/// step s's is the larger (against its bound) of the update's and the
/// buffer's b_s − β b_{s−1} − γ_s d_s; the walk meets b_{s−1} after b_s, so
/// each step is added once the next one visited brings it.
class ReverseResiduals {
 public:
  ReverseResiduals(const Manifest& m, double beta, StepResiduals& out)
      : eps_(kRoundingSlack * run_epsilon(m)), beta_(beta), out_(out) {}

  /// Step s: its update residual r against `bound`; b_s and γ_s d_s (undefined without a buffer).
  void visit(int64_t s, double r, double bound, const torch::Tensor& b, const torch::Tensor& gd) {
    if (!b.defined()) {
      out_.add(s, r, bound);
      return;
    }
    // Steps skipped on resuming leave the pending one without its b_{s−1}: only its update counts.
    if (pending_ >= 0) finish(pending_ == s + 1 ? b : torch::Tensor());
    pending_ = s;
    r_ = r;
    bound_ = bound;
    b_ = b;
    gd_ = gd;
  }
  /// After the walk: the pending step 0 has b_{−1} = 0.
  void finish_walk() {
    if (pending_ == 0) finish(torch::zeros_like(b_));
    else if (pending_ > 0) finish(torch::Tensor());
    pending_ = -1;
  }

 private:
  void finish(const torch::Tensor& prev) {
    double r = r_, bound = bound_;
    if (prev.defined()) {
      const double rb = max_abs(b_ - beta_ * prev - gd_);
      const double bb = eps_ * (max_abs(b_) + beta_ * max_abs(prev) + max_abs(gd_));
      if (rb * bound > r * bb) {  // rb / bb > r / bound, without dividing by zero
        r = rb;
        bound = bb;
      }
    }
    out_.add(pending_, r, bound);
  }

  double eps_, beta_;
  StepResiduals& out_;
  int64_t pending_ = -1;
  double r_ = 0, bound_ = 0;
  torch::Tensor b_, gd_;
};

/// Test points per chunk of the reverse walk (one replay of the path each),
/// in whole blocks, at most n rounded up to a block. One block at a time
/// takes its test features and products (per_point each); the chunk's other
/// points hold only their accumulators (held_per_point each), so a chunk
/// holds as many points as the budget left by one block allows.
int64_t chunk_size(const DecompositionOptions& options, const PointBudget& budget, int64_t n, int64_t block) {
  const int64_t left = std::max<int64_t>(0, options.memory_doubles - block * budget.per_point);
  const int64_t fit = 1 + left / std::max<int64_t>(1, block * budget.held_per_point);
  const int64_t blocks = (std::max<int64_t>(1, n) + block - 1) / block;
  return std::min(fit, blocks) * block;
}

/// The reverse walk's accumulator Ã of a chunk of test points, [nc, K, P], as
/// one allocation per group of points (ReverseWalk's groups: a block, a
/// point, or a factored network's share of a block). A BLAS may round a
/// row's product by where the row lies in memory (OpenBLAS's AVX-512
/// matrix-vector kernel does, by 1e-14, for a view that starts part-way into
/// a buffer): in a buffer of its own, each group's rows lie alike whichever
/// groups come before it, so a group of points gets the same bits alone as
/// among others (docs/math.md §12).
class AccumulatorBlocks {
 public:
  AccumulatorBlocks(const std::vector<PointGroup>& groups, int64_t K, int64_t P) {
    for (const PointGroup& g : groups) {
      first_.push_back(g.first);
      blocks_.push_back(torch::zeros({g.count, K, P}, torch::kFloat64));
    }
  }
  /// The group of points starting at point g0.
  torch::Tensor& block(int64_t g0) {
    const auto at = std::lower_bound(first_.begin(), first_.end(), g0);
    PK_ASSERT(at != first_.end() && *at == g0);
    return blocks_[static_cast<size_t>(at - first_.begin())];
  }
  /// All groups, joined in point order (saved progress).
  torch::Tensor joined() const { return torch::cat(blocks_, 0); }
  /// Takes the values of `all`, [nc, K, P] (restored progress).
  void assign(const torch::Tensor& all) {
    int64_t b0 = 0;
    for (torch::Tensor& b : blocks_) {
      b.copy_(all.narrow(0, b0, b.size(0)));
      b0 += b.size(0);
    }
  }

 private:
  std::vector<int64_t> first_;
  std::vector<torch::Tensor> blocks_;
};

/// A chunk of test points of the reverse walk, [c0, c0 + nc): its groups,
/// its accumulator Ã_{s+1} (0 after the last step), one buffer per group,
/// and the steps of it done.
struct ReverseChunk {
  ReverseChunk(const Walk& w, int64_t c0, int64_t nc, const PointBudget& budget, int64_t P)
      : c0(c0), nc(nc), groups(chunk_groups(w.ev, c0, nc, budget)), acc(groups, w.K, P) {}
  int64_t c0, nc;
  std::vector<PointGroup> groups;  ///< without features: what each step's groups start from
  AccumulatorBlocks acc;
  int64_t steps_done = 0;
};

/// A step whose training side (Walk::batch) is formed on another thread
/// while the walk works on the step after it: the step (its tensors shared
/// with the reader's) and the batch to come. Waits for the task when it
/// goes, so that none outlives the walk.
struct StepAhead {
  PathStep st;
  std::future<Walk::Batch> batch;
  /// The test features of the chunk's groups in turn, where they are formed
  /// ahead too (ReverseWalk::features_ahead_); else not valid.
  std::future<std::vector<TestFeatures>> features;
  StepAhead() = default;
  StepAhead(const StepAhead&) = delete;
  StepAhead& operator=(const StepAhead&) = delete;
  ~StepAhead() {
    if (batch.valid()) batch.wait();
    if (features.valid()) features.wait();
  }
};

/// What step s gives every block of test points: its batch, d_s = c_s G_s +
/// λ_c w_s, the update's coefficients, the buffer b_s (undefined without one)
/// and the update's residual e_s.
struct ReverseStep {
  Walk::Batch bt;
  torch::Tensor dvec;
  StepCoefficients c;
  torch::Tensor buf, residual;
  torch::Tensor buf_input;  ///< γ_s Q_s d_s, what the step added to b_s (undefined without a buffer)
};

/// The reverse walk's state across its chunks of test points: the totals d
/// it adds to, the progress bar and the saved progress.
class ReverseWalk {
 public:
  ReverseWalk(PathReader& reader, const DecompositionOptions& options, const UpdateRule& rule,
              DecompositionCheckpoint* checkpoint, Walk& w, Decomposition& d, ProgressBar& bar,
              const PointBudget& budget, int64_t chunk)
      : reader_(reader),
        m_(reader.manifest()),
        options_(options),
        rule_(rule),
        checkpoint_(checkpoint),
        w_(w),
        d_(d),
        bar_(bar),
        budget_(budget),
        workers_(point_workers(w.ev, std::min(chunk, w.n))),
        chunk_(chunk),
        K_(w.K),
        P_(m_.parameter_count),
        beta_(rule.beta()),
        lambda_(rule.coupled_decay()),
        ahead_(options.training_ahead && current_threads() >= 2 && w.ev.path_route().concurrent_points() &&
               !w.ev.path_route().couples_batch()) {}

  /// Walks the path backwards for the chunk of test points starting at c0,
  /// from the saved progress `resumed` when it stopped in this chunk.
  void walk_chunk(int64_t c0, const DecompositionProgress* resumed) {
    // Without a buffer (rmsprop, adagrad, sgd walked in reverse) Ã stays 0: [nc, K, 0].
    const int64_t acc_width = rule_.has_buffer() ? P_ : 0;
    ReverseChunk ch(w_, c0, std::min(chunk_, w_.n - c0), budget_, acc_width);
    if (resumed && c0 == resumed->chunk_start) {
      PK_CHECK(resumed->acc.defined() && resumed->acc.sizes() == torch::IntArrayRef({ch.nc, K_, acc_width}),
               "the saved progress has no accumulator of shape [" << ch.nc << ", " << K_ << ", " << acc_width
                                                                  << "]; delete it to start over");
      ch.acc.assign(resumed->acc);
      ch.steps_done = resumed->steps_done;
      done += ch.steps_done;
    }
    const int64_t skip_from = m_.steps - ch.steps_done;  // steps s >= skip_from are done
    ReverseResiduals residuals(m_, beta_, d_.residuals);
    const auto replay_start = std::chrono::steady_clock::now();
    {
      ReplayAheadScope ahead(reader_, options_.replay_ahead);
      // Forming step s−1's training side while step s's test points are
      // worked on: the two steps' training rows are kept at once, and
      // OpenBLAS (one count for the process) runs on one thread for both.
      std::optional<BlasThreads> one_blas;
      if (ahead_) {
        one_blas.emplace(1);
        w_.keep_two_steps(true);
        (void)w_.ahead_evaluator();  // made here, not on the task's thread
      }
      auto walk = [&](const PathStep& st, StepAhead* ahead) {
        w_.clock.step([&] { step(st, ahead, ch, residuals); });
      };
      // Fewer groups of test points than threads (one point): every other
      // step's test features are formed ahead too, so that both threads
      // work on test features, where the memory budget holds a second
      // step's.
      features_ahead_ = ahead_ && !options_.on_step && static_cast<int64_t>(ch.groups.size()) < current_threads() &&
                        2 * ch.nc * budget_.per_point <= options_.memory_doubles;
      if (features_ahead_) (void)w_.features_evaluator(PathStep());  // made here, not on the task's thread
      int64_t turn = 0;
      std::unique_ptr<StepAhead> held;  // formed ahead, walked next
      reader_.reverse([&](const PathStep& st) {
        if (st.step >= skip_from) return;
        if (!ahead_) return walk(st, nullptr);
        std::unique_ptr<StepAhead> next = form_ahead(st, features_ahead_ && turn++ % 2 == 1 ? &ch : nullptr);
        if (held) walk(held->st, held.get());
        held = std::move(next);
      });
      if (held) walk(held->st, held.get());
      held.reset();
      w_.keep_two_steps(false);
    }
    reader_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - replay_start).count();
    ahead_seconds += reader_.replay_ahead_seconds();
    residuals.finish_walk();
  }

  int64_t done = 0;  ///< steps walked, summed over the chunks (the progress bar's)
  double reader_seconds = 0;  ///< the reader's walks, steps included (WalkClock::split)
  double ahead_seconds = 0;   ///< the replay's on its own thread (TimeSplit::replay_ahead)

 private:
  /// Step st for the chunk's groups of test points, then the bar and the
  /// saved progress. The threads take the chunk's groups in turn, so a
  /// thread done with its point takes the next instead of waiting for the
  /// rest of its block; with an observer, one block's groups at a time,
  /// which keep their features until it has seen them.
  void step(const PathStep& st, StepAhead* ahead, ReverseChunk& ch, ReverseResiduals& residuals) {
    w_.ev.set_segment(st.w, st.delta);
    w_.hold_statistics(st);  // μ_s: the segment is g(w_s + t Δw_s, μ_s; x)
    // G_s from the chunks the contractions take
    Walk::Batch bt = ahead ? ahead->batch.get() : w_.batch(reader_, st, false, options_.train_chunk);
    w_.finish_batch(st, bt, options_.train_chunk);  // formed ahead without c_s G_s
    const ReverseStep t = step_terms(st, std::move(bt));
    if (ch.c0 == 0) {  // the steps' residuals, once (they do not depend on the test points)
      residuals.visit(st.step, max_abs(t.residual), update_bound(m_, st), t.buf, t.buf_input);
    }
    // Features formed ahead are the chunk's groups' in turn (only without
    // an observer, so all the chunk's groups are walked at once).
    std::vector<TestFeatures> formed;
    if (ahead && ahead->features.valid()) formed = ahead->features.get();
    // With features formed ahead, every step's groups run as that task's do
    // (the same bits whichever thread takes a step).
    std::optional<GroupThreadScope> as_group;
    if (features_ahead_) as_group.emplace();
    // With an observer, one block's groups at a time; else all the chunk's.
    const std::vector<PointGroup>& all = ch.groups;
    auto block_of = [&](const PointGroup& g) { return (g.first - ch.c0) / budget_.block; };
    for (size_t u0 = 0, u1 = 0; u0 < all.size(); u0 = u1) {
      for (u1 = u0 + 1; u1 < all.size() && (!options_.on_step || block_of(all[u1]) == block_of(all[u0]));) ++u1;
      std::vector<PointGroup> groups(all.begin() + static_cast<std::ptrdiff_t>(u0),
                                     all.begin() + static_cast<std::ptrdiff_t>(u1));
      run_point_groups(
          static_cast<int64_t>(groups.size()),
          [&](int64_t g) {
            group_terms(st, t, ch, groups[static_cast<size_t>(g)],
                        formed.empty() ? nullptr : &formed[u0 + static_cast<size_t>(g)]);
          },
          workers_);
      for (PointGroup& g : groups) take_group(d_, options_, w_, st.step, t.bt.idx, g);
    }
    w_.release_kept(st.step);
    bar_.update(++done, status_line(d_, ch.c0 * m_.steps + ch.nc * (m_.steps - st.step)));
    ++ch.steps_done;
    if (save_due(checkpoint_, st.step > 0)) {
      save_progress(*checkpoint_, d_, chunk_, ch.c0, ch.steps_done, Decomposition(), ch.acc.joined());
    }
  }

  /// Step st's training side, formed on a task of LibTorch's inter-op pool
  /// by the walk's second evaluator (one OpenMP thread: the walk's own
  /// thread keeps its count); with a chunk, its groups' test features too,
  /// on another task by the walk's third evaluator. The task forms the
  /// batch's signals only (Walk::batch_signals): the per-sample gradients
  /// and c_s G_s are formed when the walk takes the step (finish_batch), as
  /// the task was the walk's critical path (a user's CNN, one test point:
  /// its per-sample convolution gradients were a quarter of the task).
  std::unique_ptr<StepAhead> form_ahead(const PathStep& st, const ReverseChunk* features_of) {
    auto ahead = std::make_unique<StepAhead>();
    ahead->st = st;
    auto promise = std::make_shared<std::promise<Walk::Batch>>();
    ahead->batch = promise->get_future();
    const PathStep* s = &ahead->st;  // stays where it is: ahead is held by pointer
    // The reader may switch OpenBLAS's kernels when this step's segment
    // ends: not before the task is done (BlasKernelsHeld).
    auto held = std::make_shared<BlasKernelsHeld>();
    at::launch([this, promise, s, held]() mutable {
      try {
        OpenMpThreads single(1);
        SegmentEvaluator& at = w_.ahead_evaluator();
        at.set_segment(s->w, s->delta);
        Walk::Batch batch = w_.batch_signals(reader_, *s, options_.train_chunk, at);
        held.reset();
        promise->set_value(std::move(batch));
      } catch (...) {
        held.reset();
        promise->set_exception(std::current_exception());
      }
    });
    if (features_of) ahead->features = features_ahead(*s, features_of->groups);
    return ahead;
  }

  /// The test features of `groups` at step st, in turn, on a task of the
  /// inter-op pool, as a group's are formed on the walk's threads
  /// (GroupThreadScope).
  std::future<std::vector<TestFeatures>> features_ahead(const PathStep& st, const std::vector<PointGroup>& groups) {
    auto promise = std::make_shared<std::promise<std::vector<TestFeatures>>>();
    std::future<std::vector<TestFeatures>> out = promise->get_future();
    auto held = std::make_shared<BlasKernelsHeld>();  // as form_ahead's task
    at::launch([this, promise, s = &st, g = &groups, held]() mutable {
      try {
        GroupThreadScope as_group;
        SegmentEvaluator& fe = w_.features_evaluator(*s);
        std::vector<TestFeatures> f;
        for (const PointGroup& p : *g) {
          WalkClock::Scope timed(w_.clock, WalkClock::kTestFeatures);
          f.push_back(test_features(fe, w_.x.narrow(0, p.first, p.count), options_.quadrature));
        }
        held.reset();
        promise->set_value(std::move(f));
      } catch (...) {
        held.reset();
        promise->set_exception(std::current_exception());
      }
    });
    return out;
  }

  ReverseStep step_terms(const PathStep& st, Walk::Batch bt) {
    ReverseStep t;
    t.bt = std::move(bt);
    t.dvec = t.bt.gradient + lambda_ * st.w;  // d_s = c_s G_s + λ_c w_s
    t.c = rule_.step(st.step, st.lr, st.w, st.state);
    t.buf = rule_.buffer(st.state);
    if (t.buf.defined()) t.buf_input = UpdateRule::buffer_input(t.c, t.dvec);
    t.residual = st.delta - UpdateRule::update(t.c, t.dvec, t.buf);
    return t;
  }

  /// Step st's terms for group g of the chunk's test points: Ã updated in
  /// place, A_s, and their shares of C_i, R and E (in the group's rows of d,
  /// so groups may run at once).
  void group_terms(const PathStep& st, const ReverseStep& t, ReverseChunk& ch, PointGroup& g,
                   TestFeatures* formed) {
    SegmentEvaluator& ev = w_.ev;
    const Walk::Batch& bt = t.bt;
    const int64_t nb = g.count, p0 = g.first;
    const torch::Tensor xb_test = w_.x.narrow(0, p0, nb);
    torch::Tensor acc_b = ch.acc.block(p0);  // updated in place
    torch::Tensor erow = torch::zeros({nb, K_}, torch::kFloat64);
    // The part of Ã_{s+1} ε_{s+1} that needs b_s: −β Ã_{s+1} b_s.
    if (t.buf.defined()) erow -= beta_ * torch::matmul(acc_b, t.buf);

    TestFeatures& f = g.f;
    if (formed) {
      f = std::move(*formed);
    } else {
      WalkClock::Scope timed(w_.clock, WalkClock::kTestFeatures);
      f = test_features(ev, xb_test, options_.quadrature);
    }
    torch::Tensor a;
    {  // the accumulator's algebra, timed with the contractions
      WalkClock::Scope timed(w_.clock, WalkClock::kContraction);
      d_.gap_abs.narrow(0, p0, nb).add_(f.gap.abs());
      erow += apply_features(ev, f, t.residual);
      if (t.c.rho.defined()) d_.regularization.narrow(0, p0, nb).add_(apply_features(ev, f, t.c.rho));
      // a_s and Ã_s in one pass over the group's dense features [nb, K, P]
      a = accumulator_step(dense_features(ev, f), t.c.metric, t.buf.defined() ? acc_b : torch::Tensor(),
                           {t.c.alpha, beta_, t.c.kappa, t.c.gamma}, t.c.buffer_metric);
      if (t.buf.defined()) erow += torch::matmul(acc_b, t.buf - t.buf_input);
      d_.rounding.narrow(0, p0, nb).add_(erow);
      if (lambda_ != 0) d_.regularization.narrow(0, p0, nb).add_(lambda_ * torch::matmul(a, st.w));
    }
    torch::Tensor& step_c = g.step_c;
    if (options_.on_step) step_c = torch::empty({nb, bt.b, K_}, torch::kFloat64);
    w_.train_chunks(
        st, bt, options_.train_chunk, 1.0, [&](const TrainSignals& tr) { return contract_dense(ev, a, tr); },
        [&](int64_t r0, int64_t nr, const torch::Tensor& part) {  // [nb, nr, K]
          add_at_rows(d_.contributions.narrow(0, p0, nb), bt.idx.narrow(0, r0, nr), part);
          if (step_c.defined()) step_c.narrow(1, r0, nr).copy_(part);
        });
    if (options_.by_layer) {  // the same terms split by parameter tensor
      w_.train_chunks(
          st, bt, options_.train_chunk, 1.0,
          [&](const TrainSignals& tr) { return contract_dense_by_tensor(ev, a, tr, w_.layout); },
          [&](int64_t r0, int64_t nr, const torch::Tensor& part) {  // [nb, nr, K, L]
            add_at_rows(d_.layer_contributions.narrow(0, p0, nb), bt.idx.narrow(0, r0, nr), part);
          });
    }
    if (!options_.on_step) keep_counts(f);  // the features' memory goes now
  }

  PathReader& reader_;
  const Manifest& m_;
  const DecompositionOptions& options_;
  const UpdateRule& rule_;
  DecompositionCheckpoint* checkpoint_;
  Walk& w_;
  Decomposition& d_;
  ProgressBar& bar_;
  const PointBudget budget_;
  const int64_t workers_, chunk_, K_, P_;
  const double beta_, lambda_;
  /// Whether each step's training side is formed ahead (training_ahead).
  const bool ahead_;
  /// Whether every other step's test features are formed ahead as well (a
  /// chunk of fewer groups than threads, walked without an observer).
  bool features_ahead_ = false;
};

}  // namespace

/// Reverse accumulation (docs/math.md §4) for optimizers with a buffer. For each
/// chunk of test points, walking s = N−1 .. 0 with one [n, K, P]
/// accumulator Ã_s = κ_s J̄_s P_s + β Ã_{s+1}:
///   A_s = α_s J̄_s P_s + γ_s Ã_s,  C_i += A_s g_{i,s} / |B_s|,  R += λ_c A_s w_s + J̄_s ρ_s,
/// and, with the recorded buffers b_s and the step residuals e_s,
///   E = Σ_s J̄_s e_s + Σ_s Ã_s (b_s − β b_{s−1} − γ_s d_s),
/// so that completeness holds exactly up to quadrature.
Decomposition decompose_reverse(PathReader& reader, const torch::Tensor& x_in, const DecompositionOptions& options,
                                const UpdateRule& rule, DecompositionCheckpoint* checkpoint) {
  auto t0 = std::chrono::steady_clock::now();
  const Manifest& m = reader.manifest();
  PK_CHECK(!options.kernel, "the kernel output is built for gd and sgd runs; run '"
                                << reader.dir() << "' used '" << m.optimizer.name << "' (turn the kernel off)");
  Walk w(reader, x_in, options);
  const PointBudget budget = point_budget(w.ev, reader, w.x, options, true);
  const int64_t block = budget.block;
  Decomposition d = start(reader, w.grad64, w.x, block);
  if (options.by_layer) {
    d.layer_contributions =
        torch::zeros({w.n, w.M, w.K, static_cast<int64_t>(w.layout.size())}, torch::kFloat64);
  }
  const int64_t chunk = chunk_size(options, budget, w.n, block);
  const int64_t chunks = (w.n + chunk - 1) / chunk;
  CaptureScope capture(reader, w.captured, w.ev);

  const DecompositionProgress* resumed = restore(checkpoint, d, chunk, false);
  ProgressBar bar(m.steps * chunks, "decompose", options.progress);
  ReverseWalk walk(reader, options, rule, checkpoint, w, d, bar, budget, chunk);
  for (int64_t c0 = 0; c0 < w.n; c0 += chunk) {
    if (resumed && c0 < resumed->chunk_start) {  // finished before the interruption
      walk.done += m.steps;
      continue;
    }
    walk.walk_chunk(c0, resumed);
  }
  bar.finish();
  d.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  d.time_split = w.clock.split(walk.reader_seconds);
  d.time_split.replay_ahead = walk.ahead_seconds;
  return d;
}

}  // namespace pathkernel::decomposition_walk
