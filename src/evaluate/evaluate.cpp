// The attribution metrics: leave-one-out, the linear datamodeling score,
// brittleness and mislabel detection, each against counterfactual retraining.
#include "pathkernel/evaluate.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <filesystem>
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
ojson compare_views(const torch::Tensor& epk, const torch::Tensor& mg, const torch::Tensor& y_train, int64_t k) {
  ojson points = ojson::array();
  std::vector<double> rank_corr, overlap;
  for (int64_t p = 0; p < epk.size(0); ++p) {
    const torch::Tensor a = epk[p].contiguous(), b = mg[p].contiguous();
    const std::vector<double> va(a.data_ptr<double>(), a.data_ptr<double>() + a.numel());
    const std::vector<double> vb(b.data_ptr<double>(), b.data_ptr<double>() + b.numel());
    const std::vector<int64_t> ta = top_abs(a, k), tb = top_abs(b, k);
    auto row = [&](int64_t i) {
      return ojson{{"index", i},
                   {"label", is_regression_target(y_train) ? ojson(nullptr) : ojson(y_train[i].item<int64_t>())},
                   {"epk", va[static_cast<size_t>(i)]},
                   {"metagradient", vb[static_cast<size_t>(i)]}};
    };
    ojson only_mg = ojson::array(), only_epk = ojson::array();
    int64_t shared = 0;
    for (int64_t i : tb) {
      if (std::find(ta.begin(), ta.end(), i) == ta.end()) only_mg.push_back(row(i));
      else ++shared;
    }
    for (int64_t i : ta) {
      if (std::find(tb.begin(), tb.end(), i) == tb.end()) only_epk.push_back(row(i));
    }
    rank_corr.push_back(spearman(va, vb));
    overlap.push_back(static_cast<double>(shared) / static_cast<double>(ta.size()));
    points.push_back({{"spearman", rank_corr.back()},
                      {"pearson", pearson(va, vb)},
                      {"top_shared", shared},
                      {"counterfactual_only", only_mg},
                      {"decomposition_only", only_epk}});
  }
  return {{"top", k},
          {"meaning", "epk: the exact contribution, the training path held fixed; metagradient: the first-order "
                      "change when the point's loss weight goes to 0, the whole run responding. "
                      "counterfactual_only lists points in the metagradient's top by |score| but not the exact "
                      "contribution's; decomposition_only the reverse"},
          {"median_spearman", median_finite(rank_corr)},
          {"mean_top_shared_fraction", mean_finite(overlap)},
          {"per_test", points}};
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

/// NaN as JSON null (JSON has no NaN).
ojson number(double v) { return std::isfinite(v) ? ojson(v) : ojson(nullptr); }

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

Evaluation evaluate(PathReader& reader, const torch::Tensor& test_index, const std::string& out,
                    const EvaluateOptions& options) {
  const auto t_start = std::chrono::steady_clock::now();
  const Manifest& m = reader.manifest();
  const Dataset& data = reader.dataset();
  const int64_t M = m.num_train, K = m.num_classes;
  options.validate(M, K);
  const bool regression = is_regression_target(data.y_train);
  PK_CHECK(!(regression && options.output == "label"),
           "evaluate: --output label needs class labels; run '" << reader.dir() << "' trains on regression targets");
  PK_CHECK(!(regression && contains(options.metrics, "mislabel")),
           "evaluate: mislabel flips class labels; run '" << reader.dir() << "' trains on regression targets");
  PK_CHECK(test_index.dim() == 1 && test_index.numel() > 0 && test_index.scalar_type() == torch::kLong,
           "evaluate: test indices must be a non-empty int64 list (got " << test_index.sizes() << ")");
  PK_CHECK(test_index.min().item<int64_t>() >= 0 && test_index.max().item<int64_t>() < data.x_test.size(0),
           "evaluate: test indices must lie in [0, " << data.x_test.size(0) << ")");
  auto note = [&](const std::string& s) {
    if (options.on_note) options.on_note(s);
  };
  const std::vector<std::string>& methods = options.methods;
  auto wants = [&](const char* metric) { return contains(options.metrics, metric); };
  const std::string work = (fs::path(out) / ".work").string();
  fs::create_directories(work);

  const int64_t n = test_index.size(0);
  const torch::Tensor x = data.x_test.index_select(0, test_index);
  torch::Tensor fN;  // [n, K], on the retrainings' thread count, so a retraining that reproduces w_N reproduces it
  {
    ThreadScope threads(options.retrain.threads_per_retrain);
    fN = reader.outputs(m.steps, x);
  }
  const torch::Tensor output = chosen_outputs(fN, data.y_test.index_select(0, test_index), options.output);
  const torch::Tensor predicted = fN.argmax(1);
  const ojson key{{"manifest_crc32", reader.manifest_crc32()},
                  {"test_indices", to_indices(test_index)},
                  {"quadrature", options.attribution.quadrature.spec.str()},
                  {"tol", options.attribution.quadrature.tol},
                  {"gauss_nodes", options.attribution.quadrature.gauss_nodes},
                  {"seed", options.attribution.seed},
                  {"threads", current_threads()}};
  ScoreCache cache(work, key);
  AttributionOptions aopt = options.attribution;
  aopt.progress = options.progress;

  Evaluation ev;
  ojson& j = ev.json;
  j["run"] = reader.dir();
  j["test_indices"] = to_indices(test_index);
  j["output"] = options.output;
  j["outputs"] = to_indices(output);
  j["methods"] = methods;
  j["metrics"] = options.metrics;
  ojson seconds = ojson::object();
  ojson table = ojson::object();
  for (const std::string& meth : methods) table[meth] = ojson::object();

  // Scores on the test points, for every metric but mislabel.
  std::map<std::string, torch::Tensor> scores;
  if (wants("loo") || wants("lds") || wants("brittleness")) {
    for (const std::string& meth : methods) {
      const auto t0 = std::chrono::steady_clock::now();
      note("scores: " + meth + " on " + std::to_string(n) + " test points");
      scores[meth] = cache.get(reader, meth, "test", x, output, aopt);
      seconds["scores_" + meth] = seconds_since(t0);
    }
  }

  if (scores.count("epk") && scores.count("metagradient")) {
    j["views"] = compare_views(scores.at("epk"), scores.at("metagradient"), data.y_train, kViewTop);
  }

  Retrainer retrainer(reader);
  RetrainOptions ropt = options.retrain;
  ropt.progress = options.progress;
  int64_t retrainings = 0;
  double retrain_seconds = 0;
  auto retrain = [&](const std::vector<RetrainJob>& jobs, const std::string& name) {
    const auto t0 = std::chrono::steady_clock::now();
    RetrainOptions o = ropt;
    o.work_file = (fs::path(work) / ("retrain_" + name)).string();
    o.label = name;
    note("retraining: " + std::to_string(jobs.size()) + " " + name + " runs");
    torch::Tensor f = options.retrain_outputs ? options.retrain_outputs(retrainer, jobs, x, o)
                                              : retrainer.outputs(jobs, x, o);
    retrainings += static_cast<int64_t>(jobs.size());
    retrain_seconds += seconds_since(t0);
    seconds["retrain_" + name] = seconds_since(t0);
    return f;
  };

  torch::Tensor f_base;  // [n, K]: the retraining that removes nothing
  if (wants("loo") || wants("brittleness")) {
    f_base = retrain({RetrainJob{}}, "baseline")[0];
    const bool same = torch::equal(f_base, fN);
    j["retrain"]["baseline_reproduces_run"] = same;
    j["retrain"]["baseline_max_abs_diff"] = (f_base - fN).abs().max().item<double>();
    if (!same) {
      char text[256];
      std::snprintf(text, sizeof text,
                    "the retraining that removes nothing differs from the run (max |diff| %.1e; the run used %lld "
                    "threads, each retraining %d): effects are measured against it, not the run",
                    (f_base - fN).abs().max().item<double>(), static_cast<long long>(m.threads),
                    ropt.threads_per_retrain);
      note(text);
    }
  }

  if (wants("loo")) {
    // The sample: each test point's extremes by the first method, plus random points.
    auto gen = at::detail::createCPUGenerator(options.seed * 1000003ull + 17);
    const torch::Tensor random = torch::randperm(M, gen, torch::kLong).narrow(0, 0, options.loo_random);
    const torch::Tensor& select = scores.at(methods.front());
    std::vector<std::vector<int64_t>> sample(static_cast<size_t>(n));
    std::set<int64_t> all;
    for (int64_t t = 0; t < n; ++t) {
      std::set<int64_t> mine;
      if (options.loo_extremes > 0) {
        for (bool largest : {true, false}) {
          for (int64_t i : to_indices(std::get<1>(select[t].topk(options.loo_extremes, 0, largest)))) mine.insert(i);
        }
      }
      for (int64_t i : to_indices(random)) mine.insert(i);
      sample[static_cast<size_t>(t)].assign(mine.begin(), mine.end());
      all.insert(mine.begin(), mine.end());
    }
    const std::vector<int64_t> removed(all.begin(), all.end());
    std::vector<RetrainJob> jobs;
    for (int64_t i : removed) jobs.push_back(removal_job(M, torch::tensor({i}, torch::kLong)));
    const torch::Tensor f = at_outputs(retrain(jobs, "loo"), output);  // [R, n]
    const torch::Tensor base = f_base.gather(1, output.view({n, 1})).squeeze(1);  // [n]
    std::map<int64_t, int64_t> row;
    for (size_t r = 0; r < removed.size(); ++r) row[removed[r]] = static_cast<int64_t>(r);
    const std::vector<int64_t> random_list = to_indices(random);
    const std::set<int64_t> random_set(random_list.begin(), random_list.end());
    ojson per_test = ojson::array();
    std::map<std::string, std::vector<double>> sp, pe, sp_random, slopes;
    for (int64_t t = 0; t < n; ++t) {
      const std::vector<int64_t>& s = sample[static_cast<size_t>(t)];
      std::vector<double> effect, effect_random;
      for (int64_t i : s) {
        const double e = base[t].item<double>() - f[row[i]][t].item<double>();
        effect.push_back(e);
        if (random_set.count(i)) effect_random.push_back(e);
      }
      ojson entry{{"test_index", test_index[t].item<int64_t>()}, {"output", output[t].item<int64_t>()},
                  {"sample", s}, {"effect", effect}};
      for (const std::string& meth : methods) {
        std::vector<double> sc, sc_random;
        for (int64_t i : s) {
          const double v = scores[meth][t][i].item<double>();
          sc.push_back(v);
          if (random_set.count(i)) sc_random.push_back(v);
        }
        const double rs = spearman(sc, effect), rp = pearson(sc, effect), slope = slope_through_origin(sc, effect);
        const double rr = sc_random.size() >= 2 ? spearman(sc_random, effect_random) : std::nan("");
        sp[meth].push_back(rs);
        pe[meth].push_back(rp);
        sp_random[meth].push_back(rr);
        slopes[meth].push_back(slope);
        entry["scores"][meth] = sc;
        entry["spearman"][meth] = number(rs);
        entry["pearson"][meth] = number(rp);
        entry["spearman_random"][meth] = number(rr);
        entry["slope"][meth] = number(slope);
      }
      per_test.push_back(entry);
    }
    ojson mean;
    for (const std::string& meth : methods) {
      mean[meth] = {{"spearman", number(mean_finite(sp[meth]))},
                    {"pearson", number(mean_finite(pe[meth]))},
                    {"spearman_random", number(mean_finite(sp_random[meth]))},
                    {"slope", number(median_finite(slopes[meth]))}};
      table[meth]["loo_spearman"] = mean[meth]["spearman"];
      table[meth]["loo_pearson"] = mean[meth]["pearson"];
      table[meth]["loo_spearman_random"] = mean[meth]["spearman_random"];
      table[meth]["loo_slope"] = mean[meth]["slope"];
    }
    ev.columns.insert(ev.columns.end(), {"loo_spearman", "loo_pearson", "loo_spearman_random", "loo_slope"});
    j["loo"] = {{"selection_method", methods.front()},
                {"extremes", options.loo_extremes},
                {"random", to_indices(random)},
                {"removed", removed},
                {"base", to_vector(base)},
                {"mean", mean},
                {"per_test", per_test}};
  }

  if (wants("lds")) {
    const int64_t size = std::max<int64_t>(1, std::llround(options.lds_fraction * static_cast<double>(M)));
    std::vector<RetrainJob> jobs;
    std::vector<torch::Tensor> masks;
    for (int64_t s = 0; s < options.lds_subsets; ++s) {
      auto gen = at::detail::createCPUGenerator(options.seed * 1000003ull + 1000 + static_cast<uint64_t>(s));
      RetrainJob job;
      job.keep = torch::zeros({M}, torch::kBool);
      job.keep.index_fill_(0, torch::randperm(M, gen, torch::kLong).narrow(0, 0, size), true);
      masks.push_back(job.keep.to(torch::kFloat64));
      jobs.push_back(job);
    }
    const torch::Tensor f = at_outputs(retrain(jobs, "lds"), output);  // [S, n]
    const torch::Tensor mask = torch::stack(masks);                     // [S, M]
    ojson per_test = ojson::object();
    for (const std::string& meth : methods) {
      const torch::Tensor predicted_sum = mask.matmul(scores[meth].t());  // [S, n]
      std::vector<double> per;
      for (int64_t t = 0; t < n; ++t) per.push_back(spearman(to_vector(predicted_sum.select(1, t)),
                                                             to_vector(f.select(1, t))));
      per_test[meth] = ojson::array();
      for (double v : per) per_test[meth].push_back(number(v));
      table[meth]["lds"] = number(mean_finite(per));
    }
    ev.columns.push_back("lds");
    j["lds"] = {{"subsets", options.lds_subsets}, {"fraction", options.lds_fraction}, {"subset_size", size},
                {"per_test", per_test}};
  }

  if (wants("brittleness")) {
    const std::vector<int64_t>& grid = options.brittleness_grid;
    std::vector<RetrainJob> jobs;
    for (const std::string& meth : methods) {
      for (int64_t t = 0; t < n; ++t) {
        const torch::Tensor order = std::get<1>(scores[meth][t].topk(grid.back(), 0, true));
        for (int64_t k : grid) jobs.push_back(removal_job(M, order.narrow(0, 0, k)));
      }
    }
    const torch::Tensor f = retrain(jobs, "brittleness");  // [methods * n * grid, n, K]
    const torch::Tensor base_class = f_base.argmax(1);
    ojson per_test = ojson::object();
    size_t r = 0;
    for (const std::string& meth : methods) {
      per_test[meth] = ojson::array();
      int64_t flipped = 0;
      std::vector<double> ks;
      for (int64_t t = 0; t < n; ++t) {
        ojson smallest = nullptr;
        for (int64_t k : grid) {
          const bool flip = f[static_cast<int64_t>(r++)][t].argmax().item<int64_t>() != base_class[t].item<int64_t>();
          if (flip && smallest.is_null()) smallest = k;
        }
        if (!smallest.is_null()) {
          ++flipped;
          ks.push_back(smallest.get<double>());
        }
        per_test[meth].push_back(smallest);
      }
      std::sort(ks.begin(), ks.end());
      table[meth]["brittleness_flipped"] = static_cast<double>(flipped) / static_cast<double>(n);
      table[meth]["brittleness_median_k"] = ks.empty() ? ojson(nullptr) : ojson(ks[ks.size() / 2]);
    }
    ev.columns.insert(ev.columns.end(), {"brittleness_flipped", "brittleness_median_k"});
    j["brittleness"] = {{"grid", grid}, {"per_test", per_test}};
  }

  if (wants("mislabel")) {
    const auto t0 = std::chrono::steady_clock::now();
    // Flip a seeded fraction of the labels to another class, seeded.
    const int64_t count = std::llround(options.mislabel_fraction * static_cast<double>(M));
    auto gen = at::detail::createCPUGenerator(options.seed * 1000003ull + 99);
    const torch::Tensor flipped = torch::randperm(M, gen, torch::kLong).narrow(0, 0, count);
    torch::Tensor labels = data.y_train.clone();
    const torch::Tensor shift = torch::randint(1, K, {count}, gen, torch::kLong);
    labels.index_put_({flipped}, (labels.index_select(0, flipped) + shift).remainder(K));
    // The flipped run: the same options on the same inputs with these labels.
    const std::string data_dir = (fs::path(work) / "mislabel-data").string();
    const std::string run_dir = (fs::path(work) / "mislabel-run").string();
    bool reuse = false;
    if (fs::exists(fs::path(run_dir) / "manifest.json")) {
      try {
        const Manifest prior = Manifest::load(run_dir);
        reuse = prior.status == "complete" && read_file((fs::path(data_dir) / "train_y.npy").string()) ==
                                                   npy_bytes(labels);
      } catch (const std::exception&) {
        reuse = false;
      }
    }
    if (!reuse) {
      fs::create_directories(data_dir);
      write_npy((fs::path(data_dir) / "train_x.npy").string(), data.x_train.contiguous());
      write_npy((fs::path(data_dir) / "test_x.npy").string(), data.x_test.contiguous());
      write_npy((fs::path(data_dir) / "test_y.npy").string(), data.y_test.contiguous());
      write_npy((fs::path(data_dir) / "train_y.npy").string(), labels);
      RunOptions ro = run_options_from_manifest(m, reader.dir());
      ro.data.spec = "npy:" + data_dir;
      ro.data.train_size = -1;
      ro.data.test_size = -1;
      ro.out = run_dir;
      ro.force = true;
      ro.train.progress = options.progress;
      note("mislabel: training with " + std::to_string(count) + " of " + std::to_string(M) + " labels flipped");
      ThreadScope threads(static_cast<int>(m.threads));
      train_run(ro);
    }
    PathReader flipped_reader(run_dir);
    // Candidates: half flipped, half not, seeded.
    torch::Tensor is_flipped = torch::zeros({M}, torch::kBool);
    is_flipped.index_fill_(0, flipped, true);
    const int64_t half = options.mislabel_candidates / 2;
    const torch::Tensor clean = torch::arange(M, torch::kLong).masked_select(is_flipped.logical_not());
    const torch::Tensor pick_clean = clean.index_select(0, torch::randperm(clean.size(0), gen, torch::kLong)
                                                               .narrow(0, 0, options.mislabel_candidates - half));
    const torch::Tensor candidates = torch::cat({flipped.narrow(0, 0, half), pick_clean});
    std::vector<bool> positive;
    for (int64_t c = 0; c < candidates.size(0); ++c) positive.push_back(c < half);
    const torch::Tensor xc = flipped_reader.dataset().x_train.index_select(0, candidates);
    const torch::Tensor yc = labels.index_select(0, candidates);
    ScoreCache flipped_cache(work, ojson{{"mislabel_run", key}, {"fraction", options.mislabel_fraction},
                                         {"candidates", to_indices(candidates)}});
    ojson auc = ojson::object(), self = ojson::object();
    for (const std::string& meth : methods) {
      const auto t1 = std::chrono::steady_clock::now();
      note("mislabel: " + meth + " self-attribution of " + std::to_string(candidates.size(0)) + " training points");
      const torch::Tensor s = flipped_cache.get(flipped_reader, meth, "mislabel", xc, yc, aopt);  // [c, M]
      const std::vector<double> v = to_vector(s.gather(1, candidates.view({-1, 1})).squeeze(1));
      const double a = roc_auc(v, positive);
      auc[meth] = a;
      self[meth] = v;
      table[meth]["mislabel_auc"] = a;
      seconds["mislabel_" + meth] = seconds_since(t1);
    }
    ev.columns.push_back("mislabel_auc");
    j["mislabel"] = {{"fraction", options.mislabel_fraction},
                     {"flipped", count},
                     {"candidates", to_indices(candidates)},
                     {"flipped_candidates", half},
                     {"auc", auc},
                     {"self_attribution", self}};
    seconds["mislabel"] = seconds_since(t0);
  }

  j["retrain"]["scaling"] = removal_scaling_name(ropt.scaling);
  j["retrain"]["workers"] = ropt.workers == 0 ? hardware_threads() : ropt.workers;
  j["retrain"]["threads_per_retrain"] = ropt.threads_per_retrain;
  j["retrain"]["retrainings"] = retrainings;
  j["retrain"]["seconds"] = retrain_seconds;
  j["table"] = table;
  j["columns"] = ev.columns;
  seconds["total"] = seconds_since(t_start);
  j["seconds"] = seconds;

  fs::create_directories(out);
  for (const auto& [meth, s] : scores) write_npy((fs::path(out) / ("scores_" + meth + ".npy")).string(), s);
  write_file_atomic((fs::path(out) / "evaluate.json").string(), j.dump(2) + "\n");
  std::error_code ignored;
  fs::remove_all(work, ignored);
  return ev;
}

Evaluation read_evaluation(const std::string& dir, const Manifest& m) {
  PK_CHECK(fs::is_directory(dir), "evaluate directory '" << dir << "' does not exist: expected the directory "
                                                         << "'pathkernel evaluate' writes (its --out)");
  const std::string path = (fs::path(dir) / "evaluate.json").string();
  PK_CHECK(fs::exists(path),
           "evaluate directory '" << dir << "' has no evaluate.json: was it written by 'pathkernel evaluate'?");
  Evaluation ev;
  ojson& j = ev.json;
  try {
    j = ojson::parse(read_file(path));
  } catch (const ojson::exception& ex) {
    PK_THROW("'" << path << "' is not valid JSON (" << ex.what() << "): was it written by 'pathkernel evaluate'?");
  }
  auto strings = [](const ojson& v) {
    if (!v.is_array()) return false;
    for (const auto& e : v) {
      if (!e.is_string()) return false;
    }
    return true;
  };
  PK_CHECK(j.is_object() && j.contains("methods") && strings(j["methods"]) && !j["methods"].empty() &&
               j.contains("columns") && strings(j["columns"]) && j.contains("table") && j["table"].is_object(),
           "'" << path << "' has no \"methods\", \"columns\" and \"table\": expected the output of "
               << "'pathkernel evaluate'");
  const std::vector<std::string> methods = j["methods"];
  ev.columns = j["columns"].get<std::vector<std::string>>();
  auto in_range = [](const ojson& v, int64_t hi) {
    return v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < hi;
  };
  auto numbers = [](const ojson& v, size_t count) {  // numbers, or null for NaN
    if (!v.is_array() || v.size() != count) return false;
    for (const auto& e : v) {
      if (!e.is_number() && !e.is_null()) return false;
    }
    return true;
  };
  for (const std::string& meth : methods) {
    PK_CHECK(j["table"].contains(meth) && j["table"][meth].is_object(),
             "'" << path << "' lists method '" << meth << "' but its table has no row for it");
  }
  if (j.contains("loo")) {
    const ojson& loo = j["loo"];
    PK_CHECK(loo.is_object() && loo.contains("per_test") && loo["per_test"].is_array() && loo.contains("random") &&
                 loo["random"].is_array(),
             "'" << path << "' has a \"loo\" entry without \"per_test\" and \"random\" lists");
    for (const auto& i : loo["random"]) {
      PK_CHECK(in_range(i, m.num_train), "'" << path << "' lists training point " << i.dump()
                                             << " among the leave-one-out random points; the run has " << m.num_train
                                             << " training points");
    }
    for (size_t t = 0; t < loo["per_test"].size(); ++t) {
      const ojson& e = loo["per_test"][t];
      PK_CHECK(e.is_object() && e.contains("test_index") && in_range(e["test_index"], m.num_test),
               "'" << path << "': leave-one-out entry " << t << " has test_index "
                   << (e.is_object() && e.contains("test_index") ? e["test_index"].dump() : "(none)") << "; the run has "
                   << m.num_test << " test points");
      PK_CHECK(e.contains("output") && in_range(e["output"], m.num_classes),
               "'" << path << "': leave-one-out entry " << t << " has output "
                   << (e.contains("output") ? e["output"].dump() : "(none)") << "; the run has " << m.num_classes
                   << " outputs");
      PK_CHECK(e.contains("sample") && e["sample"].is_array() && !e["sample"].empty(),
               "'" << path << "': leave-one-out entry " << t << " has no \"sample\" of removed points");
      const size_t count = e["sample"].size();
      for (const auto& i : e["sample"]) {
        PK_CHECK(in_range(i, m.num_train), "'" << path << "': leave-one-out entry " << t << " removes training point "
                                               << i.dump() << "; the run has " << m.num_train << " training points");
      }
      // What a list holds, for the messages: "7 entries", or its JSON type.
      auto held = [](const ojson& parent, const std::string& name) {
        if (!parent.is_object() || !parent.contains(name)) return std::string("none");
        const ojson& v = parent[name];
        return v.is_array() ? std::to_string(v.size()) + " entries" : std::string("a ") + v.type_name();
      };
      PK_CHECK(e.contains("effect") && numbers(e["effect"], count),
               "'" << path << "': leave-one-out entry " << t << " needs " << count
                   << " numbers in \"effect\", one per removed point (got " << held(e, "effect") << ")");
      for (const std::string& meth : methods) {
        PK_CHECK(e.contains("scores") && e["scores"].contains(meth) && numbers(e["scores"][meth], count),
                 "'" << path << "': leave-one-out entry " << t << " needs " << count << " scores of method '" << meth
                     << "', one per removed point (got "
                     << (e.contains("scores") ? held(e["scores"], meth) : std::string("none")) << ")");
      }
    }
  }
  return ev;
}

}  // namespace pathkernel
