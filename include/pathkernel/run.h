// A training run end to end: load the data, build the model, train it and
// record its path in a run directory.
#pragma once

#include <string>

#include "pathkernel/dataset.h"
#include "pathkernel/manifest.h"
#include "pathkernel/model.h"
#include "pathkernel/trainer.h"

namespace pathkernel {

struct RunOptions {
  DataOptions data;
  std::string model = "mlp:64";
  OutputMap output = OutputMap::LogSoftmax;
  LossKind loss = LossKind::CrossEntropy;  ///< loss.h; nll and mse need the logits map
  bool zero_last_layer = false;
  uint64_t seed = 0;               ///< initialisation and batch sampling seed
  TrainOptions train;
  /// A .npy file of per-training-point loss weights (one per training point
  /// as used, finite, >= 0), copied into the run; "" for none (all 1).
  /// Overrides train.loss_weights.
  std::string loss_weights_file;
  int64_t checkpoint_every = 0;    ///< 0: default_checkpoint_every(N)
  std::string out;                 ///< the run directory
  bool force = false;              ///< overwrite an existing run directory
};

struct RunResult {
  Manifest manifest;
  TrainSummary summary;
  int64_t resumed_from = -1;  ///< the checkpoint step a resumed run continued from; -1 for a new run
  std::vector<std::string> warnings;  ///< the data's warnings (Dataset::warnings)
};

/// Trains and records. Throws Error on bad options, bad data, an existing run
/// directory without `force`, or divergence (the run is then kept, valid up to
/// the last good step). Writes RUN/timing.json (wall-clock seconds) last.
RunResult train_run(const RunOptions& options);

/// OpenBLAS's thread count for training `net` on `threads` of LibTorch's:
/// one for a network with a convolution (pathkernel's own or a TorchScript
/// module's, as its structured graph reads it), else `threads`. A
/// convolution's products are one per example, below OpenBLAS's threading
/// size, and LibTorch already spreads them over its threads; OpenBLAS's
/// threads then serve only the small products of the Linear head, and a
/// README CNN trained faster without them (docs/cli.md, "Threads"). A run
/// so trained records the count (ReplayEnvironment::blas_threads), and one
/// thread then reproduces it, so that verify replays it ahead of the walk
/// instead of in turn. A network without a convolution keeps OpenBLAS's
/// threads unless its Linear products are split into pieces
/// (training_linear_pieces), each then on one OpenBLAS thread.
int training_blas_threads(const NetworkImpl& net, int threads);

/// The pieces each Linear layer's products are split into while `net`
/// trains on `threads` (pieced_linear.h): `threads` for pathkernel's own
/// network without a convolution (an MLP), else 1. Such a run records the
/// count (ReplayEnvironment::linear_pieces) and trains OpenBLAS on one
/// thread: its bits then do not depend on the threads that replay it,
/// and its products scale over two threads where OpenBLAS's own threads
/// did not (pieced_linear.h).
int training_linear_pieces(const NetworkImpl& net, int threads);

/// The options a run directory's manifest records, as train_run would take
/// them (steps = the recorded N, whether N came from --steps or --epochs).
RunOptions run_options_from_manifest(const Manifest& manifest, const std::string& run_dir);

/// Continues the interrupted run in run_dir from its last complete checkpoint
/// (the last one the manifest lists; files written after it are discarded),
/// with every option taken from the manifest and the run's thread count. The
/// finished run is byte for byte the run an uninterrupted train_run would have
/// written, except timing.json. Throws Error when run_dir is not a run, is
/// complete or diverged, fails validation, or was written by another
/// pathkernel or LibTorch version, or when `threads` (0: unspecified) is not
/// the run's thread count. `progress`: progress bar on stderr.
RunResult resume_run(const std::string& run_dir, bool progress, int threads = 0);

}  // namespace pathkernel
