// The paths of this checkout that the tests run and read.
#pragma once

#include <string>

namespace pathkernel::testing {

/// The launcher users run (build/pathkernel), the program it starts
/// (build/pathkernel_app) and the source tree, as absolute paths. Defined in
/// test_paths.cpp, the one test object that holds this checkout's paths, so
/// that every other test object is the same in any clone and a compiler
/// cache can share it.
const std::string& binary_path();
const std::string& app_binary_path();
const std::string& source_dir();

}  // namespace pathkernel::testing
