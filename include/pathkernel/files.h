// Files: atomic writes (write to a temporary name, then rename) and checksums.
//
// Every file pathkernel writes goes through write_file_atomic, so an
// interrupted run never leaves a half-written file under its final name.
#pragma once

#include <cstdint>
#include <string>

namespace pathkernel {

/// Writes `bytes` to `path` atomically: a sibling temporary file
/// `path.tmp.PID` is written, flushed and renamed over `path`. Throws Error
/// naming `path` and the reason on any I/O failure (disk full, permissions),
/// after removing the temporary file; the previous `path` is then unchanged.
///
/// Test hook: with PATHKERNEL_TEST_PAUSE_IN_WRITE=SUBSTRING[@N] in the
/// environment, the N-th (default first) write whose path contains SUBSTRING
/// stops the process (SIGSTOP) halfway through its temporary file, so a test
/// can kill it in the middle of a write.
void write_file_atomic(const std::string& path, const std::string& bytes);

/// Reads a whole file. Throws Error naming the path if it cannot be read.
std::string read_file(const std::string& path);

/// zlib CRC-32 of a byte string.
uint32_t crc32_of(const std::string& bytes);

}  // namespace pathkernel
