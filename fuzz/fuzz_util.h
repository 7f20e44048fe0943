// Shared by the libFuzzer harnesses: a per-process scratch file, for readers
// that take a path, and the rule that only pathkernel::Error may escape.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

namespace pathkernel::fuzz {

/// A scratch path under $TMPDIR (or /tmp), unique to this process.
inline std::string scratch_path(const char* suffix) {
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp && *tmp ? tmp : "/tmp") + "/pathkernel_fuzz_" + std::to_string(::getpid()) +
         suffix;
}

/// Writes the fuzzer's bytes to `path`.
inline void write_bytes(const std::string& path, const uint8_t* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
}

/// A reader accepted input it should not have, or misread it: report it as a
/// crash so libFuzzer saves the input.
[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "pathkernel fuzz: %s\n", what);
  std::abort();
}

/// With PATHKERNEL_FUZZ_VERBOSE set, prints why an input was refused (to
/// check what a seed exercises: `PATHKERNEL_FUZZ_VERBOSE=1 build-fuzz/fuzz_npy FILE`).
inline void refused(const std::exception& e) {
  static const bool verbose = std::getenv("PATHKERNEL_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "refused: %s\n", e.what());
}

}  // namespace pathkernel::fuzz
