// The paper's experiments (Bell et al. 2023, §4; docs/math.md §11), each a named
// recipe that trains its run, measures, and writes into one directory:
//
//   run/           the recorded training run it measured
//   *.npy, *.dat   the measured data (.npy float64; .dat gnuplot tables)
//   *.png, *.gp    figures drawn by gnuplot, with their scripts
//   metrics.json   the key numbers
//   summary.md     what was run, the settings, the numbers, how long it took
//
// Names (see experiment_names()):
//   paper-4.1  Fig. 4: kernel machine vs network, gaussians3, one-hidden-layer MLP, GD
//   fig2       angle between the DPK and EPK test gradients along training
//   fig5       toy2d: kernel-value map and GP standard-deviation map on a grid
//   fig6       per-training-point kernel values for test points at the class means
//   fig7       MNIST CNN: kernel machine vs network with T = 1, 10, 200 nodes and gauss
//   fig8       weight norm, loss and accuracy along the line from w_0 to w_N
// `quick` shrinks each to a few seconds (for tests); the numbers are then
// only a smoke test of the pipeline.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace pathkernel {

struct ExperimentOptions {
  std::string out;      ///< output directory (created; files in it are replaced)
  bool quick = false;   ///< tiny sizes, for tests
  bool progress = true; ///< progress bars on stderr
};

struct ExperimentResult {
  std::string name;
  std::string out;
  nlohmann::ordered_json metrics;  ///< as written to metrics.json
  double seconds = 0;
};

/// The valid experiment names, in the order above.
std::vector<std::string> experiment_names();

/// The one-line description of an experiment. Throws Error for an unknown name.
std::string experiment_description(const std::string& name);

/// Runs experiment `name`. Throws Error for an unknown name (listing the
/// valid ones), and propagates the errors of training, the engine and gnuplot.
ExperimentResult run_experiment(const std::string& name, const ExperimentOptions& options);

}  // namespace pathkernel
