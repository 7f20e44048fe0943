// The attribution metrics: leave-one-out, the linear datamodeling score,
// brittleness and mislabel detection, each against counterfactual retraining.
#include "pathkernel/evaluate.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "pathkernel/context.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/npy.h"
#include "pathkernel/run.h"
#include "pathkernel/statistics.h"

namespace pathkernel {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

/// How many training points each side of compare_views lists.
constexpr int64_t kViewTop = 10;

/// The k training points of largest |score| in row s [M], as a set.
std::vector<int64_t> top_abs(const torch::Tensor& s, int64_t k) {
  const torch::Tensor idx = std::get<1>(s.abs().topk(std::min<int64_t>(k, s.size(0))));
  return std::vector<int64_t>(idx.data_ptr<int64_t>(), idx.data_ptr<int64_t>() + idx.numel());
}

/// The exact contribution (the path held fixed) beside the metagradient (the
/// path responding), per test point: their rank and linear correlations, how
/// many of the top k by |score| they share, and the points in one's top k and
/// not the other's.
ViewComparison compare_views(const torch::Tensor& epk, const torch::Tensor& mg, const torch::Tensor& y_train,
                             int64_t k) {
  ViewComparison views;
  std::vector<double> rank_corr, overlap;
  for (int64_t p = 0; p < epk.size(0); ++p) {
    const torch::Tensor a = epk[p].contiguous(), b = mg[p].contiguous();
    const std::vector<double> va(a.data_ptr<double>(), a.data_ptr<double>() + a.numel());
    const std::vector<double> vb(b.data_ptr<double>(), b.data_ptr<double>() + b.numel());
    const std::vector<int64_t> ta = top_abs(a, k), tb = top_abs(b, k);
    auto row = [&](int64_t i) {
      return ViewPoint{i,
                       is_regression_target(y_train) ? std::nullopt : std::optional(y_train[i].item<int64_t>()),
                       va[static_cast<size_t>(i)], vb[static_cast<size_t>(i)]};
    };
    ViewTestPoint point;
    for (int64_t i : tb) {
      if (std::find(ta.begin(), ta.end(), i) == ta.end()) point.counterfactual_only.push_back(row(i));
      else ++point.top_shared;
    }
    for (int64_t i : ta) {
      if (std::find(tb.begin(), tb.end(), i) == tb.end()) point.decomposition_only.push_back(row(i));
    }
    rank_corr.push_back(spearman(va, vb));
    overlap.push_back(static_cast<double>(point.top_shared) / static_cast<double>(ta.size()));
    point.spearman = rank_corr.back();
    point.pearson = pearson(va, vb);
    views.per_test.push_back(std::move(point));
  }
  views.top = k;
  views.median_spearman = median_finite(rank_corr);
  views.mean_top_shared_fraction = mean_finite(overlap);
  return views;
}


double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<double> to_vector(const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kFloat64).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

std::vector<int64_t> to_indices(const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kLong).contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

/// Scores of every method, computed once and kept in the work directory so
/// a rerun with the same arguments reuses them.
class ScoreCache {
 public:
  ScoreCache(std::string dir, ojson key) : dir_(std::move(dir)), key_(std::move(key)) {}
  torch::Tensor get(PathReader& reader, const std::string& method, const std::string& tag, const torch::Tensor& x,
                    const torch::Tensor& output, AttributionOptions options) {
    const std::string base = (fs::path(dir_) / ("scores_" + tag + "_" + method)).string();
    ojson key = key_;
    key["method"] = method;
    key["tag"] = tag;
    key["outputs"] = to_indices(output);
    if (fs::exists(base + ".json") && fs::exists(base + ".npy")) {
      try {
        if (ojson::parse(read_file(base + ".json")).at("key") == key) return read_npy(base + ".npy");
      } catch (const std::exception&) {
        // Damaged: compute again.
      }
    }
    options.progress_dir = (fs::path(dir_) / ("progress_" + tag)).string();
    torch::Tensor s = attribution_scores(reader, method, x, output, options);
    fs::create_directories(dir_);
    write_npy(base + ".npy", s);
    write_file_atomic(base + ".json", ojson{{"key", key}}.dump(2) + "\n");
    return s;
  }

 private:
  std::string dir_;
  ojson key_;
};

/// The chosen output of each row of f [n, K]: the predicted class, or the label.
torch::Tensor chosen_outputs(const torch::Tensor& f, const torch::Tensor& labels, const std::string& output) {
  return output == "label" ? labels.clone() : f.argmax(1);
}

/// f[j, t, output[t]] for outputs f [J, n, K]: [J, n].
torch::Tensor at_outputs(const torch::Tensor& f, const torch::Tensor& output) {
  const int64_t J = f.size(0), n = f.size(1);
  return f.gather(2, output.view({1, n, 1}).expand({J, n, 1})).squeeze(2);
}

}  // namespace

std::vector<std::string> evaluation_metric_names() { return {"loo", "lds", "brittleness", "mislabel"}; }

void EvaluateOptions::validate(int64_t num_train, int64_t num_classes) const {
  PK_CHECK(!methods.empty(), "evaluate: give at least one attribution method");
  for (const std::string& m : methods) check_attribution_method(m);
  PK_CHECK(!metrics.empty(), "evaluate: give at least one metric");
  for (const std::string& m : metrics) {
    PK_CHECK(contains(evaluation_metric_names(), m),
             "unknown metric '" << m << "': expected one of loo, lds, brittleness, mislabel");
  }
  PK_CHECK(output == "predicted" || output == "label",
           "evaluate: unknown output '" << output << "': expected predicted or label");
  if (contains(metrics, "loo")) {
    PK_CHECK(loo_extremes >= 0 && loo_random >= 0 && 2 * loo_extremes + loo_random >= 3,
             "evaluate: the leave-one-out sample needs at least 3 points (got "
                 << loo_extremes << " top and bottom and " << loo_random << " random)");
    PK_CHECK(2 * loo_extremes + loo_random <= num_train,
             "evaluate: the leave-one-out sample of " << 2 * loo_extremes + loo_random << " points exceeds the "
                                                      << num_train << " training points");
  }
  if (contains(metrics, "lds")) {
    PK_CHECK(lds_subsets >= 3, "evaluate: lds needs at least 3 subsets (got " << lds_subsets << ")");
    PK_CHECK(lds_fraction > 0 && lds_fraction < 1,
             "evaluate: the lds subset fraction must be in (0, 1) (got " << lds_fraction << ")");
  }
  if (contains(metrics, "brittleness")) {
    PK_CHECK(!brittleness_grid.empty(), "evaluate: the brittleness grid is empty");
    for (size_t i = 0; i < brittleness_grid.size(); ++i) {
      PK_CHECK(brittleness_grid[i] >= 1 && brittleness_grid[i] < num_train &&
                   (i == 0 || brittleness_grid[i] > brittleness_grid[i - 1]),
               "evaluate: the brittleness grid must increase within [1, " << num_train << ") (got "
                                                                           << brittleness_grid[i] << " at position "
                                                                           << i << ")");
    }
  }
  if (contains(metrics, "mislabel")) {
    PK_CHECK(mislabel_fraction > 0 && mislabel_fraction < 1,
             "evaluate: the mislabel fraction must be in (0, 1) (got " << mislabel_fraction << ")");
    PK_CHECK(mislabel_candidates >= 2 && mislabel_candidates <= num_train,
             "evaluate: mislabel candidates must be in [2, " << num_train << "] (got " << mislabel_candidates << ")");
    PK_CHECK(num_classes >= 2, "evaluate: mislabel needs at least 2 classes (got " << num_classes << ")");
    const int64_t flipped = std::llround(mislabel_fraction * static_cast<double>(num_train));
    PK_CHECK(flipped >= mislabel_candidates / 2 && num_train - flipped >= mislabel_candidates - mislabel_candidates / 2,
             "evaluate: " << flipped << " flipped labels (fraction " << mislabel_fraction << " of " << num_train
                          << ") cannot supply " << mislabel_candidates << " candidates, half flipped and half not");
  }
}

namespace {

/// A split's inputs as data_dir's NAME (train_x, test_x), in the form they
/// are held: the coded pair NAME.codes.npy and NAME.values.npy where they are
/// codes, else NAME.npy. Any file of the other form is removed first: npy:DIR
/// refuses a directory holding both.
void write_held_inputs(const std::string& data_dir, const std::string& name, const torch::Tensor& x,
                       const CodedInputs& coded) {
  const fs::path dir(data_dir);
  const std::vector<std::string> stale =
      coded.defined() ? std::vector<std::string>{name + ".npy"}
                      : std::vector<std::string>{name + ".codes.npy", name + ".values.npy"};
  for (const std::string& file : stale) fs::remove(dir / file);
  if (coded.defined()) {
    write_npy((dir / (name + ".codes.npy")).string(), coded.codes);
    write_npy((dir / (name + ".values.npy")).string(), coded.values);
  } else {
    write_npy((dir / (name + ".npy")).string(), x);
  }
}

/// One evaluate() call: its inputs, what is shared between the metrics (the
/// scores, the baseline retraining), and the result as it fills up. Each
/// metric is a step of its own.
class Evaluator {
 public:
  Evaluator(PathReader& reader, const torch::Tensor& test_index, const std::string& out,
            const EvaluateOptions& options);
  EvaluateResult run();

 private:
  void note(const std::string& s) const {
    if (options_.on_note) options_.on_note(s);
  }
  bool wants(const char* metric) const { return contains(options_.metrics, metric); }
  void add_seconds(const std::string& phase, double s) { r_.seconds.emplace_back(phase, s); }
  /// Adds a column with each method's value.
  template <typename Value>
  void add_column(const std::string& column, Value value);
  /// Runs one set of retrainings: their outputs, float64 [J, n, K].
  torch::Tensor retrain(const std::vector<RetrainJob>& jobs, const std::string& name);

  void start();
  void score_test_points();
  void retrain_baseline();
  /// Each test point's removed points: its extremes by the first method, plus the random points.
  std::vector<std::vector<int64_t>> loo_sample(const torch::Tensor& random) const;
  LooTestPoint loo_test_point(int64_t t, const std::vector<int64_t>& s, const torch::Tensor& f,
                              const torch::Tensor& base, const std::map<int64_t, int64_t>& row,
                              const std::set<int64_t>& random_set) const;
  void leave_one_out();
  void linear_datamodeling();
  void brittleness();
  /// Trains the run with `labels` in the work directory (or reuses it): its directory.
  std::string train_flipped_run(const torch::Tensor& labels, int64_t count);
  /// The run's training and test inputs as data_dir's train_x and test_x, in
  /// the form the reader holds them (write_held_inputs).
  void write_inputs(const std::string& data_dir) const;
  void mislabel();
  void finish(const std::chrono::steady_clock::time_point t_start);

  PathReader& reader_;
  const torch::Tensor test_index_;
  const std::string out_;
  const EvaluateOptions& options_;
  const Manifest& m_;
  const Dataset& data_;
  const int64_t M_, K_, n_;
  const std::string work_;
  torch::Tensor x_;       ///< the test inputs [n, ...]
  torch::Tensor fN_;      ///< [n, K], on the retrainings' thread count
  torch::Tensor output_;  ///< the chosen output per test point [n]
  ojson key_;             ///< what the scores depend on
  AttributionOptions aopt_;
  std::map<std::string, torch::Tensor> scores_;  ///< per method [n, M]
  std::optional<Retrainer> retrainer_;  ///< made once the scores are in (a recorded run cannot retrain)
  RetrainOptions ropt_;
  torch::Tensor f_base_;  ///< [n, K]: the retraining that removes nothing
  EvaluateResult r_;
};

Evaluator::Evaluator(PathReader& reader, const torch::Tensor& test_index, const std::string& out,
                     const EvaluateOptions& options)
    : reader_(reader),
      test_index_(test_index),
      out_(out),
      options_(options),
      m_(reader.manifest()),
      data_(reader.held_dataset()),  // the training inputs read through reader_ (train_inputs)
      M_(m_.num_train),
      K_(m_.num_classes),
      n_(test_index.size(0)),
      work_((fs::path(out) / ".work").string()) {}

void check_evaluate_inputs(PathReader& reader, const torch::Tensor& test_index, const EvaluateOptions& options) {
  const Manifest& m = reader.manifest();
  const Dataset& data = reader.held_dataset();
  PK_CHECK(m.sequence_length == 0,
           "evaluate: run '" << reader.dir() << "' trains on sequences (outputs [n, " << m.sequence_length << ", "
                             << m.num_classes << "]), which evaluate does not take yet; verify and explain "
                             << "decompose a position of them (--position)");
  options.validate(m.num_train, m.num_classes);
  const bool regression = is_regression_target(data.y_train);
  PK_CHECK(!(regression && options.output == "label"),
           "evaluate: --output label needs class labels; run '" << reader.dir() << "' trains on regression targets");
  PK_CHECK(!(regression && contains(options.metrics, "mislabel")),
           "evaluate: mislabel flips class labels; run '" << reader.dir() << "' trains on regression targets");
  PK_CHECK(test_index.dim() == 1 && test_index.numel() > 0 && test_index.scalar_type() == torch::kLong,
           "evaluate: test indices must be a non-empty int64 list (got " << test_index.sizes() << ")");
  PK_CHECK(test_index.min().item<int64_t>() >= 0 && test_index.max().item<int64_t>() < test_count(data),
           "evaluate: test indices must lie in [0, " << test_count(data) << ")");
}

template <typename Value>
void Evaluator::add_column(const std::string& column, Value value) {
  for (size_t i = 0; i < r_.table.size(); ++i) r_.table[i].values.push_back(value(i));
  r_.columns.push_back(column);
}

torch::Tensor Evaluator::retrain(const std::vector<RetrainJob>& jobs, const std::string& name) {
  const auto t0 = std::chrono::steady_clock::now();
  RetrainOptions o = ropt_;
  o.work_file = (fs::path(work_) / ("retrain_" + name)).string();
  o.label = name;
  note("retraining: " + std::to_string(jobs.size()) + " " + name + " runs");
  torch::Tensor f = options_.retrain_outputs ? options_.retrain_outputs(*retrainer_, jobs, x_, o)
                                             : retrainer_->outputs(jobs, x_, o);
  r_.retrain.retrainings += static_cast<int64_t>(jobs.size());
  r_.retrain.seconds += seconds_since(t0);
  add_seconds("retrain_" + name, seconds_since(t0));
  return f;
}

void Evaluator::start() {
  fs::create_directories(work_);
  x_ = test_inputs(data_, test_index_);
  {
    ThreadScope threads(options_.retrain.threads_per_retrain);
    fN_ = reader_.outputs(m_.steps, x_);
  }
  output_ = chosen_outputs(fN_, data_.y_test.index_select(0, test_index_), options_.output);
  key_ = ojson{{"manifest_crc32", reader_.manifest_crc32()},
               {"test_indices", to_indices(test_index_)},
               {"quadrature", options_.attribution.quadrature.spec.str()},
               {"tol", options_.attribution.quadrature.tol},
               {"gauss_nodes", options_.attribution.quadrature.gauss_nodes},
               {"seed", options_.attribution.seed},
               {"threads", current_threads()}};
  aopt_ = options_.attribution;
  aopt_.progress = options_.progress;
  ropt_ = options_.retrain;
  ropt_.progress = options_.progress;
  r_.run = reader_.dir();
  r_.test_indices = to_indices(test_index_);
  r_.output = options_.output;
  r_.outputs = to_indices(output_);
  r_.methods = options_.methods;
  r_.metrics = options_.metrics;
  for (const std::string& meth : options_.methods) r_.table.push_back({meth, {}});
}

/// Scores on the test points, for every metric but mislabel.
void Evaluator::score_test_points() {
  if (!(wants("loo") || wants("lds") || wants("brittleness"))) return;
  ScoreCache cache(work_, key_);
  for (const std::string& meth : options_.methods) {
    const auto t0 = std::chrono::steady_clock::now();
    note("scores: " + meth + " on " + std::to_string(n_) + " test points");
    scores_[meth] = cache.get(reader_, meth, "test", x_, output_, aopt_);
    add_seconds("scores_" + meth, seconds_since(t0));
  }
  if (scores_.count("epk") && scores_.count("metagradient")) {
    r_.views = compare_views(scores_.at("epk"), scores_.at("metagradient"), data_.y_train, kViewTop);
  }
}

void Evaluator::retrain_baseline() {
  if (!(wants("loo") || wants("brittleness"))) return;
  f_base_ = retrain({RetrainJob{}}, "baseline")[0];
  const bool same = torch::equal(f_base_, fN_);
  r_.retrain.baseline_reproduces_run = same;
  r_.retrain.baseline_max_abs_diff = (f_base_ - fN_).abs().max().item<double>();
  if (!same) {
    char text[256];
    std::snprintf(text, sizeof text,
                  "the retraining that removes nothing differs from the run (max |diff| %.1e; the run used %lld "
                  "threads, each retraining %d): effects are measured against it, not the run",
                  (f_base_ - fN_).abs().max().item<double>(), static_cast<long long>(m_.threads),
                  ropt_.threads_per_retrain);
    note(text);
  }
}

std::vector<std::vector<int64_t>> Evaluator::loo_sample(const torch::Tensor& random) const {
  const torch::Tensor& select = scores_.at(options_.methods.front());
  std::vector<std::vector<int64_t>> sample(static_cast<size_t>(n_));
  for (int64_t t = 0; t < n_; ++t) {
    std::set<int64_t> mine;
    if (options_.loo_extremes > 0) {
      for (bool largest : {true, false}) {
        for (int64_t i : to_indices(std::get<1>(select[t].topk(options_.loo_extremes, 0, largest)))) mine.insert(i);
      }
    }
    for (int64_t i : to_indices(random)) mine.insert(i);
    sample[static_cast<size_t>(t)].assign(mine.begin(), mine.end());
  }
  return sample;
}

/// Test point t's effects of removing its sample s (retrained outputs f [R, n]
/// in the rows `row` of the removed points) and each method's correlations.
LooTestPoint Evaluator::loo_test_point(int64_t t, const std::vector<int64_t>& s, const torch::Tensor& f,
                                       const torch::Tensor& base, const std::map<int64_t, int64_t>& row,
                                       const std::set<int64_t>& random_set) const {
  LooTestPoint entry;
  entry.test_index = test_index_[t].item<int64_t>();
  entry.output = output_[t].item<int64_t>();
  entry.sample = s;
  std::vector<double> effect_random;
  for (int64_t i : s) {
    const double e = base[t].item<double>() - f[row.at(i)][t].item<double>();
    entry.effect.push_back(e);
    if (random_set.count(i)) effect_random.push_back(e);
  }
  for (const std::string& meth : options_.methods) {
    std::vector<double> sc, sc_random;
    for (int64_t i : s) {
      const double v = scores_.at(meth)[t][i].item<double>();
      sc.push_back(v);
      if (random_set.count(i)) sc_random.push_back(v);
    }
    LooStatistics st;
    st.spearman = spearman(sc, entry.effect);
    st.pearson = pearson(sc, entry.effect);
    st.slope = slope_through_origin(sc, entry.effect);
    st.spearman_random = sc_random.size() >= 2 ? spearman(sc_random, effect_random) : std::nan("");
    entry.scores.push_back(std::move(sc));
    entry.statistics.push_back(st);
  }
  return entry;
}

void Evaluator::leave_one_out() {
  if (!wants("loo")) return;
  auto gen = at::detail::createCPUGenerator(options_.seed * 1000003ull + 17);
  const torch::Tensor random = torch::randperm(M_, gen, torch::kLong).narrow(0, 0, options_.loo_random);
  const std::vector<std::vector<int64_t>> sample = loo_sample(random);
  std::set<int64_t> all;
  for (const std::vector<int64_t>& s : sample) all.insert(s.begin(), s.end());
  LooResult loo;
  loo.removed.assign(all.begin(), all.end());
  std::vector<RetrainJob> jobs;
  for (int64_t i : loo.removed) jobs.push_back(removal_job(M_, torch::tensor({i}, torch::kLong)));
  const torch::Tensor f = at_outputs(retrain(jobs, "loo"), output_);                   // [R, n]
  const torch::Tensor base = f_base_.gather(1, output_.view({n_, 1})).squeeze(1);  // [n]
  std::map<int64_t, int64_t> row;
  for (size_t r = 0; r < loo.removed.size(); ++r) row[loo.removed[r]] = static_cast<int64_t>(r);
  loo.random = to_indices(random);
  const std::set<int64_t> random_set(loo.random.begin(), loo.random.end());
  for (int64_t t = 0; t < n_; ++t) {
    loo.per_test.push_back(loo_test_point(t, sample[static_cast<size_t>(t)], f, base, row, random_set));
  }
  for (size_t i = 0; i < options_.methods.size(); ++i) {
    std::vector<double> sp, pe, sp_random, slopes;
    for (const LooTestPoint& e : loo.per_test) {
      sp.push_back(e.statistics[i].spearman);
      pe.push_back(e.statistics[i].pearson);
      sp_random.push_back(e.statistics[i].spearman_random);
      slopes.push_back(e.statistics[i].slope);
    }
    loo.mean.push_back({mean_finite(sp), mean_finite(pe), mean_finite(sp_random), median_finite(slopes)});
  }
  add_column("loo_spearman", [&](size_t i) { return loo.mean[i].spearman; });
  add_column("loo_pearson", [&](size_t i) { return loo.mean[i].pearson; });
  add_column("loo_spearman_random", [&](size_t i) { return loo.mean[i].spearman_random; });
  add_column("loo_slope", [&](size_t i) { return loo.mean[i].slope; });
  loo.selection_method = options_.methods.front();
  loo.extremes = options_.loo_extremes;
  loo.base = to_vector(base);
  r_.loo = std::move(loo);
}

void Evaluator::linear_datamodeling() {
  if (!wants("lds")) return;
  LdsResult lds;
  lds.subsets = options_.lds_subsets;
  lds.fraction = options_.lds_fraction;
  lds.subset_size = std::max<int64_t>(1, std::llround(options_.lds_fraction * static_cast<double>(M_)));
  std::vector<RetrainJob> jobs;
  std::vector<torch::Tensor> masks;
  for (int64_t s = 0; s < options_.lds_subsets; ++s) {
    auto gen = at::detail::createCPUGenerator(options_.seed * 1000003ull + 1000 + static_cast<uint64_t>(s));
    RetrainJob job;
    job.keep = torch::zeros({M_}, torch::kBool);
    job.keep.index_fill_(0, torch::randperm(M_, gen, torch::kLong).narrow(0, 0, lds.subset_size), true);
    masks.push_back(job.keep.to(torch::kFloat64));
    jobs.push_back(job);
  }
  const torch::Tensor f = at_outputs(retrain(jobs, "lds"), output_);  // [S, n]
  const torch::Tensor mask = torch::stack(masks);                      // [S, M]
  for (const std::string& meth : options_.methods) {
    const torch::Tensor predicted_sum = mask.matmul(scores_.at(meth).t());  // [S, n]
    std::vector<double> per;
    for (int64_t t = 0; t < n_; ++t) {
      per.push_back(spearman(to_vector(predicted_sum.select(1, t)), to_vector(f.select(1, t))));
    }
    lds.per_test.push_back(per);
  }
  add_column("lds", [&](size_t i) { return mean_finite(lds.per_test[i]); });
  r_.lds = std::move(lds);
}

void Evaluator::brittleness() {
  if (!wants("brittleness")) return;
  BrittlenessResult b;
  b.grid = options_.brittleness_grid;
  const std::vector<int64_t>& grid = b.grid;
  std::vector<RetrainJob> jobs;
  for (const std::string& meth : options_.methods) {
    for (int64_t t = 0; t < n_; ++t) {
      const torch::Tensor order = std::get<1>(scores_.at(meth)[t].topk(grid.back(), 0, true));
      for (int64_t k : grid) jobs.push_back(removal_job(M_, order.narrow(0, 0, k)));
    }
  }
  const torch::Tensor f = retrain(jobs, "brittleness");  // [methods * n * grid, n, K]
  const torch::Tensor base_class = f_base_.argmax(1);
  std::vector<double> flipped_fraction, median_k;
  size_t r = 0;
  for (size_t i = 0; i < options_.methods.size(); ++i) {
    std::vector<std::optional<int64_t>> per;
    std::vector<double> ks;
    for (int64_t t = 0; t < n_; ++t) {
      std::optional<int64_t> smallest;
      for (int64_t k : grid) {
        const bool flip = f[static_cast<int64_t>(r++)][t].argmax().item<int64_t>() != base_class[t].item<int64_t>();
        if (flip && !smallest) smallest = k;
      }
      if (smallest) ks.push_back(static_cast<double>(*smallest));
      per.push_back(smallest);
    }
    std::sort(ks.begin(), ks.end());
    flipped_fraction.push_back(static_cast<double>(ks.size()) / static_cast<double>(n_));
    median_k.push_back(ks.empty() ? std::nan("") : ks[ks.size() / 2]);
    b.per_test.push_back(std::move(per));
  }
  add_column("brittleness_flipped", [&](size_t i) { return flipped_fraction[i]; });
  add_column("brittleness_median_k", [&](size_t i) { return median_k[i]; });
  r_.brittleness = std::move(b);
}

void Evaluator::write_inputs(const std::string& data_dir) const {
  const Dataset& held = reader_.held_dataset();
  write_held_inputs(data_dir, "train_x", held.x_train, held.x_train_coded);
  write_held_inputs(data_dir, "test_x", held.x_test, held.x_test_coded);
}

std::string Evaluator::train_flipped_run(const torch::Tensor& labels, int64_t count) {
  const std::string data_dir = (fs::path(work_) / "mislabel-data").string();
  const std::string run_dir = (fs::path(work_) / "mislabel-run").string();
  bool reuse = false;
  if (fs::exists(fs::path(run_dir) / "manifest.json")) {
    try {
      const Manifest prior = Manifest::load(run_dir);
      reuse = prior.status == "complete" &&
              read_file((fs::path(data_dir) / "train_y.npy").string()) == npy_bytes(labels);
    } catch (const std::exception&) {
      reuse = false;
    }
  }
  if (reuse) return run_dir;
  fs::create_directories(data_dir);
  write_inputs(data_dir);
  write_npy((fs::path(data_dir) / "test_y.npy").string(), data_.y_test.contiguous());
  write_npy((fs::path(data_dir) / "train_y.npy").string(), labels);
  RunOptions ro = run_options_from_manifest(m_, reader_.dir());
  ro.data.spec = "npy:" + data_dir;
  ro.data.train_size = -1;
  ro.data.test_size = -1;
  ro.out = run_dir;
  ro.force = true;
  ro.train.progress = options_.progress;
  note("mislabel: training with " + std::to_string(count) + " of " + std::to_string(M_) + " labels flipped");
  ThreadScope threads(static_cast<int>(m_.threads));
  train_run(ro);
  return run_dir;
}

void Evaluator::mislabel() {
  if (!wants("mislabel")) return;
  const auto t0 = std::chrono::steady_clock::now();
  MislabelResult r;
  r.fraction = options_.mislabel_fraction;
  // Flip a seeded fraction of the labels to another class, seeded.
  r.flipped = std::llround(options_.mislabel_fraction * static_cast<double>(M_));
  auto gen = at::detail::createCPUGenerator(options_.seed * 1000003ull + 99);
  const torch::Tensor flipped = torch::randperm(M_, gen, torch::kLong).narrow(0, 0, r.flipped);
  torch::Tensor labels = data_.y_train.clone();
  const torch::Tensor shift = torch::randint(1, K_, {r.flipped}, gen, torch::kLong);
  labels.index_put_({flipped}, (labels.index_select(0, flipped) + shift).remainder(K_));
  // The flipped run: the same options on the same inputs with these labels.
  PathReader flipped_reader(train_flipped_run(labels, r.flipped));
  // Candidates: half flipped, half not, seeded.
  torch::Tensor is_flipped = torch::zeros({M_}, torch::kBool);
  is_flipped.index_fill_(0, flipped, true);
  r.flipped_candidates = options_.mislabel_candidates / 2;
  const int64_t half = r.flipped_candidates;
  const torch::Tensor clean = torch::arange(M_, torch::kLong).masked_select(is_flipped.logical_not());
  const torch::Tensor pick_clean = clean.index_select(0, torch::randperm(clean.size(0), gen, torch::kLong)
                                                             .narrow(0, 0, options_.mislabel_candidates - half));
  const torch::Tensor candidates = torch::cat({flipped.narrow(0, 0, half), pick_clean});
  r.candidates = to_indices(candidates);
  std::vector<bool> positive;
  for (int64_t c = 0; c < candidates.size(0); ++c) positive.push_back(c < half);
  const torch::Tensor xc = flipped_reader.train_inputs(candidates);
  const torch::Tensor yc = labels.index_select(0, candidates);
  ScoreCache flipped_cache(work_, ojson{{"mislabel_run", key_}, {"fraction", options_.mislabel_fraction},
                                        {"candidates", r.candidates}});
  for (const std::string& meth : options_.methods) {
    const auto t1 = std::chrono::steady_clock::now();
    note("mislabel: " + meth + " self-attribution of " + std::to_string(candidates.size(0)) + " training points");
    const torch::Tensor s = flipped_cache.get(flipped_reader, meth, "mislabel", xc, yc, aopt_);  // [c, M]
    r.self_attribution.push_back(to_vector(s.gather(1, candidates.view({-1, 1})).squeeze(1)));
    r.auc.push_back(roc_auc(r.self_attribution.back(), positive));
    add_seconds("mislabel_" + meth, seconds_since(t1));
  }
  add_column("mislabel_auc", [&](size_t i) { return r.auc[i]; });
  r_.mislabel = std::move(r);
  add_seconds("mislabel", seconds_since(t0));
}

void Evaluator::finish(const std::chrono::steady_clock::time_point t_start) {
  r_.retrain.scaling = removal_scaling_name(ropt_.scaling);
  r_.retrain.workers = ropt_.workers == 0 ? hardware_threads() : ropt_.workers;
  r_.retrain.threads_per_retrain = ropt_.threads_per_retrain;
  add_seconds("total", seconds_since(t_start));
  write_evaluate_directory(out_, r_, std::vector<std::pair<std::string, torch::Tensor>>(scores_.begin(), scores_.end()));
  std::error_code ignored;
  fs::remove_all(work_, ignored);
}

EvaluateResult Evaluator::run() {
  const auto t_start = std::chrono::steady_clock::now();
  start();
  score_test_points();
  retrainer_.emplace(reader_);
  retrain_baseline();
  leave_one_out();
  linear_datamodeling();
  brittleness();
  mislabel();
  finish(t_start);
  return std::move(r_);
}

}  // namespace

EvaluateResult evaluate(PathReader& reader, const torch::Tensor& test_index, const std::string& out,
                        const EvaluateOptions& options) {
  check_evaluate_inputs(reader, test_index, options);
  return Evaluator(reader, test_index, out, options).run();
}

}  // namespace pathkernel
