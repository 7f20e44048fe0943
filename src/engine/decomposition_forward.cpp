// The forward walk of the decomposition (decomposition.h, docs/math.md §4),
// for gd and sgd: the path walked once from step 0, every test point at every
// step, each block of steps' sums added to the totals at the block's end.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <iterator>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "add_at_rows.h"
#include "decomposition_walk.h"
#include "pathkernel/blas_switch.h"
#include "pathkernel/context.h"
#include "pathkernel/progress.h"
#include "point_groups.h"

namespace pathkernel::decomposition_walk {

namespace {

/// Training rows per contraction of the forward walk: options.train_chunk,
/// or more, up to the whole batch of b rows, when every layer's features are
/// factored (Rows or Summed) and no kernel is asked for. contract()'s
/// temporaries then take at most about 4·K·R doubles per training row (R the
/// features' rows), and the chunk is as many rows as fit the memory budget:
/// fewer, wider products, and the Rows form's block formed fewer times.
int64_t contraction_rows(const DecompositionOptions& options, const TestFeatures& f, int64_t K, int64_t b) {
  if (options.kernel || !f.factored()) return options.train_chunk;
  const int64_t per_row = 4 * K * std::max<int64_t>(1, f.point.size(0));
  return std::max(options.train_chunk, std::min(b, options.memory_doubles / per_row));
}

/// The training points the batches of steps [a, b) touch, sorted, once
/// each; undefined when a step takes every point (full-batch gd).
torch::Tensor rows_touched(PathReader& reader, int64_t a, int64_t b) {
  std::vector<torch::Tensor> batches;
  for (int64_t t = a; t < b; ++t) {
    batches.push_back(reader.batch(t));
    if (!batches.back().defined()) return torch::Tensor();
  }
  return std::get<0>(torch::_unique(torch::cat(batches), /*sorted=*/true));
}

/// The blocks of steps (step_blocks) cut to [first, end), as [a, b) ranges.
std::vector<std::pair<int64_t, int64_t>> blocks_in(const Manifest& m, int64_t first, int64_t end) {
  const std::vector<int64_t> bounds = step_blocks(m);
  std::vector<std::pair<int64_t, int64_t>> out;
  for (size_t k = 0; k + 1 < bounds.size(); ++k) {
    const int64_t a = std::max(first, bounds[k]), b = std::min(end, bounds[k + 1]);
    if (a < b) out.emplace_back(a, b);
  }
  return out;
}

/// The training points that exactly one block of the steps [first, end)
/// touches (bool [M]), or undefined when there are none, as in full-batch
/// gd over two blocks or more. Their rows of the totals are zero until that
/// block and are not touched after it.
torch::Tensor touched_by_one_block(PathReader& reader, int64_t first, int64_t end, int64_t M) {
  torch::Tensor blocks = torch::zeros({M}, torch::kInt);
  for (const auto& [a, b] : blocks_in(reader.manifest(), first, end)) {
    const torch::Tensor touched = rows_touched(reader, a, b);
    if (touched.defined()) blocks.index_add_(0, touched, torch::ones({touched.size(0)}, torch::kInt));
    else blocks.add_(1);
  }
  const torch::Tensor once = blocks.eq(1);
  return once.any().item<bool>() ? once : torch::Tensor();
}

/// The sums of the block of steps in progress (step_blocks(), cut to the
/// range [first_step, end_step)), each block from zero, added to the totals
/// at the block's end. Its training side holds only the rows its batches
/// touch (`rows`, at row_pos_; all M rows, undefined, for full-batch gd): the
/// same additions, in the same order, as an [n, M, K] block would make, for
/// less memory.
///
/// The rows of training points that no other block of the walk touches
/// (`once`, touched_by_one_block) are added straight into the totals' rows
/// instead: those are zero until this block, so they take the same
/// additions in the same order, and the block's sums hold only the rows
/// that other blocks share (a one-epoch run of SGD: none).
class StepBlock {
 public:
  /// `totals` (whose contributions, kernel and contributions by layer take
  /// the rows of `once`) must outlive the block; undefined `once`: none.
  StepBlock(PathReader& reader, int64_t first_step, int64_t end_step, int64_t n, int64_t M, int64_t K, bool kernel,
            int64_t layers, Decomposition* totals, torch::Tensor once)
      : reader_(reader),
        bounds_(step_blocks(reader.manifest())),
        first_step_(first_step),
        end_step_(end_step),
        n_(n),
        M_(M),
        K_(K),
        kernel_(kernel),
        layers_(layers),
        totals_(totals),
        once_(totals ? std::move(once) : torch::Tensor()) {}

  /// The start of the block that holds step s.
  int64_t start(int64_t s) const {
    return std::max(first_step_, *(std::upper_bound(bounds_.begin(), bounds_.end(), s) - 1));
  }
  /// Its end.
  int64_t end(int64_t s) const { return std::min(end_step_, *std::upper_bound(bounds_.begin(), bounds_.end(), s)); }

  /// Zero sums for the block that holds step s.
  void open(int64_t s) {
    rows = rows_touched(reader_, start(s), end(s));
    torch::Tensor direct;  // the block's training points that no other block touches
    if (once_.defined()) {
      const torch::Tensor touched = rows.defined() ? rows : torch::arange(M_, torch::kLong);
      const torch::Tensor alone = once_.index_select(0, touched);
      direct = touched.masked_select(alone);
      rows = touched.masked_select(alone.logical_not());
    }
    if (rows.defined() && rows.size(0) == M_) rows = torch::Tensor();
    row_pos_ = torch::Tensor();
    if (rows.defined()) {
      row_pos_ = torch::full({M_}, -1, torch::kLong);
      row_pos_.index_copy_(0, rows, torch::arange(rows.size(0), torch::kLong));
      if (direct.defined()) row_pos_.index_copy_(0, direct, -direct - 1);  // −1 − m: row m of the totals
    }
    const int64_t count = rows.defined() ? rows.size(0) : M_;
    sums.contributions = torch::zeros({n_, count, K_}, torch::kFloat64);
    sums.regularization = torch::zeros({n_, K_}, torch::kFloat64);
    sums.rounding = torch::zeros({n_, K_}, torch::kFloat64);
    sums.gap_abs = torch::zeros({n_, K_}, torch::kFloat64);
    if (kernel_) sums.kernel = torch::zeros({n_, count, K_, K_}, torch::kFloat64);
    if (layers_) sums.layer_contributions = torch::zeros({n_, count, K_, layers_}, torch::kFloat64);
  }

  /// field[first:first+count, row of idx[i]] += part[:, i] for the step's
  /// batch rows idx, in increasing i: into the block's sums, or, for a
  /// training point no other block touches, into the totals' row.
  void add(torch::Tensor Decomposition::*field, int64_t first, int64_t count, const torch::Tensor& idx,
           const torch::Tensor& part) {
    torch::Tensor at = row_pos_.defined() ? row_pos_.index_select(0, idx) : idx;
    torch::Tensor sums_part = part;
    if (once_.defined()) {
      const torch::Tensor direct = at.lt(0);
      if (direct.any().item<bool>()) {
        const torch::Tensor i = direct.nonzero().squeeze(1);
        add_at_rows((totals_->*field).narrow(0, first, count), -at.index_select(0, i) - 1, part.index_select(1, i));
        const torch::Tensor kept = direct.logical_not().nonzero().squeeze(1);
        if (kept.size(0) == 0) return;
        at = at.index_select(0, kept);
        sums_part = part.index_select(1, kept);
      }
    }
    add_at_rows((sums.*field).narrow(0, first, count), at, sums_part);
  }

  Decomposition sums;  ///< the block's terms of C_i (its shared rows), R, E, gap_abs and the kernel so far
  torch::Tensor rows;  ///< int64: training point of each row of the block's sums; undefined: all M

 private:
  PathReader& reader_;
  const std::vector<int64_t> bounds_;
  const int64_t first_step_, end_step_, n_, M_, K_;
  const bool kernel_;
  const int64_t layers_;  ///< L, the parameter tensors of the contributions by layer; 0: none kept
  Decomposition* totals_;
  const torch::Tensor once_;  ///< bool [M]: the training points one block of the walk touches; undefined: none
  /// int64 [M]: each training point's row in the block's sums; −1 − m: row m
  /// of the totals; −1 also for points the block does not touch.
  torch::Tensor row_pos_;
};

/// What step s gives every group of test points: its batch and the
/// directions of regularisation ρ_s and rounding e_s, [P].
struct ForwardStep {
  Walk::Batch bt;
  torch::Tensor rho, e;
};

/// The forward walk's state across its steps: the totals d it adds to, the
/// block of steps in progress, the progress bar and the saved progress.
class ForwardWalk {
 public:
  ForwardWalk(PathReader& reader, const DecompositionOptions& options, DecompositionCheckpoint* checkpoint, Walk& w,
              Decomposition& d, StepBlock& blk, ProgressBar& bar, const PointBudget& budget, int64_t end_step)
      : reader_(reader),
        m_(reader.manifest()),
        options_(options),
        checkpoint_(checkpoint),
        w_(w),
        d_(d),
        blk_(blk),
        bar_(bar),
        budget_(budget),
        end_step_(end_step),
        lambda_(m_.optimizer.weight_decay) {}

  /// Where a block of steps' sums go when it ends, if not to the totals d.
  std::function<void(StepBlock&)> on_block_end;
  /// Runs each group under c10::InferenceMode even on one worker, as
  /// groups run beside others (a worker of the steps on threads).
  bool inference_groups = false;

  /// Step st for every test point. With several threads each point is a
  /// group (point_groups.h), its features and contractions on one thread.
  /// The groups of all chunks are taken in turn, so a thread done with its
  /// group takes the next, of any chunk, instead of waiting for the rest of
  /// its chunk (the points' kinks, and so their work, differ).
  /// Counts, and the caller's view of each group, come after the groups, in
  /// point order. With an observer (on_step), one chunk's groups at a time,
  /// which keep their features until it has seen them; without, a group
  /// keeps its counts.
  void step(const PathStep& st) {
    w_.ev.set_segment(st.w, st.delta);
    w_.hold_statistics(st);  // μ_s: the segment is g(w_s + t Δw_s, μ_s; x)
    const ForwardStep t = step_terms(st);
    std::vector<PointGroup> parts = groups();
    for (size_t u0 = 0, u1 = 0; u0 < parts.size(); u0 = u1) {
      for (u1 = u0 + 1; u1 < parts.size() && (!options_.on_step || parts[u1].chunk == parts[u0].chunk);) ++u1;
      run_point_groups(
          static_cast<int64_t>(u1 - u0),
          [&](int64_t g) {
            std::optional<c10::InferenceMode> as_group;  // as a group runs beside others
            if (inference_groups) as_group.emplace();
            group_terms(st, t, parts[u0 + static_cast<size_t>(g)]);
          },
          point_workers(w_.ev, w_.n));
      for (size_t u = u0; u < u1; ++u) take_group(d_, options_, w_, st.step, t.bt.idx, parts[u]);
    }
    end_of_step(st);
  }

 private:
  /// The step's batch and directions, and its residual added to d's.
  ForwardStep step_terms(const PathStep& st) {
    ForwardStep t;
    // The kernel needs the batch's rows. G_s is summed from the training
    // signals the step's contractions take (kept for them) where the route
    // gives them: one pass over the batch, not a second by autograd.
    t.bt = w_.batch(reader_, st, options_.kernel, options_.train_chunk);
    // Regularisation (only where there is weight decay) and rounding directions of this step.
    if (lambda_ != 0) t.rho = -st.lr * lambda_ * st.w;
    const UpdateResidual e = update_residual(m_, st, t.bt.gradient, lambda_);
    t.e = e.e;
    d_.residuals.add(st.step, e.max_abs, e.bound);
    return t;
  }

  /// The groups of every chunk (one block each) of test points, in point order.
  std::vector<PointGroup> groups() const {
    std::vector<PointGroup> parts;
    for (int64_t c0 = 0; c0 < w_.n; c0 += budget_.block) {
      std::vector<PointGroup> chunk = chunk_groups(w_.ev, c0, std::min(budget_.block, w_.n - c0), budget_);
      std::move(chunk.begin(), chunk.end(), std::back_inserter(parts));
    }
    return parts;
  }

  /// Group p's test features and its terms of the block's sums (on one thread).
  void group_terms(const PathStep& st, const ForwardStep& t, PointGroup& p) {
    SegmentEvaluator& ev = w_.ev;
    const Walk::Batch& bt = t.bt;
    Decomposition& blk = blk_.sums;
    const int64_t K = w_.K;
    {
      WalkClock::Scope timed(w_.clock, WalkClock::kTestFeatures);
      p.f = test_features(ev, w_.x.narrow(0, p.first, p.count), options_.quadrature);
    }
    const TestFeatures& f = p.f;
    {
      WalkClock::Scope timed(w_.clock, WalkClock::kContraction);
      blk.gap_abs.narrow(0, p.first, p.count).add_(f.gap.abs());
      if (lambda_ != 0) blk.regularization.narrow(0, p.first, p.count).add_(apply_features(ev, f, t.rho));
      blk.rounding.narrow(0, p.first, p.count).add_(apply_features(ev, f, t.e));
    }
    if (options_.on_step) p.step_c = torch::empty({p.count, bt.b, K}, torch::kFloat64);
    // Where G_s was summed from the training signals (step_terms), its
    // chunks are kept: the contraction takes the same ones.
    const int64_t rows = bt.from_signals ? options_.train_chunk : contraction_rows(options_, f, K, bt.b);
    w_.train_chunks(
        st, bt, rows, -st.lr, [&](const TrainSignals& tr) { return contract(ev, f, tr); },
        [&](int64_t r0, int64_t nr, const torch::Tensor& part) {  // [count, nr, K]
          const torch::Tensor idx = bt.idx.narrow(0, r0, nr);
          blk_.add(&Decomposition::contributions, p.first, p.count, idx, part);
          if (p.step_c.defined()) p.step_c.narrow(1, r0, nr).copy_(part);
          if (options_.kernel) {
            blk_.add(&Decomposition::kernel, p.first, p.count, idx, output_kernel(ev, f, bt.xb.narrow(0, r0, nr)));
          }
        });
    if (options_.by_layer) {  // the same terms split by parameter tensor, into their own sums
      w_.train_chunks(
          st, bt, options_.train_chunk, -st.lr,
          [&](const TrainSignals& tr) { return contract_by_tensor(ev, f, tr, w_.layout); },
          [&](int64_t r0, int64_t nr, const torch::Tensor& part) {  // [count, nr, K, L]
            blk_.add(&Decomposition::layer_contributions, p.first, p.count, bt.idx.narrow(0, r0, nr), part);
          });
    }
    if (!options_.on_step) keep_counts(p.f);  // the features' memory goes now
  }

  /// The bar; at a block's end its sums added to d's; the saved progress.
  void end_of_step(const PathStep& st) {
    w_.release_kept(st.step);
    const int64_t walked = st.step + 1 - options_.first_step;
    bar_.update(walked, status_line(d_, w_.n * walked));
    const bool block_done = st.step + 1 == blk_.end(st.step);
    if (block_done) {  // d += the block's sums, in the block's rows (or they go to on_block_end)
      if (on_block_end) on_block_end(blk_);
      else add_step_block(d_, blk_.sums, blk_.rows);
      if (st.step + 1 < end_step_) blk_.open(st.step + 1);
    }
    // Saved progress holds only steps the replay has checked against their
    // checkpoint (PathReader::step_verified): a due save waits for them.
    if (save_due(checkpoint_, st.step + 1 < end_step_) && reader_.step_verified(st.step)) {  // forward: one position (chunk n) for all chunks
      save_progress(*checkpoint_, d_, w_.n, 0, st.step + 1, block_done ? Decomposition() : blk_.sums,
                    torch::Tensor());
    }
  }

  PathReader& reader_;
  const Manifest& m_;
  const DecompositionOptions& options_;
  DecompositionCheckpoint* checkpoint_;
  Walk& w_;
  Decomposition& d_;
  StepBlock& blk_;
  ProgressBar& bar_;
  const PointBudget budget_;  ///< the block of test points, and whether their features are factored
  const int64_t end_step_;
  const double lambda_;
};

/// One block of steps' terms as a worker of the steps on threads hands them
/// on: the block's sums and their rows (StepBlock), and its counts,
/// certificate and residuals (`counts`, whose tensors are undefined).
struct BlockTerms {
  Decomposition sums;
  torch::Tensor rows;
  Decomposition counts;
  bool done = false;
};

/// The steps on threads (docs/math.md §12): the blocks of steps [first,
/// end) taken by `threads` workers at once, each the next not yet taken,
/// each worker on one thread (OpenMP's and, held by the caller, OpenBLAS's)
/// with a reader (PathReader::twin) and a walk of its own, replaying its
/// blocks on one thread; the caller's thread adds each block's sums to d in
/// block order as they come, as one walk adds them. So every block's terms
/// are one thread's, whatever the number of workers.
class StepsOnThreads {
 public:
  /// `totals` take the rows of the training points in `once` (StepBlock)
  /// as the workers walk; undefined `once`: none.
  StepsOnThreads(PathReader& reader, const torch::Tensor& x_in, const DecompositionOptions& options,
                 std::vector<std::pair<int64_t, int64_t>> blocks, int threads, Decomposition* totals,
                 torch::Tensor once)
      : reader_(reader), x_in_(x_in), options_(options), blocks_(std::move(blocks)), threads_(threads),
        totals_(totals), once_(std::move(once)), terms_(blocks_.size()) {
    // Each worker's share of the memory budget; its replay in turn, on its thread.
    options_.memory_doubles = std::max<int64_t>(1, options.memory_doubles / threads);
    options_.replay_ahead = false;
    options_.progress = false;
  }

  /// Walks every block, calling take(k, terms) on this thread for k = 0, 1,
  /// ... in order. Rethrows a worker's first exception once all have stopped.
  void run(const std::function<void(size_t, BlockTerms&)>& take) {
    std::vector<std::thread> workers;
    for (int t = 0; t < threads_; ++t) workers.emplace_back([this] { work(); });
    std::exception_ptr failed;
    try {
      for (size_t k = 0; k < blocks_.size(); ++k) {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return terms_[k].done || failed_; });
        if (!terms_[k].done) break;
        BlockTerms terms = std::move(terms_[k]);
        taken_ = k + 1;
        lock.unlock();
        changed_.notify_all();
        take(k, terms);
      }
    } catch (...) {
      failed = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (failed && !failed_) failed_ = failed;
      stop_ = true;
    }
    changed_.notify_all();
    for (std::thread& t : workers) t.join();
    if (failed_) std::rethrow_exception(failed_);
  }

  /// The workers' time, summed.
  const TimeSplit& time_split() const { return time_split_; }

 private:
  /// A worker: its reader, walk and thread counts, then blocks in turn, at
  /// most 2 × threads ahead of the block the caller takes next.
  void work() {
    try {
      const OpenMpThreads one(1);
      PathReader reader = twin_of_reader();
      reader.set_replay_on_one_thread(true);
      Walk w(reader, x_in_, options_);
      // A block of test points is one group, as on one thread: its rows go
      // through each layer as one product, and the step's weights, segment
      // and sums are formed once for the block, not once a point (the
      // README CNN's verify: 0.37 × the LibTorch operations). A round's
      // rows are bounded (layered_features.cpp), so a worker's memory is.
      PointBudget budget = point_budget(w.ev, reader, w.x, options_, false);
      budget.group_workers = 1;
      CaptureScope capture(reader, w.captured, w.ev);
      const auto start = std::chrono::steady_clock::now();
      struct Timed {  // the worker's time split, whichever way it leaves
        StepsOnThreads& self;
        const Walk& w;
        std::chrono::steady_clock::time_point start;
        ~Timed() {
          const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          std::lock_guard<std::mutex> lock(self.mutex_);
          self.time_split_.add(w.clock.split(s));
        }
      } timed{*this, w, start};
      for (;;) {
        size_t k = 0;
        {
          std::unique_lock<std::mutex> lock(mutex_);
          changed_.wait(lock, [&] { return stop_ || failed_ || next_ < taken_ + 2 * static_cast<size_t>(threads_); });
          if (stop_ || failed_ || next_ >= blocks_.size()) return;
          k = next_++;
        }
        BlockTerms terms;
        try {
          terms = walk_block(reader, w, budget, blocks_[k].first, blocks_[k].second);
        } catch (const ReplayOnOneThreadDiffers&) {
          // The caller's reader knows it now, and the walk has failed, at
          // once: a worker that takes its twin from that reader after the
          // notes stops at its next block, before a replay on one thread
          // that its twin knows to differ.
          std::lock_guard<std::mutex> lock(mutex_);
          reader_.take_replay_notes(reader);
          if (!failed_) failed_ = std::current_exception();
          throw;
        }
        {
          std::lock_guard<std::mutex> lock(mutex_);
          reader_.take_replay_notes(reader);
          terms_[k] = std::move(terms);
        }
        changed_.notify_all();
      }
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!failed_) failed_ = std::current_exception();
      }
      changed_.notify_all();
    }
  }

  /// A reader of the worker's own, taken while no worker writes its notes
  /// to the caller's.
  PathReader twin_of_reader() {
    std::lock_guard<std::mutex> lock(mutex_);
    return reader_.twin();
  }

  /// Steps [a, b), one block, walked as one walk walks it.
  BlockTerms walk_block(PathReader& reader, Walk& w, const PointBudget& budget, int64_t a, int64_t b) {
    DecompositionOptions o = options_;
    o.first_step = a;
    BlockTerms terms;
    const int64_t layers = o.by_layer ? static_cast<int64_t>(w.layout.size()) : 0;
    StepBlock blk(reader, a, b, w.n, w.M, w.K, o.kernel, layers, totals_, once_);
    blk.open(a);
    ProgressBar quiet(b - a, "decompose", false);
    ForwardWalk walk(reader, o, nullptr, w, terms.counts, blk, quiet, budget, b);
    walk.inference_groups = true;
    walk.on_block_end = [&](StepBlock& done) {
      terms.sums = std::move(done.sums);
      terms.rows = done.rows;
    };
    reader.forward([&](const PathStep& st) { w.clock.step([&] { walk.step(st); }); }, a, b);
    terms.done = true;
    return terms;
  }

  PathReader& reader_;
  const torch::Tensor& x_in_;
  DecompositionOptions options_;
  const std::vector<std::pair<int64_t, int64_t>> blocks_;
  const int threads_;
  Decomposition* totals_;
  const torch::Tensor once_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<BlockTerms> terms_;
  size_t next_ = 0;   ///< the next block a worker takes
  size_t taken_ = 0;  ///< blocks the caller has taken
  bool stop_ = false;
  std::exception_ptr failed_;
  TimeSplit time_split_;
};

/// Whether the forward walk of steps [first, end) takes its blocks of steps
/// on several threads at once (StepsOnThreads): with two threads or more, a
/// replay allowed on one thread (options.replay_ahead) that gives the run's
/// bits there, two blocks or more, no observer of the steps, test points
/// that may be taken on several threads (not a module's graph), and saved
/// progress, if any, at a block's end.
bool steps_on_threads(PathReader& reader, const Walk& w, const DecompositionOptions& options, size_t blocks,
                      const DecompositionProgress* saved) {
  if (current_threads() < 2 || !options.replay_ahead || options.on_step || blocks < 2) return false;
  if (point_workers(w.ev, 2) < 2) return false;
  if (saved && saved->block.contributions.defined()) return false;
  return reader.replays_alike_on_one_thread();
}

/// The forward walk with its blocks of steps on threads (StepsOnThreads).
Decomposition walk_steps_on_threads(PathReader& reader, Walk& w, const torch::Tensor& x_in,
                                    const DecompositionOptions& options, int64_t end_step,
                                    DecompositionCheckpoint* checkpoint,
                                    const std::vector<std::pair<int64_t, int64_t>>& blocks, Decomposition d,
                                    std::chrono::steady_clock::time_point t0) {
  const int threads = current_threads();
  ProgressBar bar(d.steps, "decompose", options.progress);
  const BlasPin pinned(1);  // OpenBLAS's count is the process's: one for every worker
  // Saved progress holds the totals at a block's end, which must not hold
  // the rows of blocks the workers have walked past it.
  const torch::Tensor once =
      checkpoint ? torch::Tensor() : touched_by_one_block(reader, options.first_step, end_step, w.M);
  StepsOnThreads on_threads(reader, x_in, options, blocks, threads, &d, once);
  on_threads.run([&](size_t k, BlockTerms& terms) {
    add_step_block(d, terms.sums, terms.rows);
    d.add_counts(terms.counts);
    d.certificate_max_gap = std::max(d.certificate_max_gap, terms.counts.certificate_max_gap);
    d.residuals.merge(terms.counts.residuals);
    const int64_t b = blocks[k].second;
    bar.update(b - options.first_step, status_line(d, w.n * (b - options.first_step)));
    if (save_due(checkpoint, b < end_step)) save_progress(*checkpoint, d, w.n, 0, b, Decomposition(), torch::Tensor());
  });
  bar.finish();
  d.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  d.time_split = on_threads.time_split();
  d.step_threads = threads;
  return d;
}

/// The forward walk over steps [first, end_step) (first: options.first_step,
/// or where saved progress ends).
Decomposition walk_forward(PathReader& reader, const torch::Tensor& x_in, const DecompositionOptions& options,
                           int64_t end_step, DecompositionCheckpoint* checkpoint) {
  auto t0 = std::chrono::steady_clock::now();
  Walk w(reader, x_in, options);
  // Forward, the path is replayed once whatever the chunk: one block at a time.
  const PointBudget budget = point_budget(w.ev, reader, w.x, options, false);
  const int64_t chunk = budget.block;
  Decomposition d = start(reader, w.grad64, w.x, chunk);
  d.steps = end_step - options.first_step;
  if (options.kernel) d.kernel = torch::zeros({w.n, w.M, w.K, w.K}, torch::kFloat64);
  const int64_t layers = options.by_layer ? static_cast<int64_t>(w.layout.size()) : 0;
  if (layers) d.layer_contributions = torch::zeros({w.n, w.M, w.K, layers}, torch::kFloat64);
  CaptureScope capture(reader, w.captured, w.ev);

  // Steps s < first are done (or not asked for), and so are s >= end_step;
  // the reader replays only the segments of the others.
  const DecompositionProgress* saved = checkpoint ? checkpoint->resume_point() : nullptr;
  const int64_t first =
      std::min(end_step, std::max(options.first_step, saved ? saved->steps_done : int64_t{0}));
  const std::vector<std::pair<int64_t, int64_t>> blocks = blocks_in(reader.manifest(), first, end_step);
  if (steps_on_threads(reader, w, options, blocks.size(), saved)) {
    restore(checkpoint, d, w.n, options.kernel);
    return walk_steps_on_threads(reader, w, x_in, options, end_step, checkpoint, blocks, std::move(d), t0);
  }
  StepBlock blk(reader, options.first_step, end_step, w.n, w.M, w.K, options.kernel, layers, &d,
                touched_by_one_block(reader, options.first_step, end_step, w.M));
  if (first < end_step) blk.open(first);
  restore(checkpoint, d, w.n, options.kernel, &blk.sums);
  ProgressBar bar(d.steps, "decompose", options.progress);
  ForwardWalk walk(reader, options, checkpoint, w, d, blk, bar, budget, end_step);
  const auto replay_start = std::chrono::steady_clock::now();
  {
    ReplayAheadScope ahead(reader, options.replay_ahead);
    reader.forward([&](const PathStep& st) { w.clock.step([&] { walk.step(st); }); }, first, end_step);
  }
  const auto end = std::chrono::steady_clock::now();
  bar.finish();
  d.seconds = std::chrono::duration<double>(end - t0).count();
  d.time_split = w.clock.split(std::chrono::duration<double>(end - replay_start).count());
  d.time_split.replay_ahead = reader.replay_ahead_seconds();
  return d;
}

}  // namespace

Decomposition decompose_forward(PathReader& reader, const torch::Tensor& x_in, const DecompositionOptions& options,
                                int64_t end_step, DecompositionCheckpoint* checkpoint) {
  try {
    return walk_forward(reader, x_in, options, end_step, checkpoint);
  } catch (const ReplayOnOneThreadDiffers&) {
    // A run of several threads replayed ahead on one, which reproduced its
    // shortest segment but not a later one: the steps of that segment were
    // not the run's. Walk again from where the walk began, replaying in turn.
    DecompositionOptions in_turn = options;
    in_turn.replay_ahead = false;  // nor the steps on threads, which replay on one thread
    return walk_forward(reader, x_in, in_turn, end_step, checkpoint);
  }
}

}  // namespace pathkernel::decomposition_walk
