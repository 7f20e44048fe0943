// The execution context: threads, dtype and the BLAS LibTorch calls.
//
// LibTorch defaults to one intra-op thread here; pathkernel uses all cores
// unless told otherwise. Replay of a recorded path must use the thread count
// the path was trained with (LibTorch's reductions split their sums by it,
// and so round by it): OpenMpThreads sets it around each replayed step and
// restores it after.
#pragma once

#include <string>

#include <torch/torch.h>

namespace pathkernel {

/// Number of hardware threads (at least 1).
int hardware_threads();

/// Sets LibTorch's intra-op thread count and, when OpenBLAS is the active
/// BLAS, OpenBLAS's own thread count. n must be >= 1.
void set_threads(int n);

/// LibTorch's current intra-op thread count.
int current_threads();

/// Sets a thread count for the lifetime of the object, then restores it.
class ThreadScope {
 public:
  explicit ThreadScope(int n);
  ~ThreadScope();
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  int previous_;
};

/// Sets OpenBLAS's thread count (one for the whole process) for the lifetime
/// of the object, then restores it; nothing without OpenBLAS. n must be >= 1.
class BlasThreads {
 public:
  explicit BlasThreads(int n);
  ~BlasThreads();
  BlasThreads(const BlasThreads&) = delete;
  BlasThreads& operator=(const BlasThreads&) = delete;

 private:
  int previous_ = 0;
};

/// OpenBLAS's thread count set to n and held there for the lifetime of the
/// object: BlasThreads and OpenMpThreads leave it alone meanwhile (the
/// OpenMP count, a thread's own, they still set). For a replay on a thread
/// of its own (PathReader::set_replay_ahead), whose BLAS must run at the
/// run's count while other threads work. One at a time; n must be >= 1.
class BlasPin {
 public:
  explicit BlasPin(int n);
  ~BlasPin();
  BlasPin(const BlasPin&) = delete;
  BlasPin& operator=(const BlasPin&) = delete;

 private:
  int previous_ = 0;
};

/// Sets the calling thread's OpenMP thread count, the one LibTorch's parallel
/// loops and reductions read, and OpenBLAS's thread count, for the lifetime
/// of the object, then restores both. Cheap enough for every training step
/// replayed or every row differentiated, unlike ThreadScope: LibTorch's
/// set_num_threads also rebuilds a thread pool (new threads) on every call.
/// Without OpenMP or OpenBLAS in the process (another build) it changes
/// what there is. n must be >= 1.
class OpenMpThreads {
 public:
  explicit OpenMpThreads(int n);
  ~OpenMpThreads();
  OpenMpThreads(const OpenMpThreads&) = delete;
  OpenMpThreads& operator=(const OpenMpThreads&) = delete;

 private:
  int previous_openmp_ = 0;
  BlasThreads blas_;
};

/// Which BLAS library serves dgemm_ in this process.
struct BlasInfo {
  std::string library;  ///< path of the shared object providing dgemm_, or "unknown"
  bool optimized;       ///< true for OpenBLAS (or MKL/BLIS); false for reference BLAS
};

BlasInfo active_blas();

/// Prints a warning to stderr when the active BLAS is the slow reference one.
void warn_if_slow_blas();

/// Parses "float64" / "float32" (throws Error otherwise) and back.
torch::Dtype parse_dtype(const std::string& name);
std::string dtype_name(torch::Dtype dtype);

/// Keeps the memory LibTorch frees for its next allocations instead of
/// handing it back to the kernel (glibc's mallopt: no block mapped on its
/// own, no trimming, 256 MiB top pad). By default glibc maps every block above a
/// threshold of its own (128 KiB, rising to at most 32 MiB) and unmaps it on
/// free, and trims the heap's top: each step's large temporaries were then
/// page-faulted in anew, which made the system time as large as the user
/// time. Call once at start-up. Freed large blocks then stay in the heap for
/// reuse: the README CNN's `verify --test 2` peaked at 1.39-1.49 GB against
/// 1.37 GB (docs/measurements.md, "Process overhead").
void keep_freed_memory();

/// Re-executes the program (argv as given) with OMP_WAIT_POLICY=PASSIVE when
/// that variable is unset, and with OPENBLAS_CORETYPE when the user did not
/// set it and pathkernel chooses the kernels (blas_kernels.h); returns only
/// if nothing was to be set or exec fails.
/// LibTorch runs many small OpenMP regions, and by default idle workers
/// spin between them: on a busy 2-core machine that spinning took the cores
/// from the main thread and made a small explain 7x slower. The policy is
/// read when OpenMP starts, before main(), hence the re-exec: a second
/// LibTorch start-up (about 0.35 s of CPU). The `pathkernel` launcher
/// (src/cli/launcher.cpp) sets the variable before the program loads, so this
/// re-executes only a program run directly (pathkernel_app, the benchmark).
void reexec_with_library_environment(int argc, char** argv);

}  // namespace pathkernel
