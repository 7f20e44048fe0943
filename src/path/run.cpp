// Training a model and recording its path in a run directory.
#include "pathkernel/run.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "pathkernel/context.h"
#include "pathkernel/batch_statistics.h"
#include "pathkernel/blas_switch.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/metrics_csv.h"
#include "pathkernel/npy.h"
#include "pathkernel/run_writer.h"
#include "pathkernel/script_graph.h"
#include "pathkernel/version.h"

namespace pathkernel {

namespace fs = std::filesystem;

namespace {

/// RUN/timing.json: wall-clock time, kept out of the manifest so that the
/// manifest of a resumed run equals an uninterrupted run's byte for byte.
void write_timing(const std::string& run_dir, const TrainSummary& summary, int64_t resumed_from) {
  nlohmann::ordered_json j{{"seconds", summary.seconds}};
  if (resumed_from >= 0) j["resumed_from_step"] = resumed_from;
  write_file_atomic((fs::path(run_dir) / "timing.json").string(), j.dump(2) + "\n");
}

/// The loss metrics.csv records for `step`.
double recorded_loss(const std::string& run_dir, const Manifest& m, int64_t step) {
  for (const MetricsRow& row : read_metrics_csv((fs::path(run_dir) / m.metrics).string())) {
    if (row.step == step) return row.loss;
  }
  PK_THROW("run '" << run_dir << "': metrics.csv has no row for step " << step);
}

/// OpenBLAS held at a run's count (Manifest::blas_threads) while it trains,
/// where that differs from LibTorch's (training_blas_threads).
class RunBlasThreads {
 public:
  explicit RunBlasThreads(const Manifest& m) {
    if (m.blas_threads() != m.threads) pin_.emplace(m.blas_threads());
  }

 private:
  std::optional<BlasPin> pin_;
};

}  // namespace

namespace {

bool has_convolution(const NetworkImpl& net) {
  bool convolution = false;
  for (const LayerDesc& d : net.layers()) convolution = convolution || d.convolution();
  if (const ScriptGraph* graph = net.is_script() ? net.script_graph() : nullptr) {
    for (const ScriptLayer& l : graph->layers()) convolution = convolution || l.desc.convolution();
  }
  return convolution;
}

}  // namespace

int training_linear_pieces(const NetworkImpl& net, int threads) {
  return threads > 1 && !net.is_script() && !has_convolution(net) ? threads : 1;
}

int training_blas_threads(const NetworkImpl& net, int threads) {
  return has_convolution(net) || training_linear_pieces(net, threads) > 1 ? 1 : threads;
}

RunResult train_run(const RunOptions& given) {
  RunOptions options = given;
  options.train = given.train.resolved();
  PK_CHECK(!options.out.empty(), "no run directory given (RunOptions::out is empty)");
  PK_CHECK(options.checkpoint_every >= 0,
           "checkpoint spacing must be >= 1, or 0 for about sqrt(steps) (got " << options.checkpoint_every << ")");
  DataOptions held = options.data;
  held.coded_inputs = true;  // bytes (fashion-mnist) decoded a batch at a time
  Dataset data = load_dataset(held);
  const int64_t m = train_count(data);
  if (!options.loss_weights_file.empty()) {
    const std::string& file = options.loss_weights_file;
    PK_CHECK(fs::is_regular_file(file), "loss weights file '" << file << "' does not exist or is not a file");
    options.train.loss_weights = checked_loss_weights(read_npy(file), m, "loss weights file '" + file + "'");
  }
  options.train.validate(m);
  check_loss_output(options.loss, options.output);
  PK_CHECK(options.loss != LossKind::Nll || ModelSpec::parse(options.model).is_torchscript(),
           "the loss nll is for a model whose own output is log-probabilities (a TorchScript module ending in "
           "log_softmax); pathkernel's model '" << options.model << "' outputs logits: use cross_entropy");
  PK_CHECK(!is_regression_target(data.y_train) || options.loss == LossKind::Mse,
           "dataset '" << options.data.spec << "' has float targets of shape " << data.y_train.sizes()
                       << ", which only the loss mse trains on (got '" << loss_name(options.loss) << "')");

  PK_CHECK(data.sequence_length == 0 || options.loss != LossKind::Mse,
           "dataset '" << options.data.spec << "' holds sequences (labels of shape " << data.y_train.sizes()
                       << "): the loss is the mean over a sequence's tokens, cross_entropy or nll (got 'mse', which "
                       << "is for regression targets [n, K])");
  NetworkOptions net_options;
  net_options.spec = ModelSpec::parse(options.model);
  net_options.input_shape = data.input_shape;
  net_options.num_classes = data.num_classes;
  net_options.output = options.output;
  net_options.loss = options.loss;
  net_options.zero_last_layer = options.zero_last_layer;
  net_options.dtype = options.data.dtype;
  net_options.seed = options.seed;
  net_options.integer_inputs = data.integer_inputs;
  net_options.sequence_length = data.sequence_length;
  Network net = build_network(net_options);

  Manifest base;
  base.pathkernel_version = pathkernel_version();
  base.libtorch_version = libtorch_version();
  base.data = options.data;
  base.num_train = m;
  base.num_test = test_count(data);
  base.input_shape = data.input_shape;
  base.num_classes = data.num_classes;
  base.normalization = data.normalization;
  base.source = data.source;
  base.train_crc32 = training_data_crc32(data);
  base.integer_inputs = data.integer_inputs;
  base.sequence_length = data.sequence_length;
  base.model_spec = net_options.spec.str();
  base.output = output_map_name(options.output);
  base.loss = loss_name(options.loss);
  base.zero_last_layer = options.zero_last_layer;
  base.init_seed = options.seed;
  base.dtype = dtype_name(options.data.dtype);
  base.parameters = parameter_layout(net);
  base.parameter_count = parameter_count(net);
  base.optimizer = options.train.optimizer;
  base.batch_size = (options.train.batch == 0 || options.train.batch >= m) ? 0 : options.train.batch;
  base.batch_seed = options.train.seed;
  base.schedule = options.train.schedule;
  base.threads = current_threads();
  unmix_blas_kernels();  // the run trains with the kernels it records, every routine
  base.environment = ReplayEnvironment::current(base.threads);
  // Training runs at the counts it records, the BLAS's too: the replay sets
  // both to them, and a process that never set them can start with them apart
  // (LibTorch's default and OpenBLAS's differ when OMP_NUM_THREADS is unset).
  // A network with a convolution trains with OpenBLAS at one thread
  // (training_blas_threads), and its manifest says so.
  ThreadScope pin(static_cast<int>(base.threads));
  const int blas_threads = training_blas_threads(*net, static_cast<int>(base.threads));
  if (blas_threads != base.threads) base.environment.blas_threads = blas_threads;
  const int pieces = training_linear_pieces(*net, static_cast<int>(base.threads));
  if (pieces > 1) {
    net->set_linear_pieces(pieces);
    base.environment.linear_pieces = pieces;
  }
  const RunBlasThreads blas_pin(base);
  const int64_t steps = options.train.total_steps(m);
  base.checkpoint_every =
      options.checkpoint_every == 0 ? default_checkpoint_every(steps) : options.checkpoint_every;

  RunWriter writer(options.out, base, options.force);
  if (net_options.spec.is_torchscript()) writer.add_module(net_options.spec.path);
  if (options.train.loss_weights.defined()) writer.add_loss_weights(options.train.loss_weights);
  RunResult result;
  result.warnings = data.warnings;
  result.summary = train(net, data, options.train, writer);
  write_timing(options.out, result.summary, -1);
  result.manifest = writer.manifest();
  return result;
}

RunOptions run_options_from_manifest(const Manifest& m, const std::string& run_dir) {
  RunOptions r;
  r.data = m.data;
  r.data.dtype = parse_dtype(m.dtype);
  r.model = m.model_spec;
  r.output = parse_output_map(m.output);
  r.loss = parse_loss_kind(m.loss);
  r.zero_last_layer = m.zero_last_layer;
  r.seed = m.init_seed;
  r.train.optimizer = m.optimizer;
  r.train.steps = static_cast<int64_t>(m.learning_rates.size());
  r.train.epochs = -1;
  r.train.batch = m.batch_size;
  r.train.seed = m.batch_seed;
  r.train.schedule = m.schedule;
  r.checkpoint_every = m.checkpoint_every;
  r.out = run_dir;
  return r;
}

RunResult resume_run(const std::string& run_dir, bool progress, int threads) {
  PK_CHECK(fs::is_directory(run_dir), "cannot resume '" << run_dir << "': it is not a directory");
  PK_CHECK(fs::exists(fs::path(run_dir) / "manifest.json"),
           "cannot resume '" << run_dir << "': it has no manifest.json, so it is not a run written by "
                             << "'pathkernel train' (if it was interrupted before its first checkpoint, delete it and train again)");
  Manifest m = Manifest::load(run_dir);
  // The run's own thread count: GEMM rounding can depend on it.
  PK_CHECK(threads == 0 || threads == m.threads,
           "cannot resume '" << run_dir << "' with " << threads << " threads: it was trained with " << m.threads
                             << " threads, and a resumed run uses the same count");
  PK_CHECK(m.status != "complete",
           "cannot resume '" << run_dir << "': the run is complete (" << m.steps << " steps); nothing to do");
  PK_CHECK(m.status == "running", "cannot resume '" << run_dir << "': its status is '" << m.status << "' ("
                                                    << m.message << "); only an interrupted ('running') run resumes");
  PK_CHECK(m.pathkernel_version == pathkernel_version() && m.libtorch_version == libtorch_version(),
           "cannot resume '" << run_dir << "': it was trained by pathkernel " << m.pathkernel_version
                             << " with LibTorch " << m.libtorch_version << ", this is pathkernel "
                             << pathkernel_version() << " with LibTorch " << libtorch_version()
                             << "; the continued path would not be the same");
  validate_run(run_dir, m);

  RunOptions options = run_options_from_manifest(m, run_dir);
  options.train.progress = progress;
  options.train.loss_weights = read_loss_weights(run_dir, m);
  ThreadScope thread_scope(static_cast<int>(m.threads));
  const RunBlasThreads blas_pin(m);
  DataOptions held = options.data;
  held.coded_inputs = true;
  Dataset data = load_dataset(held);
  PK_CHECK(train_count(data) == m.num_train && training_data_crc32(data) == m.train_crc32,
           "cannot resume '" << run_dir << "': the training data of '" << m.data.spec
                             << "' has changed since the run was started");
  const std::vector<double> rates =
      learning_rate_schedule(options.train.schedule, options.train.optimizer.lr, options.train.steps);
  PK_CHECK(rates == m.learning_rates, "cannot resume '" << run_dir << "': schedule '" << m.schedule
                                                        << "' no longer gives the recorded learning rates");

  NetworkOptions net_options = m.network_options();
  Network net = build_network(net_options);
  PK_CHECK(parameter_count(net) == m.parameter_count,
           "cannot resume '" << run_dir << "': model '" << m.model_spec << "' has " << parameter_count(net)
                             << " parameters, the manifest says " << m.parameter_count);

  const CheckpointRecord& last = m.checkpoints.back();
  ResumePoint at;
  at.step = last.step;
  set_flat_parameters(net, read_npy((fs::path(run_dir) / last.weights.file).string()).to(options.data.dtype));
  if (!last.module_buffers.file.empty()) {  // BatchNorm's running statistics μ at the last checkpoint
    set_flat_buffers(net, read_npy((fs::path(run_dir) / last.module_buffers.file).string()));
  }
  at.state.step = last.optimizer_step;
  for (const auto& [name, f] : last.optimizer_buffers) {
    at.state.buffers[name] = read_npy((fs::path(run_dir) / f.file).string()).to(options.data.dtype);
  }
  if (at.step > 0) {
    at.first_loss = recorded_loss(run_dir, m, 0);
    at.last_loss = recorded_loss(run_dir, m, at.step - 1);
  }

  RunWriter writer = RunWriter::reopen(run_dir, m);
  RunResult result;
  result.warnings = data.warnings;
  result.summary = train(net, data, options.train, writer, &at);
  write_timing(run_dir, result.summary, at.step);
  result.resumed_from = at.step;
  result.manifest = writer.manifest();
  return result;
}

}  // namespace pathkernel
