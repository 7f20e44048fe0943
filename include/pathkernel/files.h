// Files: atomic writes (write to a temporary name, then rename) and checksums.
//
// Every file pathkernel writes goes through write_file_atomic, so an
// interrupted run never leaves a half-written file under its final name.
#pragma once

#include <cstdint>
#include <string>

namespace pathkernel {

/// Writes `bytes` to `path` atomically: a sibling temporary file is written,
/// flushed and renamed over `path`. Throws Error on any I/O failure.
void write_file_atomic(const std::string& path, const std::string& bytes);

/// Reads a whole file. Throws Error naming the path if it cannot be read.
std::string read_file(const std::string& path);

/// zlib CRC-32 of a byte string.
uint32_t crc32_of(const std::string& bytes);

}  // namespace pathkernel
