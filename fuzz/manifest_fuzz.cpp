// libFuzzer harness: a run directory's manifest.json. At start-up the harness
// writes a small, consistent run directory (mlp:2 on 2-D inputs, momentum,
// checkpoints at steps 0, 2 and 4 with their optimizer buffers, one batch
// log) under $TMPDIR, plus a symlink in it pointing out of it. Each input
// becomes that run's manifest.json, which is then loaded and validated
// against the files, as PathReader does before replaying. Whatever the
// manifest says, the reader must refuse it with a clean pathkernel::Error or
// accept a consistent run; it must not read outside the run directory,
// allocate what a field claims, or change on a save -> load round trip.
//
// PATHKERNEL_FUZZ_SEED_MANIFEST=FILE writes the consistent manifest to FILE
// and exits (how fuzz/corpus/manifest/valid.json was made).
#include <cstdlib>
#include <filesystem>

#include "fuzz_util.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/manifest.h"
#include "pathkernel/npy.h"

namespace fs = std::filesystem;
using pathkernel::FileRecord;
using pathkernel::Manifest;

namespace {

FileRecord write_record(const fs::path& run, const std::string& name, const torch::Tensor& t) {
  const std::string bytes = pathkernel::npy_bytes(t);
  pathkernel::write_file_atomic((run / name).string(), bytes);
  return {name, static_cast<int64_t>(bytes.size()), pathkernel::crc32_of(bytes)};
}

/// Writes the run's files into `run` and returns its consistent manifest.
Manifest make_run(const fs::path& run) {
  fs::create_directories(run / "checkpoints");
  fs::create_directories(run / "optimizer");
  fs::create_directories(run / "batches");
  Manifest m;
  m.pathkernel_version = "0.1.0";
  m.libtorch_version = "1.13.1";
  m.status = "complete";
  m.steps = 4;
  m.data.spec = "toy2d";
  m.num_train = 8;
  m.num_test = 4;
  m.input_shape = {2};
  m.num_classes = 2;
  m.normalization = {{"kind", "none"}};
  m.source = nlohmann::ordered_json::object();
  m.model_spec = "mlp:2";
  pathkernel::Network net = pathkernel::build_network(m.network_options());
  m.parameters = pathkernel::parameter_layout(net);
  m.parameter_count = pathkernel::parameter_count(net);
  m.optimizer.name = "momentum";
  m.batch_size = 3;
  m.batch_seed = 1;
  m.checkpoint_every = 2;
  m.learning_rates = {0.1, 0.1, 0.1, 0.1};
  const torch::Tensor base = torch::arange(m.parameter_count, torch::kFloat64) * 0.01;
  for (int64_t step : {0, 2, 4}) {
    pathkernel::CheckpointRecord c;
    c.step = step;
    char name[64];
    std::snprintf(name, sizeof name, "checkpoints/w_%08lld.npy", static_cast<long long>(step));
    c.weights = write_record(run, name, base * (step + 1));
    if (step > 0) {
      c.optimizer_step = step;
      std::snprintf(name, sizeof name, "optimizer/momentum_buffer_%08lld.npy", static_cast<long long>(step));
      c.optimizer_buffers["momentum_buffer"] = write_record(run, name, base - 0.5 * step);
    }
    m.checkpoints.push_back(c);
  }
  const torch::Tensor batches =
      torch::tensor({0, 1, 2, 3, 4, 5, 6, 7, -1, 2, 5, 7}, torch::kInt32).reshape({4, 3});
  m.batches.push_back({0, 4, write_record(run, "batches/b_00000000.npy", batches)});
  m.summary = {{"loss", 0.5}};
  return m;
}

const std::string& run_dir() {
  static const std::string dir = [] {
    const fs::path out = pathkernel::fuzz::scratch_path(".run");
    fs::remove_all(out);
    const Manifest m = make_run(out);
    // A file outside the run and a symlink to it from inside, for the
    // containment checks (seeds name "link_out.npy").
    pathkernel::write_file_atomic(out.string() + ".outside.npy",
                                  pathkernel::npy_bytes(torch::zeros({m.parameter_count}, torch::kFloat64)));
    fs::create_symlink(out.string() + ".outside.npy", out / "link_out.npy");
    if (const char* seed = std::getenv("PATHKERNEL_FUZZ_SEED_MANIFEST")) {
      pathkernel::write_file_atomic(seed, m.dump());
      std::exit(0);
    }
    return out.string();
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  run_dir();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = run_dir();
  pathkernel::fuzz::write_bytes(dir + "/manifest.json", data, size);
  try {
    const Manifest m = Manifest::load(dir);
    const Manifest again = Manifest::from_json(m.to_json());
    if (again.dump() != m.dump()) pathkernel::fuzz::fail("manifest save -> load -> save changed it");
    pathkernel::validate_run(dir, m);
    m.network_options();
  } catch (const pathkernel::Error& e) {
    pathkernel::fuzz::refused(e);
  }
  return 0;
}
