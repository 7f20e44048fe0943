// Tests of the environment set for the libraries pathkernel loads: the user's
// GLIBC_TUNABLES are kept, and the huge-page tunable is added only when the
// user has not chosen it.
#include "pathkernel/process_environment.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "../test_util.h"

namespace pathkernel {
namespace {

using testing::ScopedEnv;

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

TEST(ProcessEnvironment, SetsWhatTheLibrariesReadAndKeepsTheUsersChoices) {
  {
    ScopedEnv wait("OMP_WAIT_POLICY", nullptr), timeout("OPENBLAS_THREAD_TIMEOUT", nullptr),
        tunables("GLIBC_TUNABLES", nullptr);
    prepare_library_environment();
    EXPECT_STREQ(std::getenv("OMP_WAIT_POLICY"), "PASSIVE");
    EXPECT_STREQ(std::getenv("OPENBLAS_THREAD_TIMEOUT"), "16");
    EXPECT_STREQ(std::getenv("GLIBC_TUNABLES"), "glibc.malloc.hugetlb=1");
  }
  {
    ScopedEnv wait("OMP_WAIT_POLICY", "ACTIVE"), timeout("OPENBLAS_THREAD_TIMEOUT", "4"),
        tunables("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0");
    prepare_library_environment();
    EXPECT_STREQ(std::getenv("OMP_WAIT_POLICY"), "ACTIVE");
    EXPECT_STREQ(std::getenv("OPENBLAS_THREAD_TIMEOUT"), "4");
    EXPECT_STREQ(std::getenv("GLIBC_TUNABLES"), "glibc.malloc.hugetlb=0");
  }
}

}  // namespace
}  // namespace pathkernel
