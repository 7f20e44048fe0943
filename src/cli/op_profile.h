// Where a command's time goes, operation by operation: LibTorch's
// operations timed on every thread, for the developers' profiles
// (BENCHMARKS.md), switched on by an environment variable.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace pathkernel::cli {

/// While it lives, times every LibTorch operation the process runs (through
/// LibTorch's RecordFunction callbacks); at its end writes to `path` (atomically), per
/// thread, the operations called from outside any other operation (pathkernel's
/// own calls): their calls and seconds, those of the costliest operations
/// by their inputs' shapes, and those by the pathkernel function that
/// called them (op_callers.h), over the threads. Threads are numbered in the order
/// they first run an operation (0: the program's own). Its overhead, a few
/// microseconds an operation, counts in the times.
class OpProfile {
 public:
  explicit OpProfile(std::string path);
  ~OpProfile();
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;

  struct Tally;

 private:
  std::string path_;
  std::unique_ptr<Tally> tally_;
  uint64_t handle_ = 0;
};

/// An OpProfile writing to PATHKERNEL_OP_PROFILE's path when that is set;
/// none otherwise.
std::unique_ptr<OpProfile> op_profile_from_environment();

}  // namespace pathkernel::cli
