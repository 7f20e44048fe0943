// Training: the loop over torch::optim, learning-rate schedules, batch
// sampling and divergence checks. What is recorded is decided by a
// TrainingObserver (the run directory writer in path.h implements one), so
// training knows nothing of files.
//
// take_step() is the single definition of one optimisation step; exact replay
// calls the same function, which is what makes replay bit for bit.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pathkernel/dataset.h"
#include "pathkernel/loss.h"
#include "pathkernel/model.h"
#include "pathkernel/optimizer.h"

namespace pathkernel {

/// Names of learning-rate schedules: constant, step, cosine, linear, warmup.
std::vector<std::string> schedule_names();

/// Per-step learning rates, shape [steps], for a schedule spec:
///   constant                lr
///   step[:EVERY[:GAMMA]]    lr GAMMA^floor(s / EVERY)   (defaults: EVERY = ceil(N/3), GAMMA = 0.1)
///   cosine                  lr (1 + cos(pi s / N)) / 2
///   linear                  lr (1 - s / N)
///   warmup[:STEPS]          lr min(1, (s+1) / STEPS)    (linear warm-up; default STEPS = max(1, N/10))
/// Throws Error naming a bad spec.
std::vector<double> learning_rate_schedule(const std::string& schedule, double lr, int64_t steps);

struct TrainOptions {
  OptimizerOptions optimizer;
  int64_t steps = -1;      ///< number of steps; -1: derive from epochs
  int64_t epochs = -1;     ///< used when steps == -1; both -1: one epoch
  int64_t batch = -1;      ///< minibatch size; 0: the whole training set; -1: 100, or the whole set for gd
  uint64_t seed = 0;       ///< batch sampling seed
  std::string schedule = "constant";
  /// Training stops with an error when the loss is not finite or exceeds
  /// divergence_factor * max(1, first loss).
  double divergence_factor = 1e3;
  bool progress = true;    ///< progress bar on stderr
  /// Per-training-point loss weights c, float64 [M]: the batch loss is
  /// (1/|B_s|) Σ_{i∈B_s} c_i ℓ_i. Undefined: all 1 (the plain mean).
  torch::Tensor loss_weights;

  /// These options with the defaults filled in: the optimizer's learning
  /// rate, the batch size and one epoch when neither steps nor epochs is set.
  TrainOptions resolved() const;
  /// Checks ranges and conflicts of resolved(); `num_train` is M. Throws Error.
  void validate(int64_t num_train) const;
  /// The number of steps resolved() means for M training points.
  int64_t total_steps(int64_t num_train) const;
};

/// Deterministic minibatches: each epoch a seeded permutation of [0, M) cut
/// into batches of `batch` (the last one may be shorter). batch == 0 or >= M
/// means the full batch, returned as an undefined tensor.
class BatchSampler {
 public:
  BatchSampler(int64_t num_train, int64_t batch, uint64_t seed);
  /// Indices (int64, [B_s]) of step s, or undefined for the full batch.
  torch::Tensor batch(int64_t step);
  int64_t steps_per_epoch() const { return steps_per_epoch_; }

 private:
  int64_t num_train_, batch_, steps_per_epoch_;
  uint64_t seed_;
  int64_t epoch_ = -1;
  torch::Tensor permutation_;
};

/// The outcome of one step.
struct StepResult {
  double loss = 0;       ///< mean loss on the batch at w_s (before the update)
  int64_t correct = 0;   ///< batch points classified correctly at w_s
  int64_t count = 0;     ///< batch size
  bool taken = false;    ///< false if the loss was rejected and no update made
};

/// The batch of one optimisation step and what it is trained with.
struct StepBatch {
  torch::Tensor x;        ///< inputs [B, ...]
  torch::Tensor y;        ///< labels or targets [B]
  torch::Tensor weights;  ///< the batch's loss weights [B] (undefined: all 1; training_loss)
  int64_t step = 0;       ///< the step's index: it seeds the step's dropout masks (dropout.h)
  double lr = 0;          ///< the step's learning rate
  double scale = 1;       ///< the loss is multiplied by this (retraining with points removed, kept weights)
  double clip = 1;        ///< the gradients are multiplied by this before the update (a recorded loop's clipping)
};

/// One optimisation step on `batch`: forward, loss, backward,
/// optimizer.step(), with the step's dropout masks on for exactly this
/// (DropoutStep(net's seed, batch.step)); gradients are multiplied by
/// batch.clip before the optimizer's step when it is not 1. If `accept(loss)` returns false the
/// update is not made. Gradients are reset to undefined before backward, so
/// training and replay accumulate identically. The loss reported is the
/// weighted, scaled one.
StepResult take_step(Network& net, torch::optim::Optimizer& optimizer, const StepBatch& batch,
                     const std::function<bool(double)>& accept = nullptr);

/// Summary of a finished training run.
struct TrainSummary {
  int64_t steps = 0;
  double final_loss = 0;       ///< mean loss of the last step's batch
  double train_accuracy = 0;   ///< on the whole training set at w_N
  double test_accuracy = 0;    ///< on the test set at w_N; NaN when there are no test points
  double seconds = 0;          ///< wall-clock time of this call (of the resumed part only, when resuming)
};

/// Receives the training run as it happens.
class TrainingObserver {
 public:
  virtual ~TrainingObserver() = default;
  /// Before the first step; net holds w_0.
  virtual void on_start(Network& net, torch::optim::Optimizer& optimizer,
                        const std::vector<double>& learning_rates) = 0;
  /// After step s was taken; net holds w_{s+1}. batch undefined = full batch.
  virtual void on_step(int64_t step, const torch::Tensor& batch, const StepResult& result,
                       Network& net, torch::optim::Optimizer& optimizer) = 0;
  /// When training completes, just before on_stop(.., "complete", ..).
  virtual void on_summary(const TrainSummary& /*summary*/) {}
  /// At the end; net holds w_{steps}. status: "complete" or "diverged".
  virtual void on_stop(int64_t steps, const std::string& status, const std::string& message,
                       Network& net, torch::optim::Optimizer& optimizer) = 0;
};

/// Where an interrupted run continues: the state after `step` steps, read
/// back from a checkpoint. Everything else training needs (batches, learning
/// rates) is a function of the options, so continuing from here takes the
/// same steps as the uninterrupted run.
struct ResumePoint {
  int64_t step = 0;            ///< steps already taken; net holds w_step
  OptimizerState state;        ///< optimizer state at w_step, in the training dtype
  double first_loss = std::numeric_limits<double>::quiet_NaN();  ///< step 0's loss (the divergence reference)
  double last_loss = 0;        ///< step `step - 1`'s loss
};

/// Trains net on (x_train, y_train), reporting to observer. Throws Error when
/// the loss diverges (after observer->on_stop(.., "diverged", ..)). With
/// `resume`, net must hold w_{resume->step}; training continues from there
/// and observer.on_start is not called (the observer already holds the run).
TrainSummary train(Network& net, const torch::Tensor& x_train, const torch::Tensor& y_train,
                   const torch::Tensor& x_test, const torch::Tensor& y_test,
                   const TrainOptions& options, TrainingObserver& observer,
                   const ResumePoint* resume = nullptr);

/// The same on `data`'s splits. Inputs held as codes
/// (DataOptions::coded_inputs) are decoded a batch (or an accuracy chunk) at
/// a time, and the training split whole once for a full batch: the same bits
/// as the splits' tensors give.
TrainSummary train(Network& net, const Dataset& data, const TrainOptions& options, TrainingObserver& observer,
                   const ResumePoint* resume = nullptr);

/// Accuracy of net on (x, y), evaluated in chunks without gradients.
double accuracy(Network& net, const torch::Tensor& x, const torch::Tensor& y);

}  // namespace pathkernel
