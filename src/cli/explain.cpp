// `pathkernel explain`: per-training-point attribution of test predictions
// (explain() in explanation.h does the work; this binds its options and
// prints what it wrote).
#include <cstdio>
#include <filesystem>
#include <algorithm>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "pathkernel/across_ranks.h"
#include "pathkernel/explanation.h"
#include "pathkernel/metagradient_check.h"

namespace pathkernel::cli {

namespace {

/// A point's top five proponents and opponents, a line each.
void print_sides(const ExplainedPoint& p) {
  const std::pair<const char*, const std::vector<RankedPoint>*> sides[] = {{"proponents", &p.proponents},
                                                                          {"opponents", &p.opponents}};
  for (const auto& [side, list] : sides) {
    std::printf("  %-10s", side);
    int shown = 0;
    for (const RankedPoint& e : *list) {
      if (shown++ == 5) break;
      // A label is a class number, or a regression target's row.
      std::printf(" #%lld(label %s) %+.3g", static_cast<long long>(e.index), e.label.str().c_str(), e.value);
    }
    std::printf("\n");
  }
}

/// The top five proponents and opponents of each explained point, as text.
void print_points(const std::vector<ExplainedPoint>& points) {
  for (const ExplainedPoint& p : points) {
    std::printf("test %lld (label %s) predicted %lld; completeness error %.2e\n", static_cast<long long>(p.test_index),
                p.labelled ? p.label.str().c_str() : "none", static_cast<long long>(p.predicted), p.completeness_error);
    if (!p.text.empty()) std::printf("  text at position %lld: \"%s\"\n", static_cast<long long>(p.position), p.text.c_str());
    print_sides(p);
  }
}

/// The slowest rank's decomposition time and the sum over the ranks (the
/// work one process would do, if the shares cost the same alone as side by side).
struct RankSeconds {
  double slowest = 0;
  double sum = 0;
};

RankSeconds rank_seconds(const ExplainAcross& a) {
  RankSeconds t;
  for (double s : a.rank_seconds) {
    t.sum += s;
    t.slowest = std::max(t.slowest, s);
  }
  return t;
}

/// Each rank's test points and decomposition time, and their slowest and sum.
nlohmann::ordered_json ranks_json(const ExplainAcross& a) {
  const RankSeconds t = rank_seconds(a);
  return {{"count", a.rank_seconds.size()},
          {"points", a.rank_points},
          {"seconds", a.rank_seconds},
          {"seconds_max", t.slowest},
          {"seconds_sum", t.sum}};
}

void print_ranks(const ExplainAcross& a) {
  std::printf("%zu ranks:", a.rank_seconds.size());
  for (size_t r = 0; r < a.rank_seconds.size(); ++r) {
    std::printf(" rank %zu: %lld points in %.2f s;", r, static_cast<long long>(a.rank_points[r]), a.rank_seconds[r]);
  }
  const RankSeconds t = rank_seconds(a);
  std::printf(" slowest %.2f s of %.2f s in all\n", t.slowest, t.sum);
}

/// What --json prints: explain.json, with where it went and the PNG grids.
nlohmann::ordered_json summary_json(const ExplainDocument& doc, const std::string& out,
                                    const std::vector<std::string>& images) {
  nlohmann::ordered_json summary = explain_json(doc);
  summary["out"] = out;
  summary["images"] = images;
  return summary;
}

/// The arguments of `pathkernel explain`.
struct ExplainArgs {
  std::string run, out;
  TestPointArgs points;
  InputArgs inputs;
  std::string kernel = "auto";
  std::string method = "exact";
  std::string outputs = "predicted";
  int64_t check = 0;
  double fd_step = 1e-5;
  ExplainOptions explain;
  QuadratureArgs q;
  PositionArgs position;
};

/// The metagradient's text: its counters, each point's sides, the check.
void print_metagradient(const MetagradientExplanation& e, const std::string& outputs, const std::string& out) {
  const Metagradient& g = e.metagradient;
  std::printf("metagradient d f(w_N, x)/d(loss weight of training point i), %s output(s), %lld adjoint(s) "
              "through %lld steps in %.2f s\n",
              outputs.c_str(), static_cast<long long>(g.adjoints), static_cast<long long>(g.steps), g.seconds);
  for (const ExplainedPoint& p : e.document.points) {
    std::printf("test %lld (label %s) predicted %lld; output %lld\n", static_cast<long long>(p.test_index),
                p.label.str().c_str(), static_cast<long long>(p.predicted), static_cast<long long>(p.output));
    print_sides(p);
  }
  if (e.document.check) {
    const MetagradientCheckEntry& c = *e.document.check;
    std::printf("check on %zu training points: max relative error %.2e against finite differences of "
                "retraining (which resolve %.1e), %lld retrainings in %.1f s\n",
                c.points.size(), c.max_rel_error, c.max_rel_spread, static_cast<long long>(c.retrainings), c.seconds);
  }
  const torch::Tensor& c = g.values;
  std::printf("wrote %s/contributions.npy [%lld, %lld, %lld] (metagradient%s) and %s/explain.json\n", out.c_str(),
              static_cast<long long>(c.size(0)), static_cast<long long>(c.size(1)), static_cast<long long>(c.size(2)),
              g.outputs.defined() ? "; NaN in outputs not differentiated" : "", out.c_str());
}

/// explain --method metagradient, in one process, with its check when asked.
void run_metagradient(const ExplainArgs& args, const ExplainOptions& options, const Globals& globals) {
  const Communicator& world = Communicator::world();
  PK_CHECK(world.size() == 1, "explain --method metagradient runs in one process (got " << world.size() << " ranks)");
  PathReader reader(args.run);
  const torch::Tensor idx = args.points.indices(reader.held_dataset().y_test, 1);
  const std::string out = args.out.empty() ? (std::filesystem::path(args.run) / "metagradient").string() : args.out;
  MetagradientExplanation e =
      explain_metagradient(reader, idx, out, options, parse_metagradient_outputs(args.outputs));
  if (args.check > 0) {
    MetagradientCheckOptions copt;
    copt.h = args.fd_step;
    copt.retrain.progress = !globals.quiet;
    copt.retrain.label = "check";
    const MetagradientCheck c = check_metagradient(reader, reader.test_inputs(idx),
                                                   e.metagradient, strongest_points(e.metagradient, args.check), copt);
    record_check(e, c, copt.h);
  }
  if (globals.json) {
    globals.print(summary_json(e.document, out, e.images), "");
    return;
  }
  print_metagradient(e, args.outputs, out);
}

/// What explain --method exact wrote, as text or JSON.
void print_explanation(const ExplainAcross& across, const std::string& out, const Globals& globals) {
  const Communicator& world = Communicator::world();
  const Explanation& e = across.explanation;
  if (!e.document.warning.empty()) {  // updates the run does not describe (decomposition.h, StepResiduals)
    std::fprintf(stderr, "pathkernel: warning: %s\n", e.document.warning.c_str());
  }
  if (!e.document.note.empty()) std::fprintf(stderr, "pathkernel: note: %s\n", e.document.note.c_str());
  if (globals.json) {
    nlohmann::ordered_json summary = summary_json(e.document, out, e.images);
    if (world.size() > 1) summary["ranks"] = ranks_json(across);
    globals.print(summary, "");
    return;
  }
  print_points(e.document.points);
  if (world.size() > 1) print_ranks(across);
  const torch::Tensor& c = e.decomposition.contributions;
  std::printf("wrote %s/contributions.npy [%lld, %lld, %lld]%s%s and %s/explain.json\n", out.c_str(),
              static_cast<long long>(c.size(0)), static_cast<long long>(c.size(1)), static_cast<long long>(c.size(2)),
              e.kernel ? ", kernel.npy" : "", e.document.layers ? ", layer_contributions.npy" : "", out.c_str());
  if (!e.images.empty()) {
    std::printf("wrote %zu PNG grids (test image in blue; proponents green, top row; opponents red, bottom row): "
                "%s/%s ...\n", e.images.size(), out.c_str(), e.images.front().c_str());
  }
}

/// explain --method exact; under mpirun each rank explains a share of the
/// points (across_ranks.h).
void run_exact(const ExplainArgs& args, const ExplainOptions& options, const Globals& globals) {
  const Communicator& world = Communicator::world();
  std::optional<PathReader> reader;
  torch::Tensor idx;
  world.agree([&] {
    reader.emplace(args.run);
    idx = args.points.indices(reader->held_dataset().y_test, 1);
  });
  const std::string out = args.out.empty() ? (std::filesystem::path(args.run) / "explain").string() : args.out;
  const ExplainAcross across = explain_across(world, *reader, idx, out, options);
  if (!world.root()) return;
  print_explanation(across, out, globals);
}

/// explain --inputs: the inputs of a file, in one process.
void run_inputs(const ExplainArgs& args, const ExplainOptions& options, const Globals& globals) {
  const Communicator& world = Communicator::world();
  PK_CHECK(world.size() == 1, "explain --inputs runs in one process (got " << world.size() << " ranks)");
  PathReader reader(args.run);
  const ExplainInputs in = read_explain_inputs(reader, args.inputs.inputs, args.inputs.labels);
  const std::string out = args.out.empty() ? (std::filesystem::path(args.run) / "explain").string() : args.out;
  ExplainAcross across;
  across.explanation = explain_inputs(reader, in, out, options);
  print_explanation(across, out, globals);
}

}  // namespace

void add_explain_command(CLI::App& app, Globals& globals) {
  auto args = std::make_shared<ExplainArgs>();
  CLI::App* cmd = app.add_subcommand(
      "explain", "Split test predictions exactly into per-training-point contributions");
  cmd->add_option("RUN", args->run, "Run directory")->required();
  args->points.add_to(cmd, "to explain (default: test point 0)");
  args->inputs.add_to(cmd, "to explain");
  cmd->add_flag("--by-layer", args->explain.by_layer,
                "Also write layer_contributions.npy [n, M, K, L]: each contribution split over the network's L "
                "parameter tensors (exact method; progress is not saved)");
  cmd->add_option("--top", args->explain.top, "Proponents and opponents to list")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--method", args->method,
                  "exact: the exact split of each prediction into contributions, the path held fixed; "
                  "metagradient: d f(w_N, x)/d(loss weight of each training point), the whole run responding "
                  "(written to RUN/metagradient by default)")
      ->check(CLI::IsMember({"exact", "metagradient"}))
      ->capture_default_str();
  cmd->add_option("--outputs", args->outputs,
                  "With --method metagradient: differentiate each point's predicted class (one adjoint per point) "
                  "or all outputs (K adjoints)")
      ->check(CLI::IsMember({"predicted", "all"}))
      ->capture_default_str();
  cmd->add_option("--check", args->check,
                  "With --method metagradient: check it on the N training points of largest |metagradient| against "
                  "central finite differences of retraining (4 retrainings per point)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--fd-step", args->fd_step, "The loss-weight step h of --check (h and h/2 are used)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  args->q.add_to(cmd, globals);
  args->position.add_to(cmd);
  cmd->add_option("--kernel", args->kernel,
                  "Write kernel.npy, the summed kernel [n, M, K, K] of a gd or sgd run: auto (when it takes at most 2 GiB), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd->add_option("--out", args->out,
                  "Directory for contributions.npy and explain.json (default: RUN/explain, or RUN/metagradient)");
  cmd->add_option("--checkpoint-seconds", args->explain.checkpoint_seconds,
                  "Save the accumulators to OUT/.progress this often; a rerun with the same arguments continues "
                  "from there")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->callback([args, &globals] {
    globals.apply();
    ExplainOptions options = args->explain;
    options.decomposition = args->q.options();
    options.decomposition.position = args->position.position;  // checked against the run by explain()
    options.kernel = parse_kernel_output(args->kernel);
    options.on_note = [](const std::string& note) {
      const bool kernel = note.rfind("kernel.npy", 0) == 0;
      std::fprintf(stderr, "pathkernel: %s%s\n", note.c_str(), kernel ? " (use --kernel on to force)" : "");
    };
    if (args->method == "metagradient") {
      PK_CHECK(!args->inputs.given() && !options.by_layer,
               "explain --method metagradient explains the run's test points as a whole: --inputs and --by-layer "
               "belong to --method exact");
      run_metagradient(*args, options, globals);
    } else if (args->inputs.given()) {
      run_inputs(*args, options, globals);
    } else {
      run_exact(*args, options, globals);
    }
  });
}

}  // namespace pathkernel::cli
