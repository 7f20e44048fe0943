// Thread control and the BLAS check.
#include "pathkernel/context.h"

#include <dlfcn.h>
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <thread>

#include "pathkernel/blas_kernels.h"
#include "pathkernel/error.h"
#include "pathkernel/process_environment.h"
#include "openblas_table.h"

namespace pathkernel {

namespace {
using SetThreadsFn = void (*)(int);

using GetThreadsFn = int (*)();

SetThreadsFn openblas_set_threads() {
  static SetThreadsFn fn =
      reinterpret_cast<SetThreadsFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  return fn;
}

GetThreadsFn openblas_get_threads() {
  static GetThreadsFn fn = reinterpret_cast<GetThreadsFn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return fn;
}

// libgomp comes with LibTorch; looked up so that another build links without it.
SetThreadsFn openmp_set_threads() {
  static SetThreadsFn fn = reinterpret_cast<SetThreadsFn>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  return fn;
}

GetThreadsFn openmp_get_threads() {
  static GetThreadsFn fn = reinterpret_cast<GetThreadsFn>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
  return fn;
}
}  // namespace

int hardware_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

void set_threads(int n) {
  PK_CHECK(n >= 1, "thread count must be >= 1 (got " << n << ")");
  // LibTorch rebuilds its pthreadpool (new threads) on every call, even for
  // the count it has: ThreadScope around each replayed segment paid that twice.
  if (torch::get_num_threads() != n) torch::set_num_threads(n);
  if (SetThreadsFn fn = openblas_set_threads()) fn(n);
}

int current_threads() { return torch::get_num_threads(); }

ThreadScope::ThreadScope(int n) : previous_(current_threads()) { set_threads(n); }
ThreadScope::~ThreadScope() { set_threads(previous_); }

namespace {
std::atomic<bool> blas_pinned{false};  ///< a BlasPin holds OpenBLAS's count
}  // namespace

BlasPin::BlasPin(int n) {
  PK_CHECK(n >= 1, "thread count must be >= 1 (got " << n << ")");
  PK_ASSERT(!blas_pinned.load());
  if (openblas_get_threads() != nullptr && openblas_set_threads() != nullptr) {
    previous_ = openblas_get_threads()();
    if (previous_ != n) openblas_set_threads()(n);
  }
  blas_pinned = true;
}

BlasPin::~BlasPin() {
  blas_pinned = false;
  if (previous_ > 0 && openblas_get_threads()() != previous_) openblas_set_threads()(previous_);
}

BlasThreads::BlasThreads(int n) {
  PK_CHECK(n >= 1, "thread count must be >= 1 (got " << n << ")");
  if (blas_pinned.load()) return;
  if (openblas_get_threads() != nullptr && openblas_set_threads() != nullptr) {
    previous_ = openblas_get_threads()();
    if (previous_ != n) openblas_set_threads()(n);
  }
}

BlasThreads::~BlasThreads() {
  if (previous_ > 0 && !blas_pinned.load() && openblas_get_threads()() != previous_) openblas_set_threads()(previous_);
}

OpenMpThreads::OpenMpThreads(int n) : blas_(n) {
  // LibTorch sets a thread's OpenMP count to the process's on the thread's
  // first query of it: on a new thread that query must come before ours,
  // or it would undo it.
  (void)torch::get_num_threads();
  if (openmp_get_threads() != nullptr && openmp_set_threads() != nullptr) {
    previous_openmp_ = openmp_get_threads()();
    if (previous_openmp_ != n) openmp_set_threads()(n);
  }
}

OpenMpThreads::~OpenMpThreads() {
  if (previous_openmp_ > 0 && openmp_get_threads()() != previous_openmp_) openmp_set_threads()(previous_openmp_);
}

BlasInfo active_blas() {
  BlasInfo info{"unknown", false};
  const std::string file = blas_library_file();
  if (!file.empty()) {
    char resolved[4096];
    info.library = realpath(file.c_str(), resolved) ? resolved : file;
  }
  const std::string& lib = info.library;
  info.optimized = lib.find("openblas") != std::string::npos ||
                   lib.find("mkl") != std::string::npos || lib.find("blis") != std::string::npos;
  return info;
}

void warn_if_slow_blas() {
  BlasInfo info = active_blas();
  if (!info.optimized) {
    std::fprintf(stderr,
                 "pathkernel: warning: LibTorch is using a slow BLAS (%s), about 30x slower than "
                 "OpenBLAS. Install it with `apt-get install libopenblas0-pthread` (or run "
                 "`make deps`).\n",
                 info.library.c_str());
  }
}

torch::Dtype parse_dtype(const std::string& name) {
  if (name == "float64" || name == "double") return torch::kFloat64;
  if (name == "float32" || name == "float") return torch::kFloat32;
  PK_THROW("unknown dtype '" << name << "': expected float64 or float32");
}

std::string dtype_name(torch::Dtype dtype) {
  if (dtype == torch::kFloat64) return "float64";
  if (dtype == torch::kFloat32) return "float32";
  PK_THROW("unsupported dtype " << dtype << ": expected float64 or float32");
}

void keep_freed_memory() {
  // 32 MiB is the largest mmap threshold glibc accepts on 64-bit; the trim
  // threshold and top pad keep the heap's pages once they have been touched.
  ::mallopt(M_MMAP_THRESHOLD, 32 << 20);
  ::mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  ::mallopt(M_TOP_PAD, 256 << 20);
  // Blocks above the threshold (a CNN's test-feature blocks reach hundreds of
  // MiB) come from the heap too, so their pages stay as well: without it they
  // were mapped and faulted in anew on every step.
  ::mallopt(M_MMAP_MAX, 0);
}

void reexec_with_library_environment(int argc, char** argv) {
  bool changed = choose_blas_kernels(argc, argv);
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    prepare_library_environment();
    changed = true;
  }
  if (changed) ::execv("/proc/self/exe", argv);  // returns only on failure: carry on as we are
}

}  // namespace pathkernel
