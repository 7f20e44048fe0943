// Writing a run directory during training.
#include "pathkernel/run_writer.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "pathkernel/batch_statistics.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/npy.h"

namespace pathkernel {

namespace fs = std::filesystem;

namespace {
std::string step_name(const std::string& prefix, int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%08lld", static_cast<long long>(step));
  return prefix + buf + ".npy";
}
}  // namespace

int64_t default_checkpoint_every(int64_t steps) {
  return std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(steps))));
}

RunWriter::RunWriter(std::string run_dir, Manifest base, bool force)
    : dir_(std::move(run_dir)), manifest_(std::move(base)) {
  PK_CHECK(manifest_.checkpoint_every >= 1,
           "checkpoint spacing must be >= 1 (got " << manifest_.checkpoint_every << ")");
  if (fs::exists(dir_)) {
    PK_CHECK(fs::is_directory(dir_), "run path '" << dir_ << "' exists and is not a directory");
    bool empty = fs::is_empty(dir_);
    if (!empty) {
      PK_CHECK(force, "run directory '" << dir_ << "' already exists; overwrite it only when forced");
      PK_CHECK(fs::exists(fs::path(dir_) / "manifest.json"),
               "run directory '" << dir_ << "' is not empty and holds no manifest.json, so it is not "
                                 << "a pathkernel run; refusing to delete it even when forced");
      fs::remove_all(dir_);
    }
  }
  for (const char* sub : {"", "checkpoints", "optimizer", "batches"}) {
    std::error_code ec;
    fs::create_directories(fs::path(dir_) / sub, ec);
    PK_CHECK(!ec, "cannot create run directory '" << (fs::path(dir_) / sub).string() << "': " << ec.message());
  }
}

RunWriter RunWriter::reopen(std::string run_dir, Manifest m) {
  PK_CHECK(!m.checkpoints.empty() && m.checkpoints.back().step == m.steps,
           "run '" << run_dir << "' does not end at a checkpoint (steps " << m.steps << ")");
  RunWriter w;
  w.dir_ = std::move(run_dir);
  w.manifest_ = std::move(m);
  w.segment_start_ = w.manifest_.steps;
  // metrics.csv is written just before the manifest, so it may hold rows past
  // the last checkpoint: keep the header and the rows of steps < N.
  const fs::path metrics = fs::path(w.dir_) / w.manifest_.metrics;
  const std::vector<MetricsRow> rows =
      fs::exists(metrics) ? read_metrics_csv(metrics.string()) : std::vector<MetricsRow>{};
  int64_t expected = 0;
  for (; expected < w.manifest_.steps && expected < static_cast<int64_t>(rows.size()); ++expected) {
    const MetricsRow& row = rows[static_cast<size_t>(expected)];
    PK_CHECK(row.step == expected, "run '" << w.dir_ << "': metrics.csv row " << expected + 1 << " is step "
                                           << row.step << ", expected step " << expected);
    w.metrics_.push_back(row);
  }
  PK_CHECK(expected == w.manifest_.steps,
           "run '" << w.dir_ << "': metrics.csv has " << expected << " step rows, the last checkpoint is at step "
                   << w.manifest_.steps);
  // Remove leftovers: temporary files, and path files the manifest does not list.
  std::set<std::string> listed;
  for (const CheckpointRecord& ck : w.manifest_.checkpoints) {
    listed.insert(ck.weights.file);
    for (const auto& [_, f] : ck.optimizer_buffers) listed.insert(f.file);
    if (!ck.module_buffers.file.empty()) listed.insert(ck.module_buffers.file);
  }
  for (const BatchRecord& b : w.manifest_.batches) listed.insert(b.indices.file);
  std::vector<fs::path> stale;
  for (const auto& e : fs::recursive_directory_iterator(w.dir_)) {
    if (!e.is_regular_file()) continue;
    const std::string rel = fs::relative(e.path(), w.dir_).string();
    const std::string top = rel.substr(0, rel.find('/'));
    bool in_path_dir = top == "checkpoints" || top == "optimizer" || top == "batches";
    if (rel.find(".tmp.") != std::string::npos || (in_path_dir && listed.count(rel) == 0)) {
      stale.push_back(e.path());
    }
  }
  for (const fs::path& p : stale) {
    std::error_code ec;
    fs::remove(p, ec);
    PK_CHECK(!ec, "cannot remove the leftover '" << p.string() << "' of the interrupted run: " << ec.message());
  }
  return w;
}

void RunWriter::add_module(const std::string& source) {
  const std::string bytes = read_file(source);
  const std::string file = "model.pt";
  write_file_atomic((fs::path(dir_) / file).string(), bytes);
  manifest_.module = {file, static_cast<int64_t>(bytes.size()), crc32_of(bytes)};
  manifest_.model_spec = "torchscript:" + file;
}

void RunWriter::add_loss_weights(const torch::Tensor& weights) {
  manifest_.loss_weights =
      write_record("loss_weights.npy", checked_loss_weights(weights, manifest_.num_train, "loss weights"));
}

FileRecord RunWriter::write_record(const std::string& relative, const torch::Tensor& tensor) {
  const NpyFile npy = npy_file(tensor);
  write_npy_file((fs::path(dir_) / relative).string(), npy);
  return {relative, static_cast<int64_t>(npy.size()), npy.crc32()};
}

void RunWriter::write_checkpoint(int64_t step, Network& net, torch::optim::Optimizer& optimizer) {
  CheckpointRecord ck;
  ck.step = step;
  ck.weights = write_record(step_name("checkpoints/w_", step), flatten_parameters(net).to(torch::kFloat64));
  OptimizerState state = export_state(optimizer, manifest_.optimizer.name, net->parameters());
  ck.optimizer_step = state.step;
  for (const auto& [name, buffer] : state.buffers) {
    ck.optimizer_buffers[name] = write_record(step_name("optimizer/" + name + "_", step), buffer.to(torch::kFloat64));
  }
  if (net->batch_statistics()) {
    ck.module_buffers = write_record(step_name("checkpoints/mu_", step), flatten_buffers(net));
  }
  manifest_.checkpoints.push_back(std::move(ck));
}

void RunWriter::flush(int64_t step) {
  if (!pending_batches_.empty()) {
    int64_t width = 0;
    for (auto& b : pending_batches_) width = std::max(width, b.size(0));
    torch::Tensor rows = torch::full({static_cast<int64_t>(pending_batches_.size()), width}, -1, torch::kInt32);
    for (size_t i = 0; i < pending_batches_.size(); ++i) {
      rows[i].narrow(0, 0, pending_batches_[i].size(0)).copy_(pending_batches_[i]);
    }
    BatchRecord br;
    br.first_step = segment_start_;
    br.steps = static_cast<int64_t>(pending_batches_.size());
    br.indices = write_record(step_name("batches/b_", segment_start_), rows);
    manifest_.batches.push_back(std::move(br));
    pending_batches_.clear();
  }
  segment_start_ = step;
  manifest_.steps = step;
  write_file_atomic((fs::path(dir_) / manifest_.metrics).string(), metrics_csv(metrics_));
  manifest_.save(dir_);
}

void RunWriter::on_start(Network& net, torch::optim::Optimizer& optimizer,
                         const std::vector<double>& learning_rates) {
  manifest_.learning_rates = learning_rates;
  manifest_.status = "running";
  write_checkpoint(0, net, optimizer);
  flush(0);
}

void RunWriter::on_step(int64_t step, const torch::Tensor& batch, const StepResult& result,
                        Network& net, torch::optim::Optimizer& optimizer) {
  if (batch.defined()) pending_batches_.push_back(batch.to(torch::kInt32));
  metrics_.push_back({step, manifest_.learning_rates[step], result.loss,
                      static_cast<double>(result.correct) / static_cast<double>(result.count)});
  if ((step + 1) % manifest_.checkpoint_every == 0) {
    write_checkpoint(step + 1, net, optimizer);
    flush(step + 1);
  }
}

void RunWriter::on_stop(int64_t steps, const std::string& status, const std::string& message,
                        Network& net, torch::optim::Optimizer& optimizer) {
  manifest_.status = status;
  manifest_.message = message;
  int64_t last = manifest_.checkpoints.back().step;
  bool finite = torch::isfinite(flatten_parameters(net)).all().item<bool>();
  if (last != steps && finite) {
    write_checkpoint(steps, net, optimizer);
    flush(steps);
  } else if (last != steps) {
    // w_steps is not finite: the path stays valid up to the last checkpoint.
    pending_batches_.clear();
    manifest_.message += "; parameters were not finite at step " + std::to_string(steps) +
                         ", so the path ends at the last checkpoint, step " + std::to_string(last);
    steps = last;
  }
  manifest_.steps = steps;
  manifest_.learning_rates.resize(static_cast<size_t>(steps));
  write_file_atomic((fs::path(dir_) / manifest_.metrics).string(), metrics_csv(metrics_));
  manifest_.save(dir_);
}

void RunWriter::on_summary(const TrainSummary& summary) {
  manifest_.summary = nlohmann::ordered_json{{"final_batch_loss", summary.final_loss},
                                             {"train_accuracy", summary.train_accuracy},
                                             {"test_accuracy", summary.test_accuracy}};
}

}  // namespace pathkernel
