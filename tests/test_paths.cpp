// The paths of this checkout that the tests run and read: the only test
// object compiled with them (CMakeLists.txt), so a compiler cache shares
// every other test object between clones.
#include <string>

#include "test_paths.h"

#if !defined(PATHKERNEL_BINARY) || !defined(PATHKERNEL_APP_BINARY) || !defined(PATHKERNEL_SOURCE_DIR)
#error "PATHKERNEL_BINARY, PATHKERNEL_APP_BINARY and PATHKERNEL_SOURCE_DIR must be defined (absolute paths, as strings)"
#endif

namespace pathkernel::testing {

const std::string& binary_path() {
  static const std::string path = PATHKERNEL_BINARY;
  return path;
}

const std::string& app_binary_path() {
  static const std::string path = PATHKERNEL_APP_BINARY;
  return path;
}

const std::string& source_dir() {
  static const std::string path = PATHKERNEL_SOURCE_DIR;
  return path;
}

}  // namespace pathkernel::testing
