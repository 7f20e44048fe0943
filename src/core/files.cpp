// Atomic file writes and CRC-32 checksums.
#include "pathkernel/files.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "pathkernel/error.h"

namespace pathkernel {

namespace {

/// The hook every atomic write reports to (none by default).
std::shared_ptr<WriteHook>& installed_hook() {
  static std::shared_ptr<WriteHook> hook;
  return hook;
}

/// Writes all of [data, data + size) to fd; returns 0 or the errno.
int write_all(int fd, const char* data, size_t size) {
  size_t written = 0;
  while (written < size) {
    ssize_t n = ::write(fd, data + written, size - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : EIO;
    written += static_cast<size_t>(n);
  }
  return 0;
}

/// Writes bytes [from, to) of the concatenation of `parts` to fd; returns 0
/// or the errno.
int write_range(int fd, const std::vector<std::string_view>& parts, size_t from, size_t to) {
  size_t start = 0;  // of the part in the concatenation
  for (const std::string_view& p : parts) {
    const size_t lo = std::max(from, start), hi = std::min(to, start + p.size());
    if (lo < hi) {
      if (const int err = write_all(fd, p.data() + (lo - start), hi - lo)) return err;
    }
    start += p.size();
  }
  return 0;
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes) {
  write_parts_atomic(path, {std::string_view(bytes)});
}

void write_parts_atomic(const std::string& path, const std::vector<std::string_view>& parts) {
  size_t size = 0;
  for (const std::string_view& p : parts) size += p.size();
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  PK_CHECK(fd >= 0, "cannot write '" << path << "': cannot create its temporary file '" << tmp
                                     << "': " << std::strerror(errno));
  const std::shared_ptr<WriteHook> hook = installed_hook();
  const size_t part = hook ? std::min(hook->split(path, size), size) : size;
  int err = write_range(fd, parts, 0, part);
  if (err == 0 && part < size) {
    ::fsync(fd);
    hook->at_split(path);
    err = write_range(fd, parts, part, size);
  }
  if (err != 0) {
    ::close(fd);
    ::unlink(tmp.c_str());
    PK_THROW("cannot write '" << path << "' (" << size << " bytes): " << std::strerror(err)
                              << "; the previous '" << path << "', if any, is unchanged");
  }
  if (::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    PK_THROW("cannot write '" << path << "': flushing its temporary file failed: " << std::strerror(err)
                              << "; the previous '" << path << "', if any, is unchanged");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    ::unlink(tmp.c_str());
    PK_THROW("cannot rename '" << tmp << "' to '" << path << "': " << std::strerror(err));
  }
  // Make the rename itself durable, so that a reboot keeps the new file.
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  if (hook) hook->after_rename(path);
}

void set_write_hook(std::shared_ptr<WriteHook> hook) { installed_hook() = std::move(hook); }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PK_CHECK(in.good(), "cannot open '" << path << "': " << std::strerror(errno));
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::is_regular_file(path, ec) ? std::filesystem::file_size(path, ec) : 0;
  if (!ec && size > 0) {
    // A regular file is read into a string of its size: one allocation, no
    // copy (a stream's buffer grew by doubling and was copied out again).
    std::string bytes(static_cast<size_t>(size), '\0');
    in.read(bytes.data(), static_cast<std::streamsize>(size));
    PK_CHECK(in.gcount() == static_cast<std::streamsize>(size) && in.peek() == std::char_traits<char>::eof(),
             "cannot read '" << path << "': it changed size while being read");
    return bytes;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  PK_CHECK(!in.bad(), "cannot read '" << path << "'");
  return ss.str();
}

uint32_t crc32_of(const std::string& bytes) { return crc32_update(0, bytes.data(), bytes.size()); }

uint32_t crc32_update(uint32_t crc, const void* data, size_t size) {
  // zlib restarts the CRC for a null buffer, so an empty block is skipped;
  // crc32_z takes the length as z_size_t, so no chunking is needed.
  if (size == 0) return crc;
  return static_cast<uint32_t>(crc32_z(crc, static_cast<const Bytef*>(data), static_cast<z_size_t>(size)));
}

}  // namespace pathkernel
