// Counterfactual retraining of a recorded run: same w_0, batches, learning
// rates and optimizer, with points removed or labels changed.
#include "pathkernel/retrain.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "pathkernel/context.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/loss.h"
#include "pathkernel/npy.h"
#include "pathkernel/progress.h"
#include "pathkernel/trainer.h"

namespace pathkernel {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

/// CRC-32 of a tensor's bytes, for the work file's key.
uint32_t tensor_crc(const torch::Tensor& t) {
  if (!t.defined()) return 0;
  const torch::Tensor c = t.contiguous();
  return crc32_update(0, c.data_ptr(), static_cast<size_t>(c.numel() * c.element_size()));
}

}  // namespace

RemovalScaling parse_removal_scaling(const std::string& name) {
  if (name == "reduced") return RemovalScaling::Reduced;
  if (name == "kept") return RemovalScaling::Kept;
  PK_THROW("unknown removal scaling '" << name << "': expected reduced or kept");
}

std::string removal_scaling_name(RemovalScaling scaling) {
  return scaling == RemovalScaling::Reduced ? "reduced" : "kept";
}

RetrainJob removal_job(int64_t num_train, const torch::Tensor& removed) {
  PK_CHECK(removed.dim() == 1 && removed.scalar_type() == torch::kLong,
           "removed training points must be an int64 list (got " << removed.sizes() << " " << removed.scalar_type()
                                                                 << ")");
  if (removed.numel() > 0) {
    PK_CHECK(removed.min().item<int64_t>() >= 0 && removed.max().item<int64_t>() < num_train,
             "removed training points must lie in [0, " << num_train << ") (got " << removed.min().item<int64_t>()
                                                        << " .. " << removed.max().item<int64_t>() << ")");
  }
  RetrainJob job;
  job.keep = torch::ones({num_train}, torch::kBool);
  job.keep.index_fill_(0, removed, false);
  return job;
}

Retrainer::Retrainer(PathReader& reader) : reader_(reader), num_train_(reader.manifest().num_train) {
  PK_CHECK(!reader.manifest().recorded,
           "run '" << reader.dir() << "' was recorded from a training loop: retraining it needs the loop itself "
                                      "(pathkernel retrains only runs it trained, with their optimizer and batches)");
  w0_ = reader.checkpoint(0);
  batches_.reserve(static_cast<size_t>(reader.steps()));
  for (int64_t s = 0; s < reader.steps(); ++s) batches_.push_back(reader.batch(s));
}

void Retrainer::check(const RetrainJob& job) const {
  if (job.keep.defined()) {
    PK_CHECK(job.keep.dim() == 1 && job.keep.size(0) == num_train_ && job.keep.scalar_type() == torch::kBool,
             "retraining: the points kept must be a bool mask [" << num_train_ << "] (got " << job.keep.sizes()
                                                                 << " " << job.keep.scalar_type() << ")");
  }
  if (job.labels.defined()) {
    PK_CHECK(!is_regression_target(reader_.held_dataset().y_train),
             "retraining: other labels need class labels; the run trains on regression targets");
    const int64_t K = reader_.manifest().num_classes;
    PK_CHECK(job.labels.dim() == 1 && job.labels.size(0) == num_train_ && job.labels.scalar_type() == torch::kLong,
             "retraining: labels must be int64 [" << num_train_ << "] (got " << job.labels.sizes() << " "
                                                  << job.labels.scalar_type() << ")");
    PK_CHECK(job.labels.min().item<int64_t>() >= 0 && job.labels.max().item<int64_t>() < K,
             "retraining: labels must lie in [0, " << K << ")");
  }
  if (job.weights.defined()) checked_loss_weights(job.weights, num_train_, "retraining", true);
}

torch::Tensor Retrainer::train(const RetrainJob& job, RemovalScaling scaling, Network& net) const {
  torch::AutoGradMode training_needs_gradients(true);
  const Manifest& m = reader_.manifest();
  const Dataset& data = reader_.held_dataset();  // the training inputs read by batch (train_inputs)
  const torch::Dtype dtype = parse_dtype(m.dtype);
  set_flat_parameters(net, w0_.to(dtype));
  std::vector<torch::Tensor> params = net->parameters();
  auto optimizer = make_optimizer(m.optimizer, params);
  const torch::Tensor& y = job.labels.defined() ? job.labels : data.y_train;
  const torch::Tensor weights = job.weights.defined() ? job.weights.to(torch::kFloat64) : reader_.loss_weights();
  const torch::Tensor all = job.keep.defined() ? torch::arange(num_train_, torch::kLong) : torch::Tensor();
  for (size_t s = 0; s < batches_.size(); ++s) {
    torch::Tensor idx = batches_[s];
    const int64_t full = idx.defined() ? idx.size(0) : num_train_;
    if (job.keep.defined()) {
      const torch::Tensor rows = idx.defined() ? idx : all;
      idx = rows.masked_select(job.keep.index_select(0, rows));
      if (idx.numel() == 0) continue;  // an empty batch: no step
    }
    const torch::Tensor xb = reader_.train_inputs(idx);
    const torch::Tensor yb = idx.defined() ? y.index_select(0, idx) : y;
    const torch::Tensor wb = weights.defined() ? (idx.defined() ? weights.index_select(0, idx) : weights) : weights;
    const bool scaled = scaling == RemovalScaling::Kept && yb.size(0) != full;
    // Kept weights: the points left keep the weight 1/|B_s| of the full batch,
    // so the batch's mean loss is scaled by b/|B_s|.
    const double scale = scaled ? static_cast<double>(yb.size(0)) / static_cast<double>(full) : 1.0;
    const StepResult r = take_step(net, *optimizer, {xb, yb, wb, static_cast<int64_t>(s), m.learning_rates[s], scale});
    PK_CHECK(std::isfinite(r.loss), "retraining diverged at step " << s << ": loss " << r.loss);
  }
  return flatten_parameters(net).to(torch::kFloat64);
}

torch::Tensor Retrainer::final_weights(const RetrainJob& job, RemovalScaling scaling) const {
  check(job);
  Network net = build_network(reader_.manifest().network_options());
  return train(job, scaling, net);
}

torch::Tensor Retrainer::outputs(const std::vector<RetrainJob>& jobs, const torch::Tensor& x,
                                 const RetrainOptions& options) const {
  for (const RetrainJob& job : jobs) check(job);
  PK_CHECK(options.threads_per_retrain >= 1,
           "retraining: threads per retraining must be >= 1 (got " << options.threads_per_retrain << ")");
  PK_CHECK(options.workers >= 0, "retraining: workers must be >= 0 (got " << options.workers << ")");
  const Manifest& m = reader_.manifest();
  const int64_t J = static_cast<int64_t>(jobs.size()), n = x.size(0), K = m.num_classes;
  const torch::Dtype dtype = parse_dtype(m.dtype);
  const torch::Tensor x_run = x.to(dtype).contiguous();
  torch::Tensor result = torch::full({J, n, K}, std::nan(""), torch::kFloat64);

  // Everything the outputs depend on; saved work made otherwise is not reused.
  uint32_t jobs_crc = 0;
  for (const RetrainJob& job : jobs) {
    jobs_crc = crc32_of(std::to_string(jobs_crc) + ":" + std::to_string(tensor_crc(job.keep)) + ":" +
                        std::to_string(tensor_crc(job.labels)) + ":" + std::to_string(tensor_crc(job.weights)));
  }
  const ojson key{{"manifest_crc32", reader_.manifest_crc32()},
                  {"scaling", removal_scaling_name(options.scaling)},
                  {"threads_per_retrain", options.threads_per_retrain},
                  {"jobs", J},
                  {"jobs_crc32", jobs_crc},
                  {"inputs_crc32", tensor_crc(x_run)}};
  const std::string npy_file = options.work_file + ".npy", json_file = options.work_file + ".json";
  if (!options.work_file.empty() && fs::exists(json_file) && fs::exists(npy_file)) {
    try {
      const ojson saved = ojson::parse(read_file(json_file));
      torch::Tensor prior = read_npy(npy_file);
      if (saved.at("key") == key && prior.sizes() == result.sizes() && prior.scalar_type() == torch::kFloat64) {
        result = prior;
      }
    } catch (const std::exception&) {
      // Damaged work: start over.
    }
  }
  std::vector<int64_t> pending;
  for (int64_t j = 0; j < J; ++j) {
    if (!torch::isfinite(result[j]).all().item<bool>()) pending.push_back(j);
  }
  auto save = [&] {
    if (options.work_file.empty()) return;
    fs::create_directories(fs::path(options.work_file).parent_path());
    write_npy(npy_file, result);
    write_file_atomic(json_file, ojson{{"key", key}}.dump(2) + "\n");
  };

  ProgressBar bar(J, options.label, options.progress);
  int64_t done = J - static_cast<int64_t>(pending.size());
  if (done > 0) bar.update(done, "resumed");
  const int hw = hardware_threads();
  const int workers = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(options.workers == 0 ? hw : options.workers,
                                             static_cast<int64_t>(pending.size()))));
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mutex;
  std::exception_ptr failure;
  auto last_save = std::chrono::steady_clock::now();
  const int previous_threads = current_threads();
  auto work = [&] {
    try {
      // Thread counts are per thread under OpenMP: set this one's.
      set_threads(options.threads_per_retrain);
      torch::NoGradGuard outputs_need_no_graph_but_training_does;
      Network net = build_network(m.network_options());
      while (!stop) {
        const size_t k = next.fetch_add(1);
        if (k >= pending.size()) break;
        const int64_t j = pending[k];
        train(jobs[static_cast<size_t>(j)], options.scaling, net);
        const torch::Tensor f = net->forward(x_run).to(torch::kFloat64);
        std::lock_guard<std::mutex> lock(mutex);
        result[j].copy_(f);
        bar.update(++done);
        const auto now = std::chrono::steady_clock::now();
        if (std::chrono::duration<double>(now - last_save).count() >= options.save_seconds) {
          save();
          last_save = now;
        }
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex);
      if (!failure) failure = std::current_exception();
      stop = true;
    }
  };
  if (!pending.empty()) {
    std::vector<std::thread> threads;
    for (int t = 1; t < workers; ++t) threads.emplace_back(work);
    work();
    for (std::thread& t : threads) t.join();
  }
  set_threads(previous_threads);
  {
    std::lock_guard<std::mutex> lock(mutex);
    save();
  }
  if (failure) std::rethrow_exception(failure);
  bar.finish();
  return result;
}

}  // namespace pathkernel
