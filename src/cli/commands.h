// The pathkernel command-line application: one file per subcommand.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pathkernel/decomposition.h"
#include "pathkernel/distributed.h"
#include "pathkernel/gram.h"
#include "pathkernel/test_points.h"

namespace pathkernel::cli {

/// Options shared by every subcommand, declared once on the application
/// (before or after the subcommand's name): --threads, --json, --quiet.
struct Globals {
  int threads = 0;      ///< 0: all cores (shared by the ranks of a job on one machine)
  bool json = false;    ///< print one JSON object instead of text
  bool quiet = false;   ///< no progress bars
  int exit_status = 0;  ///< set by a subcommand that fails without throwing
  /// Applies the globals (threads) before a subcommand runs.
  void apply() const;
  /// Prints j as one line of JSON with --json, else `text` (if not empty).
  void print(const nlohmann::ordered_json& j, const std::string& text) const;
};

void add_train_command(CLI::App& app, Globals& globals);
void add_info_command(CLI::App& app, Globals& globals);
void add_check_path_command(CLI::App& app, Globals& globals);
void add_verify_command(CLI::App& app, Globals& globals);
void add_explain_command(CLI::App& app, Globals& globals);
void add_gram_command(CLI::App& app, Globals& globals);
void add_gp_command(CLI::App& app, Globals& globals);
void add_refit_command(CLI::App& app, Globals& globals);
void add_compare_command(CLI::App& app, Globals& globals);
void add_experiment_command(CLI::App& app, Globals& globals);
void add_report_command(CLI::App& app, Globals& globals);
void add_evaluate_command(CLI::App& app, Globals& globals);

/// printf into a string.
std::string format_text(const char* format, ...) __attribute__((format(printf, 1, 2)));

/// Declares `old_name` on cmd as a deprecated spelling of `replacement`,
/// storing into `target`: using it prints a one-line note on stderr.
CLI::Option* add_deprecated_option(CLI::App* cmd, const std::string& old_name, int64_t& target,
                                   const std::string& replacement);

/// The test points of every command that takes them, declared once:
/// --test N (the first N), --test-balanced N (a class-balanced subset),
/// --test-index LIST (indices and ranges, e.g. 0-7,12) or --test-file PATH,
/// and --subset-seed.
struct TestPointArgs {
  TestPointSelection selection;
  /// Declares the four options on cmd, mutually exclusive, and --subset-seed;
  /// `what` says what the points are for in the help text.
  void add_to(CLI::App* cmd, const std::string& what);
  /// Declares `old_name` as a deprecated spelling of --test-balanced N
  /// (after add_to).
  void add_deprecated_balanced(CLI::App* cmd, const std::string& old_name);
  /// The chosen indices, int64 [n], of a test set with labels int64 [n_test];
  /// none given: the first `default_count`, or a class-balanced subset of
  /// that many with `default_balanced`.
  torch::Tensor indices(const torch::Tensor& labels, int64_t default_count, bool default_balanced = false) const {
    return selection.resolve(labels, default_count, default_balanced);
  }

 private:
  std::vector<CLI::Option*> options_;
};

/// --inputs X.npy and --labels Y.npy (verify, explain): inputs given in a
/// file instead of the run's test points (input_file.h).
struct InputArgs {
  std::string inputs, labels;
  /// Declares both on cmd (after TestPointArgs::add_to: --inputs excludes
  /// the test-point options; --labels needs --inputs).
  void add_to(CLI::App* cmd, const std::string& what);
  bool given() const { return !inputs.empty(); }
};

/// The quadrature options of the commands that decompose a run (verify,
/// explain): declared once, checked once.
struct QuadratureArgs {
  std::string quadrature = "gauss";
  double tol = 1e-12;  ///< the run's certificate budget (QuadratureOptions::run_tol)
  int gauss_nodes = 8;
  std::string pieces = "exact";  ///< QuadratureOptions::exact_pieces: exact or adaptive
  std::string kinks = "fit";  ///< QuadratureOptions::fit_kinks: bracket or fit
  std::string last_site = "auto";  ///< QuadratureOptions::last_site: auto, local or pieces
  int64_t point_block = DecompositionOptions{}.point_block;
  /// --memory in bytes: the test side's budget (DecompositionOptions::memory_doubles)
  uint64_t memory = static_cast<uint64_t>(DecompositionOptions{}.memory_doubles) * sizeof(double);
  std::string route = "auto";  ///< TorchScript modules: auto or generic
  std::string replay = "ahead";  ///< ahead or in-turn (DecompositionOptions::replay_ahead)
  std::string training_side = "ahead";  ///< ahead or in-turn (DecompositionOptions::training_ahead)
  const Globals* globals = nullptr;  ///< for --quiet
  /// Declares --quadrature, --tol, --gauss-nodes, --pieces, --kinks, --last-site, --point-block, --memory and --route on cmd.
  void add_to(CLI::App* cmd, const Globals& g);
  /// The checked decomposition options.
  DecompositionOptions options() const;
};

/// --position of verify and explain: a sequence model's position whose
/// outputs are decomposed (sequence.h).
struct PositionArgs {
  int64_t position = -1;  ///< −1: the last
  /// Declares --position on cmd.
  void add_to(CLI::App* cmd);
  /// The position checked against the run: a given one needs a sequence data
  /// set and must lie in [0, T) (or be −1).
  int64_t checked(const Manifest& m) const;
};

/// The kernel options of gram, gp and refit: --kernel, --bias-scale and the
/// quadrature options, declared and turned into GramOptions once.
struct KernelArgs {
  std::string kernel = "epk";
  double bias_scale = 0.0;
  QuadratureArgs q;
  /// Declares --kernel, --bias-scale and the quadrature options on cmd.
  void add_to(CLI::App* cmd, const Globals& g);
  /// The checked Gram options (full K x K blocks).
  GramOptions options() const;
  /// The kernel's name for file names: "ntk:5" becomes "ntk_5".
  static std::string file_stem(const GramSpec& spec);
};

/// The point sets of the kernel-method commands (gp, refit, compare): a
/// class-balanced subset of the training points, and the test points
/// (default: a class-balanced subset of 100).
struct KernelPointArgs {
  int64_t train_count = 200;
  TestPointArgs test;
  /// Declares --train-count, the test points and the deprecated --test-count on cmd.
  void add_to(CLI::App* cmd);
  /// The chosen indices into the training and test sets (int64).
  torch::Tensor train_indices(const torch::Tensor& y_train) const;
  torch::Tensor test_indices(const torch::Tensor& y_test) const { return test.indices(y_test, 100, true); }
};

/// The resume tests' fault injection: installs a WriteHook that stops the
/// process inside the write PATHKERNEL_TEST_PAUSE_IN_WRITE names (test_hook.cpp).
void install_test_write_hook();

/// Throws AgreedError on every rank unless every rank of `world` was started
/// with rank 0's arguments (one program, one job).
void check_same_arguments(const Communicator& world, int argc, char** argv);

/// Parses argv and runs the chosen subcommand. Returns the exit status.
/// User errors propagate as pathkernel::Error.
int run(int argc, char** argv);

}  // namespace pathkernel::cli
