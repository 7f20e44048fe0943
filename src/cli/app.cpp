// The application object: global options and subcommand registration.
#include <cstdio>

#include "commands.h"
#include "pathkernel/context.h"
#include "pathkernel/version.h"

namespace pathkernel::cli {

void Globals::apply() const {
  set_threads(threads == 0 ? hardware_threads() : threads);
  warn_if_slow_blas();
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return globals.exit_status;
}

}  // namespace pathkernel::cli
