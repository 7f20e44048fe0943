// What a replay hands ahead from its own thread to the caller's (steps
// forward, whole checkpoint segments in reverse): a bounded queue, with the
// replay's failure carried across and a way for the caller to stop the
// replay when it leaves early (PathReader::set_replay_ahead).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include <ATen/ThreadLocalState.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/torch.h>

namespace pathkernel {

template <typename T>
class AheadQueue {
 public:
  /// Thrown to the replay's thread by push() once the caller has stopped.
  struct Stopped {};

  explicit AheadQueue(size_t depth) : depth_(depth) {}

  /// The replay's side: waits while `depth` items are waiting, then queues
  /// item; with depth 0, waits until the caller has taken it. Throws
  /// Stopped when the caller has left.
  void push(T&& item) {
    std::unique_lock<std::mutex> lock(m_);
    room_.wait(lock, [&] { return stopped_ || items_.size() < std::max<size_t>(depth_, 1); });
    if (stopped_) throw Stopped{};
    items_.push_back(std::move(item));
    ready_.notify_one();
    if (depth_ == 0) room_.wait(lock, [&] { return stopped_ || items_.empty(); });
  }

  /// The replay's side, last: every item is queued, or the replay failed
  /// with `failure`.
  void finish(std::exception_ptr failure) {
    std::lock_guard<std::mutex> lock(m_);
    finished_ = true;
    failure_ = failure;
    ready_.notify_one();
  }

  /// The caller's side: the next item into *item, false after the last one.
  /// Rethrows the replay's failure once the items before it are taken.
  bool pop(T* item) {
    std::unique_lock<std::mutex> lock(m_);
    ready_.wait(lock, [&] { return finished_ || !items_.empty(); });
    if (items_.empty()) {
      if (failure_) std::rethrow_exception(failure_);
      return false;
    }
    *item = std::move(items_.front());
    items_.pop_front();
    room_.notify_one();
    return true;
  }

  /// The caller's side, when it leaves before the last item: the replay
  /// stops at its next push.
  void stop() {
    std::lock_guard<std::mutex> lock(m_);
    stopped_ = true;
    room_.notify_all();
  }

 private:
  const size_t depth_;
  std::mutex m_;
  std::condition_variable ready_, room_;
  std::deque<T> items_;
  bool finished_ = false, stopped_ = false;
  std::exception_ptr failure_;
};

/// Runs produce(push) on a thread of its own, with the calling thread's
/// thread-local settings, and consume(item) on the
/// calling thread for every item it pushes, in order, at most `depth` of them
/// waiting (0: the producer waits for each item to be taken before it goes
/// on, so at most two are held, one taken and one in the making). The producer's failure is rethrown here after the items before
/// it are consumed; when consume throws, the producer stops at its next push
/// and is joined. Returns the producer's seconds, less those it waited for
/// room.
template <typename T>
double hand_ahead(size_t depth, const std::function<void(const std::function<void(T&&)>&)>& produce,
                  const std::function<void(T&)>& consume) {
  AheadQueue<T> queue(depth);
  double seconds = 0;
  // The caller's thread-local settings, which a new thread would not have:
  // LibTorch's (grad mode and the like) and TorchScript's graph
  // optimisation, which pathkernel turns off so that every call of a module
  // runs the same operations (on, a tanh module's replay lost a bit).
  const at::ThreadLocalState state;
  const bool optimize = torch::jit::getGraphExecutorOptimize();
  std::thread producer([&] {
    const at::ThreadLocalStateGuard same_state(state);
    const torch::jit::GraphOptimizerEnabledGuard same_optimize(optimize);
    const auto t0 = std::chrono::steady_clock::now();
    std::chrono::steady_clock::duration waited{};
    try {
      (void)torch::get_num_threads();  // LibTorch sets a new thread's OpenMP count on its first query
      produce([&](T&& item) {
        const auto w0 = std::chrono::steady_clock::now();
        queue.push(std::move(item));
        waited += std::chrono::steady_clock::now() - w0;
      });
      queue.finish(nullptr);
    } catch (const typename AheadQueue<T>::Stopped&) {
      queue.finish(nullptr);
    } catch (...) {
      queue.finish(std::current_exception());
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0 - waited).count();
  });
  struct Join {  // however consume ends
    AheadQueue<T>& queue;
    std::thread& producer;
    ~Join() {
      queue.stop();
      if (producer.joinable()) producer.join();
    }
  } join{queue, producer};
  for (T item; queue.pop(&item);) consume(item);
  producer.join();  // finished: its seconds are final
  return seconds;
}

}  // namespace pathkernel
