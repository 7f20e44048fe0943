// `pathkernel verify`: check the exact kernel machine against the network on test points.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "pathkernel/decomposition.h"
#include "pathkernel/across_ranks.h"
#include "pathkernel/arithmetic.h"
#include "pathkernel/error.h"
#include "pathkernel/input_file.h"
#include "pathkernel/sequence.h"

namespace pathkernel::cli {

namespace {

struct VerifyArgs {
  std::string run;
  TestPointArgs points;
  InputArgs inputs;
  QuadratureArgs q;
  PositionArgs position;
  double fail_above = -1;
};

/// The test side's and the training side's arithmetic (arithmetic.h) as
/// `verify --json` reports it (divided by seconds_by_part's test_features
/// and training_signals, their rates); null on the generic route.
nlohmann::ordered_json arithmetic_json(PathReader& reader, const DecompositionOptions& options, const torch::Tensor& x,
                                       const Decomposition& d) {
  const std::optional<RowArithmetic> a = row_arithmetic(reader, options, x);
  if (!a) return nullptr;
  return {{"test_side_gflop", a->test_side_flop(d, d.f0.size(1)) / 1e9},
          {"training_side_gflop", a->training_side_flop(reader.manifest()) / 1e9},
          {"forward_mflop_per_row", a->forward_flop / 1e6},
          {"cotangent_mflop_per_row", a->cotangent_flop / 1e6},
          {"training_mflop_per_row", a->training_row_flop / 1e6}};
}

/// Kinks per test point and step by site (DecompositionSummary::
/// mean_kinks_per_step_by_site): one entry per param layer up to the last
/// with a kink after it, null where the route does not know the sites.
/// Kinks found in closed form (the first layer's) are counted in `kinks`
/// alone: the closed form does not tell flips from switches.
nlohmann::ordered_json kinks_by_site_json(const std::vector<double>& by_site) {
  if (by_site.empty()) return nullptr;
  nlohmann::ordered_json sites = nlohmann::ordered_json::array();
  const size_t kinds = QuadratureCounts::kKinkKinds;
  for (size_t l = 0; kinds * (l + 1) <= by_site.size(); ++l) {
    const double* k = &by_site[kinds * l];
    sites.push_back({{"after_param_layer", l},
                     {"kinks", k[QuadratureCounts::kReluFlip] + k[QuadratureCounts::kPoolSwitch] +
                                   k[QuadratureCounts::kClosedForm]},
                     {"relu_flips", k[QuadratureCounts::kReluFlip]},
                     {"pool_switches", k[QuadratureCounts::kPoolSwitch]}});
  }
  return sites;
}

/// The inputs checked: the test points chosen (and their indices in the
/// test set), or a file's inputs with their labels, if given (input_file.h).
void choose_points(const VerifyArgs& args, const Dataset& data, torch::Tensor& x, torch::Tensor& labels,
                   torch::Tensor& test_index) {
  if (!args.inputs.given()) {
    test_index = args.points.indices(data.y_test, 100);
    x = test_inputs(data, test_index);
    return;
  }
  x = read_inputs(args.inputs.inputs, data);
  if (!args.inputs.labels.empty()) labels = read_input_labels(args.inputs.labels, data, x.size(0));
}

}  // namespace

void add_verify_command(CLI::App& app, Globals& globals) {
  auto args = std::make_shared<VerifyArgs>();
  CLI::App* cmd = app.add_subcommand("verify", "Check the exact kernel machine against the network on test points");
  cmd->add_option("RUN", args->run, "Run directory")->required();
  args->points.add_to(cmd, "to check (default: the first 100)");
  args->inputs.add_to(cmd, "to check");
  args->q.add_to(cmd, globals);
  args->position.add_to(cmd);
  cmd->add_option("--fail-above", args->fail_above, "Exit non-zero if max_rel_error exceeds this");
  cmd->callback([args, &globals] {
    globals.apply();
    DecompositionOptions options = args->q.options();
    // Under mpirun each rank decomposes a share of the points (across_ranks.h).
    const Communicator& world = Communicator::world();
    std::optional<PathReader> reader_storage;
    torch::Tensor x, labels, test_index;
    world.agree([&] {
      reader_storage.emplace(args->run);
      options.position = args->position.checked(reader_storage->manifest());
      choose_points(*args, reader_storage->held_dataset(), x, labels, test_index);
    });
    PathReader& reader = *reader_storage;
    Decomposition d = decompose_across(world, reader, x, options);
    if (!world.root()) return;
    const DecompositionSummary s = summarize(d);
    const EngineRoute route = engine_route(reader, options);
    nlohmann::ordered_json j{{"run", args->run},
                             {"test_points", s.test_points},
                             {"steps", s.steps},
                             {"quadrature", options.quadrature.spec.str()},
                             {"tol", options.quadrature.run_tol},
                             {"max_abs_error", s.max_abs_error},
                             {"max_rel_error", s.max_rel_error},
                             {"completeness_error", s.completeness_error},
                             {"max_abs_rounding", s.max_abs_rounding},
                             {"max_abs_regularization", s.max_abs_regularization},
                             // BatchNorm in training mode: the running statistics' term S.
                             {"max_abs_statistics", std::isnan(s.max_abs_statistics)
                                                        ? nlohmann::ordered_json(nullptr)
                                                        : nlohmann::ordered_json(s.max_abs_statistics)},
                             {"certificate_max_gap", s.certificate_max_gap},
                             // The certificate's bound on max_rel_error: the steps' gaps summed.
                             {"error_bound", s.error_bound},
                             // (|f(w_0)| + Σ|C_i| + |R| + |E|) / max(1, |f|): the sums round by about ε times it.
                             {"cancellation", s.cancellation},
                             {"mean_evaluations_per_step", s.mean_evaluations_per_step},
                             {"mean_forward_evaluations_per_step", s.mean_forward_evaluations_per_step},
                             // Nodes that walk back one cotangent (the log-softmax factor's).
                             {"mean_moment_evaluations_per_step", s.mean_moment_evaluations_per_step},
                             {"mean_kinks_per_step", s.mean_kinks_per_step},
                             // Where they were: the ReLU (and its max-pool) after each param layer.
                             {"mean_kinks_per_step_by_site", kinks_by_site_json(s.mean_kinks_per_step_by_site)},
                             {"seconds", s.seconds},
                             // Where they went, summed over threads and ranks (TimeSplit).
                             {"seconds_by_part", {{"test_features", s.time_split.test_features},
                                                  {"training_signals", s.time_split.training_signals},
                                                  {"contraction", s.time_split.contraction},
                                                  {"replay", s.time_split.replay},
                                                  {"replay_ahead", s.time_split.replay_ahead}}},
                             // Threads that each walked blocks of steps on their own (1: one walk).
                             {"step_threads", s.step_threads},
                             // How the network was evaluated: pathkernel's own layers, a
                             // TorchScript module's structured route, or autograd alone.
                             {"route", route.route},
                             // A float32 run is decomposed against the float64 network at its
                             // float32 weights; its own outputs differ by float32 rounding.
                             {"dtype", reader.manifest().dtype},
                             {"max_abs_run_dtype_difference", s.max_abs_run_dtype_difference},
                             // Whether every recorded update is what the declared loss and
                             // optimizer give (StepResiduals).
                             {"updates_explained", s.residuals.explained()},
                             {"max_update_residual_ratio", s.residuals.max_ratio},
                             {"first_unexplained_step", s.residuals.explained()
                                                            ? nlohmann::ordered_json(nullptr)
                                                            : nlohmann::ordered_json(s.residuals.first_step)},
                             // Steps over their bound that the replay reproduced bit for bit:
                             // the run's rounding took a branch the float64 network did not.
                             {"rounding_branch_steps", s.residuals.rounding_branches ? s.residuals.steps_over : 0}};
    // Which point max_rel_error is of: its index in the test set (or its row
    // in the inputs file), its error and the certificate's bound on it.
    j["worst_point"] = {{test_index.defined() ? "test_index" : "input_row",
                         test_index.defined() ? test_index[s.worst_point].item<int64_t>() : s.worst_point},
                        {"max_rel_error", s.max_rel_error},
                        {"error_bound", s.worst_point_error_bound},
                        {"cancellation", s.worst_point_cancellation}};
    if (!route.reason.empty()) j["route_reason"] = route.reason;
    // Why the path was replayed between the walk's steps, not beside them.
    if (!reader.replay_in_turn_reason().empty()) j["replay_in_turn_reason"] = reader.replay_in_turn_reason();
    if (reader.replay_team() > 1) j["replay_openmp_threads"] = reader.replay_team();
    j["arithmetic"] = arithmetic_json(reader, options, x, d);
    if (reader.manifest().sequence_length > 0) {  // the position whose outputs were decomposed
      j["position"] = resolve_position(options.position, reader.manifest().sequence_length);
    }
    if (args->inputs.given()) {
      j["inputs"] = args->inputs.inputs;
      if (labels.defined() && labels.dim() == 1) {  // class labels: how many the network gets right
        j["accuracy"] = d.fN.argmax(1).eq(labels).to(torch::kFloat64).mean().item<double>();
      }
    }
    std::string drift_text;
    if (reader.replays_recorded()) {
      const ReplayDrift drift = reader.replay_drift();
      nlohmann::ordered_json per = nlohmann::ordered_json::array();
      for (size_t i = 0; i < drift.steps.size(); ++i) {
        per.push_back({{"step", drift.steps[i]}, {"max_abs_diff", drift.max_abs_diff[i]},
                       {"bit_for_bit", static_cast<bool>(drift.bitwise_equal[i])}});
      }
      const double scale = reader.checkpoint(reader.manifest().checkpoints.size() - 1).abs().max().item<double>();
      drift_text = replay_drift_message(drift, scale);
      // How far the replay of a compact recording drifted from its checkpoints (carried into E).
      j["replay_drift"] = {{"max_abs_diff", drift.max()},
                           {"at_checkpoint_step", drift.worst_step() < 0 ? nlohmann::ordered_json(nullptr)
                                                                         : nlohmann::ordered_json(drift.worst_step())},
                           {"checkpoints", drift.steps.size()},
                           {"bit_for_bit", drift.bit_for_bit()},
                           {"message", drift_text},
                           {"per_checkpoint", per}};
    }
    const std::string unexplained = unexplained_update_message(s.residuals);
    if (!unexplained.empty()) j["warning"] = unexplained;
    const std::string branches = rounding_branch_message(s.residuals);
    if (!branches.empty()) j["note"] = branches;
    std::string text = "kernel machine vs network on " + std::to_string(s.test_points) + " test points, " +
                       std::to_string(s.steps) + " steps, quadrature " + options.quadrature.spec.str() + ":";
    for (auto& [key, value] : j.items()) {
      if (key != "run" && key != "warning" && key != "note" && key != "replay_drift") text += format_text("\n  %-26s %s", key.c_str(), value.dump().c_str());
    }
    if (!drift_text.empty()) text += "\n  replay: " + drift_text;
    if (!unexplained.empty()) text += "\nwarning: " + unexplained;
    if (!branches.empty()) text += "\nnote: " + branches;
    globals.print(j, text);
    if (args->fail_above >= 0 && j["max_rel_error"].get<double>() > args->fail_above) globals.exit_status = 1;
  });
}

}  // namespace pathkernel::cli
