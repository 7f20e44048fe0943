// The environment pathkernel sets for the libraries it loads, before they load.
// Header-only and libc-only: the `pathkernel` launcher (src/cli/launcher.cpp)
// uses it without linking LibTorch, and the program itself uses it when it
// re-executes to set it (pathkernel::reexec_with_library_environment).
#pragma once

#include <algorithm>
#include <cstdlib>
#include <string>

namespace pathkernel {

/// The value of GLIBC_TUNABLES with `name=value` appended, unless `current`
/// (the user's value, or null when unset) names that tunable already: a
/// user's choice is kept. Tunables are colon-separated `name=value` pairs.
inline std::string with_tunable(const char* current, const std::string& name, const std::string& value) {
  const std::string user = current != nullptr ? current : "";
  size_t start = 0;
  while (start <= user.size()) {
    const size_t end = std::min(user.find(':', start), user.size());
    if (user.compare(start, name.size() + 1, name + "=") == 0) return user;
    start = end + 1;
  }
  return user.empty() ? name + "=" + value : user + ":" + name + "=" + value;
}

/// Sets, unless the user set them, what the libraries read as they load:
/// - OMP_WAIT_POLICY=PASSIVE: OpenMP's idle threads sleep between LibTorch's
///   many small parallel regions instead of spinning
///   (pathkernel::reexec_with_library_environment says why).
/// - OPENBLAS_THREAD_TIMEOUT=16: OpenBLAS's idle worker sleeps after 2^16
///   cycles (tens of microseconds, enough to bridge back-to-back GEMMs)
///   instead of its default 2^28 (about 0.1 s): a BLAS call every few
///   milliseconds kept it calling sched_yield all run long, a core's worth of
///   system time on an otherwise idle machine (1.6 million calls in the
///   demo's `verify`).
/// - glibc.malloc.hugetlb=1 in GLIBC_TUNABLES: glibc asks for transparent
///   huge pages (madvise) on the memory it takes from the kernel. The test
///   features' large temporaries (a CNN's [K, rows, channels, 28, 28] blocks)
///   were otherwise faulted in 4 KiB at a time: 355,000 minor faults in
///   `verify --test 2` of the README's CNN, against 8,900 with it, and about
///   15% less user time from fewer TLB misses (docs/measurements.md,
///   "Process overhead"). Without transparent huge pages in the kernel it does nothing.
/// - TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD=2^40: tcmalloc, the program's
///   allocator (src/program/allocator.h), would otherwise print a warning with a
///   stack trace for every block of 1 GiB or more, which a large run's test
///   features reach by design.
inline void prepare_library_environment() {
  ::setenv("TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD", "1099511627776", 0);
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
  ::setenv("OPENBLAS_THREAD_TIMEOUT", "16", 0);
  ::setenv("GLIBC_TUNABLES", with_tunable(std::getenv("GLIBC_TUNABLES"), "glibc.malloc.hugetlb", "1").c_str(), 1);
}

}  // namespace pathkernel
