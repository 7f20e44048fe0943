// The stderr progress bar.
#include "pathkernel/progress.h"

#include <unistd.h>

#include <cstdio>

namespace pathkernel {

ProgressBar::ProgressBar(int64_t total, std::string label, bool enabled)
    : total_(total < 1 ? 1 : total),
      label_(std::move(label)),
      enabled_(enabled),
      tty_(::isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

ProgressBar::~ProgressBar() {
  if (enabled_ && tty_ && !finished_) std::fputc('\n', stderr);
}

void ProgressBar::update(int64_t done, const std::string& status) { draw(done, status, false); }

void ProgressBar::finish(const std::string& status) {
  if (finished_) return;
  draw(total_, status, true);
  if (enabled_ && tty_) std::fputc('\n', stderr);
  finished_ = true;
}

void ProgressBar::draw(int64_t done, const std::string& status, bool force) {
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  double elapsed = std::chrono::duration<double>(now - start_).count();
  double frac = static_cast<double>(done) / static_cast<double>(total_);
  if (frac > 1) frac = 1;
  if (tty_) {
    if (!force && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    const int width = 30;
    int filled = static_cast<int>(frac * width);
    std::string bar(filled, '#');
    bar.append(width - filled, '.');
    double eta = frac > 0 ? elapsed * (1 - frac) / frac : 0;
    std::fprintf(stderr, "\r%s [%s] %3d%% %lld/%lld %.1fs eta %.1fs %s\033[K", label_.c_str(),
                 bar.c_str(), static_cast<int>(frac * 100), static_cast<long long>(done),
                 static_cast<long long>(total_), elapsed, eta, status.c_str());
    std::fflush(stderr);
  } else {
    int decile = static_cast<int>(frac * 10);
    if (decile == last_decile_ && !force) return;
    if (decile == last_decile_ && force && decile == 10) return;
    last_decile_ = decile;
    std::fprintf(stderr, "%s %3d%% %lld/%lld %.1fs %s\n", label_.c_str(), decile * 10,
                 static_cast<long long>(done), static_cast<long long>(total_), elapsed, status.c_str());
  }
}

}  // namespace pathkernel
