// The run directory writer: records a training run as it happens.
//
// Layout of RUN/:
//   manifest.json                 the index (see manifest.h), rewritten at each checkpoint
//   checkpoints/w_SSSSSSSS.npy    w_s, float64 [P], every `checkpoint_every` steps and at N
//   optimizer/NAME_SSSSSSSS.npy   optimizer buffers at those steps, float64 [P]
//   batches/b_SSSSSSSS.npy        int32 [steps, max batch] indices of each segment's steps
//   metrics.csv                   step,lr,loss,batch_accuracy (metrics_csv.h)
//   model.pt                      a TorchScript model's module, copied (see add_module)
//   loss_weights.npy              per-training-point loss weights, float64 [M] (see add_loss_weights)
// Every file is written atomically, and the manifest last, so a run
// interrupted at any moment reads as valid up to its last checkpoint, and
// reopen() continues it from there (see run.h, resume_run).
#pragma once

#include <string>
#include <vector>

#include "pathkernel/manifest.h"
#include "pathkernel/metrics_csv.h"
#include "pathkernel/trainer.h"

namespace pathkernel {

/// Default checkpoint spacing for N steps: round(sqrt(N)), at least 1.
int64_t default_checkpoint_every(int64_t steps);

class RunWriter : public TrainingObserver {
 public:
  /// `base` holds everything but the path (data, model, optimizer, training
  /// fields). Refuses an existing non-empty run_dir unless `force`, and never
  /// deletes a non-empty directory that is not a pathkernel run.
  RunWriter(std::string run_dir, Manifest base, bool force);

  /// Reopens the interrupted run in run_dir at its last checkpoint, step
  /// `m.steps` (`m` loaded from run_dir and validated): keeps the metrics rows
  /// of steps before it and removes what an interruption left behind (the
  /// temporary files of unfinished writes, and path files written after the
  /// last checkpoint but not yet in the manifest). Training then continues
  /// with on_step(m.steps, ..), without on_start.
  static RunWriter reopen(std::string run_dir, Manifest m);

  /// Copies a TorchScript model's module file into the run as model.pt and
  /// records it (size, CRC-32) with the model spec "torchscript:model.pt",
  /// so the run needs nothing outside its directory. Before training starts.
  void add_module(const std::string& source);

  /// Writes per-training-point loss weights (float64 [M]) as
  /// loss_weights.npy and records them. Before training starts.
  void add_loss_weights(const torch::Tensor& weights);

  void on_start(Network& net, torch::optim::Optimizer& optimizer,
                const std::vector<double>& learning_rates) override;
  void on_step(int64_t step, const torch::Tensor& batch, const StepResult& result, Network& net,
               torch::optim::Optimizer& optimizer) override;
  /// Keeps the final loss and accuracies for the manifest's `summary` (not
  /// the seconds: the manifest holds no wall-clock times, so a resumed run's
  /// manifest is byte for byte an uninterrupted one's).
  void on_summary(const TrainSummary& summary) override;
  void on_stop(int64_t steps, const std::string& status, const std::string& message, Network& net,
               torch::optim::Optimizer& optimizer) override;

  const Manifest& manifest() const { return manifest_; }

 private:
  RunWriter() = default;
  void write_checkpoint(int64_t step, Network& net, torch::optim::Optimizer& optimizer);
  void flush(int64_t step);  // batch segment + metrics + manifest, for a checkpoint at `step`
  FileRecord write_record(const std::string& relative, const torch::Tensor& tensor);

  std::string dir_;
  Manifest manifest_;
  int64_t segment_start_ = 0;
  std::vector<torch::Tensor> pending_batches_;
  std::vector<MetricsRow> metrics_;
};

}  // namespace pathkernel
