// Atomic writes report to an installed WriteHook: where it splits a write the
// temporary file holds exactly that much, and the file is complete after;
// a write of several parts is their concatenation.
#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "../test_util.h"
#include "pathkernel/files.h"

namespace pathkernel {
namespace {

struct Recorder : WriteHook {
  std::vector<std::string> calls;
  std::string seen_at_split;
  size_t split(const std::string& path, size_t size) override {
    calls.push_back("split " + std::filesystem::path(path).filename().string() + " " + std::to_string(size));
    return path.find("cut") != std::string::npos ? 3 : size;
  }
  void at_split(const std::string& path) override {
    calls.push_back("at_split");
    // The temporary file beside the target holds the first part; the target is not there yet.
    for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(path).parent_path())) {
      if (e.path().string().find(".tmp.") != std::string::npos) seen_at_split = read_file(e.path().string());
    }
    EXPECT_FALSE(std::filesystem::exists(path));
  }
  void after_rename(const std::string& path) override {
    calls.push_back("after_rename " + read_file(path));
  }
};

TEST(Files, AtomicWritesReportToTheInstalledHook) {
  testing::TempDir dir;
  auto hook = std::make_shared<Recorder>();
  set_write_hook(hook);
  write_file_atomic(dir / "whole.txt", "abcdef");
  write_file_atomic(dir / "cut.txt", "0123456789");
  set_write_hook(nullptr);
  write_file_atomic(dir / "cut2.txt", "xyz");  // no hook: nothing recorded
  EXPECT_EQ(hook->calls, (std::vector<std::string>{"split whole.txt 6", "after_rename abcdef", "split cut.txt 10",
                                                   "at_split", "after_rename 0123456789"}));
  EXPECT_EQ(hook->seen_at_split, "012");
  EXPECT_EQ(read_file(dir / "cut.txt"), "0123456789");
  EXPECT_EQ(read_file(dir / "cut2.txt"), "xyz");
}

TEST(Files, PartsAreWrittenInOrderAndSplitAcrossTheirBoundaries) {
  testing::TempDir dir;
  auto hook = std::make_shared<Recorder>();
  set_write_hook(hook);
  // The hook splits "cut" files after 3 bytes: inside the second part here.
  write_parts_atomic(dir / "cut.txt", {"01", "", "2345", "6789"});
  write_parts_atomic(dir / "whole.txt", {"ab", "cdef"});
  write_parts_atomic(dir / "none.txt", {});
  set_write_hook(nullptr);
  EXPECT_EQ(hook->seen_at_split, "012");
  EXPECT_EQ(read_file(dir / "cut.txt"), "0123456789");
  EXPECT_EQ(read_file(dir / "whole.txt"), "abcdef");
  EXPECT_EQ(read_file(dir / "none.txt"), "");
  EXPECT_EQ(hook->calls, (std::vector<std::string>{"split cut.txt 10", "at_split", "after_rename 0123456789",
                                                   "split whole.txt 6", "after_rename abcdef", "split none.txt 0",
                                                   "after_rename "}));
}

}  // namespace
}  // namespace pathkernel
