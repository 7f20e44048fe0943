// The pathkernel benchmark suite: rows, their shared helpers, and the
// results every row reports.
//
// Each row runs in its own process (so that its peak resident memory is its
// own) and writes one JSON object of measurements; the driver (main.cpp)
// gathers them, derives the ratio keys of bench/results.json, prints the
// table and compares each key with its goal.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pathkernel/decomposition.h"
#include "pathkernel/run.h"

namespace pathkernel::bench {

/// Where rows keep their runs and files, and how big they are.
struct BenchConfig {
  std::string work = "bench/work";  ///< run directories and exported files
  std::string source_dir;           ///< the repository (for bench/peers)
  std::string pathkernel;           ///< the pathkernel command, beside this program
  int repeats = 3;                  ///< timings of short measurements: median of this many
  bool quick = false;               ///< tiny sizes, for the suite's own smoke test
  int threads = 1;                  ///< the rows' threads (--threads)
  /// With --part: the one part of a row that runs its parts as processes
  /// of their own (run_parts) that this process runs; −1 for the whole row.
  int part = -1;
};

/// A row: a name, what it measures, and the function measuring it.
struct Row {
  std::string name;
  std::string description;
  std::function<nlohmann::ordered_json(const BenchConfig&)> run;
};

/// Every row, in the order the suite runs them.
const std::vector<Row>& rows();

/// The median of v (the upper one of an even count); v not empty.
double median_of(std::vector<double> v);

/// Median of `repeats` timings of fn (seconds); fn's last result is kept by the caller.
double median_seconds(int repeats, const std::function<void()>& fn);

/// Wall seconds of fn.
double seconds_of(const std::function<void()>& fn);

/// Trains and records the run (replacing options.out) and returns the
/// training seconds (the training loop with its recording, as `train` reports).
double train_seconds(const RunOptions& options);

/// Run options for the suite's runs: float64, log-softmax, seeded, quiet.
RunOptions run_options(const std::string& data, int64_t train_size, const std::string& model,
                       const std::string& optimizer, int64_t steps, int64_t batch, double lr,
                       const std::string& out);

/// Default decomposition options (gauss, no progress bar).
DecompositionOptions quiet_decomposition(const std::string& quadrature = "gauss");

/// Starts the program `args[0]` (this one, or pathkernel) with `args` in a
/// child process with the same environment, its standard output in
/// `stdout_file` if given; `what` names it in the error.
pid_t spawn_process(const std::vector<std::string>& args, const std::string& what,
                    const std::string& stdout_file = "");

/// A finished child process: whether it exited with status 0, its wall
/// seconds, and its peak resident memory (from wait4).
struct ProcessRun {
  bool ok = false;
  double seconds = 0;
  double peak_rss_mb = 0;
};

/// Runs `args` as spawn_process() does and waits for it.
ProcessRun run_process(const std::vector<std::string>& args, const std::string& what,
                       const std::string& stdout_file = "");

/// Runs parts 0 … count − 1 of row `name`, each as a process of its own
/// (this program with --row NAME --part I), in turn, and returns each
/// part's JSON with its process's "seconds" and "peak_rss_mb" added. So a
/// row's peak memory is its largest part's: the real-size row's rounds
/// (in one process the allocator's heap grew from round to round), and
/// the algorithm1 row's baseline apart from pathkernel.
std::vector<nlohmann::ordered_json> run_parts(const BenchConfig& c, const std::string& name, int count);

/// GFLOP/s of float64 n×n matrix products on the current threads: the
/// median of `repeats` (machine.cpp).
double dgemm_gflops(int64_t n, int repeats);

/// The machine row's dgemm GFLOP/s on `threads` threads, for rows that read
/// their arithmetic against the floor (machine.cpp).
double machine_dgemm_gflops(const BenchConfig& c, int threads);

/// OpenBLAS's kernels in this process, where they came from (pathkernel's
/// choice, the environment's OPENBLAS_CORETYPE, or OpenBLAS's own) and the
/// ones pathkernel would choose for this CPU: every row's products run on
/// them, so the results say which (machine.cpp).
struct BlasKernelsInUse {
  std::string kernels, from, best;
  std::string wider;  ///< best where it is not kernels' arithmetic, else ""
  /// "OpenBLAS's Haswell kernels (set by ...; this CPU runs SkylakeX, ...)".
  std::string describe() const;
};
BlasKernelsInUse blas_kernels_in_use();

/// The machine row: dgemm on one thread, two threads and two one-thread
/// processes at once (machine.cpp).
nlohmann::ordered_json row_machine(const BenchConfig& c);

/// max |pred − f| / max(1, |f|) over all entries.
double max_rel_error(const torch::Tensor& pred, const torch::Tensor& f);

}  // namespace pathkernel::bench
