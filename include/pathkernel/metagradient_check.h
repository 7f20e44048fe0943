// Checking a metagradient against retraining: central finite differences of
// the trained network's outputs in one training point's loss weight,
// retraining with c_i ± h and c_i ± h/2 (replay is deterministic, so the
// differences carry no seed noise). Richardson's combination of the two
// steps, (4 D(h/2) − D(h)) / 3, cancels the O(h²) term, and |D(h/2) − D(h)|
// shows how far the differences themselves are from their limit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pathkernel/metagradient.h"
#include "pathkernel/retrain.h"

namespace pathkernel {

struct MetagradientCheckOptions {
  double h = 1e-5;             ///< the larger step of the loss weight (small: a ReLU network is smooth in c only between kinks)
  RetrainOptions retrain;      ///< workers, threads, progress
};

struct MetagradientCheck {
  std::vector<int64_t> points;  ///< the training points checked
  torch::Tensor metagradient;   ///< [n, points, K] (NaN where not differentiated)
  torch::Tensor differences;    ///< [n, points, K] Richardson's estimate
  torch::Tensor spread;         ///< [n, points, K] |D(h/2) − D(h)|
  /// max |metagradient − differences| / max |differences| over the entries
  /// differentiated.
  double max_rel_error = 0;
  /// max spread / max |differences|: what the differences can resolve.
  double max_rel_spread = 0;
  int64_t retrainings = 0;
  double seconds = 0;
};

/// The `count` training points of largest |metagradient| summed over test
/// points and outputs (NaN entries skipped), largest first.
std::vector<int64_t> strongest_points(const Metagradient& g, int64_t count);

/// Checks g, the metagradient of test inputs x [n, ...], on training points
/// `points` by retraining (4 runs per point). Throws Error on bad input.
MetagradientCheck check_metagradient(PathReader& reader, const torch::Tensor& x, const Metagradient& g,
                                     const std::vector<int64_t>& points, const MetagradientCheckOptions& options);

/// The check as the explain directory records it (explain_directory.h,
/// explain.json's "check" entry): the step, the errors, the retrainings and
/// each point's metagradient beside its differences (the entries
/// differentiated, test points then outputs).
struct MetagradientCheckEntry {
  struct Point {
    int64_t index = 0;                    ///< the training point
    std::vector<double> metagradient;     ///< the entries differentiated
    std::vector<double> finite_differences;  ///< Richardson's estimate of the same entries
  };
  double h = 0;
  double max_rel_error = 0;
  double max_rel_spread = 0;
  int64_t retrainings = 0;
  double seconds = 0;
  std::vector<Point> points;
};

/// The entry of check c, made with step h.
MetagradientCheckEntry check_entry(const MetagradientCheck& c, double h);

}  // namespace pathkernel
