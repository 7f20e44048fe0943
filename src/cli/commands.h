// The pathkernel command-line application: one file per subcommand.
#pragma once

#include <CLI/CLI.hpp>

namespace pathkernel::cli {

/// Options shared by every subcommand.
struct Globals {
  int threads = 0;      ///< 0: all cores
  int exit_status = 0;  ///< set by a subcommand that fails without throwing
  /// Applies the globals (threads) before a subcommand runs.
  void apply() const;
};

void add_train_command(CLI::App& app, Globals& globals);
void add_info_command(CLI::App& app, Globals& globals);
void add_check_path_command(CLI::App& app, Globals& globals);
void add_verify_command(CLI::App& app, Globals& globals);

/// Parses argv and runs the chosen subcommand. Returns the exit status.
/// User errors propagate as pathkernel::Error.
int run(int argc, char** argv);

}  // namespace pathkernel::cli
