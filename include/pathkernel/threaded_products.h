// OpenBLAS's float32 products on several threads, added as they are there,
// on one thread: a replay on one thread beside the engine's work for a loop
// whose OpenBLAS ran on several.
//
// A Python loop runs OpenBLAS on every core unless it is told otherwise
// (torch.set_num_threads leaves OpenBLAS's count), and a run is replayed
// bit for bit only as it was trained. A product OpenBLAS runs on several
// threads differs from the same product on one in one way on the AVX-512
// kernels (SkylakeX, Cooperlake): where the inner dimension k is cut into
// blocks, its threaded driver cuts a remainder between Q and 2Q (Q its
// block size) into halves, ⌈r/2⌉ and ⌊r/2⌋, and its one-thread driver
// rounds the first half up to a multiple of its unroll. LeNet-5's first
// Linear layer (k = 400, Q = 320) adds as 200 + 200 on two threads and as
// 208 + 192 on one: every entry may differ in its last bit.
//
// While a ThreadedProductsOnOneThread lives, this thread's float32 matrix
// products (sgemm_, the routine LibTorch calls, which pathkernel's own
// definition forwards to OpenBLAS's) that OpenBLAS at `threads` threads
// would run on its threaded driver are run on one thread as products of
// the threaded driver's k-blocks in turn, each added to the last: the
// threaded driver's sums, in its order. Products OpenBLAS runs on one
// thread at any count (small ones, and those its small-matrix kernels take)
// are left as they are. A block small enough for the small-matrix kernels
// alone runs on a copy with zero columns added until it is not. Measured on
// 628 products of random shapes and transposes (2-core AMD EPYC, OpenBLAS
// 0.3.21): 448 differ between one thread and two on Cooperlake's kernels,
// 396 on SkylakeX's, and the rule reproduces every one (18 and 12 of them
// widened; scripts/blas_thread_bits.py). On Haswell's and Zen's kernels a
// product on two threads differs in more than its k-blocks (608 differ, the
// rule misses 596), and a loop run on them replays in turn as before. The
// replay compares every checkpoint it reaches, so a product the rule misses
// costs the replay its place beside the walk (it runs in turn), never a bit.
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

/// Why this process's float32 products cannot be run as OpenBLAS's threaded
/// driver runs them (ThreadedProductsOnOneThread then changes nothing): ""
/// when they can (LibTorch's calls reach pathkernel's sgemm_, and OpenBLAS's
/// active kernels' block size, unroll and small-matrix rule were found).
std::string threaded_products_unavailable();

/// How many products this thread ran in k-blocks (the tests').
long threaded_products_split();

}  // namespace pathkernel
