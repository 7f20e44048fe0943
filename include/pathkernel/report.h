// The report: one self-contained HTML file that shows a run and its
// explanations, for a person to look at in a browser (offline).
//
// It holds the training curves; the kernel machine against the network on a
// few test points (the paper's Fig. 4) with the per-step certificate gap and
// evaluation counts; each explained test point (from `pathkernel explain`)
// beside its top proponents and opponents, with every one's per-step
// contribution curve; the contribution mass over the steps; the angle between
// the DPK's and the EPK's test gradients along training (Fig. 2); an EPK Gram
// heatmap; the metagradient beside the exact contribution (when both are
// given); `pathkernel evaluate`'s table and the scatter of each method's
// predicted against the actual leave-one-out changes (when given); for 2-D data the kernel and GP-uncertainty maps (Fig. 5); and the
// manifest. The plots are drawn by Plotly (pinned in src/report/js), whose
// minified JavaScript is inlined into the file; images are inline PNGs.
//
// The report computes what no other command writes (the per-step terms) with
// one decompose() pass over its test points, observing every step.
#pragma once

#include <string>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pathkernel/decomposition.h"
#include "pathkernel/path.h"

namespace pathkernel {

struct ReportOptions {
  std::string explain_dir;       ///< explain output (explain.json, contributions.npy); "" = none
  /// explain --method metagradient output; "" = none. Its test points that
  /// the explain output also has are shown beside their exact contributions.
  std::string metagradient_dir;
  /// `pathkernel evaluate` output (evaluate.json); "" = none. Shown as its
  /// methods x metrics table and, per test point, each method's leave-one-out
  /// scores against the actual changes of retraining.
  std::string evaluate_dir;
  int64_t evaluate_tests = 20;   ///< test points whose leave-one-out scatter is drawn (evaluate's first)
  int64_t evaluate_points = 200; ///< removed points drawn per test point (evenly spaced in the actual change)
  int64_t test_points = 10;      ///< test points of the kernel-vs-network scatter (explained ones first)
  int64_t tracked = 8;           ///< proponents and opponents shown per side of each explained point
  int64_t gram_points = 40;      ///< class-balanced training points in the Gram heatmap (0: none)
  int64_t grid = 20;             ///< 2-D data: points per axis of the kernel and GP maps (0: none)
  int64_t gp_train = 100;        ///< 2-D data: class-balanced training points of the GP
  QuadratureOptions quadrature;  ///< for the decomposition and the EPK's test side
  bool progress = true;          ///< progress bars on stderr
};

/// One decompose() pass over test points x [n, ...] that keeps, per step s,
/// the step's terms C_{i,s}(x) (summing over s to C_i(x)). N steps, T
/// tracked training points, K outputs.
struct StepTrace {
  Decomposition decomposition;     ///< over every training point
  torch::Tensor tracked;           ///< int64 [T]: training points whose per-step terms are kept
  torch::Tensor per_step;          ///< [n, N, T, K]: C_{i,s}(x) of the tracked points
  torch::Tensor step_sum;          ///< [n, N, K]: Σ_i C_{i,s}(x) over every training point
  torch::Tensor step_abs;          ///< [n, N, K]: Σ_i |C_{i,s}(x)|, the contribution mass of step s
  torch::Tensor certificate_gap;   ///< [N]: the step's certificate gap, max over the test points
  torch::Tensor evaluations;       ///< [N]: the step's integrand evaluations per test point
  torch::Tensor dpk_angle;         ///< [n, N]: degrees between J̄_s(x) and J(w_s, x) (fig2's measure)
};

/// Decomposes the run on x, observing every step. tracked: int64 [T]
/// indices into the training set (checked).
StepTrace trace_steps(PathReader& reader, const torch::Tensor& x, const torch::Tensor& tracked,
                      const DecompositionOptions& options);

/// Everything the page shows, as JSON: read from the run directory and the
/// explain output, and computed (trace_steps, gram, the GP maps). Throws
/// Error on a missing or inconsistent explain or evaluate output, naming the
/// file.
nlohmann::ordered_json report_data(PathReader& reader, const ReportOptions& options);

/// The self-contained HTML page for report_data's output.
std::string report_html(const nlohmann::ordered_json& data);

/// The inlined plotting library, e.g. "plotly.js-cartesian-dist-min 2.35.3".
std::string report_plotting_library();

/// A PNG of an image [C, H, W] (C = 1 or 3; min to black, max to white) as
/// a data: URI.
std::string png_data_uri(const torch::Tensor& image);

/// Writes the report of the run at `path` atomically; returns its size in bytes.
size_t write_report(PathReader& reader, const ReportOptions& options, const std::string& path);

}  // namespace pathkernel
