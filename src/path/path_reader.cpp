// Reading a recorded path forward and in reverse by exact replay.
#include "pathkernel/path.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <thread>

#include "pathkernel/batch_statistics.h"
#include "pathkernel/blas_switch.h"
#include "pathkernel/context.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/npy.h"
#include "pathkernel/progress.h"
#include "pathkernel/threaded_products.h"
#include "pathkernel/trainer.h"
#include "ahead_queue.h"

namespace pathkernel {

namespace fs = std::filesystem;

namespace {

/// A replayed step's thread counts for its arithmetic, the caller's back
/// after it: OpenMP's, and OpenBLAS's, which a loop may have run at another
/// count than its torch (a replay at torch's count reproduced 0 of 8
/// replayed checkpoints of a user's CNN, all 8 at OpenBLAS's own).
/// OpenBLAS's count is the process's, so while a step runs it on several
/// threads, work the caller handed to other threads waits (BlasAlone; a
/// replay on several threads is never ahead).
class StepThreads {
 public:
  StepThreads(int openmp, int blas)
      : alone_(blas > 1 ? std::make_unique<BlasAlone>() : nullptr),
        openmp_(openmp),
        blas_(blas != openmp ? std::make_unique<BlasThreads>(blas) : nullptr) {}

 private:
  std::unique_ptr<BlasAlone> alone_;
  OpenMpThreads openmp_;
  std::unique_ptr<BlasThreads> blas_;
};

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.numel() * a.element_size()) == 0;
}

/// fn for each step of a replayed segment, last first, each freed once walked.
void walk_back(std::vector<PathStep>& segment, const std::function<void(const PathStep&)>& fn) {
  for (; !segment.empty(); segment.pop_back()) fn(segment.back());
}

/// Where this machine differs from the one that trained the run.
std::vector<std::string> machine_differences(const Manifest& m) {
  return m.environment.differences(ReplayEnvironment::current(m.threads));
}
}  // namespace

PathReader::PathReader(std::string run_dir) : dir_(std::move(run_dir)) {
  manifest_ = Manifest::load(dir_);
  validate_run(dir_, manifest_);
  DataOptions data = manifest_.data_options();
  data.coded_inputs = true;  // decoded a batch at a time (train_inputs), or whole by decoded_dataset()
  dataset_ = load_dataset(data);
  clip_ = read_clip_factors(dir_, manifest_);
  loss_weights_ = read_loss_weights(dir_, manifest_);
  PK_CHECK(pathkernel::train_count(dataset_) == manifest_.num_train,
           "run '" << dir_ << "': dataset '" << manifest_.data.spec << "' now has "
                   << pathkernel::train_count(dataset_) << " training points, the run used " << manifest_.num_train);
  uint32_t crc = training_data_crc32(dataset_);
  PK_CHECK(crc == manifest_.train_crc32,
           "run '" << dir_ << "': the training data of '" << manifest_.data.spec
                   << "' has changed since the run was trained (CRC-32 " << crc << ", recorded "
                   << manifest_.train_crc32 << ")");
  net_ = build_network(manifest_.network_options());
  PK_CHECK(parameter_count(net_) == manifest_.parameter_count,
           "run '" << dir_ << "': model '" << manifest_.model_spec << "' has "
                   << parameter_count(net_) << " parameters, the manifest says "
                   << manifest_.parameter_count);
  std::vector<ParamInfo> layout = parameter_layout(net_);
  for (size_t i = 0; i < layout.size(); ++i) {
    PK_CHECK(i < manifest_.parameters.size() && layout[i].name == manifest_.parameters[i].name &&
                 layout[i].shape == manifest_.parameters[i].shape,
             "run '" << dir_ << "': parameter " << i << " ('" << layout[i].name
                     << "') does not match the manifest's parameter list");
  }
  check_batch_statistics();
  // A float32 replay calls no float64 routine: the engine's take the widest kernels beside it.
  blas_kernels_for_replay(manifest_.dtype == "float32");
}

PathReader::PathReader(TwinOf twin)
    : dir_(twin.of.dir_),
      manifest_(twin.of.manifest_),
      dataset_(twin.of.dataset_),
      decoded_(twin.of.decoded_),
      net_(build_network(manifest_.network_options())),
      replay_team_(twin.of.replay_team_),
      one_thread_reproduces_(twin.of.one_thread_reproduces_),
      one_thread_differs_at_(twin.of.one_thread_differs_at_),
      clip_(twin.of.clip_),
      loss_weights_(twin.of.loss_weights_) {}

const torch::Tensor& PathReader::decoded_train_inputs() const {
  if (!dataset_.x_train_coded.defined()) return dataset_.x_train;
  std::call_once(decoded_->train_once, [&] {
    decoded_->x_train = dataset_.x_train_coded.all();
    decoded_->done = true;
  });
  return decoded_->x_train;
}

const Dataset& PathReader::decoded_dataset() const {
  if (!dataset_.x_train_coded.defined() && !dataset_.x_test_coded.defined()) return dataset_;
  std::call_once(decoded_->once, [&] {
    decoded_->data = dataset_;
    decoded_->data.x_train = decoded_train_inputs();
    decoded_->data.x_train_coded = CodedInputs();
    decoded_->data.x_test = pathkernel::test_inputs(dataset_, {});
    decoded_->data.x_test_coded = CodedInputs();
  });
  return decoded_->data;
}

torch::Tensor PathReader::train_inputs(const torch::Tensor& index) const {
  return index.defined() ? pathkernel::train_inputs(dataset_, index) : decoded_train_inputs();
}

torch::Tensor PathReader::train_rows(int64_t first, int64_t count) const {
  PK_CHECK(first >= 0 && count >= 0 && first + count <= train_count(),
           "training rows " << first << " .. " << first + count - 1 << ": expected rows in [0, " << train_count()
                            << ")");
  return held_train_inputs(dataset_).range(first, count);
}

PathReader PathReader::twin() const { return PathReader(TwinOf{*this}); }

void PathReader::take_replay_notes(const PathReader& twin) {
  for (size_t k = 0; k < twin.drift_.size(); ++k) {
    if (!std::isnan(twin.drift_[k]) && (drift_.empty() || std::isnan(drift_[k]))) {
      note_drift(k, twin.drift_[k], twin.drift_bitwise_[k]);
    }
  }
  if (!twin.one_thread_differed_.empty()) {
    one_thread_reproduces_ = false;
    one_thread_differed_ = twin.one_thread_differed_;
  }
}

void PathReader::check_batch_statistics() const {
  const bool stored = manifest_.stores_module_buffers();
  if (!net_->batch_statistics()) {
    PK_CHECK(!stored, "run '" << dir_ << "': its checkpoints store module buffers, but model '"
                              << manifest_.model_spec << "' has no BatchNorm module in training mode");
    return;
  }
  PK_CHECK(stored, "run '" << dir_ << "': model '" << manifest_.model_spec << "' has BatchNorm in training mode "
                           << "but the checkpoints store no running statistics (module_buffers), so the test "
                           << "outputs along the path cannot be evaluated; "
                           << (manifest_.recorded ? "record the loop again with this pathkernel"
                                                  : "train the run again"));
  const int64_t q = flatten_buffers(net_).numel(), stored_q = checkpoint_buffers(0).numel();
  PK_CHECK(q == stored_q, "run '" << dir_ << "': the checkpoints store " << stored_q << " module buffer values, "
                                  << "model '" << manifest_.model_spec << "' has " << q);
}

torch::Tensor PathReader::checkpoint_buffers(size_t i) const {
  PK_CHECK(i < manifest_.checkpoints.size(),
           "checkpoint index " << i << " out of range [0, " << manifest_.checkpoints.size() << ")");
  const FileRecord& f = manifest_.checkpoints[i].module_buffers;
  if (f.file.empty()) return {};
  return read_npy((fs::path(dir_) / f.file).string()).to(torch::kFloat64);
}

torch::Tensor PathReader::loss_weights(const torch::Tensor& idx) const {
  if (!loss_weights_.defined()) return {};
  return idx.defined() ? loss_weights_.index_select(0, idx) : loss_weights_;
}

torch::Tensor PathReader::checkpoint(size_t i) const {
  PK_CHECK(i < manifest_.checkpoints.size(),
           "checkpoint index " << i << " out of range [0, " << manifest_.checkpoints.size() << ")");
  // A compact recording stores a float32 run's weights as float32: exact in float64.
  return read_npy((fs::path(dir_) / manifest_.checkpoints[i].weights.file).string()).to(torch::kFloat64);
}

OptimizerState PathReader::checkpoint_state(size_t k) const {
  const CheckpointRecord& ck = manifest_.checkpoints[k];
  OptimizerState state;
  state.step = ck.optimizer_step;
  for (const auto& [name, f] : ck.optimizer_buffers) {
    state.buffers[name] = read_npy((fs::path(dir_) / f.file).string()).to(torch::kFloat64);
  }
  return state;
}

torch::Tensor PathReader::batch_indices(int64_t s) {
  if (manifest_.batch_size == 0) return {};
  std::lock_guard<std::mutex> lock(*batch_mutex_);
  if (batch_first_ < 0 || s < batch_first_ || s >= batch_first_ + batch_rows_.size(0)) {
    batch_first_ = -1;
    for (const BatchRecord& b : manifest_.batches) {
      if (s >= b.first_step && s < b.first_step + b.steps) {
        batch_rows_ = read_npy((fs::path(dir_) / b.indices.file).string());
        PK_CHECK(batch_rows_.dim() == 2 && batch_rows_.size(0) == b.steps &&
                     batch_rows_.scalar_type() == torch::kInt32,
                 "run '" << dir_ << "': batch log '" << b.indices.file << "' has shape "
                         << batch_rows_.sizes() << ", expected int32 [" << b.steps << ", B]");
        batch_first_ = b.first_step;
        break;
      }
    }
    PK_CHECK(batch_first_ >= 0, "run '" << dir_ << "': no batch log covers step " << s);
  }
  torch::Tensor row = batch_rows_[s - batch_first_];
  torch::Tensor idx = row.masked_select(row >= 0).to(torch::kInt64);
  PK_CHECK(idx.numel() > 0 && idx.max().item<int64_t>() < manifest_.num_train,
           "run '" << dir_ << "': batch of step " << s << " is empty or indexes past "
                   << manifest_.num_train << " training points");
  return idx;
}

bool PathReader::replays_recorded() const {
  return manifest_.recorded && static_cast<int64_t>(manifest_.checkpoints.size()) != manifest_.steps + 1;
}

void PathReader::read_stored_step(size_t k, const std::function<void(PathStep&&)>& fn, bool need_state) {
  PathStep step;
  step.step = manifest_.checkpoints[k].step;
  step.w = checkpoint(k);
  step.delta = checkpoint(k + 1) - step.w;
  step.buffers = checkpoint_buffers(k);
  step.buffers_next = checkpoint_buffers(k + 1);
  step.batch = batch_indices(step.step);
  step.lr = manifest_.learning_rates[step.step];
  step.clip = clip_[step.step].item<double>();
  if (need_state) step.state = checkpoint_state(k + 1);
  fn(std::move(step));
}

torch::Tensor PathReader::rejoin_checkpoint(size_t k, const torch::Tensor& replayed, torch::Tensor* mu) {
  torch::Tensor stored = checkpoint(k + 1);
  double diff = (replayed - stored).abs().max().item<double>();
  bool bitwise = bitwise_equal(replayed, stored);
  if (mu != nullptr && mu->defined()) {  // BatchNorm's running statistics rejoin theirs too
    torch::Tensor stored_mu = checkpoint_buffers(k + 1);
    diff = std::max(diff, (*mu - stored_mu).abs().max().item<double>());
    bitwise = bitwise && bitwise_equal(*mu, stored_mu);
    *mu = std::move(stored_mu);
  }
  note_drift(k, diff, bitwise);
  return stored;
}

void PathReader::note_drift(size_t k, double diff, bool bitwise) {
  if (drift_.empty()) {
    drift_.assign(manifest_.checkpoints.size() - 1, std::numeric_limits<double>::quiet_NaN());
    drift_bitwise_.assign(manifest_.checkpoints.size() - 1, false);
  }
  drift_[k] = diff;
  drift_bitwise_[k] = bitwise;
}

double PathReader::replay_segment(size_t k, const std::function<void(PathStep&&)>& fn, bool need_state,
                                  bool replay_stored) {
  PK_ASSERT(k + 1 < manifest_.checkpoints.size());
  const int64_t begin = manifest_.checkpoints[k].step, end = manifest_.checkpoints[k + 1].step;
  // Every step is stored (or this segment is one recorded step): read it, replay nothing.
  if (reads_segment(k) && !replay_stored) {
    read_stored_step(k, fn, need_state);
    return 0;
  }
  const torch::Dtype dtype = parse_dtype(manifest_.dtype);
  std::vector<torch::Tensor> params = net_->parameters();
  torch::Tensor w = checkpoint(k);
  set_flat_parameters(net_, w.to(dtype));
  torch::Tensor mu = checkpoint_buffers(k);  // μ_s; undefined without BatchNorm in training mode
  if (mu.defined()) set_flat_buffers(net_, mu);
  auto optimizer = make_optimizer(manifest_.optimizer, params);
  OptimizerState state = checkpoint_state(k);
  for (auto& [_, b] : state.buffers) b = b.to(dtype);
  import_state(*optimizer, manifest_.optimizer.name, params, state);
  for (int64_t s = begin; s < end; ++s) {
    torch::Tensor idx = batch_indices(s);
    const torch::Tensor& yt = dataset_.y_train;
    const double clip = clip_[s].item<double>();
    LayerTrace trace;
    if (capture_) net_->set_trace(&trace);
    {
      // The run's thread counts for the step's arithmetic only: the caller's
      // work on the step (fn) runs with the caller's.
      const StepThreads threads(replay_threads_ > 0 ? replay_team_ : static_cast<int>(manifest_.threads),
                                replay_threads_ > 0 ? replay_threads_ : run_blas_threads());
      // On one thread, a loop's products added as its OpenBLAS
      // added them on its threads (threaded_products.h).
      const ThreadedProductsOnOneThread as_threaded(replay_threads_ > 0 ? run_blas_threads() : 0);
      StepBatch batch{train_inputs(idx),
                      idx.defined() ? yt.index_select(0, idx) : yt,
                      loss_weights(idx), s, manifest_.learning_rates[s]};
      batch.clip = clip;
      take_step(net_, *optimizer, batch);
    }
    net_->set_trace(nullptr);
    torch::Tensor next = flatten_parameters(net_).to(torch::kFloat64);
    PathStep step;
    step.buffers = mu;
    // The step's train-mode forward moved the running statistics.
    torch::Tensor mu_next = mu.defined() ? flatten_buffers(net_) : torch::Tensor();
    // A recorded loop's replay rejoins its checkpoint (weights and running
    // statistics): the drift is this step's.
    const bool rejoin = manifest_.recorded && s + 1 == end;
    if (rejoin) next = rejoin_checkpoint(k, next, &mu_next);
    if (mu.defined()) {
      mu = mu_next;
      step.buffers_next = mu;
    }
    if (capture_) {
      for (size_t l = 0; l < trace.inputs.size(); ++l) {
        step.layer_inputs.push_back(trace.inputs[l].detach());
        step.layer_signals.push_back(*trace.signals[l]);
      }
      std::vector<torch::Tensor> grads;
      for (auto& p : params) grads.push_back(p.grad().reshape({-1}).to(torch::kFloat64));
      step.gradient = torch::cat(grads);
      if (capture_finish_) capture_finish_(step);
    }
    step.step = s;
    step.delta = next - w;
    step.w = std::move(w);
    step.batch = idx;
    step.lr = manifest_.learning_rates[s];
    step.clip = clip;
    if (need_state) {
      step.state = rejoin ? checkpoint_state(k + 1) : export_state(*optimizer, manifest_.optimizer.name, params);
    }
    w = next;
    fn(std::move(step));
  }
  if (manifest_.recorded) return drift_bitwise_[k] ? 0 : drift_[k];
  torch::Tensor stored = checkpoint(k + 1);
  if (mu.defined()) {  // the running statistics are part of the state replay reproduces
    w = torch::cat({w, mu});
    stored = torch::cat({stored, checkpoint_buffers(k + 1)});
  }
  const bool bitwise = bitwise_equal(w, stored);
  const double diff = bitwise ? 0 : (w - stored).abs().max().item<double>();
  note_drift(k, diff, bitwise);
  if (bitwise) return 0;
  return diff > 0 ? diff : std::numeric_limits<double>::infinity();
}

ReplayDrift PathReader::replay_drift() {
  ReplayDrift out;
  if (!replays_recorded()) return out;
  for (size_t k = 0; k + 1 < manifest_.checkpoints.size(); ++k) {
    const bool replayed = !reads_segment(k);
    if (replayed && (drift_.empty() || std::isnan(drift_[k]))) replay_segment(k, [](PathStep&&) {}, false);
    out.steps.push_back(manifest_.checkpoints[k + 1].step);
    out.max_abs_diff.push_back(replayed ? drift_[k] : 0.0);
    out.bitwise_equal.push_back(replayed ? static_cast<bool>(drift_bitwise_[k]) : true);
  }
  return out;
}

size_t PathReader::checkpoint_at_or_before(int64_t s) const {
  size_t k = 0;
  while (k + 1 < manifest_.checkpoints.size() && manifest_.checkpoints[k + 1].step <= s) ++k;
  return k;
}

bool PathReader::step_reproduced(int64_t s) {
  if (s < 0 || s >= manifest_.steps) return false;
  const size_t k = checkpoint_at_or_before(s);  // segment k holds step s
  if (drift_.empty() || std::isnan(drift_[k])) replay_segment(k, [](PathStep&&) {}, false, true);
  return !drift_.empty() && !std::isnan(drift_[k]) && drift_bitwise_[k];
}

std::string replay_mismatch_reason(const Manifest& manifest, const std::vector<std::string>& diffs) {
  if (manifest.environment.empty()) {
    return "the run was trained with LibTorch " + manifest.libtorch_version + " on " +
           std::to_string(manifest.threads) +
           " threads and records no more of its machine; replay needs the same CPU kernels, BLAS, LibTorch "
           "and thread count";
  }
  if (diffs.empty()) {
    return "this machine matches the one that trained the run (CPU, LibTorch kernels, BLAS, LibTorch, "
           "threads), so the run's files are not what its training wrote";
  }
  std::string out = "this machine differs from the one that trained the run, and replay is bit for bit only "
                    "where the floating-point kernels are the same: ";
  for (size_t i = 0; i < diffs.size(); ++i) out += (i ? "; " : "") + diffs[i];
  const std::string& kernels = manifest.environment.blas_kernels;
  if (!kernels.empty() && kernels != "unknown" && std::getenv("OPENBLAS_CORETYPE") != nullptr) {
    out += ". OPENBLAS_CORETYPE is set to '" + std::string(std::getenv("OPENBLAS_CORETYPE")) +
           "'; unset it (pathkernel then replays with the run's own kernels, include/pathkernel/blas_kernels.h) "
           "or set it to '" + kernels + "'";
  }
  return out;
}

void PathReader::require_equal(size_t k, double diff) const {
  if (manifest_.recorded) return;  // a recorded loop's replay may drift: it rejoins the checkpoint (E carries it)
  PK_CHECK(diff == 0, "run '" << dir_ << "': replay does not reproduce checkpoint step "
                              << manifest_.checkpoints[k + 1].step << " bit for bit (max |diff| " << diff
                              << "); " << replay_mismatch_reason(manifest_, machine_differences(manifest_)));
}

uint32_t PathReader::manifest_crc32() const {
  return crc32_of(read_file((fs::path(dir_) / "manifest.json").string()));
}

torch::Tensor PathReader::weights(int64_t s) {
  PK_CHECK(s >= 0 && s <= manifest_.steps, "step " << s << " out of range [0, " << manifest_.steps << "]");
  const size_t k = checkpoint_at_or_before(s);
  if (manifest_.checkpoints[k].step == s) return checkpoint(k);
  torch::Tensor result;
  // Replay the segment up to s; it is cheap to finish it and check the end.
  double diff = replay_segment(k, [&](PathStep&& st) { if (st.step == s) result = st.w; }, false);
  require_equal(k, diff);
  return result;
}

torch::Tensor PathReader::buffers(int64_t s) {
  PK_CHECK(s >= 0 && s <= manifest_.steps, "step " << s << " out of range [0, " << manifest_.steps << "]");
  if (!net_->batch_statistics()) return {};
  const size_t k = checkpoint_at_or_before(s);
  if (manifest_.checkpoints[k].step == s) return checkpoint_buffers(k);
  torch::Tensor result;
  double diff = replay_segment(k, [&](PathStep&& st) { if (st.step == s) result = st.buffers; }, false);
  require_equal(k, diff);
  return result;
}

torch::Tensor PathReader::outputs(int64_t s, const torch::Tensor& x) {
  const torch::Tensor w = weights(s);  // replay needs gradients: before the guard
  const torch::Tensor mu = buffers(s);
  Network net = build_network(manifest_.network_options());
  return test_outputs(net, w, mu, x);  // BatchNorm by the running statistics μ_s; a sequence's last position
}

void PathReader::forward(const std::function<void(const PathStep&)>& fn) { forward(fn, 0, manifest_.steps); }

void PathReader::forward(const std::function<void(const PathStep&)>& fn, int64_t begin, int64_t end) {
  PK_CHECK(0 <= begin && begin <= end && end <= manifest_.steps,
           "steps [" << begin << ", " << end << ") are not a range within [0, " << manifest_.steps << "]");
  ahead_seconds_ = 0;
  if (one_thread_in_turn_) return forward_on_one_thread(fn, begin, end);
  if (replays_ahead()) return forward_ahead(fn, begin, end);
  replay_range(begin, end, [&](PathStep&& st) {
    const EngineBlasKernels engine;  // the step's work: the best kernels, the replay the run's
    fn(st);
  });
}

void PathReader::replay_range(int64_t begin, int64_t end, const std::function<void(PathStep&&)>& take) {
  for (size_t k = 0; k + 1 < manifest_.checkpoints.size(); ++k) {
    // Segment k holds steps [c_k, c_{k+1}): replay it only when some are asked for.
    if (manifest_.checkpoints[k + 1].step <= begin || manifest_.checkpoints[k].step >= end) continue;
    double diff = replay_segment(k, [&](PathStep&& st) {
      if (st.step >= begin && st.step < end) take(std::move(st));
    }, true);
    if (forward_on_one_thread_) {
      if (!one_thread_reproduced(k, diff)) {
        one_thread_differed_ = "one thread does not reproduce checkpoint step " +
                               std::to_string(manifest_.checkpoints[k + 1].step) + " of the run's " +
                               std::to_string(manifest_.threads) + " threads bit for bit";
        throw ReplayOnOneThreadDiffers("run '" + dir_ + "': " + one_thread_differed_);
      }
      verified_end_->store(manifest_.checkpoints[k + 1].step);
    }
    require_equal(k, diff);
  }
}

namespace {

/// The replay's OpenMP count at one for the lifetime of the object (its
/// OpenBLAS count, the process's, is the caller's to pin: BlasPin).
class OneThreadReplay {
 public:
  explicit OneThreadReplay(int& threads) : threads_(threads) { threads_ = 1; }
  ~OneThreadReplay() { threads_ = 0; }
  OneThreadReplay(const OneThreadReplay&) = delete;
  OneThreadReplay& operator=(const OneThreadReplay&) = delete;

 private:
  int& threads_;
};

/// A forward() of a run of several threads replayed on one (`on`): the
/// replay's OpenMP count at one, no step verified yet, and the reader's
/// `forward_on_one_thread` set; that flag is cleared when the object goes.
class OneThreadForward {
 public:
  OneThreadForward(bool on, int& replay_threads, std::atomic<int64_t>& verified_end, bool& forward_on_one_thread)
      : flag_(forward_on_one_thread) {
    if (!on) return;
    one_.emplace(replay_threads);
    verified_end.store(0);
    flag_ = true;
  }
  ~OneThreadForward() { flag_ = false; }
  OneThreadForward(const OneThreadForward&) = delete;
  OneThreadForward& operator=(const OneThreadForward&) = delete;

 private:
  bool& flag_;
  std::optional<OneThreadReplay> one_;
};

}  // namespace

bool PathReader::replays_ahead() {
  in_turn_reason_ = in_turn_reason();
  return in_turn_reason_.empty();
}

std::string PathReader::in_turn_reason() {
  // A replay's BLAS count is the process's: it and the caller's stay at one
  // while it runs ahead (held at two for a run of two, the caller's groups
  // shared OpenBLAS's threads with the replay: the README CNN's verify
  // --test 10 took 18.8 s against 9.0 in turn). Switched kernels are the
  // process's too. The replay's thread is one more than the caller's: not
  // for a caller of one thread (--threads 1 keeps to one).
  // A forward walk that met a segment one thread does not reproduce walks
  // again in turn (decomposition_forward.cpp).
  if (!ahead_) return one_thread_differed_.empty() ? "asked for (--replay in-turn)" : one_thread_differed_;
  if (current_threads() < 2) return "one thread (--threads 1): a replay ahead takes a second";
  const std::string engine = engine_blas_kernels();
  if (!engine.empty()) {
    return "the replay runs OpenBLAS's " + active_blas_kernels() + " kernels, the run's, and the engine its " + engine +
           " ones: the two cannot run at once";
  }
  // A run whose Linear products are in pieces (pathkernel's own MLP trained
  // on several threads) replays them on every thread in turn; ahead, on one
  // thread beside the walk's groups, three threads shared two cores: the
  // full-batch run's verify --test 100 took 9.2 and 9.8 s ahead against
  // 9.0 and 9.6 s in turn, its replay 7.1 s of a thread against 2.4.
  if (manifest_.environment.linear_pieces > 1 && !stores_every_step()) {
    return "the run's Linear products are in " + std::to_string(manifest_.environment.linear_pieces) +
           " pieces, which a replay in turn runs on as many threads and a replay ahead on one";
  }
  if ((manifest_.threads == 1 && run_blas_threads() == 1) || stores_every_step()) return "";
  if (one_thread_reproduces()) return "";  // a run of several threads (replays_on_one_thread)
  const std::string counts = std::to_string(manifest_.threads) + " torch thread(s) and " +
                             std::to_string(run_blas_threads()) + " OpenBLAS thread(s)";
  if (manifest_.recorded) {
    return "the loop ran on " + counts + ", and one thread does not reproduce its shortest replayed segment bit for "
           "bit; a loop that calls pathkernel.record.set_threads(1) first (torch.set_num_threads(1) leaves "
           "OpenBLAS's count) replays ahead";
  }
  return "the run was trained on " + counts + ", and one thread does not reproduce its shortest checkpoint segment "
         "bit for bit";
}

bool PathReader::one_thread_reproduces() {
  if (one_thread_reproduces_) return *one_thread_reproduces_;
  // The shortest segment, replayed at one thread (OpenMP and OpenBLAS)
  // where the run had several: OpenBLAS's products and LibTorch's
  // reductions may split their work by the thread count (a full-batch MLP
  // run of 3,000 points does not replay on one thread, nor on two with
  // OpenBLAS at one; the README CNN's batches of 100 do).
  size_t shortest = 0;
  int64_t length = -1;
  for (size_t k = 0; k + 1 < manifest_.checkpoints.size(); ++k) {
    const int64_t n = manifest_.checkpoints[k + 1].step - manifest_.checkpoints[k].step;
    if (n > 0 && !reads_segment(k) && (length < 0 || n < length)) {
      shortest = k;
      length = n;
    }
  }
  // A recorded loop of one-step segments only: nothing is replayed.
  if (length < 0) return *(one_thread_reproduces_ = manifest_.recorded);
  const BlasPin pinned(1);
  const OneThreadReplay one(replay_threads_);
  one_thread_reproduces_ = one_thread_reproduced(shortest, replay_segment(shortest, [](PathStep&&) {}, false));
  // A loop of several torch threads: its operations split by the team's
  // size, which the replay's thread can take alone, the walk's keeping
  // theirs (LeNet-5's epoch at torch's two threads: all 43 checkpoints,
  // verify --test 1 0.91 of its time in turn).
  if (!*one_thread_reproduces_ && manifest_.threads > 1) {
    replay_team_ = static_cast<int>(manifest_.threads);
    one_thread_reproduces_ = one_thread_reproduced(shortest, replay_segment(shortest, [](PathStep&&) {}, false));
    if (!*one_thread_reproduces_) replay_team_ = 1;
  }
  // A recorded loop's drift is the replay's at the loop's counts: one
  // thread's, where it differs, is forgotten (replay_drift replays again).
  if (manifest_.recorded && !*one_thread_reproduces_) drift_[shortest] = std::numeric_limits<double>::quiet_NaN();
  return *one_thread_reproduces_;
}

bool PathReader::one_thread_reproduced(size_t k, double diff) const {
  return diff == 0 && one_thread_differs_at_ != static_cast<int64_t>(k);
}

void PathReader::forward_ahead(const std::function<void(const PathStep&)>& fn, int64_t begin, int64_t end) {
  std::optional<BlasPin> pinned;  // the replay's count, one, held: it is the process's
  if (!stores_every_step()) pinned.emplace(1);
  const OneThreadForward one(replays_on_one_thread(), replay_threads_, *verified_end_, forward_on_one_thread_);
  ahead_seconds_ = hand_ahead<PathStep>(
      2, [&](const std::function<void(PathStep&&)>& push) { replay_range(begin, end, push); },
      [&](PathStep& st) { fn(st); });
}

bool PathReader::replays_alike_on_one_thread() const {
  if (!engine_blas_kernels().empty()) return false;
  if ((manifest_.threads == 1 && run_blas_threads() == 1) || stores_every_step()) return true;
  // A replay team of several (replay_team_) is one replay beside the walk, not one a worker.
  return replays_on_one_thread() && one_thread_reproduces_.value_or(true) && one_thread_differed_.empty() &&
         replay_team_ == 1;
}

void PathReader::forward_on_one_thread(const std::function<void(const PathStep&)>& fn, int64_t begin, int64_t end) {
  PK_CHECK(replays_alike_on_one_thread(), "run '" << dir_ << "': a replay on one thread does not give its bits, so "
                                                  << "its steps cannot be walked on one thread each");
  const OneThreadForward one(replays_on_one_thread(), replay_threads_, *verified_end_, forward_on_one_thread_);
  replay_range(begin, end, [&](PathStep&& st) { fn(st); });
}

void PathReader::reverse(const std::function<void(const PathStep&)>& fn) {
  ahead_seconds_ = 0;
  if (replays_ahead()) return reverse_ahead(fn);
  reverse_in_turn(fn, manifest_.checkpoints.size() - 1);
}

void PathReader::reverse_in_turn(const std::function<void(const PathStep&)>& fn, size_t segments) {
  for (size_t k = segments; k-- > 0;) {
    std::vector<PathStep> segment;
    double diff = replay_segment(k, [&](PathStep&& st) { segment.push_back(std::move(st)); }, true);
    require_equal(k, diff);
    const EngineBlasKernels engine;
    walk_back(segment, fn);
  }
}

void PathReader::reverse_ahead(const std::function<void(const PathStep&)>& fn) {
  // Segments 0 .. rest-1 not handed on: one thread did not reproduce
  // segment rest-1 of a run of several, so they replay in turn at its count.
  size_t rest = 0;
  {
    std::optional<BlasPin> pinned;  // the replay's count, one, held: it is the process's
    if (!stores_every_step()) pinned.emplace(1);
    std::optional<OneThreadReplay> one;
    if (replays_on_one_thread()) one.emplace(replay_threads_);
    ahead_seconds_ = hand_ahead<std::vector<PathStep>>(
        0,  // two segments held at most: the one walked and the next
        [&](const std::function<void(std::vector<PathStep>&&)>& push) {
          for (size_t k = manifest_.checkpoints.size() - 1; k-- > 0;) {
            std::vector<PathStep> segment;
            double diff = replay_segment(k, [&](PathStep&& st) { segment.push_back(std::move(st)); }, true);
            if (one && !one_thread_reproduced(k, diff)) {
              rest = k + 1;
              return;
            }
            require_equal(k, diff);
            push(std::move(segment));
          }
        },
        [&](std::vector<PathStep>& segment) { walk_back(segment, fn); });
  }
  if (rest > 0) reverse_in_turn(fn, rest);
}

ReplayReport PathReader::check(bool progress) {
  ReplayReport report;
  report.recorded = manifest_.recorded;
  // Every step stored: the constructor checked every file against its CRC-32.
  if (manifest_.recorded && !replays_recorded()) return report;
  ProgressBar bar(manifest_.steps, "check-path", progress);
  for (size_t k = 0; k + 1 < manifest_.checkpoints.size(); ++k) {
    if (reads_segment(k)) continue;
    double diff = replay_segment(k, [&](PathStep&& st) {
      ++report.steps_replayed;
      bar.update(st.step + 1);
    }, false);
    ++report.checkpoints_compared;
    if (diff != 0) {
      ++report.mismatches;
      if (report.first_mismatch_step < 0) report.first_mismatch_step = manifest_.checkpoints[k + 1].step;
      report.max_abs_diff = std::max(report.max_abs_diff, diff);
    }
  }
  bar.finish();
  report.bitwise_equal = report.mismatches == 0;
  if (!report.bitwise_equal) {
    report.environment_differences = machine_differences(manifest_);
  }
  return report;
}

}  // namespace pathkernel
