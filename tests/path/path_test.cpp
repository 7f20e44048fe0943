// Tests of the run directory: bitwise replay for every optimizer, forward and
// reverse iteration, the manifest round trip, and corrupt or missing files.
#include <gtest/gtest.h>

#include <cstring>
#include <dlfcn.h>
#include <filesystem>
#include <fstream>
#include <functional>

#include <zlib.h>

#include "../test_util.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/npy.h"
#include "pathkernel/path.h"
#include "pathkernel/run.h"
#include "pathkernel/context.h"
#include "pathkernel/decomposition.h"
#include "pathkernel/run_writer.h"
#include "pathkernel/trainer.h"

namespace pathkernel {
namespace {

namespace fs = std::filesystem;
using testing::error_message;
using testing::same_bits;
using testing::small_run;
using testing::TempDir;

const std::vector<std::string> kOptimizers = {"gd",    "sgd",   "momentum", "nesterov",
                                              "adam", "adamw", "rmsprop",  "rmsprop-momentum", "adagrad"};

// The reference is a run that stores every step; the path under test stores
// every 4th. Replaying the sparse one must give every stored w_s bit for bit.
TEST(Replay, ReproducesEveryStepBitForBitForEveryOptimizer) {
  for (const std::string& opt : kOptimizers) {
    TempDir dir("replay_" + opt);
    RunOptions dense = small_run(dir / "dense", opt, 11, 1);
    RunOptions sparse = small_run(dir / "sparse", opt, 11, 4);
    if (opt != "adamw") dense.train.optimizer.weight_decay = sparse.train.optimizer.weight_decay = 1e-3;
    if (opt == "adamw") dense.train.optimizer.weight_decay = sparse.train.optimizer.weight_decay = 1e-2;
    train_run(dense);
    RunResult res = train_run(sparse);
    ASSERT_EQ(res.manifest.checkpoints.size(), 4u) << opt;  // 0, 4, 8, 11

    PathReader reference(dense.out), reader(sparse.out);
    ReplayReport report = reader.check();
    EXPECT_TRUE(report.bitwise_equal) << opt;
    EXPECT_EQ(report.steps_replayed, 11) << opt;
    EXPECT_EQ(report.checkpoints_compared, 3) << opt;

    int64_t next = 0;
    reader.forward([&](const PathStep& st) {
      ASSERT_EQ(st.step, next++) << opt;
      EXPECT_TRUE(same_bits(st.w, reference.checkpoint(st.step))) << opt << " step " << st.step;
      EXPECT_TRUE(same_bits(st.delta, reference.checkpoint(st.step + 1) - reference.checkpoint(st.step)))
          << opt << " step " << st.step;
      EXPECT_EQ(st.lr, res.manifest.learning_rates[st.step]);
      EXPECT_EQ(st.batch.defined(), opt != "gd");
      bool stateful = opt != "gd" && opt != "sgd";
      EXPECT_EQ(st.state.empty(), !stateful) << opt;
    });
    EXPECT_EQ(next, 11) << opt;
    for (int64_t s : {0, 3, 4, 9, 11}) {
      EXPECT_TRUE(same_bits(reader.weights(s), reference.checkpoint(s))) << opt << " weights(" << s << ")";
    }
  }
}

TEST(Replay, ReverseYieldsTheForwardSequenceReversed) {
  for (const std::string opt : {"sgd", "adam"}) {
    TempDir dir("reverse_" + opt);
    RunOptions r = small_run(dir / "run", opt, 10, 3);
    train_run(r);
    PathReader reader(r.out);
    std::vector<PathStep> fwd, rev;
    reader.forward([&](const PathStep& st) { fwd.push_back(st); });
    reader.reverse([&](const PathStep& st) { rev.push_back(st); });
    ASSERT_EQ(fwd.size(), 10u);
    ASSERT_EQ(rev.size(), 10u);
    for (size_t i = 0; i < fwd.size(); ++i) {
      const PathStep& a = fwd[i];
      const PathStep& b = rev[fwd.size() - 1 - i];
      EXPECT_EQ(a.step, b.step);
      EXPECT_TRUE(same_bits(a.w, b.w)) << "step " << a.step;
      EXPECT_TRUE(same_bits(a.delta, b.delta)) << "step " << a.step;
      EXPECT_TRUE(same_bits(a.batch, b.batch)) << "step " << a.step;
      EXPECT_EQ(a.lr, b.lr);
      EXPECT_EQ(a.state.step, b.state.step);
      ASSERT_EQ(a.state.buffers.size(), b.state.buffers.size());
      for (const auto& [name, buf] : a.state.buffers) {
        EXPECT_TRUE(same_bits(buf, b.state.buffers.at(name))) << name << " step " << a.step;
      }
    }
  }
}

// A range of steps, starting and ending inside checkpoint segments, is the
// whole walk's steps bit for bit; an empty range calls nothing.
TEST(Replay, ForwardOverARangeGivesTheWholeWalksSteps) {
  for (const std::string opt : {"gd", "sgd", "adam"}) {
    TempDir dir("range_" + opt);
    RunOptions r = small_run(dir / "run", opt, 10, 3);
    train_run(r);
    PathReader reader(r.out);
    std::vector<PathStep> all;
    reader.forward([&](const PathStep& st) { all.push_back(st); });
    ASSERT_EQ(all.size(), 10u);
    for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{{0, 10}, {4, 8}, {3, 6}, {9, 10}, {5, 5}}) {
      std::vector<int64_t> seen;
      reader.forward([&](const PathStep& st) {
        seen.push_back(st.step);
        const PathStep& e = all[static_cast<size_t>(st.step)];
        EXPECT_TRUE(same_bits(st.w, e.w)) << opt << " step " << st.step;
        EXPECT_TRUE(same_bits(st.delta, e.delta)) << opt << " step " << st.step;
        EXPECT_TRUE(same_bits(st.batch, e.batch)) << opt << " step " << st.step;
        for (const auto& [name, buf] : e.state.buffers) {
          EXPECT_TRUE(same_bits(buf, st.state.buffers.at(name))) << opt << " " << name << " step " << st.step;
        }
      }, begin, end);
      std::vector<int64_t> expect;
      for (int64_t s = begin; s < end; ++s) expect.push_back(s);
      EXPECT_EQ(seen, expect) << opt << " [" << begin << ", " << end << ")";
    }
    EXPECT_CONTAINS(error_message([&] { reader.forward([](const PathStep&) {}, 4, 11); }),
                    "steps [4, 11) are not a range within [0, 10]");
    EXPECT_CONTAINS(error_message([&] { reader.forward([](const PathStep&) {}, 5, 4); }),
                    "steps [5, 4) are not a range within [0, 10]");
  }
}

/// Trains a 9-step sgd run with checkpoints every 3 steps into dir/run, then
/// moves weight 5 of checkpoint 6 to `nudge(value)` and keeps the manifest's
/// size and CRC consistent, so that only replay can notice.
std::string tampered_run(const TempDir& dir, const std::function<double(double)>& nudge) {
  RunOptions r = small_run(dir / "run", "sgd", 9, 3);
  train_run(r);
  Manifest m = Manifest::load(r.out);
  CheckpointRecord& ck = m.checkpoints[2];
  EXPECT_EQ(ck.step, 6);
  torch::Tensor w = read_npy(dir / ("run/" + ck.weights.file));
  double* data = w.data_ptr<double>();
  data[5] = nudge(data[5]);
  std::string bytes = npy_bytes(w);
  write_file_atomic(dir / ("run/" + ck.weights.file), bytes);
  ck.weights.crc32 = crc32_of(bytes);
  m.save(r.out);
  return r.out;
}

// One ulp on one weight of checkpoint 6. Replay into 6 reproduces the
// original value, so 6 is always found. Whether the nudge still shows after
// three more steps from the nudged 6 depends on how this CPU's kernels round
// (a one-ulp change can be rounded away), so the count is 1 or 2.
TEST(Replay, DetectsAOneUlpChangeAtTheCheckpointItTouches) {
  TempDir dir("tamper_ulp");
  std::string run = tampered_run(dir, [](double v) { return std::nextafter(v, 1e300); });
  PathReader reader(run);
  ReplayReport report = reader.check();
  EXPECT_FALSE(report.bitwise_equal);
  EXPECT_EQ(report.first_mismatch_step, 6);
  EXPECT_GE(report.mismatches, 1);
  EXPECT_LE(report.mismatches, 2);
  EXPECT_EQ(report.checkpoints_compared, 3);
  EXPECT_GT(report.max_abs_diff, 0);
  EXPECT_TRUE(report.environment_differences.empty());  // same machine, same process
  std::string msg = error_message([&] { reader.forward([](const PathStep&) {}); });
  EXPECT_NE(msg.find("does not reproduce checkpoint step 6 bit for bit"), std::string::npos) << msg;
  EXPECT_NE(msg.find("this machine matches the one that trained the run"), std::string::npos) << msg;
}

// A change of 0.5 in one weight moves every later step's gradient far above
// any rounding, so replay from the changed 6 cannot reach the recorded 9:
// both checkpoints after the change differ on every machine.
TEST(Replay, DetectsALargeChangeAtItsCheckpointAndTheNext) {
  TempDir dir("tamper_large");
  std::string run = tampered_run(dir, [](double v) { return v + 0.5; });
  PathReader reader(run);
  ReplayReport report = reader.check();
  EXPECT_FALSE(report.bitwise_equal);
  EXPECT_EQ(report.first_mismatch_step, 6);
  EXPECT_EQ(report.mismatches, 2);
  EXPECT_GE(report.max_abs_diff, 0.5);
}

// A range replays only its own segments: with checkpoint 6 changed, steps
// [0, 3) and [1, 2) (segment 0) read without error, a range reaching
// segment [3, 6) does not.
TEST(Replay, ARangeReplaysOnlyItsOwnSegments) {
  TempDir dir("tamper_range");
  std::string run = tampered_run(dir, [](double v) { return v + 0.5; });
  PathReader reader(run);
  int64_t calls = 0;
  reader.forward([&](const PathStep&) { ++calls; }, 0, 3);
  reader.forward([&](const PathStep&) { ++calls; }, 1, 2);
  EXPECT_EQ(calls, 4);
  EXPECT_CONTAINS(error_message([&] { reader.forward([](const PathStep&) {}, 2, 4); }),
                  "does not reproduce checkpoint step 6 bit for bit");
}

// A run copied to a machine that differs: the error names what differs.
TEST(Replay, AMismatchOnAnotherMachineNamesTheDifference) {
  TempDir dir("tamper_machine");
  std::string run = tampered_run(dir, [](double v) { return std::nextafter(v, 1e300); });
  Manifest m = Manifest::load(run);
  ASSERT_FALSE(m.environment.empty()) << "train records the machine's environment";
  const ReplayEnvironment here = ReplayEnvironment::current(m.threads);
  EXPECT_EQ(m.environment.cpu, here.cpu);
  EXPECT_EQ(m.environment.blas_kernels, here.blas_kernels);
  EXPECT_EQ(m.environment.libtorch, here.libtorch);
  m.environment.cpu = "Another CPU 9000";
  m.environment.blas_kernels = "Elsewhere";
  m.save(run);
  PathReader reader(run);
  ReplayReport report = reader.check();
  ASSERT_EQ(report.environment_differences.size(), 2u);
  EXPECT_EQ(report.environment_differences[0], "CPU '" + here.cpu + "' (the run recorded 'Another CPU 9000')");
  EXPECT_EQ(report.environment_differences[1],
            "BLAS kernels '" + here.blas_kernels + "' (the run recorded 'Elsewhere')");
  std::string msg = error_message([&] { reader.weights(5); });  // replays 3 -> 6
  EXPECT_NE(msg.find("does not reproduce checkpoint step 6"), std::string::npos) << msg;
  EXPECT_NE(msg.find("this machine differs from the one that trained the run"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the run recorded 'Another CPU 9000'"), std::string::npos) << msg;
}

TEST(Manifest, SaveLoadSaveGivesIdenticalBytes) {
  TempDir dir("manifest");
  RunOptions r = small_run(dir / "run", "adamw", 5, 2);
  r.train.schedule = "cosine";
  r.train.optimizer.weight_decay = 0.01;
  train_run(r);
  std::string first = read_file(dir / "run/manifest.json");
  Manifest m = Manifest::load(r.out);
  fs::create_directories(dir / "copy");
  m.save(dir / "copy");
  EXPECT_EQ(read_file(dir / "copy/manifest.json"), first);
  // And through the JSON object form.
  EXPECT_EQ(Manifest::from_json(m.to_json()).dump(), first);
  // It records what a reader needs.
  EXPECT_EQ(m.steps, 5);
  EXPECT_EQ(m.learning_rates.size(), 5u);
  EXPECT_LT(m.learning_rates[4], m.learning_rates[0]);
  EXPECT_EQ(m.optimizer.name, "adamw");
  EXPECT_EQ(m.parameters.front().name, "fc1.weight");
  EXPECT_EQ(m.parameters.front().shape, (std::vector<int64_t>{6, 100}));
  EXPECT_EQ(m.checkpoints.back().optimizer_buffers.count("exp_avg_sq"), 1u);
  EXPECT_EQ(m.checkpoints.back().optimizer_step, 5);
}

// Saved progress on a run is keyed by its manifest's CRC-32: zlib's of the
// file's bytes as they are on disk, the same from a second reader, another
// once the file changes.
TEST(Manifest, Crc32IsZlibsOfTheFileOnDisk) {
  TempDir dir("manifest_crc");
  RunOptions r = small_run(dir / "run", "sgd", 2, 1);
  train_run(r);
  const std::string bytes = read_file(dir / "run/manifest.json");
  const auto expect = static_cast<uint32_t>(
      ::crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
  PathReader reader(r.out);
  EXPECT_EQ(reader.manifest_crc32(), expect);
  EXPECT_EQ(PathReader(r.out).manifest_crc32(), expect);
  std::ofstream(dir / "run/manifest.json", std::ios::app) << "\n";  // the same JSON, other bytes
  EXPECT_NE(reader.manifest_crc32(), expect);
}

TEST(RunDirectory, CheckpointsAreNumpyFilesInManifestOrder) {
  TempDir dir("npy");
  RunOptions r = small_run(dir / "run", "sgd", 4, 2);
  RunResult res = train_run(r);
  const Manifest& m = res.manifest;
  std::string bytes = read_file(dir / ("run/" + m.checkpoints.back().weights.file));
  ASSERT_EQ(bytes.substr(0, 6), std::string("\x93NUMPY", 6));
  EXPECT_NE(bytes.find("'descr': '<f8'"), std::string::npos);
  EXPECT_NE(bytes.find("'shape': (" + std::to_string(m.parameter_count) + ",)"), std::string::npos);
  // The header is padded so the data starts on a 64-byte boundary.
  size_t header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
  EXPECT_EQ((10 + header_len) % 64, 0u);
  EXPECT_EQ(bytes.size(), 10 + header_len + 8 * m.parameter_count);
  // Rebuilding the network from the manifest and loading w_N reproduces the
  // trained network's predictions.
  PathReader reader(r.out);
  set_flat_parameters(reader.network(), reader.checkpoint(m.checkpoints.size() - 1));
  torch::NoGradGuard guard;
  double acc = accuracy(reader.network(), reader.decoded_dataset().x_test, reader.decoded_dataset().y_test);
  EXPECT_DOUBLE_EQ(acc, m.summary.at("test_accuracy").get<double>());
  EXPECT_EQ(m.batches.size(), 2u);
}

TEST(RunDirectory, RefusesToOverwriteUnlessForced) {
  TempDir dir("overwrite");
  RunOptions r = small_run(dir / "run", "sgd", 2, 1);
  train_run(r);
  std::string msg = error_message([&] { train_run(r); });
  EXPECT_NE(msg.find("already exists; overwrite it only when forced"), std::string::npos) << msg;
  r.force = true;
  EXPECT_NO_THROW(train_run(r));
  // --force never deletes a directory that is not a run.
  fs::create_directories(dir / "precious");
  std::ofstream(dir / "precious/notes.txt") << "keep me";
  r.out = dir / "precious";
  msg = error_message([&] { train_run(r); });
  EXPECT_NE(msg.find("not a pathkernel run"), std::string::npos) << msg;
  EXPECT_TRUE(fs::exists(dir / "precious/notes.txt"));
}

TEST(RunDirectory, NamesTheFirstInconsistency) {
  TempDir dir("corrupt");
  RunOptions r = small_run(dir / "run", "momentum", 6, 3);
  train_run(r);
  const std::string run = r.out;
  auto copy_run = [&](const std::string& name) {
    fs::copy(run, dir / name, fs::copy_options::recursive);
    return dir / name;
  };
  Manifest m = Manifest::load(run);

  std::string missing = copy_run("missing");
  fs::remove(missing + "/" + m.checkpoints[1].weights.file);
  std::string msg = error_message([&] { PathReader reader(missing); });
  EXPECT_NE(msg.find("checkpoint 3 file 'checkpoints/w_00000003.npy' listed in manifest.json is missing"),
            std::string::npos) << msg;

  std::string flipped = copy_run("flipped");
  {
    std::string path = flipped + "/" + m.checkpoints[2].optimizer_buffers.at("momentum_buffer").file;
    std::string bytes = read_file(path);
    bytes[bytes.size() - 3] ^= 0x10;
    write_file_atomic(path, bytes);
  }
  msg = error_message([&] { PathReader reader(flipped); });
  EXPECT_NE(msg.find("momentum_buffer file"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the file is corrupt"), std::string::npos) << msg;

  std::string truncated = copy_run("truncated");
  {
    std::string path = truncated + "/" + m.batches[0].indices.file;
    std::string bytes = read_file(path);
    write_file_atomic(path, bytes.substr(0, bytes.size() - 4));
  }
  msg = error_message([&] { PathReader reader(truncated); });
  EXPECT_NE(msg.find("batch log file"), std::string::npos) << msg;
  EXPECT_NE(msg.find("manifest.json says"), std::string::npos) << msg;

  std::string no_manifest = copy_run("no_manifest");
  fs::remove(no_manifest + "/manifest.json");
  msg = error_message([&] { PathReader reader(no_manifest); });
  EXPECT_NE(msg.find("has no manifest.json: was it created by 'pathkernel train'?"), std::string::npos) << msg;

  std::string bad_json = copy_run("bad_json");
  write_file_atomic(bad_json + "/manifest.json", read_file(run + "/manifest.json").substr(0, 200));
  msg = error_message([&] { PathReader reader(bad_json); });
  EXPECT_NE(msg.find("is not valid JSON"), std::string::npos) << msg;

  std::string no_field = copy_run("no_field");
  {
    auto j = m.to_json();
    j["training"].erase("threads");
    write_file_atomic(no_field + "/manifest.json", j.dump(2));
  }
  msg = error_message([&] { PathReader reader(no_field); });
  EXPECT_NE(msg.find("training has no field 'threads'"), std::string::npos) << msg;

  msg = error_message([&] { PathReader reader(dir / "nowhere"); });
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
}

TEST(RunDirectory, ADivergedRunStaysValidUpToItsLastGoodStep) {
  TempDir dir("diverged");
  RunOptions r = small_run(dir / "run", "gd", 40, 7);
  r.train.optimizer.lr = 1e4;
  std::string msg = error_message([&] { train_run(r); });
  EXPECT_NE(msg.find("diverged at step"), std::string::npos) << msg;
  Manifest m = Manifest::load(r.out);
  EXPECT_EQ(m.status, "diverged");
  EXPECT_NE(m.message.find("diverged at step"), std::string::npos);
  EXPECT_GE(m.steps, 1);
  EXPECT_LT(m.steps, 40);
  EXPECT_EQ(static_cast<int64_t>(m.learning_rates.size()), m.steps);
  PathReader reader(r.out);
  EXPECT_TRUE(reader.check().bitwise_equal);
}

// Training interrupted mid-way (here by an exception after step 7, as a kill
// would) leaves a run that reads as valid up to its last checkpoint.
TEST(RunDirectory, AnInterruptedRunIsValidUpToItsLastCheckpoint) {
  TempDir dir("interrupted");
  RunOptions r = small_run(dir / "run", "momentum", 20, 3);
  Dataset data = load_dataset(r.data);
  NetworkOptions o;
  o.spec = ModelSpec::parse(r.model);
  o.input_shape = data.input_shape;
  o.num_classes = data.num_classes;
  Network net = build_network(o);
  Manifest base;
  base.data = r.data;
  base.num_train = data.x_train.size(0);
  base.input_shape = data.input_shape;
  base.num_classes = data.num_classes;
  base.train_crc32 = training_data_crc32(data.x_train, data.y_train);
  base.model_spec = r.model;
  base.parameters = parameter_layout(net);
  base.parameter_count = parameter_count(net);
  base.optimizer = r.train.optimizer;
  base.batch_size = r.train.batch;
  base.threads = current_threads();
  base.checkpoint_every = 3;

  struct Interrupting : RunWriter {
    using RunWriter::RunWriter;
    void on_step(int64_t step, const torch::Tensor& batch, const StepResult& result, Network& n,
                 torch::optim::Optimizer& opt) override {
      if (step == 7) throw std::runtime_error("interrupted");
      RunWriter::on_step(step, batch, result, n, opt);
    }
  } writer(r.out, base, false);
  EXPECT_THROW(train(net, data.x_train, data.y_train, data.x_test, data.y_test, r.train, writer),
               std::runtime_error);
  Manifest m = Manifest::load(r.out);
  EXPECT_EQ(m.status, "running");
  EXPECT_EQ(m.steps, 6);
  EXPECT_EQ(m.checkpoints.back().step, 6);
  PathReader reader(r.out);
  ReplayReport report = reader.check();
  EXPECT_TRUE(report.bitwise_equal);
  EXPECT_EQ(report.steps_replayed, 6);
}

// Replay runs each training step with the run's thread count, whatever the
// caller's (LibTorch's reductions split their sums by it, so the bits depend
// on it), and hands the steps to the caller's work under the caller's count.
TEST(Replay, StepsUseTheRunsThreadCountAndTheCallerKeepsItsOwn) {
  TempDir dir("replay_threads");
  const auto train_with = [&](const std::string& name, int threads) {
    RunOptions r = small_run(dir / name, "gd", 12, 4);
    r.data.train_size = 3000;  // enough rows that the reductions split by thread
    // A module's layers: pathkernel's own mlp:256 would split its products
    // into pieces fixed by the run (pieced_linear.h), the same bits on one
    // thread as on two here, and the test would have nothing to tell apart.
    r.model = "layers:linear(256),relu";
    ThreadScope scope(threads);
    train_run(r);
    return r.out;
  };
  PathReader one(train_with("one", 1)), two(train_with("two", 2));
  const size_t last = one.manifest().checkpoints.size() - 1;
  if (same_bits(one.checkpoint(last), two.checkpoint(last))) {
    GTEST_SKIP() << "one and two threads trained the same bits here: the thread count cannot be told apart";
  }
  for (int caller : {1, 2}) {
    ThreadScope scope(caller);
    for (PathReader* reader : {&one, &two}) {
      EXPECT_TRUE(reader->check().bitwise_equal) << "caller " << caller << ", run of "
                                                 << reader->manifest().threads << " thread(s)";
      int64_t seen = 0;
      reader->forward([&](const PathStep&) {
        EXPECT_EQ(current_threads(), caller);
        ++seen;
      });
      EXPECT_EQ(seen, 12);
      EXPECT_EQ(current_threads(), caller);
    }
  }
}

// A process that never sets its thread counts can start with LibTorch's and
// the BLAS's apart: with OMP_NUM_THREADS unset, LibTorch 1.13 takes 1 thread
// on this 2-core machine and OpenBLAS 2. Training records LibTorch's count and
// the replay runs both at it, so training must run the BLAS at it too: a run
// trained from that state replays bit for bit and has the bits of the same
// run trained with both counts at 1.
TEST(Replay, TrainingRunsTheBlasAtTheThreadCountItRecords) {
  using SetThreads = void (*)(int);
  auto blas_set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (blas_set == nullptr) GTEST_SKIP() << "LibTorch's BLAS here is not OpenBLAS: its thread count cannot be set apart";
  TempDir dir("blas_threads");
  const auto train_from = [&](const std::string& name, int blas_threads) {
    RunOptions r = small_run(dir / name, "gd", 12, 4);
    r.data.train_size = 3000;  // enough rows that the products split by thread
    r.model = "mlp:256";
    ThreadScope scope(1);
    blas_set(blas_threads);  // LibTorch at 1, the BLAS at blas_threads
    train_run(r);
    return r.out;
  };
  PathReader apart(train_from("apart", 2)), pinned(train_from("pinned", 1));
  EXPECT_EQ(apart.manifest().threads, 1);
  const size_t last = apart.manifest().checkpoints.size() - 1;
  EXPECT_TRUE(same_bits(apart.checkpoint(last), pinned.checkpoint(last)));
  EXPECT_TRUE(apart.check().bitwise_equal);
}

// Which runs train with OpenBLAS on one thread: a network with a
// convolution, pathkernel's own or a module's (a layers: spec, which
// pathkernel builds as TorchScript, read by its structured graph), and
// pathkernel's own MLP on several threads (its Linear products in pieces);
// a module without a convolution keeps LibTorch's count.
// tests/cli/resume_test.cpp trains and resumes one.
TEST(RunDirectory, ANetworkWithAConvolutionTrainsItsBlasOnOneThread) {
  const auto net_of = [](const std::string& spec, const std::vector<int64_t>& shape) {
    NetworkOptions o;
    o.spec = ModelSpec::parse(spec);
    o.input_shape = shape;
    o.num_classes = 3;
    return build_network(o);
  };
  EXPECT_EQ(training_blas_threads(*net_of("cnn:2", {1, 8, 8}), 2), 1);
  EXPECT_EQ(training_blas_threads(*net_of("layers:conv(3,3,padding=1),relu,flatten,linear(4)", {1, 8, 8}), 2), 1);
  EXPECT_EQ(training_blas_threads(*net_of("mlp:6", {5}), 2), 1);
  EXPECT_EQ(training_blas_threads(*net_of("layers:flatten,linear(8),relu", {1, 8, 8}), 2), 2);
  EXPECT_EQ(training_blas_threads(*net_of("mlp:6", {5}), 1), 1);
  EXPECT_EQ(training_linear_pieces(*net_of("mlp:6", {5}), 2), 2);
  EXPECT_EQ(training_linear_pieces(*net_of("mlp:6", {5}), 1), 1);
  EXPECT_EQ(training_linear_pieces(*net_of("cnn:2", {1, 8, 8}), 2), 1);
  EXPECT_EQ(training_linear_pieces(*net_of("layers:flatten,linear(8),relu", {1, 8, 8}), 2), 1);

  // Trained on two threads, the run records the count it trained OpenBLAS at.
  TempDir dir("conv_blas");
  ThreadScope scope(2);
  RunOptions cnn = small_run(dir / "cnn", "sgd", 4, 2), mlp = small_run(dir / "mlp", "sgd", 4, 2);
  cnn.data.spec = "mnist";
  cnn.data.train_size = 40;
  cnn.data.test_size = 4;
  cnn.model = "cnn:2";
  EXPECT_EQ(train_run(cnn).manifest.environment.blas_threads, 1);
  const Manifest trained_mlp = train_run(mlp).manifest;
  EXPECT_EQ(trained_mlp.environment.blas_threads, 1);
  EXPECT_EQ(trained_mlp.environment.linear_pieces, 2);
  EXPECT_EQ(Manifest::load(cnn.out).environment.blas_threads, 1);
  EXPECT_EQ(Manifest::load(mlp.out).environment.linear_pieces, 2);
  EXPECT_TRUE(PathReader(cnn.out).check().bitwise_equal);
}

TEST(RunDirectory, DefaultCheckpointSpacingIsAboutTheSquareRoot) {
  EXPECT_EQ(default_checkpoint_every(1), 1);
  EXPECT_EQ(default_checkpoint_every(300), 17);
  EXPECT_EQ(default_checkpoint_every(10000), 100);
}

// outputs(s) at a step between checkpoints replays to it first (which needs
// gradients), then evaluates the network there without them.
TEST(Replay, OutputsBetweenCheckpointsAreTheNetworkAtThatStep) {
  TempDir dir("outputs");
  RunOptions r = small_run(dir / "run", "sgd", 7, 3);
  train_run(r);
  PathReader reader(r.out);
  const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 4);
  Network net = build_network(reader.manifest().network_options());
  for (int64_t s : {0, 2, 3, 5, 7}) {
    const torch::Tensor w = reader.weights(s);
    torch::Tensor expect;
    {
      torch::NoGradGuard no_grad;
      set_flat_parameters(net, w);
      expect = net->forward(x);
    }
    EXPECT_TRUE(torch::equal(reader.outputs(s, x), expect)) << "step " << s;
  }
}

TEST(RunDirectory, Float32RunsReplayBitForBit) {
  TempDir dir("float32");
  RunOptions r = small_run(dir / "run", "momentum", 7, 3);
  r.data.dtype = torch::kFloat32;
  train_run(r);
  PathReader reader(r.out);
  EXPECT_EQ(reader.manifest().dtype, "float32");
  EXPECT_TRUE(reader.check().bitwise_equal);
}

}  // namespace
}  // namespace pathkernel

namespace pathkernel::testing {
namespace {

// The rates a schedule gives are the ones recorded and the ones training
// took: with sgd, Δw_s = −η_s G_s to rounding for the recorded η_s.
TEST(Schedule, TrainingTakesTheRecordedRates) {
  for (const std::string schedule : {"step:2:0.5", "warmup:3"}) {
    TempDir dir(schedule.substr(0, 4));
    RunOptions r = small_run(dir / "run", "sgd", 6, 2);
    r.train.schedule = schedule;
    train_run(r);
    PathReader reader(r.out);
    const std::vector<double> expect = learning_rate_schedule(schedule, r.train.optimizer.lr, 6);
    EXPECT_EQ(reader.manifest().learning_rates, expect) << schedule;
    EXPECT_NE(expect.front(), expect.back()) << schedule;
    Network net = build_network(reader.manifest().network_options());
    reader.forward([&](const PathStep& st) {
      EXPECT_EQ(st.lr, expect[st.step]);
      set_flat_parameters(net, st.w);
      for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
      const torch::Tensor idx = st.batch;
      training_loss(net->forward(reader.decoded_dataset().x_train.index_select(0, idx)),
                    reader.decoded_dataset().y_train.index_select(0, idx), OutputMap::LogSoftmax)
          .backward();
      std::vector<torch::Tensor> g;
      for (auto& p : net->parameters()) g.push_back(p.grad().reshape(-1));
      const torch::Tensor step = -expect[st.step] * torch::cat(g);
      EXPECT_LE((st.delta - step).abs().max().item<double>(), 4e-16 * st.w.abs().max().item<double>())
          << schedule << " step " << st.step;
    });
  }
}


TEST(PathReader, HoldsByteInputsAsCodesAndWalksTheirDecodedRows) {
  // Fashion-MNIST's inputs are bytes: the reader holds them as codes and
  // decodes a batch at a time (its whole set for gd's full batch), and its
  // decoded_dataset() gives the split loaded whole. A float64 run's walk takes the
  // replay's signals; a float32 run's reads the batch's inputs itself.
  const std::pair<std::string, std::string> runs[] = {{"sgd", "mlp:6"}, {"gd", "mlp:6"}, {"adam", "cnn:2"}};
  for (const auto& [optimizer, model] : runs) {
    TempDir dir(optimizer);
    RunOptions r = testing::small_run_of(dir / "run", optimizer, "fashion-mnist", model, 8, 4, 5);
    if (optimizer == "adam") r.data.dtype = torch::kFloat32;
    train_run(r);
    PathReader reader(r.out);
    EXPECT_FALSE(reader.held_dataset().x_train.defined());
    EXPECT_EQ(reader.train_count(), 40);
    const Dataset whole = load_dataset(r.data);
    const torch::Tensor index = torch::tensor({39, 3}, torch::kLong);
    EXPECT_TRUE(same_bits(reader.train_inputs(index), whole.x_train.index_select(0, index)));
    DecompositionOptions options;
    options.progress = false;
    const Decomposition d = decompose(reader, reader.test_inputs(torch::Tensor()), options);
    EXPECT_LE(summarize(d).max_rel_error, 1e-12) << optimizer;
    // E holds a float32 run's rounding of its updates (Float32Runs), no more:
    // a training side of other rows would leave its difference there.
    EXPECT_LE(d.completeness_gap().sub(d.rounding).abs().max().item<double>(), 1e-12) << optimizer;
    EXPECT_LE(d.rounding.abs().max().item<double>(), 1e-5) << optimizer;
    EXPECT_GT((d.fN - d.f0).abs().max().item<double>(), 1e-3) << optimizer;
    EXPECT_TRUE(same_bits(reader.decoded_dataset().x_train, whole.x_train));
    EXPECT_TRUE(same_bits(reader.twin().decoded_dataset().x_train, whole.x_train));
    // The test split too: held as codes, its points decoded as chosen, and
    // train's test accuracy that of the split loaded whole.
    EXPECT_FALSE(reader.held_dataset().x_test.defined());
    EXPECT_EQ(reader.test_count(), whole.x_test.size(0));
    EXPECT_TRUE(same_bits(reader.test_inputs(torch::Tensor()), whole.x_test));
    EXPECT_TRUE(same_bits(reader.decoded_dataset().x_test, whole.x_test));
    const Manifest& m = reader.manifest();
    set_flat_parameters(reader.network(), reader.checkpoint(m.checkpoints.size() - 1));
    torch::NoGradGuard guard;
    EXPECT_DOUBLE_EQ(accuracy(reader.network(), whole.x_test, whole.y_test),
                     m.summary.at("test_accuracy").get<double>())
        << optimizer;
  }
}

}  // namespace
}  // namespace pathkernel::testing
