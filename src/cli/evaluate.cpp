// `pathkernel evaluate`: do the attributions predict retraining? (evaluate()
// in evaluate.h does the work; this binds its options and prints the table.)
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "pathkernel/across_ranks.h"
#include "pathkernel/error.h"
#include "pathkernel/evaluate.h"
#include "pathkernel/text.h"

namespace pathkernel::cli {

namespace {

/// A comma-separated list of whole numbers, e.g. "10,20,40".
std::vector<int64_t> parse_grid(const std::string& text) {
  std::vector<int64_t> out;
  for (const std::string& field : split(text, ',')) {
    double v = 0;
    PK_CHECK(parse_number(field, v) && v == static_cast<double>(static_cast<int64_t>(v)),
             "--brittleness-grid: '" << field << "' is not a whole number (in '" << text << "')");
    out.push_back(static_cast<int64_t>(v));
  }
  return out;
}

/// The methods x metrics table as text, each column as wide as its name.
std::string table_text(const EvaluateResult& e) {
  std::string s = format_text("%-10s", "method");
  for (const std::string& c : e.columns) s += "  " + c;
  s += "\n";
  for (const MetricRow& row : e.table) {
    s += format_text("%-10s", row.method.c_str());
    for (size_t c = 0; c < e.columns.size(); ++c) {
      const int width = static_cast<int>(e.columns[c].size());
      const double v = row.values[c];
      s += std::isnan(v) ? format_text("  %*s", width, "-") : format_text("  %*.3g", width, v);
    }
    s += "\n";
  }
  return s;
}

/// The arguments of `pathkernel evaluate`.
struct EvaluateArgs {
  std::string run, out, methods = "epk,metagradient,dpk,tracin-cp,grad-dot,random", metrics = "loo,lds,mislabel";
  std::string scaling = "reduced", grid = "10,20,40,80";
  TestPointArgs points;
  QuadratureArgs q;
  EvaluateOptions evaluate;
};

/// What evaluate found, printed: the table, the views, each rank's retrainings.
void print_evaluation(const EvaluateResult& e, const std::string& out, const torch::Tensor& idx,
                      const std::vector<int64_t>& rank_jobs, const Globals& globals) {
  const Communicator& world = Communicator::world();
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  std::string ranks_text;
  for (size_t r = 0; r < rank_jobs.size(); ++r) {
    ranks.push_back({{"rank", r}, {"retrainings", rank_jobs[r]}});
    ranks_text += format_text("%s rank %zu: %lld", r ? "," : "", r, static_cast<long long>(rank_jobs[r]));
  }
  nlohmann::ordered_json summary{{"out", out},
                                 {"test_points", idx.size(0)},
                                 {"table", table_json(e)},
                                 {"retrain", retrain_json(e.retrain)},
                                 {"seconds", seconds_json(e)}};
  std::string views;
  if (e.views) {  // the exact contribution beside the metagradient
    const ViewComparison& v = *e.views;
    summary["views"] = {{"median_spearman", v.median_spearman},
                        {"mean_top_shared_fraction", v.mean_top_shared_fraction}};
    views = format_text("epk beside metagradient: median Spearman %.3f; of each point's top %lld by |score|, "
                        "%.0f%% shared (evaluate.json \"views\" lists the rest)\n",
                        v.median_spearman, static_cast<long long>(v.top), 100 * v.mean_top_shared_fraction);
  }
  if (world.size() > 1) summary["ranks"] = ranks;
  globals.print(summary, table_text(e) + views +
                             (world.size() > 1 ? std::to_string(world.size()) + " ranks, retrainings:" + ranks_text + "\n"
                                               : "") +
                             "wrote " + out + "/evaluate.json");
}

/// Runs `pathkernel evaluate` with its arguments.
void run_evaluate(const EvaluateArgs& args, const Globals& globals) {
  EvaluateOptions options = args.evaluate;
  options.methods = split(args.methods, ',');
  options.metrics = split(args.metrics, ',');
  options.brittleness_grid = parse_grid(args.grid);
  options.retrain.scaling = parse_removal_scaling(args.scaling);
  options.attribution.quadrature = args.q.options().quadrature;
  options.progress = !globals.quiet;
  options.on_note = [&globals](const std::string& note) {
    if (!globals.quiet) std::fprintf(stderr, "pathkernel: %s\n", note.c_str());
  };
  // Under mpirun the root evaluates and every rank takes a share of each
  // set of retrainings (across_ranks.h); the set-up is agreed first.
  const Communicator& world = Communicator::world();
  std::optional<PathReader> reader_storage;
  torch::Tensor idx;
  world.agree([&] {
    reader_storage.emplace(args.run);
    idx = args.points.indices(reader_storage->held_dataset().y_test, 20);
    options.validate(reader_storage->manifest().num_train, reader_storage->manifest().num_classes);
  });
  PathReader& reader = *reader_storage;
  const std::string out = args.out.empty() ? (std::filesystem::path(args.run) / "evaluate").string() : args.out;
  std::vector<int64_t> rank_jobs;  // retrainings per rank, under mpirun
  if (world.size() > 1) {
    if (!world.root()) {
      const Retrainer retrainer(reader);
      serve_retrainings(world, retrainer, reader.test_inputs(idx));
      return;
    }
    options.retrain_outputs = [&world, &rank_jobs](const Retrainer& r, const std::vector<RetrainJob>& jobs,
                                                   const torch::Tensor& x, const RetrainOptions& o) {
      return retrain_outputs_across(world, r, jobs, x, o, &rank_jobs);
    };
  }
  // An error on the root past this point ends the job (main()): the other
  // ranks may be waiting for jobs.
  const EvaluateResult e = evaluate(reader, idx, out, options);
  end_retrainings(world);
  print_evaluation(e, out, idx, rank_jobs, globals);
}

}  // namespace

void add_evaluate_command(CLI::App& app, Globals& globals) {
  auto args = std::make_shared<EvaluateArgs>();
  EvaluateOptions& o = args->evaluate;
  CLI::App* cmd = app.add_subcommand(
      "evaluate", "Test attribution methods against retraining: leave-one-out, LDS, brittleness, mislabel detection");
  cmd->add_option("RUN", args->run, "Run directory")->required();
  args->points.add_to(cmd, "whose attributions are tested (default: the first 20)");
  cmd->add_option("--methods", args->methods, "Attribution methods: epk, metagradient, dpk, tracin-cp, grad-dot, random")
      ->capture_default_str();
  cmd->add_option("--metrics", args->metrics, "Metrics: loo, lds, brittleness, mislabel")->capture_default_str();
  cmd->add_option("--output", o.output,
                  "The output attributed: predicted (the predicted class's) or label (the true label's)")
      ->check(CLI::IsMember({"predicted", "label"}))
      ->capture_default_str();
  args->q.add_to(cmd, globals);
  cmd->add_option("--loo-extremes", o.loo_extremes,
                  "Leave-one-out: top and bottom points per test point, by the first method")
      ->capture_default_str();
  cmd->add_option("--loo-random", o.loo_random, "Leave-one-out: random points shared by the test points")
      ->capture_default_str();
  cmd->add_option("--lds-subsets", o.lds_subsets, "LDS: retrainings on random subsets")->capture_default_str();
  cmd->add_option("--lds-fraction", o.lds_fraction, "LDS: the fraction of the training set in each subset")
      ->capture_default_str();
  cmd->add_option("--brittleness-grid", args->grid, "Brittleness: the numbers k of top points removed")
      ->capture_default_str();
  cmd->add_option("--mislabel-fraction", o.mislabel_fraction, "Mislabel: the fraction of labels flipped")
      ->capture_default_str();
  cmd->add_option("--mislabel-candidates", o.mislabel_candidates,
                  "Mislabel: training points ranked, half of them flipped")
      ->capture_default_str();
  cmd->add_option("--removal", args->scaling,
                  "Removing points from a batch: reduced (mean over the points left, as training without them) "
                  "or kept (each point left keeps its weight 1/|B|)")
      ->check(CLI::IsMember({"reduced", "kept"}))
      ->capture_default_str();
  cmd->add_option("--workers", o.retrain.workers, "Retrainings at once, one thread each (0: all cores)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "Seed of the samples, subsets and flipped labels")->capture_default_str();
  cmd->add_option("--random-seed", o.attribution.seed, "Seed of the random method")->capture_default_str();
  cmd->add_option("--out", args->out, "Directory for evaluate.json and scores_<method>.npy (default: RUN/evaluate)");
  cmd->callback([args, &globals] {
    globals.apply();
    run_evaluate(*args, globals);
  });
}

}  // namespace pathkernel::cli
