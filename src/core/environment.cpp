// Reading the machine's replay environment: CPU, LibTorch's kernels, the BLAS.
#include "pathkernel/environment.h"

#include <dlfcn.h>

#include <fstream>
#include <sstream>

#include <ATen/Version.h>

#include "pathkernel/blas_switch.h"
#include "pathkernel/error.h"
#include "pathkernel/json_number.h"
#include "pathkernel/text.h"
#include "pathkernel/version.h"
#include "openblas_table.h"

namespace pathkernel {

namespace {

constexpr const char* kSpace = " \t\r\n";

/// The first "model name" of /proc/cpuinfo, or "unknown".
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      size_t colon = line.find(':');
      if (colon != std::string::npos) return trim(line.substr(colon + 1), kSpace);
    }
  }
  return "unknown";
}

/// The value after "CPU capability usage:" in LibTorch's configuration text.
std::string torch_cpu_capability() {
  std::istringstream in(at::show_config());
  std::string line;
  const std::string key = "CPU capability usage:";
  while (std::getline(in, line)) {
    size_t at = line.find(key);
    if (at != std::string::npos) return trim(line.substr(at + key.size()), kSpace);
  }
  return "unknown";
}

/// The BLAS that provides dgemm_ in this process: OpenBLAS names itself and
/// the kernels it picked for this CPU; any other names its file.
void blas_of_process(std::string& blas, std::string& kernels) {
  using NameFn = char* (*)();
  auto config = reinterpret_cast<NameFn>(::dlsym(RTLD_DEFAULT, "openblas_get_config"));
  auto core = reinterpret_cast<NameFn>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (config != nullptr) blas = trim(config(), kSpace);
  if (core != nullptr) kernels = trim(core(), kSpace);
  // A mixed table (blas_switch.h) OpenBLAS names "Unknown", in its configuration too: the kernels of all
  // but its float64 routines, the ones a replay calls.
  if (!mixed_float64_kernels().empty()) {
    const std::string unknown = " Unknown ";
    const size_t at = blas.find(unknown);
    if (at != std::string::npos) blas.replace(at, unknown.size(), " " + active_blas_kernels() + " ");
    kernels = active_blas_kernels();
  }
  if (blas.empty()) blas = blas_library_file();
  if (blas.empty()) blas = "unknown";
  if (kernels.empty()) kernels = "unknown";
}

}  // namespace

ReplayEnvironment ReplayEnvironment::current(int64_t threads) {
  ReplayEnvironment e;
  e.cpu = cpu_model();
  e.cpu_capability = torch_cpu_capability();
  blas_of_process(e.blas, e.blas_kernels);
  e.libtorch = libtorch_version();
  e.threads = threads;
  return e;
}

nlohmann::ordered_json ReplayEnvironment::to_json() const {
  nlohmann::ordered_json j{{"cpu", cpu},   {"cpu_capability", cpu_capability}, {"blas", blas},
                           {"blas_kernels", blas_kernels}, {"libtorch", libtorch}, {"threads", threads}};
  if (blas_threads > 0) j["blas_threads"] = blas_threads;
  if (linear_pieces > 0) j["linear_pieces"] = linear_pieces;
  return j;
}

ReplayEnvironment ReplayEnvironment::from_json(const nlohmann::ordered_json& j) {
  PK_CHECK(j.is_object(), "manifest: environment is not an object (" << j.dump() << ")");
  ReplayEnvironment e;
  auto text = [&](const char* key, std::string& out) {
    auto it = j.find(key);
    PK_CHECK(it != j.end() && it->is_string(),
             "manifest: environment." << key << " is missing or not a string"
                                      << (it != j.end() ? " (" + it->dump() + ")" : std::string()));
    out = it->get<std::string>();
  };
  text("cpu", e.cpu);
  text("cpu_capability", e.cpu_capability);
  text("blas", e.blas);
  text("blas_kernels", e.blas_kernels);
  text("libtorch", e.libtorch);
  auto it = j.find("threads");
  PK_CHECK(it != j.end(), "manifest: environment.threads is missing");
  e.threads = json_number<int64_t>(*it, "manifest: environment.threads");
  it = j.find("blas_threads");
  if (it != j.end()) {
    e.blas_threads = json_number<int64_t>(*it, "manifest: environment.blas_threads");
    PK_CHECK(e.blas_threads >= 1 && e.blas_threads <= kMaxRunThreads,
             "manifest: environment.blas_threads is " << e.blas_threads << ", expected 1 to " << kMaxRunThreads);
  }
  it = j.find("linear_pieces");
  if (it != j.end()) {
    e.linear_pieces = json_number<int64_t>(*it, "manifest: environment.linear_pieces");
    PK_CHECK(e.linear_pieces >= 1 && e.linear_pieces <= kMaxRunThreads,
             "manifest: environment.linear_pieces is " << e.linear_pieces << ", expected 1 to " << kMaxRunThreads);
  }
  return e;
}

std::vector<std::string> ReplayEnvironment::differences(const ReplayEnvironment& here) const {
  std::vector<std::string> out;
  if (empty()) return out;
  auto differ = [&](const char* what, const std::string& recorded, const std::string& now) {
    if (recorded != now) out.push_back(std::string(what) + " '" + now + "' (the run recorded '" + recorded + "')");
  };
  differ("CPU", cpu, here.cpu);
  differ("LibTorch CPU kernels", cpu_capability, here.cpu_capability);
  differ("BLAS", blas, here.blas);
  differ("BLAS kernels", blas_kernels, here.blas_kernels);
  differ("LibTorch", libtorch, here.libtorch);
  if (threads != here.threads) {
    out.push_back("threads " + std::to_string(here.threads) + " (the run recorded " + std::to_string(threads) + ")");
  }
  return out;
}

}  // namespace pathkernel
