// Kernel methods beside the trained network on the same test points
// (docs/math.md §9): the exact EPK kernel machine over every training point,
// and, on a subset of M training points, an SVM refit and kernel regression
// on each chosen kernel, NNGP regression (fully-connected ReLU networks) and
// the lazy dynamics of the network linearised at w_0 under the squared loss
// for the run's total time τ = Σ_s η_s. Each method is scored by its accuracy
// and by its agreement with the network's predicted class.
//
// The kernel methods use the scalar kernel trace / K of the K x K output
// kernel (gram.h's KernelMatrices). This header also owns the comparison's
// files: compare.md (a markdown table) and compare.csv
// (method,kernel,accuracy,agreement,notes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pathkernel/decomposition.h"
#include "pathkernel/gram.h"
#include "pathkernel/path.h"

namespace pathkernel {

struct CompareOptions {
  /// Kernels of the SVM and regression rows (default epk, dpk, ntk:0, ntk, ntk-inf).
  std::vector<GramSpec> kernels = parse_kernel_list("epk,dpk,ntk:0,ntk,ntk-inf");
  double c = 1.0;                      ///< C-SVC's cost, > 0
  double bias_scale = 0.0;             ///< ntk-inf and nngp: the bias scale β, >= 0
  DecompositionOptions decomposition;  ///< quadrature and progress, for the exact machine and the EPK's test side

  /// Throws Error naming the bad option: no kernels, c <= 0, β < 0 or not finite.
  void check() const;
  /// Parses a comma-separated kernel list, e.g. "epk,ntk:0"; throws Error on
  /// an empty list or a bad name.
  static std::vector<GramSpec> parse_kernel_list(const std::string& list);
};

/// One method's scores on the test points.
struct ComparisonRow {
  std::string method;     ///< e.g. "SVM refit"
  std::string kernel;     ///< e.g. "ntk:0"; "-" for the network itself
  double accuracy = 0;    ///< fraction of test points whose label it predicts
  double agreement = 0;   ///< fraction of test points where its class is the network's
  std::string note;       ///< what it used, e.g. "40 training points, 12 support vectors"
};

struct Comparison {
  std::string run;                  ///< the run directory
  std::string model;                ///< the run's model spec
  int64_t steps = 0;                ///< N
  int64_t train_points = 0;         ///< M of the kernel methods
  int64_t test_points = 0;          ///< n
  std::vector<ComparisonRow> rows;  ///< the trained network first, then the exact machine, then the rest
  double seconds = 0;

  /// compare.md: the table, what agreement means, and the time taken.
  std::string markdown() const;
  /// compare.csv: a header, then method,kernel,accuracy,agreement,"notes" per row.
  std::string csv() const;
  /// The rows as a JSON array of {method, kernel, accuracy, agreement, notes}.
  nlohmann::ordered_json rows_json() const;
};

/// Compares every method on the run's test points test_index (int64 [n]),
/// the kernel methods trained on training points train_index (int64 [M]).
/// Throws Error on bad options or indices out of range.
Comparison compare_kernel_methods(PathReader& reader, const torch::Tensor& train_index,
                                  const torch::Tensor& test_index, const CompareOptions& options);

/// Writes DIR/compare.md and DIR/compare.csv (creating DIR); returns the
/// path of compare.md.
std::string write_comparison(const Comparison& comparison, const std::string& dir);

}  // namespace pathkernel
