// Does an attribution predict retraining? The field's standard tests of
// attribution methods (attribution_methods.h) against counterfactual
// retraining of the run (retrain.h), whose training is replayable, so the
// ground truth has no seed noise:
//
//   loo          leave-one-out: per test point, retrain without each point of
//                a sample (its `loo_extremes` top and bottom points by the
//                first method listed, plus `loo_random` random points shared
//                by all test points); the actual effect of point i is
//                f_base(x) − f_{−i}(x) (f_base: the retraining that removes
//                nothing); Spearman and Pearson between scores and effects
//                per test point, averaged; also Spearman on the random
//                points alone (a sample no method chose), and the median
//                over test points of the slope Σ score·effect / Σ score²
//                (1 when the scores are the effects in size as well)
//   lds          linear datamodeling score: retrain on `lds_subsets` random
//                subsets of a fraction `lds_fraction`; per test point the
//                Spearman correlation over subsets between Σ_{i∈S} score_i
//                and the retrained output, averaged
//   brittleness  per method and test point, the smallest k of
//                `brittleness_grid` whose top-k points' removal changes the
//                predicted class (null when none does)
//   mislabel     flip a seeded fraction of the training labels to another
//                class, train that run (same options, batches and w_0), rank
//                `mislabel_candidates` training points (half flipped, half
//                not) by their self-attribution (each method's score of point
//                i for its own trained label's output at x_i) and report the
//                ROC AUC of finding the flipped ones
//
// The chosen output of a test point is the predicted class's output at w_N
// (its log-probability for a log-softmax network) or, with output "label",
// its true label's.
//
// `evaluate()` returns an EvaluateResult and writes it as OUT/evaluate.json
// and OUT/scores_<method>.npy (float64 [n, M]) (evaluate_result.h); work in
// progress (scores, finished retrainings, decomposition progress, the
// mislabel run) lives in OUT/.work, is reused by a rerun with the same
// arguments, and is removed at the end.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pathkernel/attribution_methods.h"
#include "pathkernel/evaluate_result.h"
#include "pathkernel/manifest.h"
#include "pathkernel/path.h"
#include "pathkernel/retrain.h"

namespace pathkernel {

/// The metric names: loo, lds, brittleness, mislabel.
std::vector<std::string> evaluation_metric_names();

struct EvaluateOptions {
  std::vector<std::string> methods = {"epk", "dpk", "tracin-cp", "grad-dot", "random"};
  std::vector<std::string> metrics = {"loo", "lds", "mislabel"};
  std::string output = "predicted";  ///< "predicted" or "label"
  AttributionOptions attribution;    ///< its seed is the random method's
  RetrainOptions retrain;            ///< scaling, workers, threads (work files are set by evaluate())
  int64_t loo_extremes = 5;          ///< top and bottom points per test point
  int64_t loo_random = 10;           ///< random points shared by the test points
  int64_t lds_subsets = 50;
  double lds_fraction = 0.5;
  std::vector<int64_t> brittleness_grid = {10, 20, 40, 80};
  double mislabel_fraction = 0.1;
  int64_t mislabel_candidates = 40;  ///< half flipped, half not
  uint64_t seed = 0;                 ///< samples, subsets and flips
  bool progress = true;
  /// Called with a line for the user as work proceeds; unset: not called.
  std::function<void(const std::string&)> on_note;
  /// Runs one set of retrainings, returning what Retrainer::outputs(jobs, x,
  /// options) returns, float64 [J, n, K]; unset: that call, in this process.
  /// Under mpirun the CLI passes retrain_outputs_across (across_ranks.h),
  /// which splits the jobs across the ranks.
  std::function<torch::Tensor(const Retrainer& retrainer, const std::vector<RetrainJob>& jobs, const torch::Tensor& x,
                              const RetrainOptions& options)>
      retrain_outputs;

  /// Checks every option against a run with M training points and K
  /// classes; throws Error naming the option, its value and what was expected.
  void validate(int64_t num_train, int64_t num_classes) const;
};

/// Evaluates the methods on test points `test_index` (int64 [n] into the
/// run's test set) and writes the directory `out`. Throws Error on bad input.
EvaluateResult evaluate(PathReader& reader, const torch::Tensor& test_index, const std::string& out,
                        const EvaluateOptions& options);

}  // namespace pathkernel
