// Retraining a recorded run counterfactually: from the same w_0, with the
// same batches (as the batch log records them), learning rates, optimizer
// and loss, but with chosen training points removed from the batches they
// were in, or with other labels. This is the ground truth the attribution
// metrics compare against (evaluate.h). Nothing is written to the run
// directory; a retraining keeps only its final weights or outputs.
//
// Removing point i from a batch B_s leaves B_s \ {i}. How the remaining
// points' losses are weighted (RemovalScaling):
//   reduced  the mean over the |B_s| − 1 points left, exactly what training on
//            the data set without i does (the default);
//   kept     the sum over the points left divided by the original |B_s|: only
//            i's term is dropped, every other point keeps its weight. The
//            contribution C_i (decomposition.h) is the first-order part of
//            this change.
// A batch left empty is a step not taken (the learning-rate schedule keeps
// its place). Training points are rows of the run's training set, [M].
//
// Determinism: a retraining runs on one thread with `threads_per_retrain`
// intra-op threads, so its bits do not depend on how many run at once. A
// run trained with that thread count is reproduced bit for bit by the
// retraining that removes nothing (Retrainer::baseline_note says so or not).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pathkernel/path.h"

namespace pathkernel {

/// How the points left in a batch are weighted when some are removed.
enum class RemovalScaling { Reduced, Kept };
/// "reduced" or "kept"; throws Error listing them otherwise.
RemovalScaling parse_removal_scaling(const std::string& name);
std::string removal_scaling_name(RemovalScaling scaling);

/// One retraining.
struct RetrainJob {
  torch::Tensor keep;    ///< bool [M]: the points that stay in their batches; undefined: all of them
  torch::Tensor labels;  ///< int64 [M]: the labels trained on; undefined: the run's own
  torch::Tensor weights; ///< float64 [M]: the loss weights trained with; undefined: the run's own
};

/// A job that removes the training points `removed` (int64 [r]) from M.
RetrainJob removal_job(int64_t num_train, const torch::Tensor& removed);

struct RetrainOptions {
  RemovalScaling scaling = RemovalScaling::Reduced;
  int workers = 0;              ///< retrainings run at once (0: the hardware threads)
  int threads_per_retrain = 1;  ///< intra-op threads of each retraining
  bool progress = true;         ///< progress bar on stderr
  /// Finished retrainings are saved to WORK.npy and WORK.json (atomically,
  /// every save_seconds and at the end) and read back by a rerun of the same
  /// jobs; "" saves nothing.
  std::string work_file;
  double save_seconds = 30;
  std::string label = "retrain";  ///< the progress bar's label
};

class Retrainer {
 public:
  /// Reads w_0, the learning rates and every step's batch from the run.
  explicit Retrainer(PathReader& reader);

  /// w_N of one retraining, float64 [P], computed on the calling thread
  /// with the current intra-op thread count.
  torch::Tensor final_weights(const RetrainJob& job, RemovalScaling scaling) const;

  /// f(w'_N, x) of each job's retrained weights w'_N on inputs x
  /// [n, *input_shape] (in the run's dtype, as training computes outputs):
  /// float64 [J, n, K]. Jobs run `workers` at a time; an exception in any
  /// is rethrown here.
  torch::Tensor outputs(const std::vector<RetrainJob>& jobs, const torch::Tensor& x,
                        const RetrainOptions& options) const;

  /// M, K, N.
  int64_t num_train() const { return num_train_; }
  int64_t num_classes() const { return reader_.manifest().num_classes; }
  int64_t steps() const { return static_cast<int64_t>(batches_.size()); }

 private:
  void check(const RetrainJob& job) const;
  torch::Tensor train(const RetrainJob& job, RemovalScaling scaling, Network& net) const;

  PathReader& reader_;
  int64_t num_train_;
  torch::Tensor w0_;                   ///< float64 [P]
  std::vector<torch::Tensor> batches_; ///< per step: int64 [B_s], or undefined for the full batch
};

}  // namespace pathkernel
