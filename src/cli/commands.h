// The pathkernel command-line application: one file per subcommand.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pathkernel/decomposition.h"
#include "pathkernel/gram.h"
#include "pathkernel/test_points.h"

namespace pathkernel::cli {

/// Options shared by every subcommand, declared once on the application
/// (before or after the subcommand's name): --threads, --json, --quiet.
struct Globals {
  int threads = 0;      ///< 0: all cores
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

/// The test points of every command that takes them, declared once:
/// --test N (the first N), --test-index LIST or --test-file PATH.
struct TestPointArgs {
  TestPointSelection selection;
  /// Declares the three options on cmd, mutually exclusive; `what` says
  /// what the points are for in the help text.
  void add_to(CLI::App* cmd, const std::string& what);
  /// The chosen indices, int64 [n]; none given: the first `default_count`.
  torch::Tensor indices(int64_t n_test, int64_t default_count) const { return selection.resolve(n_test, default_count); }
};

/// The quadrature options of the commands that decompose a run (verify,
/// explain): declared once, checked once.
struct QuadratureArgs {
  std::string quadrature = "gauss";
  double tol = 1e-14;
  int gauss_nodes = 8;
  const Globals* globals = nullptr;  ///< for --quiet
  /// Declares --quadrature, --tol and --gauss-nodes on cmd.
  void add_to(CLI::App* cmd, const Globals& g);
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
  void add_to(CLI::App* cmd, const Globals& g);
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
