// Streaming the path to decompose the final outputs per training point.
#include "pathkernel/decomposition.h"
#include "pathkernel/decomposition_checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>

#include "pathkernel/dropout.h"
#include "pathkernel/error.h"
#include "pathkernel/loss.h"
#include "pathkernel/progress.h"
#include "pathkernel/update_rule.h"
#include "point_groups.h"

namespace pathkernel {

torch::Tensor Decomposition::prediction() const {
  return f0 + contributions.sum(1) + regularization + rounding;
}

torch::Tensor Decomposition::completeness_gap() const {
  return fN - f0 - contributions.sum(1) - regularization;
}

torch::Tensor relative_error(const torch::Tensor& kernel, const torch::Tensor& network) {
  PK_CHECK(kernel.sizes() == network.sizes(),
           "relative_error: kernel outputs " << kernel.sizes() << " and network outputs " << network.sizes()
                                             << " differ in shape");
  return (kernel - network).abs() / network.abs().clamp_min(1.0);
}

DecompositionSummary summarize(const Decomposition& d) {
  PK_CHECK(d.fN.defined() && d.fN.size(0) > 0, "summarize: the decomposition has no test points");
  DecompositionSummary s;
  const torch::Tensor prediction = d.prediction();
  s.test_points = d.fN.size(0);
  s.steps = d.steps;
  s.max_abs_error = (prediction - d.fN).abs().max().item<double>();
  s.max_rel_error = relative_error(prediction, d.fN).max().item<double>();
  s.completeness_error = d.completeness_gap().abs().max().item<double>();
  s.max_abs_rounding = d.rounding.abs().max().item<double>();
  s.max_abs_regularization = d.regularization.abs().max().item<double>();
  s.certificate_max_gap = d.certificate_max_gap;
  if (d.gap_abs.defined()) s.error_bound = (d.gap_abs / d.fN.abs().clamp_min(1.0)).max().item<double>();
  const double point_steps = static_cast<double>(std::max<int64_t>(1, s.test_points * d.steps));
  s.mean_evaluations_per_step = static_cast<double>(d.evaluations) / point_steps;
  s.mean_forward_evaluations_per_step = static_cast<double>(d.forward_evaluations) / point_steps;
  s.mean_moment_evaluations_per_step = static_cast<double>(d.moment_evaluations) / point_steps;
  s.mean_kinks_per_step = static_cast<double>(d.kinks) / point_steps;
  s.max_abs_run_dtype_difference = d.fN_run.defined() ? (d.fN_run - d.fN).abs().max().item<double>() : 0.0;
  s.seconds = d.seconds;
  s.residuals = d.residuals;
  return s;
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
  }
}

void StepResiduals::merge(const StepResiduals& o) {
  if (o.worst_step >= 0 && (o.max_ratio > max_ratio || worst_step < 0)) {
    max_ratio = o.max_ratio;
    max_residual = o.max_residual;
    bound = o.bound;
    worst_step = o.worst_step;
  }
  steps_over += o.steps_over;
  if (o.first_step >= 0 && (first_step < 0 || o.first_step < first_step)) first_step = o.first_step;
}

std::string unexplained_update_message(const StepResiduals& r) {
  if (r.first_step < 0) return "";
  std::ostringstream out;
  out << "from step " << r.first_step
      << " on, the recorded updates are not what the declared loss and optimizer give: " << r.steps_over
      << " step(s) differ by more than rounding (the worst, step " << r.worst_step << ", by " << r.max_residual
      << " against a rounding bound of " << r.bound
      << "). The training loop did something the run does not describe: a loss term or regulariser it does not "
         "declare, gradient clipping without its clip factor, another optimizer or other hyper-parameters, or "
         "weights changed outside the optimizer's step. The kernel machine still equals the network, because "
         "the rounding term E carries the difference, but E is not attributed to training points.";
  return out.str();
}

std::vector<int64_t> step_blocks(const Manifest& m) {
  std::vector<int64_t> bounds;
  for (const CheckpointRecord& c : m.checkpoints) bounds.push_back(c.step);
  PK_CHECK(bounds.size() >= 2 && bounds.front() == 0 && bounds.back() == m.steps,
           "the run's checkpoints must start at step 0 and end at its last step, "
               << m.steps << " (got " << bounds.size() << " checkpoint(s)"
               << (bounds.empty() ? std::string() : ", steps " + std::to_string(bounds.front()) + " to " +
                                                        std::to_string(bounds.back()))
               << ")");
  return bounds;
}

void add_step_block(Decomposition& total, const Decomposition& block, const torch::Tensor& rows) {
  PK_CHECK(total.kernel.defined() == block.kernel.defined(),
           "add_step_block: the kernel is in one decomposition and not in the other");
  if (rows.defined()) {
    total.contributions.index_add_(1, rows, block.contributions);
    if (block.kernel.defined()) total.kernel.index_add_(1, rows, block.kernel);
  } else {
    total.contributions.add_(block.contributions);
    if (block.kernel.defined()) total.kernel.add_(block.kernel);
  }
  total.regularization.add_(block.regularization);
  total.rounding.add_(block.rounding);
  total.gap_abs.add_(block.gap_abs);
}

namespace {

/// c_s G_s: the batch's mean-loss gradient at step st's w_s as the optimizer
/// received it (times the clip factor of a recorded run), computed in float64
/// by a float64 network (engine_network) under the step's dropout masks: the
/// same arithmetic the contributions' per-sample gradients use. [P]. For a
/// float64 run it is the gradient training computed; for a float32 run it
/// differs from training's by float32 rounding, which the rounding term E then
/// holds.
torch::Tensor mean_gradient(Network& net64, const Manifest& m, const PathStep& st, const torch::Tensor& x,
                            const torch::Tensor& y, const torch::Tensor& weights) {
  const DropoutStep dropout(m.init_seed, st.step);  // the training side sees the step's masks
  set_flat_parameters(net64, st.w);
  for (auto& p : net64->parameters()) p.mutable_grad() = torch::Tensor();
  training_loss(net64->forward(x.to(torch::kFloat64)), y, net64->options().output, net64->options().loss, weights)
      .backward();
  std::vector<torch::Tensor> grads;
  for (auto& p : net64->parameters()) grads.push_back(p.grad().reshape({-1}));
  return st.clip * torch::cat(grads);
}

torch::Tensor outputs_at(Network& net, const torch::Tensor& w, const torch::Tensor& x) {
  torch::NoGradGuard guard;
  set_flat_parameters(net, w.to(net->parameters()[0].scalar_type()));
  return net->forward(x.to(net->parameters()[0].scalar_type())).to(torch::kFloat64);
}

/// Whether the replay's own captured signals serve the contractions: the
/// engine works in float64, so only a float64 run's signals are exact enough,
/// and a TorchScript module's per-sample gradients are not captured.
bool use_capture(const Manifest& m, const DecompositionOptions& o) {
  return o.replay_signals && !m.recorded && m.dtype == "float64" &&
         !ModelSpec::parse(m.model_spec).is_module();
}

/// Rows r0 .. r0+nr of t, or undefined when t is.
torch::Tensor rows(const torch::Tensor& t, int64_t r0, int64_t nr) { return t.defined() ? t.narrow(0, r0, nr) : t; }

double max_abs(const torch::Tensor& t) { return t.defined() && t.numel() > 0 ? t.abs().max().item<double>() : 0.0; }

/// How far above machine epsilon rounding may take a step's residual (StepResiduals).
constexpr double kRoundingSlack = 1000;

/// The run dtype's machine epsilon.
double run_epsilon(const Manifest& m) {
  return m.dtype == "float64" ? std::numeric_limits<double>::epsilon() : std::numeric_limits<float>::epsilon();
}

/// The rounding bound of step s's update residual (StepResiduals).
double update_bound(const Manifest& m, const PathStep& st) {
  return kRoundingSlack * run_epsilon(m) * (max_abs(st.w) + max_abs(st.w + st.delta));
}

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

/// Training rows r0 .. r0+nr of the step's batch as the replay computed them
/// (PathReader::set_capture): layer inputs and the mean loss's signals, that
/// is, the per-sample signals δ_i divided by |B_s|.
TrainSignals captured_signals(const PathStep& st, int64_t r0, int64_t nr) {
  TrainSignals t;
  for (size_t l = 0; l < st.layer_inputs.size(); ++l) {
    t.inputs.push_back(st.layer_inputs[l].narrow(0, r0, nr));
    t.signals.push_back(st.layer_signals[l].narrow(0, r0, nr));
  }
  return t;
}

/// Turns the reader's capture on for a scope.
class CaptureScope {
 public:
  CaptureScope(PathReader& reader, bool on) : reader_(reader) { reader_.set_capture(on); }
  ~CaptureScope() { reader_.set_capture(false); }

 private:
  PathReader& reader_;
};

/// What both walks of the path share: the test points and the training set
/// in float64, two float64 networks of the run's own (the reader's is busy
/// replaying the path: one for the batch gradient, one for the evaluator)
/// and whether the replay's captured signals serve the contractions.
struct Walk {
  Walk(PathReader& reader, const torch::Tensor& x_in, const DecompositionOptions& options)
      : m(reader.manifest()),
        x(x_in.to(torch::kFloat64)),
        x_train(reader.dataset().x_train),
        y_train(reader.dataset().y_train),
        x_train64(x_train.to(torch::kFloat64)),
        n(x.size(0)),
        M(x_train.size(0)),
        K(m.num_classes),
        grad64(engine_network(m.network_options())),
        net64(engine_network(m.network_options())),
        ev(net64, options.quadrature.route),
        map(grad64->options().output),
        loss(grad64->options().loss),
        captured(use_capture(m, options)),
        keep_doubles(options.memory_doubles / 4) {}

  /// Step st's batch: its training rows, their loss weights (undefined: all
  /// 1), the rows themselves where signals are recomputed (and where
  /// `need_x`) and c_s G_s, the batch gradient as the optimizer received it
  /// (clipped in a recorded run).
  struct Batch {
    torch::Tensor idx, xb, yb, wb, gradient;
    int64_t b = 0;
  };
  Batch batch(PathReader& reader, const PathStep& st, bool need_x) {
    Batch out;
    out.idx = st.batch.defined() ? st.batch : torch::arange(M);
    out.b = out.idx.size(0);
    if (!captured || need_x) out.xb = x_train64.index_select(0, out.idx);
    if (!captured) out.yb = y_train.index_select(0, out.idx);
    out.wb = reader.loss_weights(out.idx);
    out.gradient = captured ? st.gradient : mean_gradient(grad64, m, st, out.xb, out.yb, out.wb);
    return out;
  }

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
    for (int64_t r0 = 0; r0 < bt.b; r0 += chunk) {
      const int64_t nr = std::min(chunk, bt.b - r0);
      const DropoutStep dropout(m.init_seed, st.step);
      torch::Tensor part = contract_with(chunk_signals(st, bt, r0, nr));
      use(r0, nr, scale != 1 ? part * scale : part);
    }
  }

  /// Training rows r0 .. r0+nr of step st's batch (under the step's dropout
  /// masks, which the caller sets), with the per-sample
  /// gradients their contractions need formed. A step's chunks are kept
  /// while they fit in `keep_doubles`, so that the step's other blocks of
  /// test points contract against them without forming them again (a
  /// convolution's per-sample gradients; every signal when they are not the
  /// replay's).
  TrainSignals chunk_signals(const PathStep& st, const Batch& bt, int64_t r0, int64_t nr) const {
    // Groups of test points ask concurrently: the first forms a chunk, the
    // others wait and take it if kept.
    std::lock_guard<std::mutex> lock(kept_mutex);
    if (kept_step != st.step) {
      kept.clear();
      kept_step = st.step;
      kept_doubles = 0;
    }
    const auto found = kept.find({r0, nr});
    if (found != kept.end()) return found->second;
    TrainSignals t;
    int64_t doubles = 0;
    if (captured) {
      t = captured_signals(st, r0, nr);  // views of the replay's own
    } else {
      t = train_signals(ev, bt.xb.narrow(0, r0, nr), bt.yb.narrow(0, r0, nr), map, loss, rows(bt.wb, r0, nr));
      for (size_t l = 0; l < t.inputs.size(); ++l) doubles += t.inputs[l].numel() + t.signals[l].numel();
    }
    doubles += form_sample_gradients(ev, t);
    if (kept_doubles + doubles <= keep_doubles) {
      kept.emplace(std::make_pair(r0, nr), t);
      kept_doubles += doubles;
    }
    return t;
  }

  const Manifest& m;
  const torch::Tensor x;
  const torch::Tensor& x_train;
  const torch::Tensor& y_train;
  const torch::Tensor x_train64;
  const int64_t n, M, K;
  Network grad64, net64;
  SegmentEvaluator ev;
  const OutputMap map;
  const LossKind loss;
  const bool captured;
  /// Memory for the training rows kept across a step's blocks of test points.
  int64_t keep_doubles = 0;
  /// The step whose training rows are kept, and its chunks by (first row, rows).
  mutable int64_t kept_step = -1;
  mutable std::map<std::pair<int64_t, int64_t>, TrainSignals> kept;
  mutable int64_t kept_doubles = 0;
  mutable std::mutex kept_mutex;
};

/// Adds the test features' counts and certificate to d's.
void tally(Decomposition& d, const TestFeatures& f) {
  d.add_counts(f);
  d.certificate_max_gap = std::max(d.certificate_max_gap, f.certificate_gap);
}

/// The progress bar's status: the certificate and the integrand evaluations
/// per test point and step over the `point_steps` walked so far.
std::string status_line(const Decomposition& d, int64_t point_steps) {
  char status[96];
  std::snprintf(status, sizeof status, "certificate gap %.1e, %.1f evaluations/step", d.certificate_max_gap,
                static_cast<double>(d.evaluations) / static_cast<double>(point_steps));
  return status;
}

/// The decomposition's outputs before any step: f(w_0), f(w_N) in float64
/// (by net64, an engine_network of the run), f(w_N) as the run's own network
/// computes it, and zeros.
Decomposition start(PathReader& reader, Network& net64, const torch::Tensor& x, int64_t block) {
  const Manifest& m = reader.manifest();
  const int64_t n = x.size(0), M = reader.dataset().x_train.size(0), K = m.num_classes;
  Decomposition d;
  d.steps = m.steps;
  const torch::Tensor w0 = reader.checkpoint(0), wN = reader.checkpoint(m.checkpoints.size() - 1);
  Network net = m.dtype == "float64" ? Network(nullptr) : build_network(m.network_options());
  std::vector<torch::Tensor> f0, fN, fN_run;
  for (int64_t b0 = 0; b0 < n; b0 += block) {  // block by block, like the rest
    const torch::Tensor xb = x.narrow(0, b0, std::min(block, n - b0));
    f0.push_back(outputs_at(net64, w0, xb));
    fN.push_back(outputs_at(net64, wN, xb));
    // A float64 run's network is net64's twin.
    fN_run.push_back(m.dtype == "float64" ? fN.back() : outputs_at(net, wN, xb));
  }
  d.f0 = torch::cat(f0);
  d.fN = torch::cat(fN);
  d.fN_run = torch::cat(fN_run);
  d.contributions = torch::zeros({n, M, K}, torch::kFloat64);
  d.regularization = torch::zeros({n, K}, torch::kFloat64);
  d.rounding = torch::zeros({n, K}, torch::kFloat64);
  d.gap_abs = torch::zeros({n, K}, torch::kFloat64);
  return d;
}

/// Continues from saved progress: its accumulators replace d's. Returns the
/// progress, or null when there is none.
const DecompositionProgress* restore(DecompositionCheckpoint* checkpoint, Decomposition& d, int64_t chunk,
                                     bool kernel, Decomposition* block = nullptr) {
  const DecompositionProgress* p = checkpoint ? checkpoint->resume_point() : nullptr;
  if (p == nullptr) return nullptr;
  // A forward walk saved in the middle of a block of steps also holds that block's sums so far.
  if (p->block.contributions.defined()) {
    PK_CHECK(block != nullptr && block->contributions.defined() &&
                 p->block.contributions.sizes() == block->contributions.sizes() &&
                 p->block.regularization.defined() && p->block.rounding.defined() && p->block.gap_abs.defined() &&
                 p->block.kernel.defined() == kernel,
             "the saved progress holds sums of a block of steps that do not fit this decomposition; delete it to "
             "start over");
    block->contributions.copy_(p->block.contributions);
    block->regularization.copy_(p->block.regularization);
    block->rounding.copy_(p->block.rounding);
    block->gap_abs.copy_(p->block.gap_abs);
    if (kernel) block->kernel.copy_(p->block.kernel);
  }
  PK_CHECK(p->chunk == chunk && p->partial.contributions.sizes() == d.contributions.sizes() &&
               p->partial.regularization.sizes() == d.regularization.sizes() &&
               p->partial.rounding.sizes() == d.rounding.sizes() && p->partial.kernel.defined() == kernel,
           "the saved progress does not fit this decomposition (chunk " << p->chunk << ", expected " << chunk
                                                                       << "); delete it to start over");
  d.contributions = p->partial.contributions.clone();
  d.regularization = p->partial.regularization.clone();
  d.rounding = p->partial.rounding.clone();
  if (p->partial.gap_abs.defined() && p->partial.gap_abs.sizes() == d.gap_abs.sizes()) {
    d.gap_abs = p->partial.gap_abs.clone();
  }
  if (kernel) d.kernel = p->partial.kernel.clone();
  d.certificate_max_gap = p->partial.certificate_max_gap;
  static_cast<QuadratureCounts&>(d) = p->partial;
  d.residuals = p->partial.residuals;
  return p;
}

/// What one test point costs in memory, and how many are computed together.
struct PointBudget {
  /// Doubles per test point: its test features (a guess at its rows) and,
  /// in the reverse walk, the accumulators Ã, A and J̄ P (three K x P
  /// matrices).
  int64_t per_point = 0;
  /// Test points computed together: options.point_block, or when it is 0
  /// (automatic) 32 for a network whose test features are all factored (its
  /// decomposition is mostly thin GEMMs of the block's features against the
  /// training rows, which wider blocks make fewer and wider) and 4 otherwise
  /// (convolutions, sequences, modules: the test features are most of the
  /// work, and small blocks were measured faster; see BENCHMARKS.md); fewer
  /// when per_point doubles each would not fit in the budget. It does not
  /// depend on n, so a point's block (and its numbers) are the same in any
  /// split at block boundaries.
  int64_t block = 1;
};

PointBudget point_budget(SegmentEvaluator& ev, PathReader& reader, const torch::Tensor& x,
                         const DecompositionOptions& options, bool reverse) {
  PK_CHECK(options.point_block >= 0, "the test points computed together must be >= 1, or 0 for automatic (got "
                                         << options.point_block << ")");
  const Manifest& m = reader.manifest();
  const QuadratureSpec& spec = options.quadrature.spec;
  const int64_t rows_per_point = spec.kind == QuadratureSpec::Kind::Riemann ? spec.nodes
                                 : spec.kind == QuadratureSpec::Kind::Dpk   ? 1
                                                                            : 8 * options.quadrature.gauss_nodes;
  ev.set_segment(reader.checkpoint(0), torch::zeros({m.parameter_count}, torch::kFloat64));
  const FeatureLayout layout = feature_layout(ev, x.narrow(0, 0, std::min<int64_t>(x.size(0), 1)));
  PointBudget budget;
  budget.per_point = (reverse ? 3 * m.num_classes * m.parameter_count : 0) + rows_per_point * layout.doubles_per_row;
  const int64_t asked = options.point_block > 0 ? options.point_block : layout.factored ? 32 : 4;
  budget.block = std::clamp<int64_t>(options.memory_doubles / std::max<int64_t>(1, budget.per_point), 1, asked);
  return budget;
}

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

/// Test points per chunk of the reverse walk (one replay of the path each):
/// as many whole blocks as fit in the budget, at most n rounded up to a block.
int64_t chunk_size(const DecompositionOptions& options, int64_t per_point, int64_t n, int64_t block) {
  const int64_t fit = std::max<int64_t>(1, options.memory_doubles / std::max<int64_t>(1, per_point) / block);
  const int64_t blocks = (std::max<int64_t>(1, n) + block - 1) / block;
  return std::min(fit, blocks) * block;
}

/// The reverse walk's accumulator Ã of a chunk of test points, [nc, K, P], as
/// one allocation per block of points. A BLAS may round a row's product by
/// where the row lies in memory (OpenBLAS's AVX-512 matrix-vector kernel does,
/// by 1e-14, for a view that starts part-way into a buffer): in a buffer of
/// its own, each block's rows lie alike whichever blocks come before it, so a
/// block of points gets the same bits alone as among others (docs/math.md §12).
class AccumulatorBlocks {
 public:
  AccumulatorBlocks(int64_t nc, int64_t block, int64_t K, int64_t P) : block_(block) {
    for (int64_t b0 = 0; b0 < nc; b0 += block)
      blocks_.push_back(torch::zeros({std::min(block, nc - b0), K, P}, torch::kFloat64));
  }
  /// The block of points starting at b0 (a multiple of the block size).
  torch::Tensor& block(int64_t b0) { return blocks_[static_cast<size_t>(b0 / block_)]; }
  /// All blocks, joined in point order (saved progress).
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
  int64_t block_;
  std::vector<torch::Tensor> blocks_;
};

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
  const torch::Tensor& x = w.x;
  SegmentEvaluator& ev = w.ev;
  const int64_t n = w.n, K = w.K, P = m.parameter_count;
  const double beta = rule.beta(), lambda = rule.coupled_decay();
  const PointBudget budget = point_budget(ev, reader, x, options, true);
  const int64_t block = budget.block;
  Decomposition d = start(reader, w.grad64, x, block);
  const int64_t chunk = chunk_size(options, budget.per_point, n, block);
  const int64_t chunks = (n + chunk - 1) / chunk;
  CaptureScope capture(reader, w.captured);

  const DecompositionProgress* resumed = restore(checkpoint, d, chunk, false);
  ProgressBar bar(m.steps * chunks, "decompose", options.progress);
  int64_t done = 0;
  for (int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int64_t nc = std::min(chunk, n - c0);
    if (resumed && c0 < resumed->chunk_start) {  // finished before the interruption
      done += m.steps;
      continue;
    }
    const torch::Tensor xc = x.narrow(0, c0, nc);
    AccumulatorBlocks acc(nc, block, K, P);  // Ã_{s+1}, 0 after the last step
    int64_t steps_done = 0;
    if (resumed && c0 == resumed->chunk_start) {
      PK_CHECK(resumed->acc.defined() && resumed->acc.sizes() == torch::IntArrayRef({nc, K, P}),
               "the saved progress has no accumulator of shape [" << nc << ", " << K << ", " << P
                                                                  << "]; delete it to start over");
      acc.assign(resumed->acc);
      steps_done = resumed->steps_done;
      done += steps_done;
    }
    const int64_t skip_from = m.steps - steps_done;  // steps s >= skip_from are done
    ReverseResiduals residuals(m, beta, d.residuals);
    reader.reverse([&](const PathStep& st) {
      if (st.step >= skip_from) return;
      ev.set_segment(st.w, st.delta);
      const Walk::Batch bt = w.batch(reader, st, false);
      const torch::Tensor dvec = bt.gradient + lambda * st.w;  // d_s = c_s G_s + λ_c w_s
      const StepCoefficients c = rule.step(st.step, st.lr, st.w, st.state);
      const torch::Tensor buf = rule.buffer(st.state);
      const torch::Tensor residual = st.delta - UpdateRule::update(c, dvec, buf);
      if (c0 == 0) {  // the steps' residuals, once (they do not depend on the test points)
        residuals.visit(st.step, max_abs(residual), update_bound(m, st), buf,
                        buf.defined() ? c.gamma * dvec : torch::Tensor());
      }
      for (int64_t b0 = 0; b0 < nc; b0 += block) {  // the chunk's blocks of test points
        const int64_t nb = std::min(block, nc - b0), p0 = c0 + b0;
        const torch::Tensor xb_test = xc.narrow(0, b0, nb);
        torch::Tensor acc_b = acc.block(b0);  // updated in place
        torch::Tensor erow = torch::zeros({nb, K}, torch::kFloat64);
        // The part of Ã_{s+1} ε_{s+1} that needs b_s: −β Ã_{s+1} b_s.
        if (buf.defined()) erow -= beta * torch::matmul(acc_b, buf);

        TestFeatures f = test_features(ev, xb_test, options.quadrature);
        tally(d, f);
        d.gap_abs.narrow(0, p0, nb).add_(f.gap.abs());
        erow += apply_features(ev, f, residual);
        if (c.rho.defined()) d.regularization.narrow(0, p0, nb).add_(apply_features(ev, f, c.rho));
        torch::Tensor jp = dense_features(ev, f);  // [nb, K, P]
        if (c.metric.defined()) jp.mul_(c.metric);
        torch::Tensor a = c.alpha * jp;
        if (buf.defined()) {
          acc_b.mul_(beta).add_(jp, c.kappa);
          a.add_(acc_b, c.gamma);
          erow += torch::matmul(acc_b, buf - c.gamma * dvec);
        }
        jp = torch::Tensor();
        d.rounding.narrow(0, p0, nb).add_(erow);
        if (lambda != 0) d.regularization.narrow(0, p0, nb).add_(lambda * torch::matmul(a, st.w));
        torch::Tensor step_c = options.on_step ? torch::empty({nb, bt.b, K}, torch::kFloat64) : torch::Tensor();
        w.train_chunks(
            st, bt, options.train_chunk, 1.0, [&](const TrainSignals& t) { return contract_dense(ev, a, t); },
            [&](int64_t r0, int64_t nr, const torch::Tensor& part) {  // [nb, nr, K]
              d.contributions.narrow(0, p0, nb).index_add_(1, bt.idx.narrow(0, r0, nr), part);
              if (step_c.defined()) step_c.narrow(1, r0, nr).copy_(part);
            });
        if (options.on_step) options.on_step({st.step, p0, &ev, &xb_test, &f, bt.idx, step_c});
      }
      bar.update(++done, status_line(d, c0 * m.steps + nc * (m.steps - st.step)));
      ++steps_done;
      if (checkpoint && st.step > 0 && checkpoint->due()) {
        DecompositionProgress p;
        p.chunk = chunk;
        p.chunk_start = c0;
        p.steps_done = steps_done;
        p.partial = d;
        p.acc = acc.joined();
        checkpoint->save(p);
      }
    });
    residuals.finish_walk();
  }
  bar.finish();
  d.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return d;
}

}  // namespace

Decomposition decompose(PathReader& reader, const torch::Tensor& x_in, const DecompositionOptions& options) {
  return decompose(reader, x_in, options, nullptr);
}

EngineRoute engine_route(PathReader& reader, const DecompositionOptions& options) {
  Network net64 = engine_network(reader.manifest().network_options());
  SegmentEvaluator ev(net64, options.quadrature.route);
  return {ev.route(), ev.route_reason()};
}

int64_t decomposition_block(PathReader& reader, const torch::Tensor& x, const DecompositionOptions& options) {
  const Manifest& m = reader.manifest();
  const bool reverse = UpdateRule(m.optimizer).has_buffer() || options.reverse;
  Network net64 = engine_network(m.network_options());
  SegmentEvaluator ev(net64, options.quadrature.route);
  const torch::Tensor x64 = x.to(torch::kFloat64);
  return point_budget(ev, reader, x64, options, reverse).block;
}

Decomposition decompose(PathReader& reader, const torch::Tensor& x_in, const DecompositionOptions& given,
                        DecompositionCheckpoint* checkpoint) {
  const Manifest& m = reader.manifest();
  DecompositionOptions options = given;
  options.quadrature = given.quadrature.for_run(m.steps);  // the run's budget shared over its steps
  const UpdateRule rule(m.optimizer);  // checks the optimizer is supported
  const int64_t end_step = options.end_step < 0 ? m.steps : options.end_step;
  PK_CHECK(options.first_step >= 0 && options.first_step <= end_step && end_step <= m.steps,
           "the steps to decompose must be a range within [0, " << m.steps << "] (got [" << options.first_step
                                                                << ", " << end_step << "))");
  if (rule.has_buffer() || options.reverse) {
    PK_CHECK(options.first_step == 0 && end_step == m.steps,
             "a range of steps is decomposed alone for gd and sgd runs only; run '"
                 << reader.dir() << "' used '" << m.optimizer.name << "', whose buffer links every step to the next");
    return decompose_reverse(reader, x_in, options, rule, checkpoint);
  }
  auto t0 = std::chrono::steady_clock::now();
  Walk w(reader, x_in, options);
  const torch::Tensor& x = w.x;
  SegmentEvaluator& ev = w.ev;
  const int64_t n = w.n, M = w.M, K = w.K;
  const double lambda = m.optimizer.weight_decay;
  // Forward, the path is replayed once whatever the chunk: one block at a time.
  const int64_t chunk = point_budget(ev, reader, x, options, false).block;
  Decomposition d = start(reader, w.grad64, x, chunk);
  d.steps = end_step - options.first_step;
  if (options.kernel) d.kernel = torch::zeros({n, M, K, K}, torch::kFloat64);
  // The sums of the block of steps in progress (step_blocks(), cut to the
  // range), each block from zero, added to d's at the block's end. Its
  // training side holds only the rows its batches touch (block_rows, at
  // row_pos; all M rows, undefined, for full-batch gd): the same additions,
  // in the same order, as an [n, M, K] block would make, for less memory.
  const std::vector<int64_t> bounds = step_blocks(m);
  const auto block_start = [&](int64_t s) {  // the start of the block that holds step s
    return std::max(options.first_step, *(std::upper_bound(bounds.begin(), bounds.end(), s) - 1));
  };
  const auto block_end = [&](int64_t s) {  // its end
    return std::min(end_step, *std::upper_bound(bounds.begin(), bounds.end(), s));
  };
  Decomposition blk;
  torch::Tensor block_rows, row_pos;
  const auto open_block = [&](int64_t s) {  // zero sums for the block that holds step s
    std::vector<torch::Tensor> batches;
    bool all = false;
    for (int64_t t = block_start(s); t < block_end(s) && !all; ++t) {
      const torch::Tensor b = reader.batch(t);
      all = !b.defined();
      batches.push_back(b);
    }
    block_rows = all ? torch::Tensor() : std::get<0>(torch::_unique(torch::cat(batches), /*sorted=*/true));
    if (block_rows.defined() && block_rows.size(0) == M) block_rows = torch::Tensor();
    row_pos = torch::Tensor();
    if (block_rows.defined()) {
      row_pos = torch::full({M}, -1, torch::kLong);
      row_pos.index_copy_(0, block_rows, torch::arange(block_rows.size(0), torch::kLong));
    }
    const int64_t rows = block_rows.defined() ? block_rows.size(0) : M;
    blk.contributions = torch::zeros({n, rows, K}, torch::kFloat64);
    blk.regularization = torch::zeros({n, K}, torch::kFloat64);
    blk.rounding = torch::zeros({n, K}, torch::kFloat64);
    blk.gap_abs = torch::zeros({n, K}, torch::kFloat64);
    if (options.kernel) blk.kernel = torch::zeros({n, rows, K, K}, torch::kFloat64);
  };
  // The block's rows of step s's batch rows idx.
  const auto block_index = [&](const torch::Tensor& idx) {
    return row_pos.defined() ? row_pos.index_select(0, idx) : idx;
  };
  CaptureScope capture(reader, w.captured);

  // Steps s < first are done (or not asked for), and so are s >= end_step;
  // the reader replays only the segments of the others.
  const DecompositionProgress* saved = checkpoint ? checkpoint->resume_point() : nullptr;
  const int64_t first =
      std::min(end_step, std::max(options.first_step, saved ? saved->steps_done : int64_t{0}));
  if (first < end_step) open_block(first);
  restore(checkpoint, d, n, options.kernel, &blk);
  ProgressBar bar(d.steps, "decompose", options.progress);
  reader.forward([&](const PathStep& st) {
    ev.set_segment(st.w, st.delta);
    const Walk::Batch bt = w.batch(reader, st, options.kernel);  // the kernel needs the batch's rows
    // Regularisation and rounding directions of this step.
    torch::Tensor rho = -st.lr * lambda * st.w;
    torch::Tensor e = st.delta + st.lr * (bt.gradient + lambda * st.w);
    d.residuals.add(st.step, max_abs(e), update_bound(m, st));
    // Each chunk's points in one group per thread (point_groups.h), each
    // group's features and contractions on one thread. The groups of all
    // chunks are taken in turn, so a thread done with its group takes the
    // next, of any chunk, instead of waiting for the rest of its chunk (the
    // points' kinks, and so their work, differ). Counts, and the caller's
    // view of each group, come after the groups, in point order. With an
    // observer (on_step), one chunk's groups at a time, which keep their
    // features until it has seen them; without, a group keeps its counts.
    struct Group {
      int64_t chunk = 0, first = 0, count = 0;
      TestFeatures f;
      torch::Tensor step_c;
    };
    std::vector<Group> parts;
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
      const int64_t nc = std::min(chunk, n - c0), groups = point_groups(ev, nc);
      for (int64_t g = 0; g < groups; ++g) {
        Group& p = parts.emplace_back();
        p.chunk = c0;
        p.first = c0 + group_start(g, groups, nc);
        p.count = c0 + group_start(g + 1, groups, nc) - p.first;
      }
    }
    for (size_t u0 = 0, u1 = 0; u0 < parts.size(); u0 = u1) {
      for (u1 = u0 + 1; u1 < parts.size() && (!options.on_step || parts[u1].chunk == parts[u0].chunk);) ++u1;
      run_point_groups(static_cast<int64_t>(u1 - u0), [&](int64_t g) {
        Group& p = parts[u0 + static_cast<size_t>(g)];
        p.f = test_features(ev, x.narrow(0, p.first, p.count), options.quadrature);
        const TestFeatures& f = p.f;
        blk.gap_abs.narrow(0, p.first, p.count).add_(f.gap.abs());
        if (lambda != 0) blk.regularization.narrow(0, p.first, p.count).add_(apply_features(ev, f, rho));
        blk.rounding.narrow(0, p.first, p.count).add_(apply_features(ev, f, e));
        if (options.on_step) p.step_c = torch::empty({p.count, bt.b, K}, torch::kFloat64);
        const int64_t rows = contraction_rows(options, f, K, bt.b);
        w.train_chunks(
            st, bt, rows, -st.lr, [&](const TrainSignals& t) { return contract(ev, f, t); },
            [&](int64_t r0, int64_t nr, const torch::Tensor& part) {  // [count, nr, K]
              const torch::Tensor at = block_index(bt.idx.narrow(0, r0, nr));
              blk.contributions.narrow(0, p.first, p.count).index_add_(1, at, part);
              if (p.step_c.defined()) p.step_c.narrow(1, r0, nr).copy_(part);
              if (options.kernel) {
                blk.kernel.narrow(0, p.first, p.count).index_add_(1, at, output_kernel(ev, f, bt.xb.narrow(0, r0, nr)));
              }
            });
        if (!options.on_step) {  // the counts alone: the features' memory goes now
          TestFeatures counts;
          static_cast<QuadratureCounts&>(counts) = p.f;
          counts.certificate_gap = p.f.certificate_gap;
          p.f = std::move(counts);
        }
      }, point_groups(ev, n));
      for (size_t u = u0; u < u1; ++u) {
        Group& p = parts[u];
        tally(d, p.f);
        if (options.on_step) {
          const torch::Tensor xc = x.narrow(0, p.first, p.count);
          options.on_step({st.step, p.first, &ev, &xc, &p.f, bt.idx, p.step_c});
        }
        p.f = TestFeatures();
        p.step_c = torch::Tensor();
      }
    }
    const int64_t walked = st.step + 1 - options.first_step;
    bar.update(walked, status_line(d, n * walked));
    const bool block_done = st.step + 1 == block_end(st.step);
    if (block_done) {  // d += blk, in the block's rows
      add_step_block(d, blk, block_rows);
      if (st.step + 1 < end_step) open_block(st.step + 1);
    }
    if (checkpoint && st.step + 1 < end_step && checkpoint->due()) {
      DecompositionProgress p;
      p.chunk = n;  // forward: one position for all chunks
      p.chunk_start = 0;
      p.steps_done = st.step + 1;
      p.partial = d;
      if (!block_done) p.block = blk;
      checkpoint->save(p);
    }
  }, first, end_step);
  bar.finish();
  d.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return d;
}

}  // namespace pathkernel
