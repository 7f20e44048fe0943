// What the experiments share: the output directory, training their run, the
// kernel-vs-network error, and summary.md. Internal to src/experiments.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pathkernel/experiment.h"
#include "pathkernel/path.h"
#include "pathkernel/plot.h"
#include "pathkernel/run.h"

namespace pathkernel::experiments {

/// One experiment in progress: where it writes, its numbers, its summary.
class Session {
 public:
  Session(std::string name, const ExperimentOptions& options);

  const ExperimentOptions& options() const { return options_; }
  bool quick() const { return options_.quick; }
  bool progress() const { return options_.progress; }
  /// The path of `file` in the output directory.
  std::string path(const std::string& file) const;

  /// Trains `run` into OUT/run (replacing it) and returns the run directory.
  /// The settings and training summary go into the summary.
  std::string train(RunOptions run);

  /// Writes a tensor as OUT/file (.npy, float64 unless integral).
  void save(const std::string& file, const torch::Tensor& t) const;
  /// Draws a figure whose png is given relative to OUT.
  void plot(Figure figure);

  nlohmann::ordered_json& metrics() { return metrics_; }
  /// Appends a markdown line (or paragraph) to the summary.
  void line(const std::string& text);
  /// Seconds since the session started.
  double elapsed() const;

  /// Writes metrics.json and summary.md; returns the result.
  ExperimentResult finish();

 private:
  std::string name_;
  ExperimentOptions options_;
  nlohmann::ordered_json metrics_ = nlohmann::ordered_json::object();
  std::vector<std::string> lines_;
  std::vector<std::string> figures_;
  std::chrono::steady_clock::time_point start_;
};

/// The kernel machine's error against the network: max |k − f| and
/// max |k − f| / max(1, |f|) over every entry of k, f [n, K].
struct OutputError {
  double max_abs = 0;
  double max_rel = 0;
};
OutputError output_error(const torch::Tensor& kernel, const torch::Tensor& network);

/// The paper's §4.1–4.2 run on `data` (gaussians3 or toy2d): a
/// one-hidden-layer ReLU MLP (mlp:32), full-batch GD, lr 0.1, 100 steps;
/// gaussians3 keeps 100 test points. Quick: 30 (toy2d) or 60 training
/// points, 12 test points, mlp:8, 10 steps.
RunOptions paper_gd_run(const std::string& data, bool quick);

/// The kernel machine against the network on x with one quadrature rule.
struct RuleComparison {
  std::string rule, tag;   ///< e.g. "riemann:100" and "riemann_100" (for file names)
  torch::Tensor network;   ///< [n, K] f(w_N, x)
  torch::Tensor kernel;    ///< [n, K] the kernel machine's prediction
  OutputError error;
  nlohmann::ordered_json json;  ///< the numbers, for metrics.json
};

/// Decomposes with `rule`, saves kernel_<tag>.npy and adds a summary line.
RuleComparison compare_rule(Session& session, PathReader& reader, const torch::Tensor& x, const std::string& rule);

/// "%.3g"-style formatting for summaries.
std::string fmt(double v, int digits = 3);

/// The gnuplot script of a kernel-vs-network scatter: data file `data`
/// with columns (network, kernel) per class k in columns 2k+1, 2k+2.
std::string scatter_script(const std::string& data, int64_t classes, const std::string& title);

// The experiments.
ExperimentResult paper_4_1(const ExperimentOptions& options);
ExperimentResult fig2(const ExperimentOptions& options);
ExperimentResult fig5(const ExperimentOptions& options);
ExperimentResult fig6(const ExperimentOptions& options);
ExperimentResult fig7(const ExperimentOptions& options);
ExperimentResult fig8(const ExperimentOptions& options);

}  // namespace pathkernel::experiments
