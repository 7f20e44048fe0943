// manifest.json: serialisation, loading and validation against the files.
#include "pathkernel/manifest.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <type_traits>
#include <vector>

#include "pathkernel/context.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/json_number.h"
#include "pathkernel/loss.h"
#include "pathkernel/npy.h"
#include "pathkernel/npy_array.h"

namespace pathkernel {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

/// Reads field `key` of object `j` as T; `where` names the object in errors.
template <typename T>
T field(const ojson& j, const char* key, const std::string& where) {
  PK_CHECK(j.is_object(), "manifest: " << where << " is not an object");
  auto it = j.find(key);
  PK_CHECK(it != j.end(), "manifest: " << where << " has no field '" << key << "'");
  const std::string what = "manifest: field '" + std::string(key) + "' of " + where;
  if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
    return json_number<T>(*it, what);
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>> || std::is_same_v<T, std::vector<double>>) {
    return json_numbers<typename T::value_type>(*it, what);
  }
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception& e) {
    PK_THROW("manifest: field '" << key << "' of " << where << " has the wrong type (" << it->dump()
                                 << "): " << e.what());
  }
}

ojson file_json(const FileRecord& f) {
  return ojson{{"file", f.file}, {"bytes", f.bytes}, {"crc32", f.crc32}};
}

FileRecord file_from(const ojson& j, const std::string& where) {
  return {field<std::string>(j, "file", where), field<int64_t>(j, "bytes", where),
          field<uint32_t>(j, "crc32", where)};
}

}  // namespace

ojson Manifest::to_json() const {
  ojson j;
  j["format"] = format;
  j["format_version"] = format_version;
  j["pathkernel_version"] = pathkernel_version;
  j["libtorch_version"] = libtorch_version;
  j["status"] = status;
  j["message"] = message;
  j["steps"] = steps;
  j["data"] = ojson{{"spec", data.spec},
                    {"train_size", data.train_size},
                    {"test_size", data.test_size},
                    {"seed", data.seed},
                    {"num_train", num_train},
                    {"num_test", num_test},
                    {"input_shape", input_shape},
                    {"num_classes", num_classes},
                    {"normalization", normalization},
                    {"source", source},
                    {"train_crc32", train_crc32}};
  if (integer_inputs) j["data"]["integer_inputs"] = true;
  if (sequence_length > 0) j["data"]["sequence_length"] = sequence_length;
  j["model"] = ojson{{"spec", model_spec},
                     {"output", output},
                     {"zero_last_layer", zero_last_layer},
                     {"init_seed", init_seed}};
  if (!module.file.empty()) {
    j["model"]["module"] = ojson{{"file", module.file}, {"bytes", module.bytes}, {"crc32", module.crc32}};
  }
  j["dtype"] = dtype;
  ojson params = ojson::array();
  for (const ParamInfo& p : parameters) {
    params.push_back(ojson{{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}, {"numel", p.numel}});
  }
  j["parameters"] = ojson{{"count", parameter_count}, {"tensors", params}};
  j["optimizer"] = optimizer.to_json();
  j["training"] = ojson{{"batch_size", batch_size},
                        {"batch_seed", batch_seed},
                        {"schedule", schedule},
                        {"threads", threads},
                        {"checkpoint_every", checkpoint_every},
                        {"loss", loss}};
  if (recorded) j["training"]["recorded"] = true;
  if (!clip_factors.file.empty()) j["training"]["clip_factors"] = file_json(clip_factors);
  if (!loss_weights.file.empty()) j["training"]["loss_weights"] = file_json(loss_weights);
  if (!environment.empty()) j["environment"] = environment.to_json();
  j["learning_rates"] = learning_rates;
  ojson cks = ojson::array();
  for (const CheckpointRecord& c : checkpoints) {
    ojson ck = ojson{{"step", c.step}, {"file", c.weights.file}, {"bytes", c.weights.bytes},
               {"crc32", c.weights.crc32}};
    ojson state = ojson::object();
    for (const auto& [name, f] : c.optimizer_buffers) state[name] = file_json(f);
    ck["optimizer_state"] = ojson{{"step", c.optimizer_step}, {"buffers", state}};
    if (!c.module_buffers.file.empty()) ck["module_buffers"] = file_json(c.module_buffers);
    cks.push_back(ck);
  }
  j["checkpoints"] = cks;
  ojson bs = ojson::array();
  for (const BatchRecord& b : batches) {
    bs.push_back(ojson{{"first_step", b.first_step}, {"steps", b.steps}, {"file", b.indices.file},
                       {"bytes", b.indices.bytes}, {"crc32", b.indices.crc32}});
  }
  j["batches"] = bs;
  j["metrics"] = metrics;
  j["summary"] = summary;
  return j;
}

Manifest Manifest::from_json(const ojson& j) {
  Manifest m;
  m.format = field<std::string>(j, "format", "the manifest");
  PK_CHECK(m.format == "pathkernel-run",
           "manifest: format is '" << m.format << "', expected 'pathkernel-run'");
  m.format_version = field<int64_t>(j, "format_version", "the manifest");
  PK_CHECK(m.format_version == 1, "manifest: format_version " << m.format_version
                                                              << " is not supported (expected 1)");
  m.pathkernel_version = field<std::string>(j, "pathkernel_version", "the manifest");
  m.libtorch_version = field<std::string>(j, "libtorch_version", "the manifest");
  m.status = field<std::string>(j, "status", "the manifest");
  m.message = field<std::string>(j, "message", "the manifest");
  m.steps = field<int64_t>(j, "steps", "the manifest");

  const ojson d = field<ojson>(j, "data", "the manifest");
  m.data.spec = field<std::string>(d, "spec", "data");
  m.data.train_size = field<int64_t>(d, "train_size", "data");
  m.data.test_size = field<int64_t>(d, "test_size", "data");
  m.data.seed = field<uint64_t>(d, "seed", "data");
  m.num_train = field<int64_t>(d, "num_train", "data");
  m.num_test = field<int64_t>(d, "num_test", "data");
  m.input_shape = field<std::vector<int64_t>>(d, "input_shape", "data");
  m.num_classes = field<int64_t>(d, "num_classes", "data");
  m.normalization = field<ojson>(d, "normalization", "data");
  m.source = field<ojson>(d, "source", "data");
  m.train_crc32 = field<uint32_t>(d, "train_crc32", "data");
  if (d.contains("integer_inputs")) m.integer_inputs = field<bool>(d, "integer_inputs", "data");
  if (d.contains("sequence_length")) m.sequence_length = field<int64_t>(d, "sequence_length", "data");

  const ojson mo = field<ojson>(j, "model", "the manifest");
  m.model_spec = field<std::string>(mo, "spec", "model");
  m.output = field<std::string>(mo, "output", "model");
  m.zero_last_layer = field<bool>(mo, "zero_last_layer", "model");
  m.init_seed = field<uint64_t>(mo, "init_seed", "model");
  if (mo.contains("module")) m.module = file_from(field<ojson>(mo, "module", "model"), "model module");
  PK_CHECK(m.module.file.empty() == !ModelSpec::parse(m.model_spec).is_torchscript(),
           "manifest: model '" << m.model_spec << "' "
                               << (m.module.file.empty() ? "names no module file" : "is not a TorchScript model but names a module file"));
  m.dtype = field<std::string>(j, "dtype", "the manifest");
  m.data.dtype = parse_dtype(m.dtype);

  const ojson ps = field<ojson>(j, "parameters", "the manifest");
  m.parameter_count = field<int64_t>(ps, "count", "parameters");
  for (const ojson& p : field<ojson>(ps, "tensors", "parameters")) {
    m.parameters.push_back({field<std::string>(p, "name", "a parameter tensor"),
                            field<std::vector<int64_t>>(p, "shape", "a parameter tensor"),
                            field<int64_t>(p, "offset", "a parameter tensor"),
                            field<int64_t>(p, "numel", "a parameter tensor")});
  }
  try {
    m.optimizer = OptimizerOptions::from_json(field<ojson>(j, "optimizer", "the manifest"));
  } catch (const nlohmann::json::exception& e) {
    PK_THROW("manifest: bad optimizer entry: " << e.what());
  }
  const ojson t = field<ojson>(j, "training", "the manifest");
  m.batch_size = field<int64_t>(t, "batch_size", "training");
  m.batch_seed = field<uint64_t>(t, "batch_seed", "training");
  m.schedule = field<std::string>(t, "schedule", "training");
  m.threads = field<int64_t>(t, "threads", "training");
  m.checkpoint_every = field<int64_t>(t, "checkpoint_every", "training");
  if (t.contains("loss")) m.loss = field<std::string>(t, "loss", "training");
  check_loss_output(parse_loss_kind(m.loss), parse_output_map(m.output));
  if (t.contains("recorded")) m.recorded = field<bool>(t, "recorded", "training");
  if (t.contains("clip_factors")) {
    PK_CHECK(m.recorded, "manifest: training.clip_factors belongs to a recorded run (training.recorded)");
    m.clip_factors = file_from(field<ojson>(t, "clip_factors", "training"), "clip factors");
  }
  if (t.contains("loss_weights")) {
    m.loss_weights = file_from(field<ojson>(t, "loss_weights", "training"), "loss weights");
  }
  if (j.contains("environment")) m.environment = ReplayEnvironment::from_json(j["environment"]);
  m.learning_rates = field<std::vector<double>>(j, "learning_rates", "the manifest");

  for (const ojson& c : field<ojson>(j, "checkpoints", "the manifest")) {
    CheckpointRecord ck;
    ck.step = field<int64_t>(c, "step", "a checkpoint");
    std::string where = "checkpoint " + std::to_string(ck.step);
    ck.weights = file_from(c, where);
    const ojson st = field<ojson>(c, "optimizer_state", where);
    ck.optimizer_step = field<int64_t>(st, "step", where + " optimizer_state");
    const ojson buffers = field<ojson>(st, "buffers", where + " optimizer_state");
    for (const auto& [name, f] : buffers.items()) {
      ck.optimizer_buffers[name] = file_from(f, where + " buffer " + name);
    }
    if (c.contains("module_buffers")) ck.module_buffers = file_from(c["module_buffers"], where + " module_buffers");
    m.checkpoints.push_back(std::move(ck));
  }
  for (const ojson& b : field<ojson>(j, "batches", "the manifest")) {
    BatchRecord br;
    br.first_step = field<int64_t>(b, "first_step", "a batch log");
    br.steps = field<int64_t>(b, "steps", "a batch log");
    br.indices = file_from(b, "batch log at step " + std::to_string(br.first_step));
    m.batches.push_back(std::move(br));
  }
  m.metrics = field<std::string>(j, "metrics", "the manifest");
  m.summary = field<ojson>(j, "summary", "the manifest");
  return m;
}

std::string Manifest::dump() const { return to_json().dump(2) + "\n"; }

Manifest Manifest::load(const std::string& run_dir) {
  fs::path path = fs::path(run_dir) / "manifest.json";
  PK_CHECK(fs::is_directory(run_dir), "run directory '" << run_dir << "' does not exist");
  PK_CHECK(fs::exists(path), "run directory '" << run_dir
                                               << "' has no manifest.json: was it created by "
                                                  "'pathkernel train'?");
  std::string text = read_file(run_file_path(run_dir, "manifest.json"));
  ojson j;
  try {
    j = ojson::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // parse_error for bad syntax, out_of_range for a number beyond double (1e400).
    PK_THROW("manifest '" << path.string() << "' is not valid JSON: " << e.what());
  }
  try {
    Manifest m = from_json(j);
    m.directory = run_dir;
    return m;
  } catch (const nlohmann::json::exception& e) {
    PK_THROW("manifest '" << path.string() << "' is malformed: " << e.what());
  }
}

void Manifest::save(const std::string& run_dir) const {
  write_file_atomic((fs::path(run_dir) / "manifest.json").string(), dump());
}

NetworkOptions Manifest::network_options(int64_t position) const {
  NetworkOptions o;
  o.position = position;
  o.spec = ModelSpec::parse(model_spec);
  if (o.spec.is_torchscript()) o.spec.path = directory.empty() ? module.file : run_file_path(directory, module.file);
  o.integer_inputs = integer_inputs;
  o.sequence_length = sequence_length;
  o.input_shape = input_shape;
  o.num_classes = num_classes;
  o.output = parse_output_map(output);
  o.loss = parse_loss_kind(loss);
  o.zero_last_layer = zero_last_layer;
  o.dtype = parse_dtype(dtype);
  o.seed = init_seed;
  o.linear_pieces = std::max<int64_t>(1, environment.linear_pieces);
  return o;
}

DataOptions Manifest::data_options() const {
  DataOptions o = data;
  if (source.is_object() && source.value("in_run", false)) {
    const std::string dir = source.value("directory", std::string());
    PK_CHECK(source.value("kind", std::string()) == "npy" && !dir.empty(),
             "manifest: data.source.in_run names no npy directory (expected {\"kind\": \"npy\", \"directory\": "
             "DIR, \"in_run\": true})");
    PK_CHECK(!directory.empty(), "manifest: data stored in the run directory, but the manifest was not loaded "
                                 "from a run directory");
    // Each array must be a regular file inside the run (run_file_path refuses the rest).
    // An array is NAME.npy or the coded pair NAME.codes.npy and NAME.values.npy.
    for (const char* name : {"train_x", "train_y", "test_x", "test_y"}) {
      const fs::path data_dir = fs::path(directory) / dir;
      std::vector<std::string> files;
      try {
        files = npy_array_files(data_dir.string(), name);
      } catch (const Error& e) {
        PK_THROW("run '" << directory << "': data stored in the run: " << e.what());
      }
      for (const std::string& f : files) run_file_path(directory, (fs::path(dir) / f).string());
    }
    o.spec = "npy:" + (fs::path(directory) / dir).string();
  }
  return o;
}

int64_t Manifest::path_bytes() const {
  int64_t total = 0;
  total += clip_factors.bytes;
  for (const CheckpointRecord& c : checkpoints) {
    total += c.weights.bytes;
    for (const auto& [_, f] : c.optimizer_buffers) total += f.bytes;
    total += c.module_buffers.bytes;
  }
  for (const BatchRecord& b : batches) total += b.indices.bytes;
  return total;
}

std::string run_file_path(const std::string& run_dir, const std::string& file) {
  const fs::path name(file);
  PK_CHECK(!file.empty() && name.is_relative(),
           "run '" << run_dir << "': file name '" << file
                   << "' in manifest.json must be a path relative to the run directory");
  for (const fs::path& part : name) {
    PK_CHECK(part != "..", "run '" << run_dir << "': file name '" << file
                                   << "' in manifest.json leaves the run directory ('..')");
  }
  const fs::path path = fs::path(run_dir) / name;
  std::error_code ec;
  PK_CHECK(fs::exists(path, ec), "run '" << run_dir << "': file '" << file
                                         << "' listed in manifest.json is missing");
  // Resolve every symlink, of the run directory and of the file, and compare.
  const fs::path root = fs::canonical(run_dir, ec);
  PK_CHECK(!ec, "run '" << run_dir << "': cannot resolve the run directory: " << ec.message());
  const fs::path real = fs::canonical(path, ec);
  PK_CHECK(!ec, "run '" << run_dir << "': cannot resolve file '" << file << "': " << ec.message());
  const auto [r, _] = std::mismatch(root.begin(), root.end(), real.begin(), real.end());
  PK_CHECK(r == root.end(), "run '" << run_dir << "': file '" << file << "' resolves to '"
                                    << real.string()
                                    << "', outside the run directory (a symlink out of the run "
                                       "is refused)");
  PK_CHECK(fs::is_regular_file(real, ec),
           "run '" << run_dir << "': file '" << file << "' is not a regular file");
  return path.string();
}

namespace {
/// Checks a listed file's presence, size and CRC-32; returns its bytes.
std::string check_file(const std::string& run_dir, const FileRecord& f, const std::string& what) {
  fs::path path = fs::path(run_dir) / f.file;
  std::error_code ec;
  PK_CHECK(!f.file.empty() && fs::exists(path, ec),
           "run '" << run_dir << "': " << what << " file '" << f.file
                   << "' listed in manifest.json is missing");
  run_file_path(run_dir, f.file);
  // Compare sizes before reading, so a wrong file is never read whole.
  const uintmax_t size = fs::file_size(path, ec);
  PK_CHECK(!ec, "run '" << run_dir << "': cannot stat " << what << " file '" << f.file
                        << "': " << ec.message());
  PK_CHECK(f.bytes >= 0 && size == static_cast<uintmax_t>(f.bytes),
           "run '" << run_dir << "': " << what << " file '" << f.file << "' has " << size
                   << " bytes, manifest.json says " << f.bytes);
  std::string bytes = read_file(path.string());
  PK_CHECK(static_cast<int64_t>(bytes.size()) == f.bytes,
           "run '" << run_dir << "': " << what << " file '" << f.file << "' has " << bytes.size()
                   << " bytes, manifest.json says " << f.bytes);
  uint32_t crc = crc32_of(bytes);
  PK_CHECK(crc == f.crc32, "run '" << run_dir << "': " << what << " file '" << f.file
                                   << "' has CRC-32 " << crc << ", manifest.json says " << f.crc32
                                   << " (the file is corrupt)");
  return bytes;
}

/// Checks that an .npy file holds a flat float64 vector of length p.
void check_flat_vector(const std::string& run_dir, const FileRecord& f, const std::string& what,
                       int64_t p, bool float32_allowed) {
  torch::Tensor t = parse_npy(check_file(run_dir, f, what), (fs::path(run_dir) / f.file).string());
  const bool dtype_ok = t.scalar_type() == torch::kFloat64 || (float32_allowed && t.scalar_type() == torch::kFloat32);
  PK_CHECK(dtype_ok && t.dim() == 1 && t.size(0) == p,
           "run '" << run_dir << "': " << what << " file '" << f.file << "' holds " << t.scalar_type()
                   << " of shape " << t.sizes() << ", expected " << (float32_allowed ? "float32 or " : "")
                   << "float64 of shape [" << p << "]");
  t = t.to(torch::kFloat64);
  const double* w = t.data_ptr<double>();
  for (int64_t i = 0; i < p; ++i) {
    PK_CHECK(std::isfinite(w[i]), "run '" << run_dir << "': " << what << " file '" << f.file
                                          << "' holds a non-finite value (" << w[i]
                                          << " at index " << i
                                          << "), expected finite weights");
  }
}

/// Checks checkpoint i's module buffers (CheckpointRecord::module_buffers):
/// every checkpoint has them or none does, and each holds a finite float64
/// vector of the first one's size.
void check_module_buffers(const std::string& run_dir, const Manifest& m, size_t i) {
  const CheckpointRecord& c = m.checkpoints[i];
  const CheckpointRecord& first = m.checkpoints.front();
  PK_CHECK(c.module_buffers.file.empty() == first.module_buffers.file.empty(),
           "run '" << run_dir << "': checkpoint " << c.step << (c.module_buffers.file.empty() ? " lacks" : " has")
                   << " module_buffers but checkpoint " << first.step
                   << (first.module_buffers.file.empty() ? " has none" : " has them")
                   << ", expected every checkpoint to store the module's running statistics or none");
  if (c.module_buffers.file.empty()) return;
  const int64_t q = parse_npy(check_file(run_dir, first.module_buffers, "module buffers"),
                              (fs::path(run_dir) / first.module_buffers.file).string())
                        .numel();
  check_flat_vector(run_dir, c.module_buffers, "checkpoint " + std::to_string(c.step) + " module buffers", q, false);
}

/// Checks a batch log: int32 [steps, B] of training-set indices, rows padded
/// with -1, at least one index per row.
void check_batch_log(const std::string& run_dir, const BatchRecord& b, int64_t num_train) {
  const std::string name = (fs::path(run_dir) / b.indices.file).string();
  torch::Tensor t = parse_npy(check_file(run_dir, b.indices, "batch log"), name);
  PK_CHECK(t.scalar_type() == torch::kInt32 && t.dim() == 2 && t.size(0) == b.steps && t.size(1) > 0,
           "run '" << run_dir << "': batch log '" << b.indices.file << "' holds " << t.scalar_type()
                   << " of shape " << t.sizes() << ", expected int32 of shape [" << b.steps
                   << ", B] with B >= 1");
  const int32_t* v = t.data_ptr<int32_t>();
  const int64_t width = t.size(1);
  for (int64_t row = 0; row < t.size(0); ++row) {
    PK_CHECK(v[row * width] >= 0, "run '" << run_dir << "': batch log '" << b.indices.file
                                          << "' row " << row << " (step " << b.first_step + row
                                          << ") is empty");
    for (int64_t col = 0; col < width; ++col) {
      const int32_t i = v[row * width + col];
      PK_CHECK(i >= -1 && i < num_train,
               "run '" << run_dir << "': batch log '" << b.indices.file << "' row " << row
                       << " holds index " << i << ", expected a training-set index in [0, "
                       << num_train << ") or -1 padding");
    }
  }
}

int64_t add_no_overflow(int64_t a, int64_t b, const std::string& what) {
  PK_CHECK(b >= 0 && a <= std::numeric_limits<int64_t>::max() - b,
           what << ": count overflows or is negative (" << a << " + " << b << ")");
  return a + b;
}
}  // namespace

void validate_run(const std::string& run_dir, const Manifest& m) {
  const std::string where = "run '" + run_dir + "'";
  PK_CHECK(m.status == "running" || m.status == "complete" || m.status == "diverged",
           where << ": unknown status '" << m.status << "' (expected running, complete or diverged)");
  PK_CHECK(m.steps >= 0, where << ": negative step count " << m.steps);
  PK_CHECK(m.threads >= 1 && m.threads <= kMaxRunThreads,
           where << ": training.threads is " << m.threads << ", expected 1 to " << kMaxRunThreads);
  PK_CHECK(m.num_train >= 1, where << ": data.num_train is " << m.num_train << ", expected >= 1");
  PK_CHECK(m.batch_size >= 0, where << ": training.batch_size is " << m.batch_size
                                    << ", expected >= 0 (0: full batch)");
  PK_CHECK(static_cast<int64_t>(m.learning_rates.size()) >= m.steps,
           where << ": " << m.learning_rates.size() << " learning rates for " << m.steps << " steps");
  int64_t offset = 0;
  for (const ParamInfo& p : m.parameters) {
    PK_CHECK(p.offset == offset, where << ": parameter '" << p.name << "' at offset " << p.offset
                                       << ", expected " << offset);
    int64_t n = 1;
    for (int64_t d : p.shape) n = mul_no_overflow(n, d, "parameter size");
    PK_CHECK(n == p.numel, where << ": parameter '" << p.name << "' has numel " << p.numel
                                 << " but shape gives " << n);
    offset = add_no_overflow(offset, n, where + ": parameter count");
  }
  PK_CHECK(offset == m.parameter_count,
           where << ": parameter tensors hold " << offset << " values, count says " << m.parameter_count);
  if (!m.module.file.empty()) {
    const std::string bytes = read_file(run_file_path(run_dir, m.module.file));
    PK_CHECK(static_cast<int64_t>(bytes.size()) == m.module.bytes && crc32_of(bytes) == m.module.crc32,
             where << ": the model's module file '" << m.module.file << "' has " << bytes.size()
                   << " bytes and CRC-32 " << crc32_of(bytes) << ", the manifest says " << m.module.bytes
                   << " bytes and CRC-32 " << m.module.crc32 << ": it was changed after training");
  }
  PK_CHECK(!m.checkpoints.empty() && m.checkpoints.front().step == 0,
           where << ": the first checkpoint must be step 0");
  PK_CHECK(m.checkpoints.back().step == m.steps,
           where << ": the last checkpoint is step " << m.checkpoints.back().step
                 << ", expected the final step " << m.steps);
  for (size_t i = 0; i < m.checkpoints.size(); ++i) {
    const CheckpointRecord& c = m.checkpoints[i];
    if (i > 0) {
      PK_CHECK(c.step > m.checkpoints[i - 1].step,
               where << ": checkpoint steps out of order (" << m.checkpoints[i - 1].step << " then "
                     << c.step << ")");
    }
    const std::string what = "checkpoint " + std::to_string(c.step);
    // A compact recording of a float32 loop stores its checkpoints in float32.
    const bool float32_allowed = m.recorded && m.dtype == "float32";
    check_flat_vector(run_dir, c.weights, what, m.parameter_count, float32_allowed);
    for (const auto& [name, f] : c.optimizer_buffers) {
      check_flat_vector(run_dir, f, what + " " + name, m.parameter_count, float32_allowed);
    }
    check_module_buffers(run_dir, m, i);
  }
  if (m.batch_size != 0) {
    int64_t next = 0;
    for (const BatchRecord& b : m.batches) {
      PK_CHECK(b.first_step == next, where << ": batch log starts at step " << b.first_step
                                           << ", expected " << next);
      PK_CHECK(b.steps >= 1, where << ": batch log at step " << b.first_step << " covers "
                                   << b.steps << " steps, expected >= 1");
      check_batch_log(run_dir, b, m.num_train);
      next = add_no_overflow(next, b.steps, where + ": batch log steps");
    }
    PK_CHECK(next >= m.steps, where << ": batch logs cover " << next << " steps, expected " << m.steps);
  }
  if (m.recorded) {
    // Every step's weights (nothing replayed), or a compact recording's
    // checkpoints with the steps between replayed: both list each step's batch.
    PK_CHECK(m.batch_size != 0, where << ": a recorded run lists each step's batch (training.batch_size > 0)");
    if (!m.clip_factors.file.empty()) read_clip_factors(run_dir, m);
  }
  if (!m.loss_weights.file.empty()) read_loss_weights(run_dir, m);
}

torch::Tensor read_loss_weights(const std::string& run_dir, const Manifest& m) {
  if (m.loss_weights.file.empty()) return {};
  const std::string where = "run '" + run_dir + "'";
  torch::Tensor c = parse_npy(check_file(run_dir, m.loss_weights, "loss weights"),
                              (fs::path(run_dir) / m.loss_weights.file).string());
  PK_CHECK(c.scalar_type() == torch::kFloat64 && c.dim() == 1 && c.size(0) == m.num_train,
           where << ": loss weights file '" << m.loss_weights.file << "' holds " << c.scalar_type() << " of shape "
                 << c.sizes() << ", expected float64 of shape [" << m.num_train << "]");
  return checked_loss_weights(c, m.num_train, where + ": '" + m.loss_weights.file + "'");
}

torch::Tensor read_clip_factors(const std::string& run_dir, const Manifest& m) {
  if (m.clip_factors.file.empty()) return torch::ones({m.steps}, torch::kFloat64);
  const std::string where = "run '" + run_dir + "'";
  torch::Tensor c = parse_npy(check_file(run_dir, m.clip_factors, "clip factors"),
                              (fs::path(run_dir) / m.clip_factors.file).string());
  PK_CHECK(c.scalar_type() == torch::kFloat64 && c.dim() == 1 && c.size(0) == m.steps,
           where << ": clip factors file '" << m.clip_factors.file << "' holds " << c.scalar_type() << " of shape "
                 << c.sizes() << ", expected float64 of shape [" << m.steps << "]");
  const double* v = c.data_ptr<double>();
  for (int64_t s = 0; s < m.steps; ++s) {
    PK_CHECK(std::isfinite(v[s]) && v[s] > 0, where << ": the clip factor of step " << s << " is " << v[s]
                                                    << ", expected a finite factor > 0");
  }
  return c;
}

uint32_t training_data_crc32(const torch::Tensor& x, const torch::Tensor& y) {
  // The CRC of x's bytes followed by y's, read where they are: a copy into
  // one string (and its growth for y) took 1.07 GB for Fashion-MNIST.
  uint32_t crc = 0;
  for (const torch::Tensor& t : {x.contiguous(), y.contiguous()})
    crc = crc32_update(crc, t.data_ptr(), static_cast<size_t>(t.numel() * t.element_size()));
  return crc;
}

uint32_t training_data_crc32(const Dataset& data) {
  if (!data.x_train_coded.defined()) return training_data_crc32(data.x_train, data.y_train);
  // Blocks of rows decoded in turn: the CRC of their bytes one after another
  // is the CRC of the whole split's, without the whole split decoded.
  constexpr int64_t kBlockRows = 4096;
  uint32_t crc = 0;
  const int64_t n = data.x_train_coded.size();
  for (int64_t first = 0; first < n; first += kBlockRows) {
    const torch::Tensor rows = data.x_train_coded.range(first, std::min(kBlockRows, n - first));
    crc = crc32_update(crc, rows.data_ptr(), static_cast<size_t>(rows.numel() * rows.element_size()));
  }
  const torch::Tensor y = data.y_train.contiguous();
  return crc32_update(crc, y.data_ptr(), static_cast<size_t>(y.numel() * y.element_size()));
}

}  // namespace pathkernel
