// Version strings.
#include "pathkernel/version.h"

#include <torch/version.h>

namespace pathkernel {

std::string pathkernel_version() { return PATHKERNEL_VERSION; }
std::string libtorch_version() { return TORCH_VERSION; }

}  // namespace pathkernel
