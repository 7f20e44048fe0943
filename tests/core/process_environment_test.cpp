// Tests of the environment set for the libraries pathkernel loads: the user's
// GLIBC_TUNABLES are kept, and the huge-page tunable is added only when the
// user has not chosen it.
#include "pathkernel/process_environment.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace pathkernel {
namespace {

TEST(ProcessEnvironment, AddsATunableUnlessTheUserNamedIt) {
  EXPECT_EQ(with_tunable(nullptr, "glibc.malloc.hugetlb", "1"), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(with_tunable("", "glibc.malloc.hugetlb", "1"), "glibc.malloc.hugetlb=1");
  EXPECT_EQ(with_tunable("glibc.malloc.arena_max=2", "glibc.malloc.hugetlb", "1"),
            "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1");
  // The user's own value wins, wherever it stands in the list.
  EXPECT_EQ(with_tunable("glibc.malloc.hugetlb=0", "glibc.malloc.hugetlb", "1"), "glibc.malloc.hugetlb=0");
  EXPECT_EQ(with_tunable("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0", "glibc.malloc.hugetlb", "1"),
            "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0");
  // A name that only begins like the tunable's, or holds it as a value, is another one.
  EXPECT_EQ(with_tunable("glibc.malloc.hugetlbx=0", "glibc.malloc.hugetlb", "1"),
            "glibc.malloc.hugetlbx=0:glibc.malloc.hugetlb=1");
  EXPECT_EQ(with_tunable("x.y=glibc.malloc.hugetlb=0", "glibc.malloc.hugetlb", "1"),
            "x.y=glibc.malloc.hugetlb=0:glibc.malloc.hugetlb=1");
}

/// Sets (or unsets) variables for one test and restores them after it.
class ScopedEnvironment {
 public:
  explicit ScopedEnvironment(std::initializer_list<std::pair<const char*, const char*>> values) {
    for (const auto& [name, value] : values) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old != nullptr ? std::optional<std::string>(old) : std::nullopt);
      value != nullptr ? ::setenv(name, value, 1) : ::unsetenv(name);
    }
  }
  ~ScopedEnvironment() {
    for (const auto& [name, old] : saved_) old ? ::setenv(name.c_str(), old->c_str(), 1) : ::unsetenv(name.c_str());
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST(ProcessEnvironment, SetsWhatTheLibrariesReadAndKeepsTheUsersChoices) {
  {
    ScopedEnvironment env({{"OMP_WAIT_POLICY", nullptr}, {"OPENBLAS_THREAD_TIMEOUT", nullptr}, {"GLIBC_TUNABLES", nullptr}});
    prepare_library_environment();
    EXPECT_STREQ(std::getenv("OMP_WAIT_POLICY"), "PASSIVE");
    EXPECT_STREQ(std::getenv("OPENBLAS_THREAD_TIMEOUT"), "16");
    EXPECT_STREQ(std::getenv("GLIBC_TUNABLES"), "glibc.malloc.hugetlb=1");
  }
  {
    ScopedEnvironment env({{"OMP_WAIT_POLICY", "ACTIVE"},
                           {"OPENBLAS_THREAD_TIMEOUT", "4"},
                           {"GLIBC_TUNABLES", "glibc.malloc.hugetlb=0"}});
    prepare_library_environment();
    EXPECT_STREQ(std::getenv("OMP_WAIT_POLICY"), "ACTIVE");
    EXPECT_STREQ(std::getenv("OPENBLAS_THREAD_TIMEOUT"), "4");
    EXPECT_STREQ(std::getenv("GLIBC_TUNABLES"), "glibc.malloc.hugetlb=0");
  }
}

}  // namespace
}  // namespace pathkernel
