// The decomposing commands' shared options (src/cli/common.cpp): what the
// command line says reaches DecompositionOptions, and bad values are refused
// with the value and what was expected.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../../src/cli/commands.h"

namespace pathkernel::cli {
namespace {

/// `args` parsed by a command that declares the quadrature options.
DecompositionOptions parse(std::vector<std::string> args) {
  CLI::App app("test");
  Globals globals;
  QuadratureArgs q;
  q.add_to(&app, globals);
  args.insert(args.begin(), "test");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  return q.options();
}

TEST(QuadratureArgs, MemoryIsTheTestSidesBudgetInBytes) {
  EXPECT_EQ(parse({}).memory_doubles, DecompositionOptions{}.memory_doubles);
  EXPECT_EQ(parse({}).memory_doubles, int64_t{2} * 1024 * 1024 * 1024 / 8);  // the help's default
  EXPECT_EQ(parse({"--memory", "2MiB"}).memory_doubles, 2 * 1024 * 1024 / 8);
  EXPECT_EQ(parse({"--memory", "3GB"}).memory_doubles, int64_t{3000000000} / 8);
  EXPECT_EQ(parse({"--memory", "64KiB"}).memory_doubles, 64 * 1024 / 8);
  EXPECT_EQ(parse({"--memory", "1048576"}).memory_doubles, 1048576 / 8);
  EXPECT_EQ(parse({"--point-block", "7"}).point_block, 7);
}

TEST(QuadratureArgs, BadMemoryGetsTheValueAndTheRange) {
  try {
    parse({"--memory", "1KiB"});
    ADD_FAILURE() << "1KiB accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("--memory must be between 64KiB and 1PiB (got 1024 bytes)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse({"--memory", "12parsecs"}), CLI::ParseError);
  EXPECT_THROW(parse({"--memory", "-5MiB"}), CLI::ParseError);
}

}  // namespace
}  // namespace pathkernel::cli
