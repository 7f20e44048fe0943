// Files: atomic writes (write to a temporary name, then rename) and checksums.
//
// Every file pathkernel writes goes through write_file_atomic, so an
// interrupted run never leaves a half-written file under its final name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace pathkernel {

/// Writes `bytes` to `path` atomically: a sibling temporary file
/// `path.tmp.PID` is written, flushed and renamed over `path`. Throws Error
/// naming `path` and the reason on any I/O failure (disk full, permissions),
/// after removing the temporary file; the previous `path` is then unchanged.
/// With a WriteHook installed, the write reports to it.
void write_file_atomic(const std::string& path, const std::string& bytes);

/// Writes the concatenation of `parts` to `path` atomically, as
/// write_file_atomic does, without joining them first: a large array goes
/// to the file from its own memory, not through a copy of it.
void write_parts_atomic(const std::string& path, const std::vector<std::string_view>& parts);

/// Observes atomic writes, for fault-injection tests (a test stops the
/// process inside a write and kills it there). Not installed by default.
class WriteHook {
 public:
  virtual ~WriteHook() = default;
  /// How many of the `size` bytes of the write to `path` go into its
  /// temporary file before at_split() is called (size: no split).
  virtual size_t split(const std::string& /*path*/, size_t size) { return size; }
  /// The temporary file holds split() bytes, flushed; the rest follows.
  virtual void at_split(const std::string& /*path*/) {}
  /// The write to `path` is complete: renamed into place and made durable.
  virtual void after_rename(const std::string& /*path*/) {}
};

/// Installs `hook` for every later write_file_atomic in the process
/// (nullptr: none). Not thread-safe against concurrent writes.
void set_write_hook(std::shared_ptr<WriteHook> hook);

/// Reads a whole file. Throws Error naming the path if it cannot be read.
std::string read_file(const std::string& path);

/// zlib CRC-32 of a byte string.
uint32_t crc32_of(const std::string& bytes);

/// Extends `crc` (0 to start) by `size` bytes at `data`, read in place:
/// crc32_update(crc32_update(0, a), b) is the CRC of a followed by b.
/// An empty block (data may then be null) leaves `crc` unchanged.
uint32_t crc32_update(uint32_t crc, const void* data, size_t size);

}  // namespace pathkernel
