// `pathkernel_bench`: the benchmark suite behind `make bench`.
//
// Without --row it is the driver: it runs every row in its own process (this
// program with --row NAME), records each row's wall time and peak resident
// memory, derives the ratio keys, prints one table with each key beside its
// goal and writes bench/results.json (with --rows, a selection of rows:
// bench/work/results-rows.json, unless --out says where). With --row NAME it
// runs that row and writes its JSON to --row-out.
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>

#include <CLI/CLI.hpp>

#include "bench.h"
#include "pathkernel/context.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/text.h"
#include "pathkernel/version.h"
#include "../src/program/allocator.h"

extern char** environ;

namespace pathkernel::bench {
namespace {

using json = nlohmann::ordered_json;

/// A goal: the key, its bound, and whether larger is better.
struct Goal {
  const char* key;
  double bound;
  bool at_least;
};

const std::vector<Goal> kGoals{
    {"speedup_vs_algorithm1", 100, true},
    {"pathkernel_max_rel_error", 1e-12, false},
    {"speedup_vs_pytorch_peer", 100, true},
    {"full_batch_attribution_over_training_10", 1, false},
    {"full_batch_attribution_over_training_100", 2, false},
    {"gauss_evaluations_per_step", 16, false},
    {"path_storage_ratio", 10, true},
    {"replay_over_training", 1.2, false},
    {"gram_structured_speedup", 10, true},
    {"thread_speedup_over_machine_scaling", 0.9, true},
    {"user_cnn_verify_1_over_training", 2, false},
    {"user_cnn_verify_8_over_verify_1", 5, false},
    {"user_cnn_max_rel_error", 1e-12, false},
    {"readme_cnn_seconds_verify_10", 10, false},
    {"readme_cnn_max_rel_error", 1e-12, false},
};

struct RowRun {
  json result;
  double seconds = 0;
  double peak_rss_mb = 0;
  bool ok = false;
};

}  // namespace

pid_t spawn_process(const std::vector<std::string>& args, const std::string& what,
                    const std::string& stdout_file) {
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!stdout_file.empty()) {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, stdout_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  pid_t pid;
  const int failed = posix_spawn(&pid, copy[0].c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  PK_CHECK(failed == 0, "cannot start '" << copy[0] << "' for " << what);
  return pid;
}

ProcessRun run_process(const std::vector<std::string>& args, const std::string& what,
                       const std::string& stdout_file) {
  ProcessRun r;
  int status = 0;
  struct rusage ru {};
  r.seconds = seconds_of([&] { wait4(spawn_process(args, what, stdout_file), &status, 0, &ru); });
  r.ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  r.peak_rss_mb = static_cast<double>(ru.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
  return r;
}

namespace {

/// Runs `self --row name` in a child process; its peak RSS comes from wait4.
RowRun run_row(const std::string& self, const std::string& name, const BenchConfig& c, int threads) {
  const std::string out = c.work + "/rows/" + name + ".json";
  std::filesystem::create_directories(c.work + "/rows");
  std::filesystem::remove(out);
  std::vector<std::string> args{self, "--row", name, "--row-out", out, "--work", c.work, "--repeats",
                                std::to_string(c.repeats), "--threads", std::to_string(threads)};
  if (c.quick) args.push_back("--quick");
  const ProcessRun p = run_process(args, "row " + name);
  RowRun r;
  r.seconds = p.seconds;
  r.peak_rss_mb = p.peak_rss_mb;
  r.ok = p.ok && std::filesystem::exists(out);
  if (r.ok) r.result = json::parse(read_file(out));
  return r;
}

}  // namespace

std::vector<json> run_parts(const BenchConfig& c, const std::string& name, int count) {
  const std::string self = std::filesystem::canonical("/proc/self/exe").string();
  std::filesystem::create_directories(c.work + "/rows");
  std::vector<json> out;
  for (int i = 0; i < count; ++i) {
    const std::string file = c.work + "/rows/" + name + "_part_" + std::to_string(i) + ".json";
    std::filesystem::remove(file);
    std::vector<std::string> args{self,    "--row",     name, "--part", std::to_string(i), "--row-out", file,
                                  "--work", c.work, "--repeats", std::to_string(c.repeats), "--threads",
                                  std::to_string(c.threads)};
    if (c.quick) args.push_back("--quick");
    const ProcessRun p = run_process(args, "part " + std::to_string(i) + " of row " + name);
    PK_CHECK(p.ok && std::filesystem::exists(file),
             "part " << i << " of row " << name << " failed (its process exited with an error or wrote no "
                      << file << ")");
    json j = json::parse(read_file(file));
    j["seconds"] = p.seconds;
    j["peak_rss_mb"] = p.peak_rss_mb;
    out.push_back(std::move(j));
  }
  return out;
}

namespace {

std::string format_value(const json& v) {
  if (!v.is_number()) return v.dump();
  char buf[32];
  double x = v.get<double>();
  std::snprintf(buf, sizeof buf, (std::abs(x) >= 1e-3 && std::abs(x) < 1e5) || x == 0 ? "%.3g" : "%.2e", x);
  return buf;
}

/// The keys of results.json, derived from the rows' measurements.
json derive_keys(const std::map<std::string, RowRun>& runs) {
  json k;
  auto row = [&](const char* name) -> const json* {
    auto it = runs.find(name);
    return it != runs.end() && it->second.ok ? &it->second.result : nullptr;
  };
  if (const json* a = row("algorithm1")) {
    k["speedup_vs_algorithm1"] = (*a)["algorithm1_seconds"].get<double>() / (*a)["pathkernel_seconds"].get<double>();
    k["algorithm1_max_rel_error"] = (*a)["algorithm1_max_rel_error"];
    k["pathkernel_max_rel_error"] = (*a)["pathkernel_max_rel_error"];
    k["algorithm1_row_pathkernel_peak_rss_mb"] = (*a)["pathkernel_peak_rss_mb"];
    k["algorithm1_row_baseline_peak_rss_mb"] = (*a)["algorithm1_peak_rss_mb"];
  }
  if (const json* p = row("pytorch_peer")) {
    k["speedup_vs_pytorch_peer"] = (*p)["peer_seconds"].get<double>() / (*p)["pathkernel_seconds"].get<double>();
    k["pytorch_peer_max_rel_error"] = (*p)["peer_max_rel_error"];
  }
  if (const json* g = row("pytorch_peer_generic")) {
    k["generic_route_speedup_vs_pytorch_peer"] =
        (*g)["peer_seconds"].get<double>() / (*g)["pathkernel_seconds"].get<double>();
    k["generic_route_max_rel_error"] = (*g)["pathkernel_max_rel_error"];
  }
  if (const json* f = row("full_batch")) {
    const double train = (*f)["training_seconds"].get<double>();
    // Each round's attribution over the same round's training, the median
    // of the rounds: a ratio of each side's median paired a slow phase of
    // the machine on one side with a fast one on the other.
    const json& rounds = (*f)["rounds"];
    auto paired = [&rounds](const char* attribution) {
      std::vector<double> ratios;
      for (size_t i = 0; i < rounds["training_seconds"].size(); ++i) {
        ratios.push_back(rounds[attribution][i].get<double>() / rounds["training_seconds"][i].get<double>());
      }
      return median_of(ratios);
    };
    k["full_batch_attribution_over_training_10"] = paired("attribution_seconds_10");
    k["full_batch_attribution_over_training_100"] = paired("attribution_seconds_100");
    k["path_storage_ratio"] = (*f)["every_step_bytes"].get<double>() / (*f)["stored_bytes"].get<double>();
    k["replay_over_training"] = (*f)["replay_seconds"].get<double>() / train;
  }
  if (const json* s = row("real_size")) {
    k["real_size_attribution_over_training_100"] = (*s)["attribution_over_training"];  // paired by round
    k["real_size_peak_rss_mb"] = (*s)["peak_rss_mb_after_attribution"];
    k["real_size_max_rel_error"] = (*s)["max_rel_error"];
  }
  if (const json* q = row("quadrature")) {
    k["gauss_evaluations_per_step"] = (*q)["gauss_evaluations_per_step"];
    k["gauss_max_rel_error"] = (*q)["gauss_max_rel_error"];
    json errors;
    for (const json& r : (*q)["rules"]) errors[r["quadrature"].get<std::string>()] = r["max_rel_error"];
    k["quadrature_max_rel_error"] = errors;
  }
  if (const json* g = row("gram")) {
    k["gram_structured_speedup"] = (*g)["dense_seconds"].get<double>() / (*g)["structured_seconds"].get<double>();
    k["gram_max_rel_difference"] = (*g)["max_rel_difference"];
  }
  if (const json* m = row("machine")) {
    k["machine_dgemm_gflops_1_thread"] = (*m)["dgemm_gflops_1_thread"];
    k["machine_two_thread_scaling"] = (*m)["two_thread_scaling"];
    k["machine_two_process_scaling"] = (*m)["two_process_scaling"];
  }
  if (const json* t = row("threads")) {
    k["thread_speedup"] = (*t)["thread_speedup"];
    if (k.contains("machine_two_thread_scaling")) {
      k["thread_speedup_over_machine_scaling"] =
          (*t)["thread_speedup"].get<double>() / k["machine_two_thread_scaling"].get<double>();
    }
  }
  if (const json* u = row("user_cnn")) {
    k["user_cnn_verify_1_over_training"] = (*u)["verify_1_over_training"];
    k["user_cnn_verify_8_over_verify_1"] = (*u)["verify_8_over_verify_1"];
    k["user_cnn_max_rel_error"] = std::max((*u)["max_rel_error_1"].get<double>(), (*u)["max_rel_error_8"].get<double>());
    k["user_cnn_verify_1_over_floor"] = (*u)["verify_1_over_floor"];
    k["user_cnn_verify_peak_rss_mb"] =
        std::max((*u)["peak_rss_mb_verify_1"].get<double>(), (*u)["peak_rss_mb_verify_8"].get<double>());
  }
  if (const json* r = row("readme_cnn")) {
    k["readme_cnn_seconds_verify_10"] = (*r)["seconds_verify_10"];
    k["readme_cnn_max_rel_error"] = (*r)["max_rel_error"];
    k["readme_cnn_verify_10_over_training"] = (*r)["verify_10_over_training"];
    k["readme_cnn_verify_10_over_floor"] = (*r)["verify_10_over_floor"];
    k["readme_cnn_verify_peak_rss_mb"] = (*r)["peak_rss_mb_verify_10"];
  }
  json scaling;
  for (const char* name : {"scaling_training_points", "scaling_test_points", "scaling_steps"}) {
    if (const json* s = row(name)) scaling[name] = (*s)["growth_exponent"];
  }
  if (!scaling.empty()) k["scaling_growth_exponents"] = scaling;
  return k;
}

std::string machine_line(const json& m) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "%d cores, %s, LibTorch %s, pathkernel %s, %s",
                m["cores"].get<int>(), m["blas"].get<std::string>().c_str(),
                m["libtorch"].get<std::string>().c_str(), m["pathkernel"].get<std::string>().c_str(),
                m["date"].get<std::string>().c_str());
  return buf;
}

void print_table(const json& results) {
  std::printf("\npathkernel benchmarks: %s\n\n", machine_line(results["machine"]).c_str());
  std::printf("%-44s %12s %12s  %s\n", "key", "measured", "goal", "status");
  for (const Goal& g : kGoals) {
    const json& keys = results["keys"];
    std::string value = keys.contains(g.key) ? format_value(keys[g.key]) : "missing";
    std::string goal = std::string(g.at_least ? ">= " : "<= ") + format_value(g.bound);
    std::string status = "missing";
    if (keys.contains(g.key)) {
      double v = keys[g.key].get<double>();
      bool met = g.at_least ? v >= g.bound : v <= g.bound;
      char dist[64];
      std::snprintf(dist, sizeof dist, "missed (%.2gx %s the goal)", g.at_least ? g.bound / v : v / g.bound,
                    g.at_least ? "below" : "above");
      status = met ? "met" : dist;
    }
    std::printf("%-44s %12s %12s  %s\n", g.key, value.c_str(), goal.c_str(), status.c_str());
  }
  const json& keys = results["keys"];
  for (const char* extra : {"machine_dgemm_gflops_1_thread", "machine_two_thread_scaling",
                            "machine_two_process_scaling", "thread_speedup", "algorithm1_max_rel_error",
                            "algorithm1_row_pathkernel_peak_rss_mb", "algorithm1_row_baseline_peak_rss_mb",
                            "pytorch_peer_max_rel_error", "gauss_max_rel_error",
                            "gram_max_rel_difference", "generic_route_speedup_vs_pytorch_peer",
                            "generic_route_max_rel_error", "real_size_attribution_over_training_100",
                            "real_size_peak_rss_mb", "real_size_max_rel_error", "user_cnn_verify_1_over_floor",
                            "user_cnn_verify_peak_rss_mb", "readme_cnn_verify_10_over_training",
                            "readme_cnn_verify_10_over_floor", "readme_cnn_verify_peak_rss_mb"}) {
    if (keys.contains(extra)) std::printf("%-44s %12s\n", extra, format_value(keys[extra]).c_str());
  }
  if (keys.contains("quadrature_max_rel_error")) {
    std::printf("\nquadrature on the MNIST CNN, max relative error against the network:\n");
    for (auto& [q, e] : keys["quadrature_max_rel_error"].items()) {
      std::printf("  %-12s %s\n", q.c_str(), format_value(e).c_str());
    }
  }
  std::printf("\n%-26s %10s %12s  %s\n", "row", "seconds", "peak_rss_mb", "setting");
  for (const json& r : results["rows"]) {
    std::printf("%-26s %10.1f %12.0f  %s\n", r["name"].get<std::string>().c_str(), r["seconds"].get<double>(),
                r["peak_rss_mb"].get<double>(),
                r.contains("setting") ? r["setting"].get<std::string>().c_str() : "(failed)");
    if (r.contains("points")) {
      for (const json& p : r["points"]) {
        std::printf("%-26s %10.2f %12s  M=%lld, n=%lld, steps=%lld\n", "", p["seconds"].get<double>(), "",
                    static_cast<long long>(p["training_points"].get<int64_t>()),
                    static_cast<long long>(p["test_points"].get<int64_t>()),
                    static_cast<long long>(p["steps"].get<int64_t>()));
      }
    }
  }
}

std::string today() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

int drive(const std::string& self, const BenchConfig& c, const std::vector<std::string>& only,
          const std::string& out_path, int threads) {
  json machine{{"cores", hardware_threads()},
               {"threads", threads},
               {"blas", active_blas().library},
               {"blas_optimized", active_blas().optimized},
               {"libtorch", libtorch_version()},
               {"pathkernel", pathkernel_version()},
               {"date", today()},
               {"quick", c.quick}};
  std::printf("pathkernel benchmarks: %s\n", machine_line(machine).c_str());
  std::map<std::string, RowRun> runs;
  json rows_json = json::array();
  int index = 0, failed = 0;
  const auto& all = rows();
  for (const Row& row : all) {
    ++index;
    if (!only.empty() && std::find(only.begin(), only.end(), row.name) == only.end()) continue;
    std::printf("[%d/%zu] %-24s %s ...\n", index, all.size(), row.name.c_str(), row.description.c_str());
    std::fflush(stdout);
    RowRun r = run_row(self, row.name, c, threads);
    std::printf("        %s in %.1f s, peak RSS %.0f MB\n", r.ok ? "done" : "FAILED", r.seconds, r.peak_rss_mb);
    std::fflush(stdout);
    failed += r.ok ? 0 : 1;
    json j{{"name", row.name}, {"seconds", r.seconds}, {"peak_rss_mb", r.peak_rss_mb}, {"ok", r.ok}};
    if (r.ok) j.update(r.result);
    rows_json.push_back(j);
    runs[row.name] = std::move(r);
  }
  json goals;
  for (const Goal& g : kGoals) goals[g.key] = std::string(g.at_least ? ">= " : "<= ") + format_value(g.bound);
  json keys = derive_keys(runs);
  json results{{"machine", machine}, {"command", "make bench"}, {"keys", keys}, {"goals", goals}, {"rows", rows_json}};
  // The keys also stand at the top level, so results["speedup_vs_algorithm1"] works.
  for (auto& [k, v] : keys.items()) results[k] = v;
  std::filesystem::create_directories(std::filesystem::path(out_path).parent_path());
  write_file_atomic(out_path, results.dump(2) + "\n");
  print_table(results);
  std::printf("\nwrote %s\n", out_path.c_str());
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace pathkernel::bench

int main(int argc, char** argv) {
  using namespace pathkernel;
  using namespace pathkernel::bench;
  reexec_with_library_environment(argc, argv);
  // The program's allocator, set up as the program sets it up: each row's
  // time and peak memory are the library's as users run it.
  program::set_up_allocator();
  CLI::App app{"pathkernel's benchmark suite: every ratio measured side by side in one run"};
  BenchConfig c;
  c.source_dir = PATHKERNEL_SOURCE_DIR;
  c.pathkernel = (std::filesystem::canonical("/proc/self/exe").parent_path() / "pathkernel").string();
  std::string row, row_out, out = std::string(PATHKERNEL_SOURCE_DIR) + "/bench/results.json", only;
  int threads = 0;
  c.work = std::string(PATHKERNEL_SOURCE_DIR) + "/bench/work";
  app.add_option("--out", out,
                 "Where to write the results JSON (with --rows: default WORK/results-rows.json, so that some "
                 "rows do not replace the whole suite's results)")
      ->capture_default_str();
  app.add_option("--work", c.work, "Directory for the runs the rows train")->capture_default_str();
  app.add_option("--rows", only, "Comma-separated rows to run (default: all)");
  app.add_option("--repeats", c.repeats, "Timings of short measurements: the median of this many")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--threads", threads, "Threads (default: all cores)")->check(CLI::Range(0, 1024));
  app.add_flag("--quick", c.quick, "Tiny sizes: a smoke test of the suite, not a measurement");
  app.add_option("--row", row, "Run one row in this process (used by the driver)");
  app.add_option("--row-out", row_out, "Where --row (or --dgemm-gflops) writes its result");
  app.add_option("--part", c.part,
                 "With --row: run only this part of a row whose parts run as processes of their own (used by the "
                 "row)")
      ->check(CLI::Range(0, 100));
  int64_t dgemm_size = 0;
  app.add_option("--dgemm-gflops", dgemm_size,
                 "Measure float64 NxN matrix products alone and write the GFLOP/s to --row-out (used by the "
                 "machine row)")
      ->check(CLI::Range(int64_t{1}, int64_t{20000}));
  CLI11_PARSE(app, argc, argv);
  try {
    if (threads == 0) threads = hardware_threads();
    set_threads(threads);
    c.threads = threads;
    if (row.empty() && dgemm_size == 0) std::printf("BLAS: %s\n", blas_kernels_in_use().describe().c_str());
    PK_CHECK(c.part < 0 || !row.empty(), "--part " << c.part << " needs --row, the row whose part it is");
    if (dgemm_size > 0) {
      PK_CHECK(!row_out.empty(), "--dgemm-gflops needs --row-out, the file its GFLOP/s are written to");
      write_file_atomic(row_out, std::to_string(dgemm_gflops(dgemm_size, c.repeats)) + "\n");
      return 0;
    }
    if (!row.empty()) {
      for (const Row& r : rows()) {
        if (r.name != row) continue;
        nlohmann::ordered_json j = r.run(c);
        write_file_atomic(row_out, j.dump(2));
        return 0;
      }
      std::string names;
      for (const Row& r : rows()) names += (names.empty() ? "" : ", ") + r.name;
      throw Error("unknown row '" + row + "'; rows are: " + names);
    }
    std::vector<std::string> selected = only.empty() ? std::vector<std::string>{} : split(only, ',');
    for (const auto& s : selected) {
      bool known = false;
      for (const Row& r : rows()) known |= r.name == s;
      PK_CHECK(known, "unknown row '" << s << "' in --rows");
    }
    // Some rows alone do not replace the full suite's bench/results.json.
    if (!selected.empty() && app.count("--out") == 0) out = c.work + "/results-rows.json";
    return drive(std::filesystem::canonical("/proc/self/exe").string(), c, selected, out, threads);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pathkernel_bench: %s\n", e.what());
    return 1;
  }
}
