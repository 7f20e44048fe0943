// explain, verify and gram across the ranks of a job (distributed.h), split
// by test points (docs/distributed.md), and evaluate's retrainings split by
// jobs.
//
// Test points are independent (docs/math.md §12): each rank decomposes a
// contiguous share of them, balanced by their estimated cost, and the root
// (rank 0) receives the shares in rank order, that is, in the order of the
// test points, and alone writes the outputs. The shares are whole blocks of
// the points the engine computes together (decomposition_block(), GramOptions
// ::block), so every block is computed with the same shapes as in a single
// process: every number is the one a single process computes with the same
// options and thread count, bit for bit, whatever the BLAS.
//
// Every rank calls these functions with the same arguments, after agreeing
// that its set-up (the run opened, the test points resolved) succeeded
// (Communicator::agree). An error in a rank's own share propagates from that
// rank only: its caller ends the job (Communicator::abort). In a world of
// one rank each function is its one-process counterpart.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pathkernel/decomposition.h"
#include "pathkernel/distributed.h"
#include "pathkernel/explanation.h"
#include "pathkernel/gram_file.h"
#include "pathkernel/path.h"
#include "pathkernel/retrain.h"

namespace pathkernel {

/// A rank's share of n work items: items [begin, end).
struct Share {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

/// The estimated relative cost of decomposing each test input x [n, ...]:
/// the integrand evaluations (forward passes and backprops) its certified
/// test feature takes along the chord from the first checkpoint to the
/// second, a proxy for its kinks along the path. Each rank estimates a
/// strided part and every rank receives all n, in order. Fixed rules
/// (riemann, dpk) cost the same for every point: all ones, no evaluation.
std::vector<double> estimate_point_costs(const Communicator& comm, PathReader& reader, const torch::Tensor& x,
                                         const QuadratureOptions& quadrature);

/// This rank's share of n items with these costs (split_by_cost of the
/// blocks' costs), in whole blocks of `block` items: shares start at
/// multiples of it, so each block is computed whole by one rank.
Share share_of(const Communicator& comm, const std::vector<double>& costs, int64_t block = 1);

/// Concatenates every rank's decomposition of its share (in rank order) on
/// the root: contributions, outputs, regularisation, rounding and kernel
/// gathered; certificate gap and seconds the maximum, counters summed. The
/// other ranks get their own `d` back.
Decomposition gather_decomposition(const Communicator& comm, const Decomposition& d);

/// decompose() (decomposition.h) of test inputs x [n, ...] across the
/// ranks: the root returns the whole decomposition, the other ranks their
/// share's. With fewer blocks of test points than ranks, a gd or sgd run's
/// steps are split instead, in whole blocks of steps (step_blocks(): the
/// run's checkpoint segments; contiguous shares balanced by their numbers of
/// steps, every rank all the points), each block decomposed alone and its
/// sums added to the running total in block order, the total passed from
/// rank to rank (add_step_block), exactly as one process's walk adds them:
/// one process's bits whatever the number of ranks. A rank other than 0
/// holds its blocks' sums (n M K doubles each, and n M K K with the kernel)
/// until the total reaches it.
Decomposition decompose_across(const Communicator& comm, PathReader& reader, const torch::Tensor& x,
                               const DecompositionOptions& options);

/// What explain_across() did on each rank.
struct ExplainAcross {
  Explanation explanation;             ///< on the root: the whole explanation written; elsewhere: dir and notes only
  std::vector<double> rank_seconds;    ///< each rank's decomposition time, in rank order
  std::vector<int64_t> rank_points;    ///< each rank's number of test points
};

/// explain() (explanation.h) across the ranks, split as decompose_across()
/// splits (test points, or a gd or sgd run's blocks of steps when there are
/// fewer blocks of test points than ranks), with the same bits as one
/// process. Split by test points, each rank saves its progress to
/// OUT/.progress/rank-R-of-N (a rerun with the same arguments and number of
/// ranks continues it). Split by steps, each block of steps [A, B) saves its
/// progress, and its sums once done, to OUT/.progress/steps-A-B (a rerun
/// with the same arguments continues it, with any number of ranks), and a
/// rank reads its finished blocks back from there when the running total
/// reaches it instead of holding them in memory. The root writes the
/// explain directory once all shares have arrived and then removes
/// OUT/.progress. An error writing the outputs ends every rank with it
/// (AgreedError).
ExplainAcross explain_across(const Communicator& comm, PathReader& reader, const torch::Tensor& test_index,
                             const std::string& out, const ExplainOptions& options);

/// Retrainer::outputs() (retrain.h) of `jobs` on test inputs x [n, ...]
/// across the ranks: called by the root alone, while every other rank waits
/// in serve_retrainings(). The root sends the jobs and its options; each
/// rank retrains a contiguous share of the jobs (equal counts, in job order)
/// and saves its finished ones to options.work_file + ".rank-R-of-N" (a rerun
/// with the same number of ranks continues them); the root receives the
/// outputs in rank order, that is in job order: float64 [J, n, K]. A
/// retraining's bits do not depend on where it runs (retrain.h), so these
/// are one process's outputs, bit for bit. With `rank_jobs`, each rank's
/// number of jobs is added to (*rank_jobs)[rank] (resized to the ranks).
torch::Tensor retrain_outputs_across(const Communicator& comm, const Retrainer& retrainer,
                                     const std::vector<RetrainJob>& jobs, const torch::Tensor& x,
                                     const RetrainOptions& options, std::vector<int64_t>* rank_jobs = nullptr);

/// The other ranks' side of retrain_outputs_across(): retrains this rank's
/// share of every set of jobs the root sends, on inputs x (the root's), until
/// the root calls end_retrainings(). Not called on the root.
void serve_retrainings(const Communicator& comm, const Retrainer& retrainer, const torch::Tensor& x);

/// Tells the ranks in serve_retrainings() that no more jobs come. Root only.
void end_retrainings(const Communicator& comm);

/// gram_between() (gram_file.h) across the ranks, split by the test side's
/// points (the rows when both or neither side is test points): the root
/// returns the whole matrix and its record, the other ranks an empty GramFile.
GramFile gram_across(const Communicator& comm, PathReader& reader, const std::string& row_set,
                     const torch::Tensor& row_indices, const std::string& col_set, const torch::Tensor& col_indices,
                     const GramOptions& options);

}  // namespace pathkernel
