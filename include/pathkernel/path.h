// The path reader: the recorded training path w_0 .. w_N of a run directory,
// reconstructed by deterministic replay from its checkpoints.
//
// Replay re-runs take_step() from the checkpoint before the wanted step with
// the recorded batches, learning rates and optimizer state, using the thread
// count the run was trained with. It reproduces the recorded checkpoints bit
// for bit; every checkpoint the replay reaches is compared, and a difference
// throws Error (check() reports instead of throwing).
//
// A run recorded from a user's own training loop (Manifest::recorded) stores
// every step's weights and optimizer state instead: nothing is replayed, and
// each step is read from its files.
//
// All weight vectors are flat float64 [P] in the manifest's parameter order.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pathkernel/dataset.h"
#include "pathkernel/manifest.h"
#include "pathkernel/model.h"
#include "pathkernel/optimizer.h"

namespace pathkernel {

/// One step of the path.
struct PathStep {
  int64_t step = 0;       ///< s
  torch::Tensor w;        ///< w_s, float64 [P]
  torch::Tensor delta;    ///< the recorded difference w_{s+1} - w_s, float64 [P]
  torch::Tensor batch;    ///< B_s as int64 [B_s] indices into the training set; undefined = all
  double lr = 0;          ///< eta_s
  OptimizerState state;   ///< optimizer state after step s (the one that produced delta)
  double clip = 1;        ///< c_s: the factor the batch gradient was clipped by (recorded runs; else 1)
  /// With PathReader::set_capture(true), what the replayed step itself
  /// computed at w_s on its batch (rows in the order of `batch`), in the
  /// run's dtype; empty or undefined otherwise:
  std::vector<torch::Tensor> layer_inputs;   ///< per param layer: a_l [B_s, ...]
  std::vector<torch::Tensor> layer_signals;  ///< per param layer: ∂L_s/∂y_l [B_s, ...] of the batch's mean loss
  torch::Tensor gradient;                    ///< G_s = ∂L_s/∂w [P] float64, as the optimizer received it
};

/// The outcome of replaying a whole path against its checkpoints.
struct ReplayReport {
  int64_t steps_replayed = 0;
  int64_t checkpoints_compared = 0;
  int64_t mismatches = 0;
  int64_t first_mismatch_step = -1;
  /// The run was recorded from a training loop: there is nothing to replay,
  /// every step's weights are stored (and were checked against their CRC-32s).
  bool recorded = false;
  double max_abs_diff = 0;
  bool bitwise_equal = true;
  /// Where this machine differs from the one the run was trained on
  /// (ReplayEnvironment::differences); filled in when a checkpoint differs.
  std::vector<std::string> environment_differences;
};

/// Why a replay may not reproduce a run's checkpoints on this machine, as one
/// sentence: `differences` (ReplayReport::environment_differences, the
/// recorded environment's differences from this machine's) listed, or, when
/// there are none, that the environments agree, so the run's files changed.
std::string replay_mismatch_reason(const Manifest& manifest, const std::vector<std::string>& differences);

class PathReader {
 public:
  /// Opens a run: reads and validates the manifest against the files, reloads
  /// the training data (checking it matches what was trained on) and rebuilds
  /// the network. Throws Error naming the first inconsistency.
  explicit PathReader(std::string run_dir);

  const Manifest& manifest() const { return manifest_; }
  const Dataset& dataset() const { return dataset_; }
  Network& network() { return net_; }
  int64_t steps() const { return manifest_.steps; }
  /// The run's per-training-point loss weights, float64 [M]; undefined when
  /// every weight is 1.
  const torch::Tensor& loss_weights() const { return loss_weights_; }
  /// The loss weights of the training points idx (undefined idx: all of
  /// them), float64; undefined when every weight is 1.
  torch::Tensor loss_weights(const torch::Tensor& idx) const;
  const std::string& dir() const { return dir_; }
  /// CRC-32 of the run's manifest.json as it is on disk now: what saved
  /// progress on the run (resumable scores, explanations, retrainings) is
  /// keyed by, so that progress on another or a changed run is not resumed.
  uint32_t manifest_crc32() const;

  /// w at checkpoint i of manifest().checkpoints, float64 [P].
  torch::Tensor checkpoint(size_t i) const;

  /// w_s for any s in [0, N], replayed from the checkpoint before it.
  torch::Tensor weights(int64_t s);

  /// f(w_s, x) for inputs x [n, ...], computed as training did (in the run's
  /// dtype), returned in float64 [n, K].
  torch::Tensor outputs(int64_t s, const torch::Tensor& x);

  /// Calls fn for s = 0 .. N-1 in order. Memory: O(P).
  void forward(const std::function<void(const PathStep&)>& fn);

  /// Calls fn for s = begin .. end-1 in order (0 <= begin <= end <= N),
  /// replaying only the checkpoint segments that hold those steps, from the
  /// checkpoint at or before `begin`: the steps are the bits forward() gives.
  void forward(const std::function<void(const PathStep&)>& fn, int64_t begin, int64_t end);

  /// Calls fn for s = N-1 .. 0, replaying one checkpoint segment at a time and
  /// holding at most one segment in memory.
  void reverse(const std::function<void(const PathStep&)>& fn);

  /// Makes forward() and reverse() of a replayed (not recorded) run hand each step the batch's layer inputs,
  /// backprop signals and gradient that its replay computed (PathStep), so
  /// a consumer need not run the batch through the network again. Costs
  /// the batch's activations per step held (one segment's in reverse()).
  void set_capture(bool on) { capture_ = on; }

  /// Replays every step and compares every checkpoint bit for bit.
  ReplayReport check(bool progress = false);

  /// B_s as the batch log records it: int64 [B_s] indices into the training
  /// set, or undefined for full-batch training. Throws Error when no batch
  /// log covers s or the recorded batch is bad.
  torch::Tensor batch(int64_t s) { return batch_indices(s); }

 private:
  /// Replays checkpoint segment k (steps c_k .. c_{k+1}-1), calling fn per
  /// step, then compares with checkpoint k+1. Returns the max |diff| there
  /// (0 when bit for bit equal, +inf when bits differ but values are equal).
  double replay_segment(size_t k, const std::function<void(PathStep&&)>& fn, bool need_state);
  torch::Tensor batch_indices(int64_t s);
  OptimizerState checkpoint_state(size_t k) const;
  void require_equal(size_t k, double diff) const;

  std::string dir_;
  Manifest manifest_;
  Dataset dataset_;
  Network net_{nullptr};
  // The batch log currently loaded.
  int64_t batch_first_ = -1;
  torch::Tensor batch_rows_;
  bool capture_ = false;
  torch::Tensor clip_;  ///< c_s of every step, float64 [N]
  torch::Tensor loss_weights_;  ///< float64 [M], or undefined (all 1)
};

}  // namespace pathkernel
