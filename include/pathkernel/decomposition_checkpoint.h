// Checkpoints of a long decomposition (explain): its accumulators saved now
// and then, so that an interrupted job rerun with the same arguments
// continues where it stopped instead of starting over, and ends with the
// same bits as an uninterrupted one.
//
// decompose() walks the path one chunk of test points at a time (forward for
// gd and sgd: a single chunk position 0; in reverse for optimizers with a
// buffer). A checkpoint holds the accumulators after `steps_done` steps of
// the chunk starting at `chunk_start` (every earlier chunk finished), plus the
// reverse walk's test-side accumulator Ã of the current chunk.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pathkernel/decomposition_result.h"

namespace pathkernel {

/// Where a decomposition stands. Shapes as in Decomposition.
struct DecompositionProgress {
  int64_t chunk = 0;        ///< test points per chunk (a resume must use the same)
  int64_t chunk_start = 0;  ///< first test point of the chunk in progress
  int64_t steps_done = 0;   ///< steps of that chunk finished (forward: s < steps_done; reverse: s >= N - steps_done)
  Decomposition partial;    ///< contributions, regularization, rounding, kernel and the counters so far
  /// Forward, saved inside a block of steps (step_blocks()): that block's
  /// sums so far (contributions, regularization, rounding, gap_abs, kernel),
  /// not yet in `partial`; undefined at a block's end and in reverse.
  Decomposition block;
  torch::Tensor acc;        ///< reverse only: Ã of the chunk in progress, [nc, K, P]; undefined forward
};

/// Where decompose() keeps its progress.
class DecompositionCheckpoint {
 public:
  virtual ~DecompositionCheckpoint() = default;
  /// The saved progress to continue from, or null to start over.
  virtual const DecompositionProgress* resume_point() = 0;
  /// Whether a save is due now (called after every step).
  virtual bool due() = 0;
  virtual void save(const DecompositionProgress& progress) = 0;
};

/// Progress kept in a directory: DIR/state.json (the arguments, the position,
/// the counters and each tensor file's size and CRC-32, written last) and
/// DIR/NAME_SEQ.npy tensors, all written atomically; a new state's files are
/// complete before state.json names them, and the old ones are removed after.
class DirectoryCheckpoint : public DecompositionCheckpoint {
 public:
  /// `arguments`: everything the result depends on; a saved state made with
  /// other arguments (or damaged) is set aside with a message and the job
  /// starts over. `every_seconds`: spacing of the saves (0: after every step).
  DirectoryCheckpoint(std::string dir, nlohmann::ordered_json arguments, double every_seconds);

  const DecompositionProgress* resume_point() override;
  bool due() override;
  void save(const DecompositionProgress& progress) override;
  /// Removes the directory once the job's outputs are written.
  void finish();
  /// What resume_point() found, for the user: "" (nothing saved), or a sentence.
  const std::string& message() const { return message_; }

 private:
  std::string dir_;
  nlohmann::ordered_json arguments_;
  double every_seconds_;
  double last_save_;
  int64_t sequence_ = 0;
  bool loaded_ = false;
  std::unique_ptr<DecompositionProgress> saved_;
  std::string message_;
};

}  // namespace pathkernel
