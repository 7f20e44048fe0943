// `pathkernel`, the launcher: sets up what LibTorch's libraries read while they
// load, answers `--help` and `--version` itself, and otherwise replaces itself
// (same process, same pid) with the program, `pathkernel_app` beside it.
//
// Loading LibTorch costs about 0.35 s of CPU before main() (binding some 290
// libraries and registering its operators), and its OpenMP runtime reads
// OMP_WAIT_POLICY only then (and glibc its tunables, OpenBLAS its thread
// timeout: pathkernel/process_environment.h). Setting them here, before the
// program is loaded, spares the program's own re-exec (a second start-up); and the two
// answers that need nothing of LibTorch come without loading it at all. The
// texts are the program's own, captured at build time (cmake/launcher_text.cmake).
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "launcher_text.h"  // kHelp (with kArgv0Marker for argv[0]) and kVersion
#include "pathkernel/blas_kernels.h"
#include "pathkernel/process_environment.h"

namespace {

/// The program's help text as `argv0` would print it.
std::string help_text(const char* argv0) {
  std::string text = kHelp;
  const std::string marker = kArgv0Marker;
  for (size_t at = text.find(marker); at != std::string::npos; at = text.find(marker, at + std::strlen(argv0))) {
    text.replace(at, marker.size(), argv0);
  }
  return text;
}

/// The directory of this executable, with its trailing '/'.
std::string own_directory() {
  char path[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return "./";
  path[n] = '\0';
  const char* slash = std::strrchr(path, '/');
  return std::string(path, slash == nullptr ? 0 : slash - path + 1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::fputs(help_text(argv[0]).c_str(), stdout);
    return 0;
  }
  if (argc == 2 && std::strcmp(argv[1], "--version") == 0) {
    std::fputs(kVersion, stdout);
    return 0;
  }
  pathkernel::prepare_library_environment();
  pathkernel::choose_blas_kernels(argc, argv);
  const std::string program = own_directory() + "pathkernel_app";
  ::execv(program.c_str(), argv);
  std::fprintf(stderr, "pathkernel: error: cannot run %s: %s (it is built beside %s)\n", program.c_str(),
               std::strerror(errno), argv[0]);
  return 127;
}
