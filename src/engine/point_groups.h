// Test points taken in turn by one worker per thread (docs/math.md §12). A
// step's work on its test points (their features, and their contractions
// with the training rows) is independent from point to point. With several
// threads each point is a group of its own, and the threads take the groups
// in turn, each the next not yet taken, doing a group's operations on that
// thread alone. Their operations are many and small: shared between
// threads, each would pay the threads' wake-up and wait. A point that
// crosses more kinks than the others then keeps only its own thread busy:
// with consecutive groups of several points, one per thread, a thread whose
// group finished first waited for the other's (the user CNN's 8 points took
// 1.4 times as long).
//
// Internal to the engine (features.cpp, decomposition.cpp).
#pragma once

#include <cstdint>
#include <functional>

#include <c10/core/InferenceMode.h>

#include "pathkernel/context.h"

namespace pathkernel {

class SegmentEvaluator;

/// How a group of test points runs on whichever thread takes it
/// (run_point_groups, and the reverse walk's test features ahead): one
/// OpenMP thread, and no graph or version counters recorded (about a
/// twentieth of the README CNN's verify was that bookkeeping).
class GroupThreadScope {
 private:
  OpenMpThreads single_{1};
  c10::InferenceMode inference_;
};

/// The threads that take n test points' groups on ev: one per thread of the
/// caller, at most n, and one where the evaluator runs a module's graph (the
/// structured and generic TorchScript routes) or where the caller's thread
/// is itself one-threaded (inside a group).
int64_t point_workers(const SegmentEvaluator& ev, int64_t n);

/// Test points a group holds at most where the test features are all
/// factored (Linear layers on flat inputs): little work a point, done best
/// as products over many points, which one-point groups make thin (half
/// the automatic block of 32, so two threads split a block as before).
constexpr int64_t kFactoredGroupPoints = 16;

/// The groups n test points are split into on ev when several workers take
/// them (point_workers(ev, n) > 1), else one group of all n, whose
/// operations use every thread the caller has. With several workers: one
/// per point, so that a point that crosses more kinks keeps only its own
/// thread busy, or, where the features are `factored`, groups of up to
/// kFactoredGroupPoints and at least two (n > 1). The groups are the same for every worker count
/// above one, and so are the bits.
/// `workers` > 0: the groups as that many workers take them, whatever the
/// caller's threads (a worker of the steps on threads, on one thread).
int64_t point_groups(const SegmentEvaluator& ev, int64_t n, bool factored, int64_t workers = 0);

/// The first of n points that group g of `groups` takes (g = groups: n).
inline int64_t group_start(int64_t g, int64_t groups, int64_t n) { return g * n / groups; }

/// Runs work(g) for every g in [0, groups), each call on one thread with
/// LibTorch's and OpenBLAS's thread counts at one: the calling thread and
/// tasks on LibTorch's inter-op pool, up to `workers` in all (0: one per
/// group), take the groups in turn, each the next not yet taken. Returns
/// once every group is done; rethrows the first group's exception, if any.
/// With one worker (workers = 1, or one group and workers 0) the calling
/// thread runs the groups in order at its own thread count; a single group
/// with more workers allowed still runs one-threaded, as it would beside
/// others (so a point's bits do not depend on how the groups were batched).
/// Several workers run each group under c10::InferenceMode: its operations
/// record no autograd graph, and tensors a group makes are inference
/// tensors (read anywhere; changed in place only inside a group).
void run_point_groups(int64_t groups, const std::function<void(int64_t)>& work, int64_t workers = 0);

}  // namespace pathkernel
