// The fault-injection hook of the resume tests, installed by main() in builds
// with PATHKERNEL_TEST_HOOKS: PATHKERNEL_TEST_PAUSE_IN_WRITE=SUBSTRING[@N][:after]
// stops the process (SIGSTOP) in the N-th (default first) atomic write whose
// target path contains SUBSTRING: when half of the temporary file is written
// and before the rename, or with ":after" once the rename is done (between
// writes). The test then kills it there with SIGKILL.
#include <csignal>
#include <cstdlib>
#include <memory>
#include <string>

#include "commands.h"
#include "pathkernel/files.h"

namespace pathkernel::cli {

namespace {

class PauseInWrite : public WriteHook {
 public:
  explicit PauseInWrite(std::string spec) : pattern_(std::move(spec)) {
    const std::string after = ":after";
    if (pattern_.size() > after.size() &&
        pattern_.compare(pattern_.size() - after.size(), after.size(), after) == 0) {
      after_rename_ = true;
      pattern_.resize(pattern_.size() - after.size());
    }
    const size_t at = pattern_.rfind('@');
    if (at != std::string::npos) {
      wanted_ = std::strtol(pattern_.c_str() + at + 1, nullptr, 10);
      pattern_.resize(at);
    }
  }

  size_t split(const std::string& path, size_t size) override {
    stop_here_ = path.find(pattern_) != std::string::npos && ++matches_ == wanted_;
    return stop_here_ && !after_rename_ ? size / 2 : size;
  }
  void at_split(const std::string&) override { std::raise(SIGSTOP); }
  void after_rename(const std::string&) override {
    if (stop_here_ && after_rename_) std::raise(SIGSTOP);
  }

 private:
  std::string pattern_;
  bool after_rename_ = false;
  long wanted_ = 1;
  long matches_ = 0;
  bool stop_here_ = false;
};

}  // namespace

void install_test_write_hook() {
  const char* spec = std::getenv("PATHKERNEL_TEST_PAUSE_IN_WRITE");
  if (spec != nullptr && *spec != '\0') set_write_hook(std::make_shared<PauseInWrite>(spec));
}

}  // namespace pathkernel::cli
