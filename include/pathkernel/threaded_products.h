// OpenBLAS's matrix products on several threads, added as they are there,
// on one thread: a replay on one thread beside the engine's work for a loop
// whose OpenBLAS ran on several.
//
// A Python loop runs OpenBLAS on every core unless it is told otherwise
// (torch.set_num_threads leaves OpenBLAS's count), and a run is replayed
// bit for bit only as it was trained. OpenBLAS's threaded driver cuts a
// product otherwise than its one-thread driver: the rows into one range a
// thread, the inner dimension k into halves where its one-thread driver
// rounds them to its unroll, and the columns into buffers whose widths its
// kernels' sums can depend on. LeNet-5's first Linear layer (k = 400, Q =
// 320 on Cooperlake's kernels) adds as 200 + 200 on two threads and as
// 208 + 192 on one; on Haswell's and Zen's kernels, and in float64 on any,
// the rows at the end of each thread's range add otherwise too.
//
// While a ThreadedProductsOnOneThread lives, this thread's float32 and
// float64 matrix products (sgemm_ and dgemm_, the routines LibTorch calls,
// which pathkernel's own definitions forward to OpenBLAS's) that OpenBLAS
// at `threads` threads would run on its threaded driver are run by that
// driver's steps on this one thread: OpenBLAS 0.3.21's
// driver/level3/level3_thread.c followed step by step, every thread's share
// in turn, calling OpenBLAS's own packing, beta and kernel routines (the
// active kernels', found by name from its table of kernels) with the blocks
// and widths each thread would give them. Products OpenBLAS runs on one
// thread at any count (small ones, those its small-matrix kernels take, and
// those its threaded driver hands to its one-thread driver) are left as
// they are. Measured on 640 products of random shapes and transposes
// (2-core AMD EPYC, OpenBLAS 0.3.21, two threads): between 400 and 616
// differ between one thread and two on Cooperlake's, SkylakeX's, Haswell's
// and Zen's kernels, in float32 and float64, and this reproduces every one,
// as on Sandybridge's and Prescott's, and against OpenBLAS on 3, 4 and 8
// threads (scripts/blas_thread_bits.py --threads N). The replay compares every checkpoint it
// reaches, so a product this misses (another OpenBLAS) costs the replay its
// place beside the walk (it runs in turn), never a bit.
#pragma once

#include <string>

namespace pathkernel {

class ThreadedProductsOnOneThread {
 public:
  /// `threads` <= 1: nothing changes.
  explicit ThreadedProductsOnOneThread(int threads);
  ~ThreadedProductsOnOneThread();
  ThreadedProductsOnOneThread(const ThreadedProductsOnOneThread&) = delete;
  ThreadedProductsOnOneThread& operator=(const ThreadedProductsOnOneThread&) = delete;

 private:
  int previous_;
};

/// Why this process's float32 or float64 products cannot be run as
/// OpenBLAS's threaded driver runs them (ThreadedProductsOnOneThread then
/// changes nothing for them): "" when both can (LibTorch's calls reach
/// pathkernel's sgemm_ and dgemm_, and OpenBLAS's active kernels' block
/// sizes, packing routines and small-matrix rule were found).
std::string threaded_products_unavailable();

/// How many products this thread ran by the threaded driver's steps (the
/// tests').
long threaded_products_split();

}  // namespace pathkernel
