// The machine's own floor, measured before any row: float64 matrix products
// (dgemm) on one thread, on two, and in two one-thread processes at once. The
// rows' costs are read against it: on a machine whose two cores share one
// floating-point unit, a second thread cannot speed up arithmetic, and a
// thread speedup means something only beside the machine's own scaling.
#include <sys/wait.h>

#include <filesystem>
#include <string>
#include <vector>

#include "bench.h"
#include "pathkernel/blas_kernels.h"
#include "pathkernel/blas_switch.h"
#include "pathkernel/context.h"
#include "pathkernel/environment.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"

namespace pathkernel::bench {

using json = nlohmann::ordered_json;

double dgemm_gflops(int64_t n, int repeats) {
  torch::manual_seed(0);
  const torch::Tensor a = torch::randn({n, n}, torch::kFloat64), b = torch::randn({n, n}, torch::kFloat64);
  torch::Tensor c = torch::mm(a, b);  // warm: the kernels' buffers allocated
  const double seconds = median_seconds(repeats, [&] { c = torch::mm(a, b); });
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / seconds / 1e9;
}

BlasKernelsInUse blas_kernels_in_use() {
  BlasKernelsInUse k;
  const CpuFeatures cpu = CpuFeatures::current();
  k.kernels = ReplayEnvironment::current(1).blas_kernels;
  k.best = best_blas_kernels(cpu);
  if (k.best.empty()) k.best = k.kernels;  // no rule for this CPU: OpenBLAS's own choice
  k.wider = wider_blas_kernels(k.kernels, cpu);
  k.from = blas_kernels_chosen_by_pathkernel()             ? "chosen by pathkernel"
           : std::getenv("OPENBLAS_CORETYPE") != nullptr ? "set by OPENBLAS_CORETYPE in the environment"
                                                         : "chosen by OpenBLAS";
  return k;
}

std::string BlasKernelsInUse::describe() const {
  std::string text = "OpenBLAS's " + kernels + " kernels (" + from;
  if (!wider.empty()) text += "; this CPU runs " + wider + ", pathkernel's choice without it";
  return text + ")";
}

namespace {

/// The matrices' size: n x n.
int64_t machine_dgemm_size(const BenchConfig& c) { return c.quick ? 300 : 2000; }

/// GFLOP/s of each of `count` one-thread processes (this program with
/// --dgemm-gflops) started together.
std::vector<double> concurrent_dgemm(const BenchConfig& c, int64_t n, int count) {
  const std::string self = std::filesystem::canonical("/proc/self/exe").string();
  std::vector<pid_t> pids;
  std::vector<std::string> outs;
  for (int i = 0; i < count; ++i) {
    outs.push_back(c.work + "/rows/dgemm_" + std::to_string(i) + ".txt");
    std::filesystem::remove(outs.back());
    std::vector<std::string> args{self,         "--dgemm-gflops", std::to_string(n), "--repeats",
                                  std::to_string(3 * c.repeats), "--row-out",     outs.back(), "--threads", "1"};
    pids.push_back(spawn_process(args, "the machine's concurrent dgemm"));
  }
  std::vector<double> gflops;
  for (size_t i = 0; i < pids.size(); ++i) {
    int status = 0;
    waitpid(pids[i], &status, 0);
    PK_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0 && std::filesystem::exists(outs[i]),
             "the machine's concurrent dgemm process " << i << " failed");
    gflops.push_back(std::stod(read_file(outs[i])));
  }
  return gflops;
}

}  // namespace

double machine_dgemm_gflops(const BenchConfig& c, int threads) {
  ThreadScope scope(threads);
  return dgemm_gflops(machine_dgemm_size(c), 3 * c.repeats);
}

json row_machine(const BenchConfig& c) {
  const int64_t n = machine_dgemm_size(c);
  std::filesystem::create_directories(c.work + "/rows");
  json j;
  // One thread and two in turn, three rounds, and the median of each: a
  // shared machine's speed drifts by 20% between measurements a few seconds
  // apart, and measured once each, one after the other, the two-thread
  // scaling came out anywhere from 1.97 to 2.39.
  std::vector<double> ones, twos;
  for (int round = 0; round < 3; ++round) {
    ones.push_back(machine_dgemm_gflops(c, 1));
    twos.push_back(machine_dgemm_gflops(c, 2));
  }
  const double one = median_of(ones), two = median_of(twos);
  const std::vector<double> both = concurrent_dgemm(c, n, 2);
  const BlasKernelsInUse kernels = blas_kernels_in_use();
  j["setting"] = "float64 " + std::to_string(n) + "x" + std::to_string(n) + " matrix products (torch::mm), median of " +
                 std::to_string(3 * c.repeats) + ", one and two threads in turn, the median of 3 rounds, " +
                 active_blas().library + ", " + kernels.describe();
  j["blas_kernels"] = kernels.kernels;
  j["blas_kernels_from"] = kernels.from;
  j["best_blas_kernels"] = kernels.best;
  j["dgemm_gflops_1_thread_rounds"] = ones;
  j["dgemm_gflops_2_threads_rounds"] = twos;
  j["dgemm_gflops_1_thread"] = one;
  j["dgemm_gflops_2_threads"] = two;
  j["dgemm_gflops_2_processes"] = both;
  j["two_thread_scaling"] = two / one;
  j["two_process_scaling"] = (both[0] + both[1]) / one;
  return j;
}

}  // namespace pathkernel::bench
