// Version strings recorded in every run manifest.
#pragma once

#include <string>

namespace pathkernel {

std::string pathkernel_version();  ///< e.g. "0.1.0"
std::string libtorch_version();    ///< e.g. "1.13.0"

}  // namespace pathkernel
