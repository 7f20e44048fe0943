// BatchNorm in training mode (docs/math.md §15): a TorchScript module's
// running statistics as one flat vector, and the scope in which its
// BatchNorm modules normalise by them (eval mode).
//
// Training runs BatchNorm in training mode: each step normalises the batch
// by its own statistics and moves the running statistics μ_s -> μ_{s+1}.
// A test output is the eval-mode function g(w, μ; x). A run's checkpoints
// store μ (RunWriter), its replay reproduces every μ_s bit for bit
// (PathReader, PathStep::buffers), and the decomposition evaluates step s's
// segment with μ_s held and reports the jumps g(w_{s+1}, μ_{s+1}; x) −
// g(w_{s+1}, μ_s; x) as their own term (Decomposition::statistics).
#pragma once

#include <torch/torch.h>

#include "pathkernel/model.h"

namespace pathkernel {

/// Every buffer of net's module (running means and variances, batch
/// counters) in order, as one float64 vector [Q] (a copy); [0] for a network
/// without buffers.
torch::Tensor flatten_buffers(const Network& net);

/// Copies flat [Q] (flatten_buffers' layout) into net's buffers, bit for bit
/// (integer counters from their exact float64 values). Throws Error when the
/// size differs.
void set_flat_buffers(Network& net, const torch::Tensor& flat);

/// A test output g(w, μ; x): net's parameters set to w and, when mu is
/// defined, its buffers to mu; BatchNorm in eval mode; x in the parameters'
/// dtype; a sequence model's outputs at its position (model.h). Float64 [n, K].
torch::Tensor test_outputs(Network& net, const torch::Tensor& w, const torch::Tensor& mu, const torch::Tensor& x);

/// For its scope, puts net's BatchNorm modules in eval mode (normalising by
/// the running statistics, leaving them unchanged), then back in the mode
/// they were in. Nothing for a network without batch statistics.
class RunningStatistics {
 public:
  explicit RunningStatistics(Network& net);
  ~RunningStatistics();
  RunningStatistics(const RunningStatistics&) = delete;
  RunningStatistics& operator=(const RunningStatistics&) = delete;

 private:
  Network& net_;
  bool was_training_;
};

/// For its scope, puts net's BatchNorm modules in training mode (batch
/// statistics), and afterwards restores both their mode and the buffers a
/// forward pass moved: what the engine's per-example total derivatives
/// need, which run the batch through the network without taking a step.
class BatchStatistics {
 public:
  explicit BatchStatistics(Network& net);
  ~BatchStatistics();
  BatchStatistics(const BatchStatistics&) = delete;
  BatchStatistics& operator=(const BatchStatistics&) = delete;

 private:
  Network& net_;
  bool was_training_;
  torch::Tensor saved_;
};

}  // namespace pathkernel
