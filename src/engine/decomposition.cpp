// Streaming the path to decompose the final outputs per training point: the
// summary, the blocks of steps, and decompose() choosing the forward walk
// (decomposition_forward.cpp) or the reverse walk (decomposition_reverse.cpp).
#include "pathkernel/decomposition.h"

#include <algorithm>
#include <sstream>

#include "add_at_rows.h"
#include "decomposition_walk.h"
#include "pathkernel/error.h"
#include "pathkernel/loss.h"
#include "pathkernel/progress.h"
#include "pathkernel/sequence.h"
#include "pathkernel/update_rule.h"

namespace pathkernel {

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
  const torch::Tensor point_error = std::get<0>(relative_error(prediction, d.fN).flatten(1).max(1));
  s.worst_point = point_error.argmax().item<int64_t>();
  s.max_rel_error = point_error[s.worst_point].item<double>();
  s.completeness_error = d.completeness_gap().abs().max().item<double>();
  s.max_abs_rounding = d.rounding.abs().max().item<double>();
  s.max_abs_regularization = d.regularization.abs().max().item<double>();
  if (d.statistics.defined()) s.max_abs_statistics = d.statistics.abs().max().item<double>();
  s.certificate_max_gap = d.certificate_max_gap;
  torch::Tensor magnitude = d.f0.abs() + d.contributions.abs().sum(1) + d.regularization.abs() + d.rounding.abs();
  if (d.statistics.defined()) magnitude = magnitude + d.statistics.abs();
  const torch::Tensor scale = d.fN.abs().clamp_min(1.0);  // what max_rel_error is relative to
  const torch::Tensor cancellation = (magnitude / scale).flatten(1);
  s.cancellation = cancellation.max().item<double>();
  s.worst_point_cancellation = cancellation[s.worst_point].max().item<double>();
  if (d.gap_abs.defined()) {
    const torch::Tensor bound = (d.gap_abs / scale).flatten(1);
    s.error_bound = bound.max().item<double>();
    s.worst_point_error_bound = bound[s.worst_point].max().item<double>();
  }
  const double point_steps = static_cast<double>(std::max<int64_t>(1, s.test_points * d.steps));
  s.mean_evaluations_per_step = static_cast<double>(d.evaluations) / point_steps;
  s.mean_forward_evaluations_per_step = static_cast<double>(d.forward_evaluations) / point_steps;
  s.mean_moment_evaluations_per_step = static_cast<double>(d.moment_evaluations) / point_steps;
  s.mean_kinks_per_step = static_cast<double>(d.kinks) / point_steps;
  for (int64_t k : d.kinks_by_site) s.mean_kinks_per_step_by_site.push_back(static_cast<double>(k) / point_steps);
  s.max_abs_run_dtype_difference = d.fN_run.defined() ? (d.fN_run - d.fN).abs().max().item<double>() : 0.0;
  s.seconds = d.seconds;
  s.time_split = d.time_split;
  s.step_threads = d.step_threads;
  s.residuals = d.residuals;
  return s;
}

std::string unexplained_update_message(const StepResiduals& r) {
  if (r.explained()) return "";
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

std::string rounding_branch_message(const StepResiduals& r) {
  if (!r.rounding_branches || r.first_step < 0) return "";
  std::ostringstream out;
  out << r.steps_over << " step(s) from step " << r.first_step
      << " on differ from the update the engine's float64 gradient gives by more than rounding (the worst, step "
      << r.worst_step << ", by " << r.max_residual << " against a rounding bound of " << r.bound
      << "), yet replaying the training with the declared loss and optimizer reproduced the checkpoints after "
         "them bit for bit: the training did what the run describes, and its rounding took a branch the float64 network "
         "did not (a ReLU input or a max-pool window's two largest entries within rounding of a tie). The "
         "kernel machine still equals the network: the rounding term E carries those steps' difference, which "
         "is not attributed to training points.";
  return out.str();
}

void read_residuals_against_replay(PathReader& reader, StepResiduals& r) {
  r.rounding_branches = r.steps_over > 0 && static_cast<int64_t>(r.over_steps.size()) == r.steps_over &&
                        std::all_of(r.over_steps.begin(), r.over_steps.end(),
                                    [&](int64_t s) { return reader.step_reproduced(s); });
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
  PK_CHECK(total.layer_contributions.defined() == block.layer_contributions.defined(),
           "add_step_block: the contributions by layer are in one decomposition and not in the other");
  if (block.layer_contributions.defined()) {
    if (rows.defined()) add_at_rows(total.layer_contributions, rows, block.layer_contributions);
    else total.layer_contributions.add_(block.layer_contributions);
  }
  if (rows.defined()) {
    add_at_rows(total.contributions, rows, block.contributions);
    if (block.kernel.defined()) add_at_rows(total.kernel, rows, block.kernel);
  } else {
    total.contributions.add_(block.contributions);
    if (block.kernel.defined()) total.kernel.add_(block.kernel);
  }
  total.regularization.add_(block.regularization);
  total.rounding.add_(block.rounding);
  if (block.statistics.defined()) {
    total.statistics = total.statistics.defined() ? total.statistics + block.statistics : block.statistics.clone();
  }
  total.gap_abs.add_(block.gap_abs);
}

Decomposition decompose(PathReader& reader, const torch::Tensor& x_in, const DecompositionOptions& options) {
  return decompose(reader, x_in, options, nullptr);
}

EngineRoute engine_route(PathReader& reader, const DecompositionOptions& options) {
  Network net64 = engine_network(reader.manifest().network_options(options.position));
  SegmentEvaluator ev(net64, options.quadrature.route);
  return {ev.route(), ev.route_reason()};
}

int64_t decomposition_block(PathReader& reader, const torch::Tensor& x, const DecompositionOptions& options) {
  const Manifest& m = reader.manifest();
  const bool reverse = UpdateRule(m.optimizer).walks_in_reverse() || options.reverse;
  Network net64 = engine_network(m.network_options(options.position));
  SegmentEvaluator ev(net64, options.quadrature.route);
  const torch::Tensor x64 = x.to(torch::kFloat64);
  return decomposition_walk::point_budget(ev, reader, x64, options, reverse).block;
}

namespace {

/// d with its residuals read against the replay (read_residuals_against_replay).
Decomposition with_replay_read(PathReader& reader, Decomposition d) {
  read_residuals_against_replay(reader, d.residuals);
  return d;
}

/// d with its running-statistics term S over the decomposed steps
/// (decomposition_walk::statistics_term), for a network with BatchNorm in
/// training mode; d unchanged otherwise.
Decomposition with_statistics(PathReader& reader, const torch::Tensor& x, const DecompositionOptions& options,
                              Decomposition d) {
  Network net64 = engine_network(reader.manifest().network_options());
  if (!net64->batch_statistics()) return d;
  const int64_t end = options.end_step < 0 ? reader.steps() : options.end_step;
  d.statistics = decomposition_walk::statistics_term(reader, net64, x.to(torch::kFloat64), options.first_step, end,
                                                     std::max<int64_t>(1, options.point_block > 0 ? options.point_block : 64));
  return d;
}

}  // namespace

Decomposition decompose(PathReader& reader, const torch::Tensor& x_in, const DecompositionOptions& given,
                        DecompositionCheckpoint* checkpoint) {
  const Manifest& m = reader.manifest();
  DecompositionOptions options = given;
  options.quadrature = given.quadrature.for_run(m.steps);  // the run's budget shared over its steps
  const UpdateRule rule(m.optimizer);  // checks the optimizer is supported
  if (options.position != -1 || m.sequence_length > 0) {  // a sequence model's position (sequence.h)
    resolve_position(options.position, m.sequence_length, "the position decomposed");
  }
  const int64_t end_step = options.end_step < 0 ? m.steps : options.end_step;
  PK_CHECK(options.first_step >= 0 && options.first_step <= end_step && end_step <= m.steps,
           "the steps to decompose must be a range within [0, " << m.steps << "] (got [" << options.first_step
                                                                << ", " << end_step << "))");
  PK_CHECK(!(options.kernel && ModelSpec::parse(m.model_spec).is_module() && reader.network()->batch_statistics()),
           "run '" << reader.dir() << "': the kernel K_s(x, x_i) is not computed for a module with BatchNorm in "
                   << "training mode (a training point's Jacobian depends on its whole batch); its contributions "
                   << "are: decompose without the kernel");
  PK_CHECK(!options.by_layer || !checkpoint,
           "the contributions by layer are not saved with the progress: decompose them without a checkpoint");
  if (rule.walks_in_reverse() || options.reverse) {
    PK_CHECK(options.first_step == 0 && end_step == m.steps,
             "a range of steps is decomposed alone for gd and sgd runs only; run '"
                 << reader.dir() << "' used '" << m.optimizer.name
                 << "', whose path is walked in reverse, as a whole (its buffer or its metric comes from the steps "
                    "before)");
    return with_statistics(reader, x_in, options,
                           with_replay_read(reader, decomposition_walk::decompose_reverse(reader, x_in, options, rule,
                                                                                          checkpoint)));
  }
  return with_statistics(
      reader, x_in, options,
      with_replay_read(reader, decomposition_walk::decompose_forward(reader, x_in, options, end_step, checkpoint)));
}

}  // namespace pathkernel
