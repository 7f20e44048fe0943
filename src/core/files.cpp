// Atomic file writes and CRC-32 checksums.
#include "pathkernel/files.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <csignal>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "pathkernel/error.h"

namespace pathkernel {

namespace {

/// Where the test hook stops a write.
enum class Pause { None, HalfWritten, AfterRename };

/// Test hook: PATHKERNEL_TEST_PAUSE_IN_WRITE=SUBSTRING[@N][:after] stops the
/// process (SIGSTOP) in the N-th (default first) atomic write whose target
/// path contains SUBSTRING: when half of the temporary file is written and
/// before the rename, or with ":after" once the rename is done (between
/// writes). A test then kills it there with SIGKILL.
Pause pause_here(const std::string& path) {
  static const char* spec = std::getenv("PATHKERNEL_TEST_PAUSE_IN_WRITE");
  static long matches = 0;
  if (spec == nullptr || *spec == '\0') return Pause::None;
  std::string pattern = spec;
  Pause where = Pause::HalfWritten;
  const std::string after = ":after";
  if (pattern.size() > after.size() && pattern.compare(pattern.size() - after.size(), after.size(), after) == 0) {
    where = Pause::AfterRename;
    pattern.resize(pattern.size() - after.size());
  }
  long wanted = 1;
  size_t at = pattern.rfind('@');
  if (at != std::string::npos) {
    wanted = std::strtol(pattern.c_str() + at + 1, nullptr, 10);
    pattern.resize(at);
  }
  if (path.find(pattern) == std::string::npos) return Pause::None;
  return ++matches == wanted ? where : Pause::None;
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

}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  PK_CHECK(fd >= 0, "cannot write '" << path << "': cannot create its temporary file '" << tmp
                                     << "': " << std::strerror(errno));
  const Pause pause = pause_here(path);
  size_t half = pause == Pause::HalfWritten ? bytes.size() / 2 : bytes.size();
  int err = write_all(fd, bytes.data(), half);
  if (err == 0 && half < bytes.size()) {
    ::fsync(fd);
    std::raise(SIGSTOP);
    err = write_all(fd, bytes.data() + half, bytes.size() - half);
  }
  if (err != 0) {
    ::close(fd);
    ::unlink(tmp.c_str());
    PK_THROW("cannot write '" << path << "' (" << bytes.size() << " bytes): " << std::strerror(err)
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
  if (pause == Pause::AfterRename) std::raise(SIGSTOP);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  PK_CHECK(in.good(), "cannot open '" << path << "': " << std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  PK_CHECK(!in.bad(), "cannot read '" << path << "'");
  return ss.str();
}

uint32_t crc32_of(const std::string& bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* data = reinterpret_cast<const Bytef*>(bytes.data());
  size_t left = bytes.size();
  while (left > 0) {  // zlib takes uInt lengths
    uInt chunk = static_cast<uInt>(std::min<size_t>(left, 1u << 30));
    crc = crc32(crc, data, chunk);
    data += chunk;
    left -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

}  // namespace pathkernel
