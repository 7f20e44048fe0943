#include "point_groups.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "pathkernel/context.h"
#include "pathkernel/segment.h"

namespace pathkernel {

int64_t point_workers(const SegmentEvaluator& ev, int64_t n) {
  // The structured TorchScript route runs the module's graph: concurrent
  // runs of it were measured mixed (0.98 and 0.81 of the time on a CNN) and
  // are not made.
  if (!ev.path_route().concurrent_points()) return 1;
  return std::max<int64_t>(1, std::min<int64_t>(current_threads(), n));
}

int64_t point_groups(const SegmentEvaluator& ev, int64_t n, bool factored, int64_t workers) {
  if ((workers > 0 ? std::min(workers, n) : point_workers(ev, n)) <= 1) return 1;
  if (!factored) return n;
  // At least two groups, so that a block of up to 2 * kFactoredGroupPoints
  // points keeps two threads busy (10 points were one group: one thread
  // did their features and contractions while the other waited).
  const int64_t size = std::min(kFactoredGroupPoints, (n + 1) / 2);
  return (n + size - 1) / size;
}

void run_point_groups(int64_t groups, const std::function<void(int64_t)>& work, int64_t workers) {
  if (workers <= 0) workers = groups;
  std::vector<std::exception_ptr> failed(static_cast<size_t>(groups));
  auto one = [&](int64_t g) {
    try {
      GroupThreadScope as_group;
      work(g);
    } catch (...) {
      failed[static_cast<size_t>(g)] = std::current_exception();
    }
  };
  if (workers == 1) {
    for (int64_t g = 0; g < groups; ++g) work(g);  // one worker: the caller, at its own thread count
    return;
  }
  {
    OpenMpThreads single(1);  // OpenBLAS's count is the process's: one for every group
    // The groups are taken in turn by this thread and by tasks on LibTorch's
    // inter-op pool (threads that stay: a new thread costs LibTorch a
    // thread-pool rebuild on its first operation). This thread waits only
    // for groups taken, so a task that never starts (a busy pool, or a call
    // from a pool thread) is no wait: this thread takes its group.
    struct Turns {
      std::atomic<int64_t> next{0};
      std::mutex m;
      std::condition_variable cv;
      int64_t done = 0;
    };
    auto turns = std::make_shared<Turns>();
    auto take = [turns, groups, &one] {
      for (int64_t g; (g = turns->next++) < groups;) {
        one(g);
        std::lock_guard<std::mutex> lock(turns->m);
        if (++turns->done == groups) turns->cv.notify_all();
      }
    };
    for (int64_t t = 1; t < std::min(workers, groups); ++t) at::launch(take);
    take();
    std::unique_lock<std::mutex> lock(turns->m);
    turns->cv.wait(lock, [&] { return turns->done == groups; });
  }
  for (const std::exception_ptr& e : failed) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace pathkernel
