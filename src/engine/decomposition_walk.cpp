// What the decomposition's walks of the path share (decomposition_walk.h).
#include "decomposition_walk.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "feature_parts.h"
#include "point_groups.h"
#include "pathkernel/batch_statistics.h"
#include "pathkernel/context.h"
#include "pathkernel/error.h"
#include "pathkernel/update_rule.h"

namespace pathkernel::decomposition_walk {

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


/// Whether the replay's own captured signals serve the contractions: the
/// engine works in float64, so only a float64 run's signals are exact enough,
/// and a TorchScript module's per-sample gradients are not captured.
bool use_capture(const Manifest& m, const DecompositionOptions& o) {
  return o.replay_signals && !m.recorded && m.dtype == "float64" &&
         !ModelSpec::parse(m.model_spec).is_module();
}

/// Rows r0 .. r0+nr of t, or undefined when t is.
torch::Tensor rows(const torch::Tensor& t, int64_t r0, int64_t nr) { return t.defined() ? t.narrow(0, r0, nr) : t; }

/// Training rows r0 .. r0+nr of the step's batch as the replay computed them
/// (PathReader::set_capture): layer inputs and the mean loss's signals, that
/// is, the per-sample signals δ_i divided by |B_s|, with the per-sample
/// gradients CaptureScope formed (undefined where it formed none).
TrainSignals captured_signals(const PathStep& st, int64_t r0, int64_t nr) {
  TrainSignals t;
  for (size_t l = 0; l < st.layer_inputs.size(); ++l) {
    t.inputs.push_back(st.layer_inputs[l].narrow(0, r0, nr));
    t.signals.push_back(st.layer_signals[l].narrow(0, r0, nr));
    t.gradients.push_back(l < st.layer_gradients.size() ? rows(st.layer_gradients[l], r0, nr) : torch::Tensor());
  }
  return t;
}

/// Whether the layers of ev's route hold every one of its P parameters, each
/// with a gradient rule (no Module layer).
bool layers_hold_every_parameter(const SegmentEvaluator& ev, int64_t P) {
  int64_t held = 0;
  for (const ParamLayer& p : ev.param_layers()) {
    if (p.desc.kind == LayerDesc::Kind::Module) return false;
    held += p.weight_numel + p.bias_numel;
  }
  return held == P;
}

/// Adds layer l's gradient summed over training rows t to g [P]: a Linear
/// layer's as one product δᵀ a (over rows and any leading dimensions), any
/// other's as its per-sample gradients summed.
void add_layer_gradient(const SegmentEvaluator& ev, const TrainSignals& t, size_t l, torch::Tensor& g) {
  const ParamLayer& p = ev.param_layers()[l];
  if (p.desc.kind == LayerDesc::Kind::Linear) {
    const torch::Tensor d = t.signals[l].reshape({-1, t.signals[l].size(-1)});
    const torch::Tensor a = t.inputs[l].reshape({-1, t.inputs[l].size(-1)});
    g.narrow(0, p.weight_offset, p.weight_numel).add_(torch::mm(d.t(), a).reshape({-1}));
    if (p.bias_numel) g.narrow(0, p.bias_offset, p.bias_numel).add_(d.sum(0));
    return;
  }
  const torch::Tensor s = layer_sample_gradients(ev, t, l).sum(0);  // [Q]: weight, then bias
  g.narrow(0, p.weight_offset, p.weight_numel).add_(s.narrow(0, 0, p.weight_numel));
  if (p.bias_numel) g.narrow(0, p.bias_offset, p.bias_numel).add_(s.narrow(0, p.weight_numel, p.bias_numel));
}

}  // namespace

namespace {

/// Whether t is a contiguous float64 CPU tensor (its entries read as one array).
bool flat_doubles(const torch::Tensor& t) {
  return t.defined() && t.scalar_type() == torch::kFloat64 && t.device().is_cpu() && t.is_contiguous();
}

/// A running max |v| that keeps a NaN, as max() over a tensor does.
struct MaxAbs {
  double value = 0;
  bool nan = false;
  void add(double v) {
    const double a = std::abs(v);
    nan = nan || std::isnan(a);
    value = a > value ? a : value;
  }
  double get() const { return nan ? std::numeric_limits<double>::quiet_NaN() : value; }
};

}  // namespace

double max_abs(const torch::Tensor& t) {
  if (!t.defined() || t.numel() == 0) return 0.0;
  if (!flat_doubles(t)) return t.abs().max().item<double>();
  MaxAbs m;
  const double* p = t.data_ptr<double>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) m.add(p[i]);
  return m.get();
}

double run_epsilon(const Manifest& m) {
  return m.dtype == "float64" ? std::numeric_limits<double>::epsilon() : std::numeric_limits<float>::epsilon();
}

namespace {

/// The rounding bound of an update from its two ends' largest entries, max |w_s| and max |w_s + Δw_s|.
double bound_of_ends(const Manifest& m, double max_w, double max_end) {
  return kRoundingSlack * run_epsilon(m) * (max_w + max_end);
}

}  // namespace

double update_bound(const Manifest& m, const PathStep& st) {
  return bound_of_ends(m, max_abs(st.w), max_abs(st.w + st.delta));
}

UpdateResidual update_residual(const Manifest& m, const PathStep& st, const torch::Tensor& gradient, double lambda) {
  UpdateResidual r;
  const int64_t P = st.w.numel();
  if (!(flat_doubles(st.w) && flat_doubles(st.delta) && flat_doubles(gradient) && st.delta.numel() == P &&
        gradient.numel() == P)) {
    r.e = st.delta + st.lr * (gradient + lambda * st.w);
    r.max_abs = max_abs(r.e);
    r.bound = update_bound(m, st);
    return r;
  }
  r.e = torch::empty_like(st.w);
  const double* w = st.w.data_ptr<double>();
  const double* d = st.delta.data_ptr<double>();
  const double* g = gradient.data_ptr<double>();
  double* e = r.e.data_ptr<double>();
  const double lr = st.lr;
  MaxAbs max_e, max_w, max_end;
  for (int64_t i = 0; i < P; ++i) {
    e[i] = d[i] + lr * (g[i] + lambda * w[i]);
    max_e.add(e[i]);
    max_w.add(w[i]);
    max_end.add(w[i] + d[i]);
  }
  r.max_abs = max_e.get();
  r.bound = bound_of_ends(m, max_w.get(), max_end.get());
  return r;
}

CaptureScope::CaptureScope(PathReader& reader, bool on, const SegmentEvaluator& ev) : reader_(reader) {
  reader_.set_capture(on, [&ev](PathStep& st) {
    torch::NoGradGuard no_grad;
    TrainSignals t{st.layer_inputs, st.layer_signals, {}, {}};
    form_sample_gradients(ev, t);
    st.layer_gradients = std::move(t.gradients);
  });
}

Walk::Walk(PathReader& reader, const torch::Tensor& x_in, const DecompositionOptions& options)
    : m(reader.manifest()),
      x(x_in.to(torch::kFloat64)),
      y_train(reader.held_dataset().y_train),
      n(x.size(0)),
      M(reader.train_count()),
      K(m.num_classes),
      network_options(m.network_options(options.position)),
      route(options.quadrature.route),
      grad64(engine_network(network_options)),
      net64(engine_network(network_options)),
      ev(net64, route),
      map(grad64->options().output),
      loss(grad64->options().loss),
      captured(use_capture(m, options)),
      gradient_from_signals(!captured && !ev.path_route().couples_batch() &&
                            layers_hold_every_parameter(ev, m.parameter_count)),
      layout(parameter_layout(net64)),
      keep_doubles(options.memory_doubles / 4) {}

SegmentEvaluator& Walk::ahead_evaluator() {
  if (!ahead_ev) {
    ahead64 = engine_network(network_options);
    ahead_ev = std::make_unique<SegmentEvaluator>(ahead64, route);
  }
  return *ahead_ev;
}

SegmentEvaluator& Walk::features_evaluator(const PathStep& st) {
  if (!features_ev) {
    features64 = engine_network(network_options);
    features_ev = std::make_unique<SegmentEvaluator>(features64, route);
  }
  if (st.w.defined()) {
    features_ev->set_segment(st.w, st.delta);
    if (st.buffers.defined()) set_flat_buffers(features64, st.buffers);
  }
  return *features_ev;
}

void Walk::KeptStep::hold(int64_t s) {
  if (step == s) return;
  chunks.clear();
  doubles = 0;
  step = s;
}

void Walk::keep_two_steps(bool on) {
  two_steps = on;
  if (on) return;
  for (KeptStep& slot : kept) {
    std::lock_guard<std::mutex> lock(slot.mutex);
    slot.hold(-1);
  }
}

void Walk::release_kept(int64_t step) const {
  if (two_steps) return;
  KeptStep& slot = kept[static_cast<size_t>(step % 2)];
  std::lock_guard<std::mutex> lock(slot.mutex);
  if (slot.step == step) slot.hold(-1);
}

TimeSplit WalkClock::split(double reader_seconds) const {
  const auto seconds = [this](Part p) { return static_cast<double>(nanoseconds_[p].load()) * 1e-9; };
  TimeSplit t;
  t.test_features = seconds(kTestFeatures);
  t.training_signals = seconds(kTrainingSignals);
  t.contraction = seconds(kContraction);
  t.replay = std::max(0.0, reader_seconds - std::chrono::duration<double>(in_steps_).count());
  return t;
}

Walk::Batch Walk::batch(PathReader& reader, const PathStep& st, bool need_x, int64_t signal_chunk,
                        const SegmentEvaluator* at) {
  return batch_of(reader, st, need_x, signal_chunk, at, true);
}

Walk::Batch Walk::batch_signals(PathReader& reader, const PathStep& st, int64_t signal_chunk,
                                const SegmentEvaluator& at) {
  return batch_of(reader, st, false, signal_chunk, &at, false);
}

void Walk::finish_batch(const PathStep& st, Batch& bt, int64_t signal_chunk) const {
  if (bt.gradient.defined()) return;
  OpenMpThreads single(1);  // as the task that formed the batch's signals would have
  bt.gradient = signals_gradient(st, bt, signal_chunk, ev);
}

Walk::Batch Walk::batch_of(PathReader& reader, const PathStep& st, bool need_x, int64_t signal_chunk,
                           const SegmentEvaluator* at, bool gradient) {
  const bool from_signals = !captured && signal_chunk > 0 && gradient_from_signals;
  Batch out;
  out.from_signals = from_signals;
  {
    WalkClock::Scope timed(clock, WalkClock::kTrainingSignals);
    out.idx = st.batch.defined() ? st.batch : torch::arange(M);
    out.b = out.idx.size(0);
    // Converted per batch: a float64 copy of the whole set (376 MB for
    // Fashion-MNIST) was memory first touched for little.
    if (!captured || need_x) {
      out.xb = reader.train_inputs(st.batch).to(torch::kFloat64);
    }
    if (!captured) out.yb = y_train.index_select(0, out.idx);
    out.wb = reader.loss_weights(out.idx);
    if (captured) out.gradient = st.gradient;
    else if (!from_signals) out.gradient = mean_gradient(grad64, m, st, out.xb, out.yb, out.wb);
  }
  if (from_signals && gradient) {
    out.gradient = signals_gradient(st, out, signal_chunk, at ? *at : ev);  // timed by chunk_signals
  } else if (from_signals) {  // the chunks' signals only, kept for finish_batch
    for (int64_t r0 = 0; r0 < out.b; r0 += signal_chunk) {
      const DropoutStep dropout(m.init_seed, st.step);  // as signals_gradient
      (void)chunk_signals(st, out, r0, std::min(signal_chunk, out.b - r0), at ? *at : ev, false);
    }
  }
  return out;
}

torch::Tensor Walk::signals_gradient(const PathStep& st, const Batch& bt, int64_t chunk,
                                     const SegmentEvaluator& at) const {
  PK_ASSERT(gradient_from_signals && chunk > 0);
  torch::Tensor g = torch::zeros({m.parameter_count}, torch::kFloat64);
  for (int64_t r0 = 0; r0 < bt.b; r0 += chunk) {
    const int64_t nr = std::min(chunk, bt.b - r0);
    const DropoutStep dropout(m.init_seed, st.step);  // as train_chunks: the step's masks
    const TrainSignals t = chunk_signals(st, bt, r0, nr, at);
    for (size_t l = 0; l < at.param_layers().size(); ++l) add_layer_gradient(at, t, l, g);
  }
  return g.mul_(st.clip / static_cast<double>(bt.b));
}

void Walk::hold_statistics(const PathStep& st) {
  if (st.buffers.defined()) set_flat_buffers(net64, st.buffers);
}

TrainSignals Walk::chunk_signals(const PathStep& st, const Batch& bt, int64_t r0, int64_t nr,
                                 const SegmentEvaluator& at, bool gradients) const {
  WalkClock::Scope timed(clock, WalkClock::kTrainingSignals);
  PK_ASSERT(st.step >= 0);
  // Groups of test points ask concurrently: the first forms a chunk, the
  // others wait and take it if kept.
  KeptStep& slot = kept[static_cast<size_t>(st.step % 2)];
  std::lock_guard<std::mutex> lock(slot.mutex);
  slot.hold(st.step);
  const auto found = slot.chunks.find({r0, nr});
  if (found != slot.chunks.end()) {
    // Kept without its per-sample gradients (batch_signals): the first
    // to need them forms them in place.
    if (gradients) slot.doubles += form_sample_gradients(at, found->second);
    return found->second;
  }
  TrainSignals t;
  int64_t doubles = 0;
  if (captured) {
    t = captured_signals(st, r0, nr);  // views of the replay's own
  } else {
    t = train_signals(at, bt.xb.narrow(0, r0, nr), bt.yb.narrow(0, r0, nr), map, loss, rows(bt.wb, r0, nr));
    doubles += signal_doubles(t);
  }
  if (gradients) doubles += form_sample_gradients(at, t);
  if (slot.doubles + doubles <= keep_doubles) {
    slot.chunks.emplace(std::make_pair(r0, nr), t);
    slot.doubles += doubles;
  }
  return t;
}

void tally(Decomposition& d, const TestFeatures& f) {
  d.add_counts(f);
  d.certificate_max_gap = std::max(d.certificate_max_gap, f.certificate_gap);
}

void take_group(Decomposition& d, const DecompositionOptions& options, const Walk& w, int64_t step,
                const torch::Tensor& train_index, PointGroup& g) {
  tally(d, g.f);
  if (options.on_step) {
    const torch::Tensor x = w.x.narrow(0, g.first, g.count);
    options.on_step({step, g.first, &w.ev, &x, &g.f, train_index, g.step_c});
  }
  g.f = TestFeatures();
  g.step_c = torch::Tensor();
}

std::vector<PointGroup> chunk_groups(const SegmentEvaluator& ev, int64_t c0, int64_t nc, const PointBudget& budget) {
  std::vector<PointGroup> out;
  for (int64_t b0 = 0; b0 < nc; b0 += budget.block) {
    const int64_t nb = std::min(budget.block, nc - b0), groups = point_groups(ev, nb, budget.factored, budget.group_workers);
    for (int64_t g = 0; g < groups; ++g) {
      PointGroup& p = out.emplace_back();
      p.chunk = c0;
      p.first = c0 + b0 + group_start(g, groups, nb);
      p.count = group_start(g + 1, groups, nb) - group_start(g, groups, nb);
    }
  }
  return out;
}

void keep_counts(TestFeatures& f) {
  TestFeatures counts;
  static_cast<QuadratureCounts&>(counts) = f;
  counts.certificate_gap = f.certificate_gap;
  f = std::move(counts);
}

std::string status_line(const Decomposition& d, int64_t point_steps) {
  char status[96];
  std::snprintf(status, sizeof status, "certificate gap %.1e, %.1f evaluations/step", d.certificate_max_gap,
                static_cast<double>(d.evaluations) / static_cast<double>(point_steps));
  return status;
}

Decomposition start(PathReader& reader, Network& net64, const torch::Tensor& x, int64_t block) {
  const Manifest& m = reader.manifest();
  const int64_t n = x.size(0), M = reader.train_count(), K = m.num_classes;
  Decomposition d;
  d.steps = m.steps;
  const size_t last = m.checkpoints.size() - 1;
  const torch::Tensor w0 = reader.checkpoint(0), wN = reader.checkpoint(last);
  const torch::Tensor mu0 = reader.checkpoint_buffers(0), muN = reader.checkpoint_buffers(last);
  Network net = m.dtype == "float64" ? Network(nullptr) : build_network(m.network_options(net64->options().position));
  std::vector<torch::Tensor> f0, fN, fN_run;
  for (int64_t b0 = 0; b0 < n; b0 += block) {  // block by block, like the rest
    const torch::Tensor xb = x.narrow(0, b0, std::min(block, n - b0));
    f0.push_back(test_outputs(net64, w0, mu0, xb));
    fN.push_back(test_outputs(net64, wN, muN, xb));
    // A float64 run's network is net64's twin.
    fN_run.push_back(m.dtype == "float64" ? fN.back() : test_outputs(net, wN, muN, xb));
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

torch::Tensor statistics_term(PathReader& reader, Network& net64, const torch::Tensor& x, int64_t first, int64_t end,
                              int64_t block) {
  if (!net64->batch_statistics()) return {};
  const int64_t n = x.size(0);
  torch::Tensor total = torch::zeros({n, reader.manifest().num_classes}, torch::kFloat64);
  reader.forward(
      [&](const PathStep& st) {
        const torch::Tensor w1 = st.w + st.delta;  // w_{s+1}, as the step's segment ends
        for (int64_t b0 = 0; b0 < n; b0 += block) {
          const int64_t nb = std::min(block, n - b0);
          const torch::Tensor xb = x.narrow(0, b0, nb);
          total.narrow(0, b0, nb)
              .add_(test_outputs(net64, w1, st.buffers_next, xb) - test_outputs(net64, w1, st.buffers, xb));
        }
      },
      first, end);
  return total;
}

const DecompositionProgress* restore(DecompositionCheckpoint* checkpoint, Decomposition& d, int64_t chunk,
                                     bool kernel, Decomposition* block) {
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

void save_progress(DecompositionCheckpoint& checkpoint, const Decomposition& d, int64_t chunk, int64_t chunk_start,
                   int64_t steps_done, const Decomposition& block, const torch::Tensor& acc) {
  DecompositionProgress p;
  p.chunk = chunk;
  p.chunk_start = chunk_start;
  p.steps_done = steps_done;
  p.partial = d;
  p.block = block;
  p.acc = acc;
  checkpoint.save(p);
}

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
  // A reverse walk's group takes its dense features and A_s, K x P each; a
  // buffer's accumulator Ã is held for every point of the chunk.
  const int64_t dense = reverse ? m.num_classes * m.parameter_count : 0;
  budget.held_per_point = UpdateRule(m.optimizer).has_buffer() ? dense : 0;
  budget.per_point = 2 * dense + budget.held_per_point + rows_per_point * layout.doubles_per_row;
  const int64_t asked = options.point_block > 0 ? options.point_block : layout.factored ? 32 : 4;
  budget.block = std::clamp<int64_t>(options.memory_doubles / std::max<int64_t>(1, budget.per_point), 1, asked);
  budget.factored = layout.factored;
  return budget;
}

}  // namespace pathkernel::decomposition_walk
