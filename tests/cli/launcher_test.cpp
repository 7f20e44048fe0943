// The launcher (src/cli/launcher.cpp): its --help and --version are the
// program's own, and the program it runs sees OMP_WAIT_POLICY set before
// LibTorch's OpenMP runtime starts.
#include <gtest/gtest.h>

#include <string>

#include "../test_util.h"

namespace pathkernel {
namespace {

using testing::run_shell;

/// `text` with every `from` replaced by `to`.
std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

TEST(Launcher, HelpAndVersionAreTheProgramsOwn) {
  for (const char* flag : {"--help", "-h", "--version"}) {
    const testing::CommandOutput launcher = run_shell(pathkernel::testing::binary_path() + " " + flag);
    const testing::CommandOutput app = run_shell(pathkernel::testing::app_binary_path() + " " + flag);
    ASSERT_EQ(launcher.status, 0) << flag << "\n" << launcher.out;
    ASSERT_EQ(app.status, 0) << flag << "\n" << app.out;
    // The usage line names the program as it was called.
    EXPECT_EQ(launcher.out, replace_all(app.out, pathkernel::testing::app_binary_path(), pathkernel::testing::binary_path())) << flag;
  }
  EXPECT_CONTAINS(run_shell(pathkernel::testing::binary_path() + " --help").out,
                  "Usage: " + pathkernel::testing::binary_path() + " [OPTIONS] SUBCOMMAND");
}

TEST(Launcher, EverythingElseRunsTheProgram) {
  // A subcommand's help, an argument error and a missing subcommand: the
  // program's answers and exit codes, through the launcher.
  for (const char* args : {"train --help", "--threads 0 info x", "", "--help --json", "frobnicate"}) {
    const testing::CommandOutput launcher = run_shell(pathkernel::testing::binary_path() + " " + args);
    const testing::CommandOutput app = run_shell(pathkernel::testing::app_binary_path() + " " + args);
    EXPECT_EQ(launcher.status, app.status) << args << "\n" << launcher.out;
    EXPECT_EQ(launcher.out, replace_all(app.out, pathkernel::testing::app_binary_path(), pathkernel::testing::binary_path())) << args;
  }
}

TEST(Launcher, OpenMpStartsPassiveOnceUnlessTheUserChose) {
  // libgomp prints its settings as it starts, when OMP_DISPLAY_ENV is set;
  // a spin count of 0 is what OMP_WAIT_POLICY=PASSIVE gives (unset: 300000).
  const std::string env = "env -u OMP_WAIT_POLICY OMP_DISPLAY_ENV=VERBOSE ";
  const std::string passive = run_shell(env + pathkernel::testing::binary_path() + " info /nonexistent").out;
  EXPECT_CONTAINS(passive, "GOMP_SPINCOUNT = '0'");
  // Started once: the program did not have to re-execute itself.
  EXPECT_EQ(passive.find("GOMP_SPINCOUNT"), passive.rfind("GOMP_SPINCOUNT")) << passive;
  const std::string chosen = run_shell(env + "OMP_WAIT_POLICY=ACTIVE " + pathkernel::testing::binary_path() + " info /nonexistent").out;
  EXPECT_CONTAINS(chosen, "OMP_WAIT_POLICY = 'ACTIVE'");
}

}  // namespace
}  // namespace pathkernel
