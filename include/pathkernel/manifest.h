// The run manifest: manifest.json, the index of a run directory.
//
// It holds everything needed to reproduce the run and to read it without
// pathkernel: data, model, parameter layout (names, shapes, flat offsets),
// optimizer, per-step learning rates, seeds, dtype, versions, and the list
// of files with their sizes and CRC-32s. JSON keys keep a fixed order, so
// save -> load -> save gives identical bytes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pathkernel/dataset.h"
#include "pathkernel/environment.h"
#include "pathkernel/model.h"
#include "pathkernel/optimizer.h"

namespace pathkernel {

/// A file of the run, relative to the run directory.
struct FileRecord {
  std::string file;
  int64_t bytes = 0;
  uint32_t crc32 = 0;
};

/// A full checkpoint: w_step as a flat float64 [P] .npy, plus the optimizer
/// state at that step (each buffer a flat [P] .npy; none before step 1).
struct CheckpointRecord {
  int64_t step = 0;
  FileRecord weights;
  int64_t optimizer_step = 0;
  std::map<std::string, FileRecord> optimizer_buffers;
  /// The module's buffers μ at this checkpoint (batch_statistics.h), float64
  /// [Q]; file empty for a network without BatchNorm in training mode.
  FileRecord module_buffers;
};

/// The batch indices of steps [first_step, first_step + steps): an int32 .npy
/// of shape [steps, max batch], rows padded with -1.
struct BatchRecord {
  int64_t first_step = 0;
  int64_t steps = 0;
  FileRecord indices;
};

struct Manifest {
  std::string format = "pathkernel-run";
  int64_t format_version = 1;
  std::string pathkernel_version;
  std::string libtorch_version;
  std::string status = "running";  ///< running | complete | diverged
  std::string message;             ///< why training stopped, if it did not complete
  int64_t steps = 0;               ///< N: the path is w_0 .. w_N

  // Data.
  DataOptions data;
  int64_t num_train = 0;
  int64_t num_test = 0;
  std::vector<int64_t> input_shape;
  int64_t num_classes = 0;
  nlohmann::ordered_json normalization;
  nlohmann::ordered_json source;
  uint32_t train_crc32 = 0;  ///< CRC-32 of the training inputs and labels as used
  bool integer_inputs = false;  ///< inputs are integer codes (recorded only when true)
  int64_t sequence_length = 0;  ///< sequence data's T (sequence.h; recorded only when > 0)

  // Model.
  std::string model_spec;  ///< a TorchScript model's is "torchscript:model.pt", the copy in the run
  /// A TorchScript model's module file, copied into the run directory so
  /// the run is self-contained (file empty for pathkernel's own models).
  FileRecord module;
  std::string output = "logsoftmax";
  std::string loss = "cross_entropy";  ///< training.loss (loss.h); runs written before it had cross_entropy
  bool zero_last_layer = false;
  uint64_t init_seed = 0;
  std::string dtype = "float64";
  int64_t parameter_count = 0;
  std::vector<ParamInfo> parameters;

  // Training.
  OptimizerOptions optimizer;
  int64_t batch_size = 0;  ///< 0: full batch
  uint64_t batch_seed = 0;
  std::string schedule = "constant";
  int64_t threads = 1;  ///< intra-op threads used; replay uses the same
  /// The machine training ran on, as far as bit-for-bit replay depends on it
  /// (empty in runs written before it was recorded).
  ReplayEnvironment environment;
  int64_t checkpoint_every = 1;
  std::vector<double> learning_rates;  ///< [N]: eta_s of every step
  std::vector<CheckpointRecord> checkpoints;
  std::vector<BatchRecord> batches;  ///< empty for full-batch training
  /// A path recorded from a user's own training loop (python/pathkernel):
  /// every step's weights and optimizer state are stored, nothing is
  /// replayed, and the data lives in the run directory.
  bool recorded = false;
  /// Recorded runs that clipped gradients: float64 [N], the factor c_s each
  /// step's batch gradient was multiplied by (file empty: none, all 1).
  FileRecord clip_factors;
  /// Per-training-point loss weights, float64 [M] (train --loss-weights;
  /// file empty: none, all 1). The batch loss is (1/|B_s|) Σ_{i∈B_s} c_i ℓ_i.
  FileRecord loss_weights;
  std::string metrics = "metrics.csv";
  nlohmann::ordered_json summary;  ///< final loss and accuracies, when complete
  /// The run directory load() read this manifest from (not serialised): a
  /// TorchScript model's module file is resolved inside it.
  std::string directory;

  nlohmann::ordered_json to_json() const;
  /// Parses a manifest; throws Error naming the missing or mistyped field.
  static Manifest from_json(const nlohmann::ordered_json& j);
  std::string dump() const;  ///< to_json().dump(2) + "\n"

  /// Reads RUN/manifest.json. Throws Error if missing or malformed.
  static Manifest load(const std::string& run_dir);
  /// Writes RUN/manifest.json atomically.
  void save(const std::string& run_dir) const;

  /// The options to rebuild the network of this run. A TorchScript model's
  /// path is the module file inside `directory` (checked by run_file_path).
  NetworkOptions network_options(int64_t position = -1) const;
  /// The options to reload the training data. Data stored inside the run
  /// directory (a recorded run's, `data.source.in_run`) is found there.
  DataOptions data_options() const;
  /// Bytes of the path data: checkpoints, optimizer state and batch logs.
  int64_t path_bytes() const;
  /// The OpenBLAS threads the run's steps ran with: the recorded count
  /// (environment.blas_threads), or the run's threads where none was recorded.
  int blas_threads() const {
    return static_cast<int>(environment.blas_threads > 0 ? environment.blas_threads : threads);
  }
  /// Whether the checkpoints store the module's buffers μ: a model with
  /// BatchNorm in training mode (every checkpoint stores them, or none does).
  bool stores_module_buffers() const {
    return !checkpoints.empty() && !checkpoints.front().module_buffers.file.empty();
  }
};

/// Checks the manifest against the files in run_dir: every listed file exists
/// inside run_dir (run_file_path) with the recorded size and CRC-32, weights
/// and optimizer buffers are finite float64 [P], checkpoints are in order and
/// start at 0 and end at N, batch logs are int32 [steps, B] indices into the
/// training set covering every step of minibatch training, and there is one
/// learning rate per step. Throws Error naming the first inconsistency.
void validate_run(const std::string& run_dir, const Manifest& manifest);

/// The path of `file`, a file named by the manifest, inside run_dir. Throws
/// Error naming the file unless it is a relative path that, with every
/// symlink resolved, stays inside run_dir and is a regular file (a manifest
/// must not make pathkernel read /etc/passwd, /dev/zero or another run).
std::string run_file_path(const std::string& run_dir, const std::string& file);

/// A recorded run's clip factors, float64 [N] (all 1 when it clipped nothing).
torch::Tensor read_clip_factors(const std::string& run_dir, const Manifest& manifest);

/// The run's loss weights, float64 [M], checked (finite, >= 0); undefined
/// when the run has none (every weight 1).
torch::Tensor read_loss_weights(const std::string& run_dir, const Manifest& manifest);

/// CRC-32 of a training set (inputs then labels, raw bytes).
uint32_t training_data_crc32(const torch::Tensor& x, const torch::Tensor& y);

/// The same CRC of a dataset's training split, its inputs decoded by blocks
/// of rows where they are held as codes (the same bytes as x_train's).
uint32_t training_data_crc32(const Dataset& data);

}  // namespace pathkernel
