// The run directory writer: records a training run as it happens.
//
// Layout of RUN/:
//   manifest.json                 the index (see manifest.h), rewritten at each checkpoint
//   checkpoints/w_SSSSSSSS.npy    w_s, float64 [P], every `checkpoint_every` steps and at N
//   optimizer/NAME_SSSSSSSS.npy   optimizer buffers at those steps, float64 [P]
//   batches/b_SSSSSSSS.npy        int32 [steps, max batch] indices of each segment's steps
//   metrics.csv                   step,lr,loss,batch_accuracy
// Every file is written atomically, and the manifest last, so a run
// interrupted at any moment reads as valid up to its last checkpoint.
#pragma once

#include <string>
#include <vector>

#include "pathkernel/manifest.h"
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

  void on_start(Network& net, torch::optim::Optimizer& optimizer,
                const std::vector<double>& learning_rates) override;
  void on_step(int64_t step, const torch::Tensor& batch, const StepResult& result, Network& net,
               torch::optim::Optimizer& optimizer) override;
  void on_stop(int64_t steps, const std::string& status, const std::string& message, Network& net,
               torch::optim::Optimizer& optimizer) override;

  /// Records the training summary in the manifest and saves it.
  void set_summary(const nlohmann::ordered_json& summary);

  const Manifest& manifest() const { return manifest_; }

 private:
  void write_checkpoint(int64_t step, Network& net, torch::optim::Optimizer& optimizer);
  void flush(int64_t step);  // batch segment + metrics + manifest, for a checkpoint at `step`
  FileRecord write_record(const std::string& relative, const torch::Tensor& tensor);

  std::string dir_;
  Manifest manifest_;
  int64_t segment_start_ = 0;
  std::vector<torch::Tensor> pending_batches_;
  std::string metrics_;
};

}  // namespace pathkernel
