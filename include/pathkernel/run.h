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
  bool zero_last_layer = false;
  uint64_t seed = 0;               ///< initialisation and batch sampling seed
  TrainOptions train;
  int64_t checkpoint_every = 0;    ///< 0: default_checkpoint_every(N)
  std::string out;                 ///< the run directory
  bool force = false;              ///< overwrite an existing run directory
};

struct RunResult {
  Manifest manifest;
  TrainSummary summary;
};

/// Trains and records. Throws Error on bad options, bad data, an existing run
/// directory without `force`, or divergence (the run is then kept, valid up to
/// the last good step).
RunResult train_run(const RunOptions& options);

}  // namespace pathkernel
