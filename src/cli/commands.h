// The pathkernel command-line application: one file per subcommand.
#pragma once

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include "pathkernel/decomposition.h"
#include "pathkernel/gram.h"

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
void add_explain_command(CLI::App& app, Globals& globals);
void add_gram_command(CLI::App& app, Globals& globals);
void add_gp_command(CLI::App& app, Globals& globals);
void add_refit_command(CLI::App& app, Globals& globals);
void add_compare_command(CLI::App& app, Globals& globals);
void add_experiment_command(CLI::App& app, Globals& globals);
void add_report_command(CLI::App& app, Globals& globals);

/// Test indices from --test-index LIST (comma-separated) or, when LIST is
/// empty, the first `count`; checked against n_test. int64 [n].
torch::Tensor parse_test_indices(int64_t count, const std::string& list, int64_t n_test);

/// The quadrature options of the commands that decompose a run (verify,
/// explain): declared once, checked once.
struct QuadratureArgs {
  std::string quadrature = "gauss";
  double tol = 1e-14;
  int gauss_nodes = 8;
  bool quiet = false;
  /// Declares --quadrature, --tol, --gauss-nodes and --quiet on cmd.
  void add_to(CLI::App* cmd);
  /// The checked decomposition options.
  DecompositionOptions options() const;
};

/// The kernel options of gram, gp and refit: --kernel, --bias-scale and the
/// quadrature options, declared and turned into GramOptions once.
struct KernelArgs {
  std::string kernel = "epk";
  double bias_scale = 0.0;
  QuadratureArgs q;
  /// Declares --kernel, --bias-scale and the quadrature options on cmd.
  void add_to(CLI::App* cmd);
  /// The checked Gram options (full K x K blocks).
  GramOptions options() const;
  /// The kernel's name for file names: "ntk:5" becomes "ntk_5".
  static std::string file_stem(const GramSpec& spec);
};

/// The point sets of the kernel-method commands (gp, refit, compare): a
/// class-balanced subset of the training points and of the test points.
struct KernelPointArgs {
  int64_t train_count = 200, test_count = 100;
  uint64_t seed = 0;
  /// Declares --train-count, --test-count and --subset-seed on cmd.
  void add_to(CLI::App* cmd);
  /// The chosen indices into the training and test sets (sorted, int64).
  torch::Tensor train_indices(const torch::Tensor& y_train) const;
  torch::Tensor test_indices(const torch::Tensor& y_test) const;
};

/// Parses argv and runs the chosen subcommand. Returns the exit status.
/// User errors propagate as pathkernel::Error.
int run(int argc, char** argv);

}  // namespace pathkernel::cli
