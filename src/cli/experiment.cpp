// `pathkernel experiment`: reproduces one of the paper's experiments.
#include <cstdio>
#include <filesystem>
#include <memory>

#include "commands.h"
#include "pathkernel/experiment.h"

namespace pathkernel::cli {

void add_experiment_command(CLI::App& app, Globals& globals) {
  struct Args {
    std::string name, out;
    bool quick = false;
  };
  auto args = std::make_shared<Args>();
  std::string names;
  for (const auto& n : experiment_names()) names += "\n  " + n + "  " + experiment_description(n);
  CLI::App* cmd = app.add_subcommand("experiment", "Reproduce one of the paper's experiments: train, measure, plot");
  cmd->add_option("NAME", args->name, "Experiment:" + names)->required();
  cmd->add_option("--out", args->out, "Output directory (default: experiments/NAME)");
  cmd->add_flag("--quick", args->quick, "Tiny sizes: a smoke test of the pipeline in seconds");
  cmd->callback([args, &globals] {
    globals.apply();
    ExperimentOptions options;
    options.out = args->out.empty() ? (std::filesystem::path("experiments") / args->name).string() : args->out;
    options.quick = args->quick;
    options.progress = !globals.quiet;
    experiment_description(args->name);  // an unknown name fails before anything is written
    ExperimentResult r = run_experiment(args->name, options);
    globals.print({{"experiment", r.name}, {"out", r.out}, {"summary", r.out + "/summary.md"}, {"seconds", r.seconds}},
                  r.name + ": " + r.out + "/summary.md (" + std::to_string(r.seconds) + " s)");
  });
}

}  // namespace pathkernel::cli
