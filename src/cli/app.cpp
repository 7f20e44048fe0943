// The application object: global options and subcommand registration.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>

#include "commands.h"
#include "op_profile.h"
#include "pathkernel/context.h"
#include "pathkernel/version.h"

namespace pathkernel::cli {

void Globals::apply() const {
  // The ranks of a job on one machine share its cores.
  const int local_ranks = Communicator::world().local_size();
  set_threads(threads == 0 ? std::max(1, hardware_threads() / local_ranks) : threads);
  warn_if_slow_blas();
}

void check_same_arguments(const Communicator& world, int argc, char** argv) {
  if (world.size() == 1) return;
  std::string mine;
  for (int i = 1; i < argc; ++i) mine += std::string(i > 1 ? " " : "") + argv[i];
  const std::string root = world.broadcast(mine);
  world.check(mine == root ? "" : "started with the arguments '" + mine + "', rank 0 with '" + root +
                                      "': every rank of a job runs the same command");
}

int run(int argc, char** argv) {
  CLI::App app{
      "pathkernel: a network trained by gradient descent as its exact kernel machine.\n"
      "Train a model and record its path, then inspect and replay it."};
  app.set_version_flag("--version", "pathkernel " + pathkernel_version() + " (LibTorch " +
                                        libtorch_version() + ")");
  Globals globals;
  app.add_option("--threads", globals.threads, "Threads for LibTorch and BLAS (default: all cores)")
      ->check(CLI::Range(1, 1024));
  app.add_flag("--json", globals.json, "Print the result as one JSON object");
  app.add_flag("--quiet", globals.quiet, "No progress bars");
  // The global options may also follow the subcommand: `pathkernel verify R --json`.
  app.fallthrough();
  app.require_subcommand(1);
  add_train_command(app, globals);
  add_info_command(app, globals);
  add_check_path_command(app, globals);
  add_verify_command(app, globals);
  add_explain_command(app, globals);
  add_gram_command(app, globals);
  add_gp_command(app, globals);
  add_refit_command(app, globals);
  add_compare_command(app, globals);
  add_experiment_command(app, globals);
  add_report_command(app, globals);
  add_evaluate_command(app, globals);
  // Under mpirun only these split their work; the others would run N times over.
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    const std::string name = sub->get_name();
    if (name == "explain" || name == "verify" || name == "gram" || name == "evaluate") continue;
    sub->preparse_callback([name](std::size_t) {
      const Communicator& world = Communicator::world();
      if (world.size() == 1) return;
      throw AgreedError("'" + name + "' runs as one process, not under mpirun (" + std::to_string(world.size()) +
                        " ranks): only explain, verify, gram and evaluate split their work across ranks");
    });
  }
  // PATHKERNEL_OP_PROFILE=FILE: where the command's time goes, by LibTorch operation.
  const std::unique_ptr<OpProfile> profile = op_profile_from_environment();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Every rank parses the same arguments: rank 0 says what is wrong.
    if (Communicator::world().root()) return app.exit(e);
    std::ostringstream quiet;
    return app.exit(e, quiet, quiet);
  }
  return globals.exit_status;
}

}  // namespace pathkernel::cli
