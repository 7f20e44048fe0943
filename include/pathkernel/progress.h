// A progress bar on stderr for long work: redrawn in place on a terminal,
// a line every 10% otherwise (logs stay short).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace pathkernel {

class ProgressBar {
 public:
  /// total: units of work; label: shown before the bar; enabled: false = silent.
  ProgressBar(int64_t total, std::string label, bool enabled = true);
  ~ProgressBar();
  /// Reports `done` units finished, with a short status such as "loss 0.31".
  void update(int64_t done, const std::string& status = "");
  /// Finishes the bar (prints a newline on a terminal).
  void finish(const std::string& status = "");

 private:
  void draw(int64_t done, const std::string& status, bool force);
  int64_t total_;
  std::string label_;
  bool enabled_, tty_, finished_ = false;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace pathkernel
