// The path reader: the recorded training path w_0 .. w_N of a run directory,
// reconstructed by deterministic replay from its checkpoints.
//
// Replay re-runs take_step() from the checkpoint before the wanted step with
// the recorded batches, learning rates and optimizer state, using the thread
// count the run was trained with. It reproduces the recorded checkpoints bit
// for bit; every checkpoint the replay reaches is compared, and a difference
// throws Error (check() reports instead of throwing).
//
// A run recorded from a user's own training loop (Manifest::recorded) either
// stores every step's weights and optimizer state (nothing is replayed, each
// step is read from its files), or is compact: checkpoints every ~√N steps,
// and the steps between are replayed with the run's TorchScript module,
// LibTorch's optimizer, the recorded batches, rates and clip factors. The
// loop ran in Python, so replay may drift from its checkpoints: the replayed
// path is the one handed out, and at each checkpoint it rejoins the recorded
// weights and state (the last step of a segment ends at the recorded
// checkpoint), so the difference lands in that step's residual, i.e. in E.
// The drift is measured per checkpoint (replay_drift()), never an error.
//
// All weight vectors are flat float64 [P] in the manifest's parameter order.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
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
  /// BatchNorm in training mode (batch_statistics.h): the module's buffers
  /// μ_s before the step and μ_{s+1} after it, float64 [Q]; undefined
  /// otherwise.
  torch::Tensor buffers, buffers_next;
  /// With PathReader::set_capture(true), what the replayed step itself
  /// computed at w_s on its batch (rows in the order of `batch`), in the
  /// run's dtype; empty or undefined otherwise:
  std::vector<torch::Tensor> layer_inputs;   ///< per param layer: a_l [B_s, ...]
  std::vector<torch::Tensor> layer_signals;  ///< per param layer: ∂L_s/∂y_l [B_s, ...] of the batch's mean loss
  torch::Tensor gradient;                    ///< G_s = ∂L_s/∂w [P] float64, as the optimizer received it
  /// What the capture's consumer formed from the captured tensors where it
  /// asked (set_capture's `finish`: the engine's per-sample gradients of
  /// the batch, per param layer, undefined for a layer without them);
  /// empty otherwise.
  std::vector<torch::Tensor> layer_gradients;
};

/// The outcome of replaying a whole path against its checkpoints.
struct ReplayReport {
  int64_t steps_replayed = 0;
  int64_t checkpoints_compared = 0;
  int64_t mismatches = 0;
  int64_t first_mismatch_step = -1;
  /// The run was recorded from a training loop. With steps_replayed 0 every
  /// step's weights are stored (and were checked against their CRC-32s);
  /// otherwise it is a compact recording, and a mismatch is replay drift,
  /// which the decomposition carries into E (not an error).
  bool recorded = false;
  double max_abs_diff = 0;
  bool bitwise_equal = true;
  /// Where this machine differs from the one the run was trained on
  /// (ReplayEnvironment::differences); filled in when a checkpoint differs.
  std::vector<std::string> environment_differences;
};

/// How far the replay of a compact recorded run drifted from its recorded
/// checkpoints: max |replayed - recorded| of the weights at each checkpoint
/// after step 0, in checkpoint order.
struct ReplayDrift {
  std::vector<int64_t> steps;        ///< the checkpoints' steps
  std::vector<double> max_abs_diff;  ///< per checkpoint; 0 when values agree
  /// Bytes of the replayed weights differ at the checkpoint (+0 vs -0 counts
  /// as agreeing in max_abs_diff but not here).
  std::vector<bool> bitwise_equal;
  double max() const;
  /// The step of the checkpoint with the largest drift (-1: none drifted).
  int64_t worst_step() const;
  int64_t bit_for_bit() const;  ///< checkpoints reproduced bit for bit
};

/// verify's plain-words account of `drift` for a run whose weights are of
/// order `weight_scale` (max |w_N|): how far replay drifted, and what that
/// means for each contribution C_i.
std::string replay_drift_message(const ReplayDrift& drift, double weight_scale);

/// Why a replay may not reproduce a run's checkpoints on this machine, as one
/// sentence: `differences` (ReplayReport::environment_differences, the
/// recorded environment's differences from this machine's) listed, or, when
/// there are none, that the environments agree, so the run's files changed.
std::string replay_mismatch_reason(const Manifest& manifest, const std::vector<std::string>& differences);

/// Thrown by forward() when it replays ahead, on one thread, a run trained
/// on several (PathReader::set_replay_ahead) and a checkpoint is not
/// reproduced bit for bit that way: the steps of its segment already handed
/// on were not the run's. The caller walks again with the replay in turn;
/// step_verified() told it which steps it could keep.
struct ReplayOnOneThreadDiffers : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class PathReader {
 public:
  /// Opens a run: reads and validates the manifest against the files, reloads
  /// the training data (checking it matches what was trained on) and rebuilds
  /// the network. Throws Error naming the first inconsistency.
  explicit PathReader(std::string run_dir);

  /// A second reader of the same run, for a walk of other steps on another
  /// thread: the same manifest, training data, clip factors and loss
  /// weights (their tensors shared, not copied), what this reader found of
  /// one thread's replay, and a network of its own.
  PathReader twin() const;

  const Manifest& manifest() const { return manifest_; }
  /// The dataset as held: x_train and x_test undefined where the inputs are
  /// coded. For the labels and the sizes; a command reads the training and
  /// test rows it needs with train_inputs, train_rows and test_inputs.
  const Dataset& held_dataset() const { return dataset_; }
  /// The run's dataset with every input decoded into x_train and x_test.
  /// Where they are held as codes (a source of bytes, such as fashion-mnist)
  /// the first call decodes both splits, once for the reader and its twins:
  /// 376 + 63 MB for fashion-mnist in float64. For what needs all of it at once.
  const Dataset& decoded_dataset() const;
  /// Rows `index` of the training inputs, in the run's dtype, decoded where
  /// they are held as codes. An undefined index means every row: decoded_dataset()'s
  /// x_train, decoded once for the reader and its twins, not a step at a time
  /// (the test split left as held).
  torch::Tensor train_inputs(const torch::Tensor& index) const;
  /// Training rows first .. first+count-1: a view of x_train where it is
  /// held decoded, the rows decoded where it is held as codes.
  torch::Tensor train_rows(int64_t first, int64_t count) const;
  int64_t train_count() const { return manifest_.num_train; }
  /// Rows `index` ([k] int64) of the test inputs, decoded where they are
  /// held as codes; every row for an undefined index (decoded on each call).
  torch::Tensor test_inputs(const torch::Tensor& index) const { return pathkernel::test_inputs(dataset_, index); }
  int64_t test_count() const { return pathkernel::test_count(dataset_); }
  /// Whether this reader or a twin has decoded its whole coded training split
  /// (decoded_dataset, or train_inputs of every row); false where the inputs
  /// are not held as codes. What a command's memory test asks.
  bool whole_split_decoded() const { return decoded_->done.load(); }
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

  /// The module's buffers at checkpoint i (batch_statistics.h), float64 [Q];
  /// undefined when the run stores none.
  torch::Tensor checkpoint_buffers(size_t i) const;
  /// μ_s for any s in [0, N], replayed like weights(s); undefined for a
  /// network without BatchNorm in training mode.
  torch::Tensor buffers(int64_t s);

  /// f(w_s, x) for inputs x [n, ...], computed as training did (in the run's
  /// dtype; BatchNorm in eval mode with the running statistics μ_s), returned
  /// in float64 [n, K] (a sequence model's at its last position, sequence.h).
  torch::Tensor outputs(int64_t s, const torch::Tensor& x);

  /// Calls fn for s = 0 .. N-1 in order. Memory: O(P).
  void forward(const std::function<void(const PathStep&)>& fn);

  /// Calls fn for s = begin .. end-1 in order (0 <= begin <= end <= N),
  /// replaying only the checkpoint segments that hold those steps, from the
  /// checkpoint at or before `begin`: the steps are the bits forward() gives.
  void forward(const std::function<void(const PathStep&)>& fn, int64_t begin, int64_t end);

  /// Calls fn for s = N-1 .. 0, replaying one checkpoint segment at a time and
  /// holding at most one segment in memory (two when it replays ahead: the
  /// one walked and the next).
  void reverse(const std::function<void(const PathStep&)>& fn);

  /// Makes forward() and reverse() of a replayed (not recorded) run hand each step the batch's layer inputs,
  /// backprop signals and gradient that its replay computed (PathStep), so
  /// a consumer need not run the batch through the network again. Costs
  /// the batch's activations per step held (one segment's in reverse()).
  /// `finish`, when given, is called on each captured step before it is
  /// handed on, on the thread that replayed it (its own when the replay
  /// runs ahead): the consumer's work on the captured tensors, done ahead
  /// of the consumer's need.
  void set_capture(bool on, std::function<void(PathStep&)> finish = nullptr) {
    capture_ = on;
    capture_finish_ = on ? std::move(finish) : nullptr;
  }

  /// Makes forward() and reverse() replay on a thread of its own, ahead of
  /// the caller's work (forward: up to two steps; reverse: the next
  /// segment while the caller walks one), where that changes no bit of
  /// either: a caller of two threads or more (one more thread than its
  /// own), with OpenBLAS's kernels not switched between the replay and the
  /// caller (blas_switch.h), OpenBLAS's count, the process's, held at one
  /// for both while they run. So the replay runs on one thread: a run
  /// trained on one (torch's and OpenBLAS's), or one that stores every step (nothing replayed),
  /// always; a run trained on several (torch's or OpenBLAS's, a recorded
  /// loop's included) when one thread reproduces its shortest replayed
  /// segment bit for bit, checked once. Every checkpoint is still compared:
  /// in reverse() a segment is handed on only once reproduced, and from
  /// the first one thread does not reproduce the rest replay in turn at the
  /// run's count; forward() hands each step on as it comes and throws
  /// ReplayOnOneThreadDiffers there (step_verified). Elsewhere they replay
  /// in turn with fn, as without it. fn may call batch() and the const
  /// methods meanwhile, not other replaying ones.
  void set_replay_ahead(bool on) { ahead_ = on; }
  /// Whether forward() and reverse() replay ahead (set_replay_ahead, and
  /// the run and the caller's threads allow it). For a run of several
  /// threads, the first call replays its shortest segment on one thread.
  bool replays_ahead();
  /// Why the last forward() or reverse() replayed in turn with fn, not
  /// ahead: empty when it replayed ahead (or nothing was replayed yet).
  const std::string& replay_in_turn_reason() const { return in_turn_reason_; }
  /// The OpenMP count a replay on its own thread runs at: 1, or the run's
  /// torch count where one thread does not reproduce it (replay_team_).
  int replay_team() const { return replay_team_; }
  /// Whether one thread reproduces the run's shortest segment bit for bit
  /// (replayed once, then remembered).
  bool one_thread_reproduces();
  /// Whether a replay on one thread (OpenMP's and OpenBLAS's) may give the
  /// run's bits, with OpenBLAS's kernels the engine's (blas_switch.h): it
  /// does for a run trained on one and one that stores every step; a run
  /// of several is compared segment by segment as it replays, unless one
  /// thread is already known not to reproduce it. Replays nothing.
  bool replays_alike_on_one_thread() const;
  /// Makes forward() replay in turn with fn on one thread (OpenMP's;
  /// OpenBLAS's count is the process's, the caller's to hold at one),
  /// comparing every segment with its checkpoint and throwing
  /// ReplayOnOneThreadDiffers at the first that a run of several threads
  /// does not reproduce: for several ranges of steps walked at once, each
  /// on a thread of its own with a reader of its own (twin()).
  void set_replay_on_one_thread(bool on) { one_thread_in_turn_ = on; }
  /// Takes what `twin` found replaying segments this reader has not
  /// replayed: their drift from their checkpoints (replay_drift,
  /// step_reproduced), and a segment one thread did not reproduce.
  void take_replay_notes(const PathReader& twin);
  /// Whether step s, handed on by the forward() in progress, is known to be
  /// the run's: false only while a run of several threads is replayed ahead
  /// on one and s's checkpoint segment is not compared yet. Progress a
  /// caller saves for a later resume should end at such a step.
  bool step_verified(int64_t s) const { return !forward_on_one_thread_ || s < verified_end_->load(); }
  /// For tests of the replay of a run of several threads on one: segment
  /// k's replay on one thread counts as not reproducing its checkpoint (-1:
  /// none; the check of the shortest segment included).
  void set_one_thread_differs_at(int64_t k) { one_thread_differs_at_ = k; }
  /// The seconds the last forward() replayed on its own thread; 0 when it
  /// replayed in turn with fn.
  double replay_ahead_seconds() const { return ahead_seconds_; }

  /// Replays every step and compares every checkpoint bit for bit.
  ReplayReport check(bool progress = false);

  /// B_s as the batch log records it: int64 [B_s] indices into the training
  /// set, or undefined for full-batch training. Throws Error when no batch
  /// log covers s or the recorded batch is bad.
  torch::Tensor batch(int64_t s) { return batch_indices(s); }

  /// Whether the run is a compact recording (recorded, with steps between
  /// checkpoints that are replayed).
  bool replays_recorded() const;

  /// The drift of every checkpoint of a compact recorded run, replaying the
  /// segments not replayed yet; empty for every other run.
  ReplayDrift replay_drift();

  /// Whether step s of a recorded run, replayed with the run's declared loss
  /// and optimizer from the checkpoint before it, reproduces the checkpoint
  /// closing its segment bit for bit (so the loop's step s is the declared
  /// one). A segment not compared yet is replayed first; a stored step (every
  /// step recorded) is replayed from its stored weights and state. For a run
  /// pathkernel trained, whether its segment replays bit for bit (the
  /// training it declares is the training that ran).
  bool step_reproduced(int64_t s);

 private:
  /// twin()'s reader of `of`'s run.
  struct TwinOf {
    const PathReader& of;
  };
  explicit PathReader(TwinOf twin);
  /// Replays checkpoint segment k (steps c_k .. c_{k+1}-1), calling fn per
  /// step, then compares with checkpoint k+1. Returns the max |diff| there
  /// (0 when bit for bit equal, +inf when bits differ but values are equal).
  /// The last checkpoint at or before step s (the segment holding s, for s
  /// before the last step).
  size_t checkpoint_at_or_before(int64_t s) const;
  /// A stored step (a recorded segment of one step) is read, not replayed,
  /// unless `replay_stored`.
  double replay_segment(size_t k, const std::function<void(PathStep&&)>& fn, bool need_state,
                        bool replay_stored = false);
  /// The segments holding steps [begin, end), replayed in order, each step
  /// of the range handed to take, each segment's end checked (require_equal).
  void replay_range(int64_t begin, int64_t end, const std::function<void(PathStep&&)>& take);
  /// forward() and reverse() with the replay on a thread of its own
  /// (set_replay_ahead): at most two steps held ahead of fn, or two whole
  /// segments (the one walked and the next).
  void forward_ahead(const std::function<void(const PathStep&)>& fn, int64_t begin, int64_t end);
  /// forward() in turn on one thread (set_replay_on_one_thread).
  void forward_on_one_thread(const std::function<void(const PathStep&)>& fn, int64_t begin, int64_t end);
  void reverse_ahead(const std::function<void(const PathStep&)>& fn);
  /// reverse() with the replay in turn with fn, of segments 0 .. segments-1
  /// (the last first).
  void reverse_in_turn(const std::function<void(const PathStep&)>& fn, size_t segments);
  /// The OpenBLAS threads the run's steps ran with (Manifest::blas_threads).
  int run_blas_threads() const { return manifest_.blas_threads(); }
  /// Why forward() and reverse() would replay in turn: empty when they
  /// replay ahead (replays_ahead).
  std::string in_turn_reason();
  /// Whether a replay ahead runs on one thread a run trained on several
  /// (torch's or OpenBLAS's: a recorded loop's torch.set_num_threads(1)
  /// leaves OpenBLAS on every core). A recorded loop's replay rejoins its
  /// checkpoints where it drifts: one thread is taken only where it
  /// reproduces each of them bit for bit, as for a run of pathkernel's.
  bool replays_on_one_thread() const {
    return (manifest_.threads > 1 || run_blas_threads() > 1) && !stores_every_step();
  }
  /// Whether segment k, replayed on one thread, reproduced its checkpoint
  /// (diff: its max |diff| there).
  bool one_thread_reproduced(size_t k, double diff) const;
  /// A run recorded with every step stored: nothing is replayed.
  bool stores_every_step() const { return manifest_.recorded && !replays_recorded(); }
  /// Whether segment k is one recorded step: its two checkpoints are
  /// stored, so it is read, not replayed (replay_segment).
  bool reads_segment(size_t k) const {
    return manifest_.recorded && manifest_.checkpoints[k + 1].step - manifest_.checkpoints[k].step == 1;
  }
  torch::Tensor batch_indices(int64_t s);
  OptimizerState checkpoint_state(size_t k) const;
  /// Checks that a network with BatchNorm in training mode has its running
  /// statistics stored at every checkpoint (own runs and recorded loops).
  void check_batch_statistics() const;
  void require_equal(size_t k, double diff) const;
  /// Segment k of a run that stores every step: read, not replayed.
  void read_stored_step(size_t k, const std::function<void(PathStep&&)>& fn, bool need_state);
  /// The end of the last replayed step of segment k of a compact recorded
  /// run: notes the drift of `replayed` from checkpoint k+1 and returns the
  /// recorded checkpoint, which the path rejoins. With BatchNorm in training
  /// mode, `*mu` (the replayed running statistics) counts in the drift and
  /// is replaced by the checkpoint's.
  torch::Tensor rejoin_checkpoint(size_t k, const torch::Tensor& replayed, torch::Tensor* mu);
  /// Notes segment k's replay against checkpoint k+1: its max |diff| and
  /// whether the bytes agreed (drift_, drift_bitwise_).
  void note_drift(size_t k, double diff, bool bitwise);

  std::string dir_;
  Manifest manifest_;
  Dataset dataset_;
  /// The inputs decoded whole, shared by a reader and its twins: the training
  /// split, made by the first train_inputs of every row or decoded_dataset();
  /// dataset_ with both splits decoded, made by the first decoded_dataset().
  struct Decoded {
    std::once_flag train_once, once;
    torch::Tensor x_train;
    Dataset data;
    std::atomic<bool> done{false};  ///< x_train made
  };
  const torch::Tensor& decoded_train_inputs() const;
  std::shared_ptr<Decoded> decoded_ = std::make_shared<Decoded>();
  Network net_{nullptr};
  // The batch log currently loaded; read under batch_mutex_ (a replay
  // ahead and its caller both read it).
  std::unique_ptr<std::mutex> batch_mutex_ = std::make_unique<std::mutex>();
  int64_t batch_first_ = -1;
  torch::Tensor batch_rows_;
  bool capture_ = false;
  std::function<void(PathStep&)> capture_finish_;
  bool ahead_ = false;
  double ahead_seconds_ = 0;
  std::string in_turn_reason_;  ///< replay_in_turn_reason
  std::string one_thread_differed_;  ///< where a forward walk ahead on one thread met a segment it did not reproduce
  int replay_threads_ = 0;  ///< the replay's OpenMP count: the run's (0), or one (replays_on_one_thread)
  /// The OpenMP count of a replay on one thread (replay_threads_ 1): one, or
  /// the run's torch count where one does not reproduce the run and that
  /// count, on the replay's thread alone, does (one_thread_reproduces):
  /// LibTorch splits an operation by the calling thread's OpenMP team.
  int replay_team_ = 1;
  std::optional<bool> one_thread_reproduces_;
  bool forward_on_one_thread_ = false;  ///< a forward() replaying a run of several threads on one
  bool one_thread_in_turn_ = false;  ///< set_replay_on_one_thread
  /// The steps before it are verified (step_verified); written by the replay's thread.
  std::unique_ptr<std::atomic<int64_t>> verified_end_ = std::make_unique<std::atomic<int64_t>>(0);
  int64_t one_thread_differs_at_ = -1;
  torch::Tensor clip_;  ///< c_s of every step, float64 [N]
  torch::Tensor loss_weights_;  ///< float64 [M], or undefined (all 1)
  /// The drift at checkpoint k+1, per segment k replayed so far (NaN: not
  /// yet), and whether its bytes agreed; an own run's replay, which must
  /// agree, is noted too (step_reproduced).
  std::vector<double> drift_;
  std::vector<bool> drift_bitwise_;
};

}  // namespace pathkernel
