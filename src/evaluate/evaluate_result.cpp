// evaluate's directory (evaluate_result.h): evaluate.json spelled out from
// EvaluateResult and read back into it, and the scores' .npy files.
#include "pathkernel/evaluate_result.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/json_number.h"
#include "pathkernel/npy.h"

namespace pathkernel {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Writing. A NaN double is written as null by nlohmann's dump.

/// {method: value(i)} over the methods, in order.
template <typename Value>
ojson per_method(const std::vector<std::string>& methods, Value value) {
  ojson out = ojson::object();
  for (size_t i = 0; i < methods.size(); ++i) out[methods[i]] = value(i);
  return out;
}

ojson view_points_json(const std::vector<ViewPoint>& points) {
  ojson out = ojson::array();
  for (const ViewPoint& p : points) {
    out.push_back({{"index", p.index},
                   {"label", p.label ? ojson(*p.label) : ojson(nullptr)},
                   {"epk", p.epk},
                   {"metagradient", p.metagradient}});
  }
  return out;
}

ojson views_json(const ViewComparison& v) {
  ojson points = ojson::array();
  for (const ViewTestPoint& p : v.per_test) {
    points.push_back({{"spearman", p.spearman},
                      {"pearson", p.pearson},
                      {"top_shared", p.top_shared},
                      {"counterfactual_only", view_points_json(p.counterfactual_only)},
                      {"decomposition_only", view_points_json(p.decomposition_only)}});
  }
  return {{"top", v.top},
          {"meaning", "epk: the exact contribution, the training path held fixed; metagradient: the first-order "
                      "change when the point's loss weight goes to 0, the whole run responding. "
                      "counterfactual_only lists points in the metagradient's top by |score| but not the exact "
                      "contribution's; decomposition_only the reverse"},
          {"median_spearman", v.median_spearman},
          {"mean_top_shared_fraction", v.mean_top_shared_fraction},
          {"per_test", points}};
}

ojson loo_test_json(const LooTestPoint& t, const std::vector<std::string>& methods) {
  auto stat = [&](double LooStatistics::*field) {
    return per_method(methods, [&](size_t i) { return t.statistics[i].*field; });
  };
  return {{"test_index", t.test_index},
          {"output", t.output},
          {"sample", t.sample},
          {"effect", t.effect},
          {"scores", per_method(methods, [&](size_t i) { return t.scores[i]; })},
          {"spearman", stat(&LooStatistics::spearman)},
          {"pearson", stat(&LooStatistics::pearson)},
          {"spearman_random", stat(&LooStatistics::spearman_random)},
          {"slope", stat(&LooStatistics::slope)}};
}

ojson loo_json(const LooResult& loo, const std::vector<std::string>& methods) {
  ojson per_test = ojson::array();
  for (const LooTestPoint& t : loo.per_test) per_test.push_back(loo_test_json(t, methods));
  const ojson mean = per_method(methods, [&](size_t i) {
    const LooStatistics& s = loo.mean[i];
    return ojson{{"spearman", s.spearman}, {"pearson", s.pearson}, {"spearman_random", s.spearman_random},
                 {"slope", s.slope}};
  });
  return {{"selection_method", loo.selection_method},
          {"extremes", loo.extremes},
          {"random", loo.random},
          {"removed", loo.removed},
          {"base", loo.base},
          {"mean", mean},
          {"per_test", per_test}};
}

ojson lds_json(const LdsResult& lds, const std::vector<std::string>& methods) {
  return {{"subsets", lds.subsets},
          {"fraction", lds.fraction},
          {"subset_size", lds.subset_size},
          {"per_test", per_method(methods, [&](size_t i) { return lds.per_test[i]; })}};
}

ojson brittleness_json(const BrittlenessResult& b, const std::vector<std::string>& methods) {
  const ojson per_test = per_method(methods, [&](size_t i) {
    ojson ks = ojson::array();
    for (const std::optional<int64_t>& k : b.per_test[i]) ks.push_back(k ? ojson(*k) : ojson(nullptr));
    return ks;
  });
  return {{"grid", b.grid}, {"per_test", per_test}};
}

ojson mislabel_json(const MislabelResult& r, const std::vector<std::string>& methods) {
  return {{"fraction", r.fraction},
          {"flipped", r.flipped},
          {"candidates", r.candidates},
          {"flipped_candidates", r.flipped_candidates},
          {"auc", per_method(methods, [&](size_t i) { return r.auc[i]; })},
          {"self_attribution", per_method(methods, [&](size_t i) { return r.self_attribution[i]; })}};
}


// Reading back.

/// evaluate.json, parsed, with its path for the messages.
struct EvaluateFile {
  std::string path;
  ojson j;
  std::string where() const { return "'" + path + "'"; }
};

/// A number, or NaN for null.
double number_or_nan(const ojson& v, const std::string& what) {
  return v.is_null() ? kNaN : json_number<double>(v, what);
}

std::vector<double> numbers_or_nan(const ojson& v, const std::string& what) {
  PK_CHECK(v.is_array(), what << " must be an array of numbers, got " << v.dump());
  std::vector<double> out;
  for (const auto& e : v) out.push_back(number_or_nan(e, what + " element"));
  return out;
}

/// o[key][method] per method, read by `read`, or `fallback` when absent.
template <typename T, typename Read>
std::vector<T> read_per_method(const ojson& o, const char* key, const std::vector<std::string>& methods, T fallback,
                               Read read) {
  std::vector<T> out;
  for (const std::string& meth : methods) {
    const bool has = o.contains(key) && o[key].is_object() && o[key].contains(meth);
    out.push_back(has ? read(o[key][meth]) : fallback);
  }
  return out;
}

bool strings(const ojson& v) {
  if (!v.is_array()) return false;
  for (const auto& e : v) {
    if (!e.is_string()) return false;
  }
  return true;
}

bool in_range(const ojson& v, int64_t hi) {
  return v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < hi;
}

/// Numbers, or null for NaN, `count` of them.
bool numbers(const ojson& v, size_t count) {
  if (!v.is_array() || v.size() != count) return false;
  for (const auto& e : v) {
    if (!e.is_number() && !e.is_null()) return false;
  }
  return true;
}

/// What a list holds, for the messages: "7 entries", or its JSON type.
std::string held(const ojson& parent, const std::string& name) {
  if (!parent.is_object() || !parent.contains(name)) return std::string("none");
  const ojson& v = parent[name];
  return v.is_array() ? std::to_string(v.size()) + " entries" : std::string("a ") + v.type_name();
}

/// Checks leave-one-out entry t against the run and the methods.
void check_loo_entry(const EvaluateFile& f, const ojson& e, size_t t, const Manifest& m,
                     const std::vector<std::string>& methods) {
  PK_CHECK(e.is_object() && e.contains("test_index") && in_range(e["test_index"], m.num_test),
           f.where() << ": leave-one-out entry " << t << " has test_index "
                     << (e.is_object() && e.contains("test_index") ? e["test_index"].dump() : "(none)")
                     << "; the run has " << m.num_test << " test points");
  PK_CHECK(e.contains("output") && in_range(e["output"], m.num_classes),
           f.where() << ": leave-one-out entry " << t << " has output "
                     << (e.contains("output") ? e["output"].dump() : "(none)") << "; the run has " << m.num_classes
                     << " outputs");
  PK_CHECK(e.contains("sample") && e["sample"].is_array() && !e["sample"].empty(),
           f.where() << ": leave-one-out entry " << t << " has no \"sample\" of removed points");
  const size_t count = e["sample"].size();
  for (const auto& i : e["sample"]) {
    PK_CHECK(in_range(i, m.num_train), f.where() << ": leave-one-out entry " << t << " removes training point "
                                                 << i.dump() << "; the run has " << m.num_train << " training points");
  }
  PK_CHECK(e.contains("effect") && numbers(e["effect"], count),
           f.where() << ": leave-one-out entry " << t << " needs " << count
                     << " numbers in \"effect\", one per removed point (got " << held(e, "effect") << ")");
  for (const std::string& meth : methods) {
    PK_CHECK(e.contains("scores") && e["scores"].contains(meth) && numbers(e["scores"][meth], count),
             f.where() << ": leave-one-out entry " << t << " needs " << count << " scores of method '" << meth
                       << "', one per removed point (got "
                       << (e.contains("scores") ? held(e["scores"], meth) : std::string("none")) << ")");
  }
}

LooStatistics read_statistics(const ojson& o, const std::string& meth, const std::string& what) {
  auto get = [&](const char* key) {
    return o.contains(key) && o[key].is_object() && o[key].contains(meth)
               ? number_or_nan(o[key][meth], what + " " + key + " of '" + meth + "'")
               : kNaN;
  };
  return {get("spearman"), get("pearson"), get("spearman_random"), get("slope")};
}

LooTestPoint read_loo_entry(const EvaluateFile& f, const ojson& e, const std::vector<std::string>& methods) {
  const std::string what = f.where() + ": a leave-one-out entry's";
  LooTestPoint t;
  t.test_index = e["test_index"].get<int64_t>();
  t.output = e["output"].get<int64_t>();
  t.sample = json_numbers<int64_t>(e["sample"], what + " sample");
  t.effect = numbers_or_nan(e["effect"], what + " effect");
  for (const std::string& meth : methods) {
    t.scores.push_back(numbers_or_nan(e["scores"][meth], what + " scores"));
    t.statistics.push_back(read_statistics(e, meth, what));
  }
  return t;
}

LooResult read_loo(const EvaluateFile& f, const Manifest& m, const std::vector<std::string>& methods) {
  const ojson& loo = f.j["loo"];
  PK_CHECK(loo.is_object() && loo.contains("per_test") && loo["per_test"].is_array() && loo.contains("random") &&
               loo["random"].is_array(),
           f.where() << " has a \"loo\" entry without \"per_test\" and \"random\" lists");
  LooResult r;
  for (const auto& i : loo["random"]) {
    PK_CHECK(in_range(i, m.num_train), f.where() << " lists training point " << i.dump()
                                                 << " among the leave-one-out random points; the run has "
                                                 << m.num_train << " training points");
    r.random.push_back(i.get<int64_t>());
  }
  for (size_t t = 0; t < loo["per_test"].size(); ++t) {
    check_loo_entry(f, loo["per_test"][t], t, m, methods);
    r.per_test.push_back(read_loo_entry(f, loo["per_test"][t], methods));
  }
  const std::string what = f.where() + ": leave-one-out's";
  r.selection_method = loo.value("selection_method", std::string());
  r.extremes = loo.contains("extremes") ? json_number<int64_t>(loo["extremes"], what + " extremes") : 0;
  if (loo.contains("removed")) r.removed = json_numbers<int64_t>(loo["removed"], what + " removed");
  if (loo.contains("base")) r.base = numbers_or_nan(loo["base"], what + " base");
  for (const std::string& meth : methods) {
    const ojson mean = loo.contains("mean") && loo["mean"].contains(meth) ? loo["mean"][meth] : ojson::object();
    auto get = [&](const char* key) {
      return mean.contains(key) ? number_or_nan(mean[key], what + " mean " + key) : kNaN;
    };
    r.mean.push_back({get("spearman"), get("pearson"), get("spearman_random"), get("slope")});
  }
  return r;
}

std::vector<ViewPoint> read_view_points(const ojson& v, const std::string& what) {
  std::vector<ViewPoint> out;
  if (!v.is_array()) return out;
  for (const auto& p : v) {
    ViewPoint q;
    q.index = json_number<int64_t>(p.at("index"), what + " index");
    if (p.contains("label") && !p["label"].is_null()) q.label = json_number<int64_t>(p["label"], what + " label");
    q.epk = number_or_nan(p.value("epk", ojson()), what + " epk");
    q.metagradient = number_or_nan(p.value("metagradient", ojson()), what + " metagradient");
    out.push_back(q);
  }
  return out;
}

ViewComparison read_views(const EvaluateFile& f) {
  const ojson& v = f.j["views"];
  const std::string what = f.where() + ": the views'";
  PK_CHECK(v.is_object(), what << " entry is not an object: " << v.dump());
  ViewComparison r;
  r.top = json_number<int64_t>(v.value("top", ojson(0)), what + " top");
  r.median_spearman = number_or_nan(v.value("median_spearman", ojson()), what + " median_spearman");
  r.mean_top_shared_fraction =
      number_or_nan(v.value("mean_top_shared_fraction", ojson()), what + " mean_top_shared_fraction");
  for (const auto& p : v.value("per_test", ojson::array())) {
    r.per_test.push_back({number_or_nan(p.value("spearman", ojson()), what + " spearman"),
                          number_or_nan(p.value("pearson", ojson()), what + " pearson"),
                          json_number<int64_t>(p.value("top_shared", ojson(0)), what + " top_shared"),
                          read_view_points(p.value("counterfactual_only", ojson()), what + " counterfactual_only"),
                          read_view_points(p.value("decomposition_only", ojson()), what + " decomposition_only")});
  }
  return r;
}

LdsResult read_lds(const EvaluateFile& f, const std::vector<std::string>& methods) {
  const ojson& v = f.j["lds"];
  const std::string what = f.where() + ": lds's";
  LdsResult r;
  r.subsets = json_number<int64_t>(v.value("subsets", ojson(0)), what + " subsets");
  r.fraction = json_number<double>(v.value("fraction", ojson(0.0)), what + " fraction");
  r.subset_size = json_number<int64_t>(v.value("subset_size", ojson(0)), what + " subset_size");
  r.per_test = read_per_method(v, "per_test", methods, std::vector<double>(),
                               [&](const ojson& x) { return numbers_or_nan(x, what + " per_test"); });
  return r;
}

BrittlenessResult read_brittleness(const EvaluateFile& f, const std::vector<std::string>& methods) {
  const ojson& v = f.j["brittleness"];
  const std::string what = f.where() + ": brittleness's";
  BrittlenessResult r;
  r.grid = json_numbers<int64_t>(v.value("grid", ojson::array()), what + " grid");
  r.per_test = read_per_method(v, "per_test", methods, std::vector<std::optional<int64_t>>(), [&](const ojson& x) {
    std::vector<std::optional<int64_t>> ks;
    for (const auto& k : x) ks.push_back(k.is_null() ? std::nullopt : std::optional(json_number<int64_t>(k, what + " k")));
    return ks;
  });
  return r;
}

MislabelResult read_mislabel(const EvaluateFile& f, const std::vector<std::string>& methods) {
  const ojson& v = f.j["mislabel"];
  const std::string what = f.where() + ": mislabel's";
  MislabelResult r;
  r.fraction = json_number<double>(v.value("fraction", ojson(0.0)), what + " fraction");
  r.flipped = json_number<int64_t>(v.value("flipped", ojson(0)), what + " flipped");
  r.candidates = json_numbers<int64_t>(v.value("candidates", ojson::array()), what + " candidates");
  r.flipped_candidates = json_number<int64_t>(v.value("flipped_candidates", ojson(0)), what + " flipped_candidates");
  r.auc = read_per_method(v, "auc", methods, kNaN, [&](const ojson& x) { return number_or_nan(x, what + " auc"); });
  r.self_attribution = read_per_method(v, "self_attribution", methods, std::vector<double>(),
                                       [&](const ojson& x) { return numbers_or_nan(x, what + " self_attribution"); });
  return r;
}

RetrainSummary read_retrain(const EvaluateFile& f) {
  const ojson v = f.j.value("retrain", ojson::object());
  const std::string what = f.where() + ": retrain's";
  RetrainSummary r;
  if (v.contains("baseline_reproduces_run")) r.baseline_reproduces_run = v["baseline_reproduces_run"].get<bool>();
  if (v.contains("baseline_max_abs_diff")) {
    r.baseline_max_abs_diff = number_or_nan(v["baseline_max_abs_diff"], what + " baseline_max_abs_diff");
  }
  r.scaling = v.value("scaling", std::string());
  r.workers = json_number<int64_t>(v.value("workers", ojson(0)), what + " workers");
  r.threads_per_retrain = json_number<int64_t>(v.value("threads_per_retrain", ojson(0)), what + " threads_per_retrain");
  r.retrainings = json_number<int64_t>(v.value("retrainings", ojson(0)), what + " retrainings");
  r.seconds = json_number<double>(v.value("seconds", ojson(0.0)), what + " seconds");
  return r;
}

/// The header, the table and the timings; checks the methods, columns and rows.
void read_summary(const EvaluateFile& f, EvaluateResult& r) {
  const ojson& j = f.j;
  PK_CHECK(j.is_object() && j.contains("methods") && strings(j["methods"]) && !j["methods"].empty() &&
               j.contains("columns") && strings(j["columns"]) && j.contains("table") && j["table"].is_object(),
           f.where() << " has no \"methods\", \"columns\" and \"table\": expected the output of "
                     << "'pathkernel evaluate'");
  r.methods = j["methods"].get<std::vector<std::string>>();
  r.columns = j["columns"].get<std::vector<std::string>>();
  for (const std::string& meth : r.methods) {
    PK_CHECK(j["table"].contains(meth) && j["table"][meth].is_object(),
             f.where() << " lists method '" << meth << "' but its table has no row for it");
    MetricRow row{meth, {}};
    for (const std::string& c : r.columns) {
      const ojson& row_j = j["table"][meth];
      row.values.push_back(row_j.contains(c) ? number_or_nan(row_j[c], f.where() + ": table value " + c) : kNaN);
    }
    r.table.push_back(std::move(row));
  }
  const std::string what = f.where() + ":";
  r.run = j.value("run", std::string());
  r.test_indices = json_numbers<int64_t>(j.value("test_indices", ojson::array()), what + " test_indices");
  r.output = j.value("output", std::string("predicted"));
  r.outputs = json_numbers<int64_t>(j.value("outputs", ojson::array()), what + " outputs");
  if (j.contains("metrics") && strings(j["metrics"])) r.metrics = j["metrics"].get<std::vector<std::string>>();
  if (j.contains("seconds") && j["seconds"].is_object()) {
    for (const auto& [phase, v] : j["seconds"].items()) r.seconds.emplace_back(phase, number_or_nan(v, what + " seconds"));
  }
}

EvaluateFile read_evaluate_json(const std::string& dir) {
  PK_CHECK(fs::is_directory(dir), "evaluate directory '" << dir << "' does not exist: expected the directory "
                                                         << "'pathkernel evaluate' writes (its --out)");
  EvaluateFile f;
  f.path = (fs::path(dir) / "evaluate.json").string();
  PK_CHECK(fs::exists(f.path),
           "evaluate directory '" << dir << "' has no evaluate.json: was it written by 'pathkernel evaluate'?");
  try {
    f.j = ojson::parse(read_file(f.path));
  } catch (const ojson::exception& ex) {
    PK_THROW("'" << f.path << "' is not valid JSON (" << ex.what() << "): was it written by 'pathkernel evaluate'?");
  }
  return f;
}

}  // namespace

double EvaluateResult::value(const std::string& method, const std::string& column) const {
  const auto c = std::find(columns.begin(), columns.end(), column);
  PK_CHECK(c != columns.end(), "evaluate's table has no column '" << column << "'");
  for (const MetricRow& row : table) {
    if (row.method == method) return row.values.at(static_cast<size_t>(c - columns.begin()));
  }
  PK_THROW("evaluate's table has no row for method '" << method << "'");
}

ojson table_json(const EvaluateResult& r) {
  ojson table = ojson::object();
  for (const MetricRow& row : r.table) {
    ojson values = ojson::object();
    for (size_t c = 0; c < r.columns.size(); ++c) values[r.columns[c]] = row.values[c];
    table[row.method] = values;
  }
  return table;
}

ojson retrain_json(const RetrainSummary& s) {
  ojson j = ojson::object();
  if (s.baseline_reproduces_run) j["baseline_reproduces_run"] = *s.baseline_reproduces_run;
  if (s.baseline_max_abs_diff) j["baseline_max_abs_diff"] = *s.baseline_max_abs_diff;
  j["scaling"] = s.scaling;
  j["workers"] = s.workers;
  j["threads_per_retrain"] = s.threads_per_retrain;
  j["retrainings"] = s.retrainings;
  j["seconds"] = s.seconds;
  return j;
}

ojson seconds_json(const EvaluateResult& r) {
  ojson j = ojson::object();
  for (const auto& [phase, s] : r.seconds) j[phase] = s;
  return j;
}

ojson evaluate_json(const EvaluateResult& r) {
  ojson j;
  j["run"] = r.run;
  j["test_indices"] = r.test_indices;
  j["output"] = r.output;
  j["outputs"] = r.outputs;
  j["methods"] = r.methods;
  j["metrics"] = r.metrics;
  if (r.views) j["views"] = views_json(*r.views);
  // A baseline's entry is made when it is retrained, ahead of the metrics.
  const bool baseline = r.retrain.baseline_reproduces_run.has_value();
  if (baseline) j["retrain"] = retrain_json(r.retrain);
  if (r.loo) j["loo"] = loo_json(*r.loo, r.methods);
  if (r.lds) j["lds"] = lds_json(*r.lds, r.methods);
  if (r.brittleness) j["brittleness"] = brittleness_json(*r.brittleness, r.methods);
  if (r.mislabel) j["mislabel"] = mislabel_json(*r.mislabel, r.methods);
  if (!baseline) j["retrain"] = retrain_json(r.retrain);
  j["table"] = table_json(r);
  j["columns"] = r.columns;
  j["seconds"] = seconds_json(r);
  return j;
}

void write_evaluate_directory(const std::string& dir, const EvaluateResult& r,
                              const std::vector<std::pair<std::string, torch::Tensor>>& scores) {
  fs::create_directories(dir);
  for (const auto& [method, s] : scores) write_npy((fs::path(dir) / ("scores_" + method + ".npy")).string(), s);
  write_file_atomic((fs::path(dir) / "evaluate.json").string(), evaluate_json(r).dump(2) + "\n");
}

EvaluateResult read_evaluation(const std::string& dir, const Manifest& m) {
  const EvaluateFile f = read_evaluate_json(dir);
  EvaluateResult r;
  read_summary(f, r);
  r.retrain = read_retrain(f);
  if (f.j.contains("views")) r.views = read_views(f);
  if (f.j.contains("loo")) r.loo = read_loo(f, m, r.methods);
  if (f.j.contains("lds")) r.lds = read_lds(f, r.methods);
  if (f.j.contains("brittleness")) r.brittleness = read_brittleness(f, r.methods);
  if (f.j.contains("mislabel")) r.mislabel = read_mislabel(f, r.methods);
  return r;
}

}  // namespace pathkernel
