// The operation profile (src/cli/op_profile.cpp): each operation pathkernel
// calls counted once, on its thread, with the operations it runs inside it
// left out; the file written when the profile ends.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>
#include <string>
#include <thread>

#include "../../src/cli/op_profile.h"
#include "../test_util.h"
#include "pathkernel/files.h"

namespace pathkernel::cli {
namespace {

using testing::TempDir;

/// The calls the profile's first table gives `op` on `thread` (0: none listed).
long long calls_of(const std::string& profile, int thread, const std::string& op) {
  std::istringstream in(profile);
  std::string line;
  const std::string key = "thread " + std::to_string(thread) + "  " + op;
  while (std::getline(in, line) && line.rfind("# the same by", 0) != 0) {
    if (line.empty() || line[0] == '#') continue;
    const size_t at = line.find(key);
    if (at == std::string::npos || at + key.size() != line.size()) continue;
    double seconds = 0;
    long long calls = 0;
    std::istringstream(line) >> seconds >> calls;
    return calls;
  }
  return 0;
}

TEST(OpProfile, CountsEachOuterOperationOnItsThread) {
  TempDir dir("op_profile");
  const std::string path = dir / "ops.txt";
  const torch::Tensor a = torch::randn({40, 30}, torch::kFloat64), b = torch::randn({30, 20}, torch::kFloat64);
  {
    OpProfile profile(path);
    for (int i = 0; i < 3; ++i) (void)torch::mm(a, b);
    (void)torch::matmul(a, b);  // runs aten::mm inside: one matmul, no mm more
    (void)torch::cat({a, a});   // a list's shapes in turn
    std::thread other([&] {
      for (int i = 0; i < 2; ++i) (void)torch::mm(a, b);
    });
    other.join();
  }
  const std::string profile = read_file(path);
  EXPECT_EQ(calls_of(profile, 0, "aten::mm"), 3) << profile;
  EXPECT_EQ(calls_of(profile, 0, "aten::matmul"), 1) << profile;
  EXPECT_EQ(calls_of(profile, 1, "aten::mm"), 2) << profile;
  EXPECT_NE(profile.find("aten::mm  [40, 30] [30, 20]"), std::string::npos) << profile;
  EXPECT_NE(profile.find("aten::cat  [40, 30] [40, 30]"), std::string::npos) << profile;
}

/// Products called from a function of the test program's own, not inlined.
[[gnu::noinline]] void multiply_here(const torch::Tensor& a, const torch::Tensor& b, int times) {
  for (int i = 0; i < times; ++i) (void)torch::mm(a, b);
  asm volatile("" ::: "memory");
}

// The profile's last table names the function that called each operation:
// the program's frame past LibTorch's, named by addr2line.
TEST(OpProfile, NamesTheFunctionThatCalledEachOperation) {
  TempDir dir("op_profile");
  const std::string path = dir / "ops.txt";
  const torch::Tensor a = torch::randn({8, 6}, torch::kFloat64), b = torch::randn({6, 4}, torch::kFloat64);
  {
    OpProfile profile(path);
    multiply_here(a, b, 4);
  }
  const std::string profile = read_file(path);
  const size_t table = profile.find("# the same by the pathkernel function that called them");
  ASSERT_NE(table, std::string::npos) << profile;
  std::istringstream in(profile.substr(table));
  std::string line;
  long long calls = -1;
  while (std::getline(in, line)) {
    if (line.find("pathkernel::cli::multiply_here  aten::mm") == std::string::npos) continue;
    double seconds = 0;
    std::istringstream(line) >> seconds >> calls;
  }
  EXPECT_EQ(calls, 4) << profile;
}

TEST(OpProfile, IsOffWithoutItsEnvironmentVariable) {
  ::unsetenv("PATHKERNEL_OP_PROFILE");
  EXPECT_EQ(op_profile_from_environment(), nullptr);
}

}  // namespace
}  // namespace pathkernel::cli
