// What evaluate() found (evaluate.h), typed, and its directory written and
// read back here alone:
//
//   evaluate.json        EvaluateResult, as evaluate_json() spells it:
//                        {run, test_indices, output, outputs, methods,
//                        metrics, views, retrain, loo, lds, brittleness,
//                        mislabel, table: {method: {column: value}},
//                        columns, seconds: {phase: s}} (views and the
//                        metrics' entries only when computed; retrain comes
//                        before the metrics when a baseline was retrained)
//   scores_<method>.npy  float64 [n, M]: each method's scores of the test points
//
// Per method values are listed in the order of EvaluateResult::methods. A
// value that is NaN is written as null (JSON has no NaN) and read back as NaN.
// n test points, M training points.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pathkernel/manifest.h"

namespace pathkernel {

/// A training point in one view's top k by |score| and not in the other's.
struct ViewPoint {
  int64_t index = 0;
  std::optional<int64_t> label;  ///< its class (none for regression targets)
  double epk = 0;
  double metagradient = 0;
};

/// The exact contribution beside the metagradient for one test point.
struct ViewTestPoint {
  double spearman = 0;
  double pearson = 0;
  int64_t top_shared = 0;
  std::vector<ViewPoint> counterfactual_only;  ///< in the metagradient's top k only
  std::vector<ViewPoint> decomposition_only;   ///< in the exact contribution's top k only
};

/// evaluate.json's "views": both scores of every test point, compared.
struct ViewComparison {
  int64_t top = 0;
  double median_spearman = 0;
  double mean_top_shared_fraction = 0;
  std::vector<ViewTestPoint> per_test;
};

/// Leave-one-out's correlations of one method on one test point, or their
/// means (slope: the median) over the test points.
struct LooStatistics {
  double spearman = 0;
  double pearson = 0;
  double spearman_random = 0;
  double slope = 0;
};

/// One test point's leave-one-out: the removed points, their actual
/// effects and each method's scores of them.
struct LooTestPoint {
  int64_t test_index = 0;
  int64_t output = 0;                ///< the output measured
  std::vector<int64_t> sample;       ///< removed training points, increasing
  std::vector<double> effect;        ///< f_base − f_{−i}, per removed point
  std::vector<std::vector<double>> scores;  ///< per method: its score of each removed point
  std::vector<LooStatistics> statistics;    ///< per method
};

struct LooResult {
  std::string selection_method;      ///< the method whose extremes were removed
  int64_t extremes = 0;
  std::vector<int64_t> random;       ///< the random points every test point removes
  std::vector<int64_t> removed;      ///< every removed point
  std::vector<double> base;          ///< f_base at each test point's output [n]
  std::vector<LooStatistics> mean;   ///< per method
  std::vector<LooTestPoint> per_test;
};

struct LdsResult {
  int64_t subsets = 0;
  double fraction = 0;
  int64_t subset_size = 0;
  std::vector<std::vector<double>> per_test;  ///< per method: the Spearman correlation per test point
};

struct BrittlenessResult {
  std::vector<int64_t> grid;
  /// Per method and test point: the smallest k whose removal flips the
  /// class, or none.
  std::vector<std::vector<std::optional<int64_t>>> per_test;
};

struct MislabelResult {
  double fraction = 0;
  int64_t flipped = 0;                  ///< labels flipped
  std::vector<int64_t> candidates;      ///< the training points ranked (flipped ones first)
  int64_t flipped_candidates = 0;
  std::vector<double> auc;              ///< per method
  std::vector<std::vector<double>> self_attribution;  ///< per method, per candidate
};

/// How the retrainings went.
struct RetrainSummary {
  std::optional<bool> baseline_reproduces_run;  ///< when a baseline was retrained
  std::optional<double> baseline_max_abs_diff;
  std::string scaling;
  int64_t workers = 0;
  int64_t threads_per_retrain = 0;
  int64_t retrainings = 0;
  double seconds = 0;
};

/// One method's row of the methods x metrics table: a value per column of
/// EvaluateResult::columns (NaN: none).
struct MetricRow {
  std::string method;
  std::vector<double> values;
};

struct EvaluateResult {
  std::string run;
  std::vector<int64_t> test_indices;
  std::string output;                ///< "predicted" or "label"
  std::vector<int64_t> outputs;      ///< the output measured per test point
  std::vector<std::string> methods;
  std::vector<std::string> metrics;
  std::optional<ViewComparison> views;  ///< when both epk and metagradient were scored
  RetrainSummary retrain;
  std::optional<LooResult> loo;
  std::optional<LdsResult> lds;
  std::optional<BrittlenessResult> brittleness;
  std::optional<MislabelResult> mislabel;
  std::vector<std::string> columns;  ///< the table's columns, in order
  std::vector<MetricRow> table;      ///< one row per method, in order
  std::vector<std::pair<std::string, double>> seconds;  ///< per phase, in order

  /// The value of `method` in `column` (NaN when it has none). Throws Error
  /// naming them when either is not in the table.
  double value(const std::string& method, const std::string& column) const;
};

/// evaluate.json's content, ordered as written.
nlohmann::ordered_json evaluate_json(const EvaluateResult& r);
/// Its parts that `pathkernel evaluate --json` prints.
nlohmann::ordered_json table_json(const EvaluateResult& r);
nlohmann::ordered_json retrain_json(const RetrainSummary& s);
nlohmann::ordered_json seconds_json(const EvaluateResult& r);

/// Writes DIR/scores_<method>.npy of each (method, scores [n, M]) and then
/// DIR/evaluate.json atomically.
void write_evaluate_directory(const std::string& dir, const EvaluateResult& r,
                              const std::vector<std::pair<std::string, torch::Tensor>>& scores);

/// Reads the evaluate.json that evaluate() wrote into `dir`, checked against
/// the run it evaluated (manifest m): the methods, the table, and, when
/// leave-one-out was run, each test point's entry (a test index and output
/// of the run, removed training points of the run, and as many effects and
/// scores of every method as removed points; a null score reads as NaN).
/// Throws Error naming the file and what is wrong.
EvaluateResult read_evaluation(const std::string& dir, const Manifest& m);

}  // namespace pathkernel
