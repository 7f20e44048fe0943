// Tests of validate_run and Manifest::load on hostile run directories: files
// named by the manifest that leave the run (absolute paths, "..", symlinks),
// non-finite weights, wrong dtypes and shapes, absurd sizes and counts.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "../test_util.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/manifest.h"
#include "pathkernel/npy.h"
#include "pathkernel/path.h"

namespace pathkernel {
namespace {

namespace fs = std::filesystem;
using testing::error_message;
using testing::small_run;
using testing::TempDir;

/// Trains one small momentum run (checkpoints, optimizer buffers and batch
/// logs) into dir/source and returns its path.
std::string train_source(const TempDir& dir) {
  RunOptions r = small_run(dir.file("source"), "momentum", 4, 2);
  train_run(r);
  return r.out;
}

/// Rewrites run file `f` with `bytes` and records its new size and CRC-32,
/// so only the content under test is wrong.
void rewrite(const std::string& run, FileRecord& f, const std::string& bytes) {
  write_file_atomic(run + "/" + f.file, bytes);
  f.bytes = static_cast<int64_t>(bytes.size());
  f.crc32 = crc32_of(bytes);
}

struct HostileCase {
  std::string name;
  std::function<void(const std::string& run, Manifest& m)> corrupt;
  std::string message;
};

TEST(HostileRun, EveryCorruptionIsRefusedWithAClearError) {
  TempDir dir("hostile");
  const std::string source = train_source(dir);
  const std::string outside = dir.file("outside.npy");
  write_npy(outside, torch::zeros({3}, torch::kFloat64));

  const std::vector<HostileCase> cases = {
      {"nan_weights",
       [](const std::string& run, Manifest& m) {
         torch::Tensor w = read_npy(run + "/" + m.checkpoints[1].weights.file);
         w[5] = std::numeric_limits<double>::quiet_NaN();
         rewrite(run, m.checkpoints[1].weights, npy_bytes(w));
       },
       "holds a non-finite value (nan at index 5), expected finite weights"},
      {"inf_optimizer_state",
       [](const std::string& run, Manifest& m) {
         FileRecord& f = m.checkpoints[1].optimizer_buffers.begin()->second;
         torch::Tensor b = read_npy(run + "/" + f.file);
         b[0] = -std::numeric_limits<double>::infinity();
         rewrite(run, f, npy_bytes(b));
       },
       "holds a non-finite value (-inf at index 0)"},
      {"float32_weights",
       [](const std::string& run, Manifest& m) {
         torch::Tensor w = read_npy(run + "/" + m.checkpoints[0].weights.file);
         rewrite(run, m.checkpoints[0].weights, npy_bytes(w.to(torch::kFloat32)));
       },
       "expected float64 of shape"},
      {"wrong_shape_weights",
       [](const std::string& run, Manifest& m) {
         torch::Tensor w = read_npy(run + "/" + m.checkpoints[0].weights.file);
         rewrite(run, m.checkpoints[0].weights, npy_bytes(w.narrow(0, 0, 10)));
       },
       "of shape [10], expected float64 of shape"},
      {"truncated_weights",
       [](const std::string& run, Manifest& m) {
         std::string bytes = read_file(run + "/" + m.checkpoints[1].weights.file);
         rewrite(run, m.checkpoints[1].weights, bytes.substr(0, bytes.size() - 8));
       },
       "bytes, expected"},
      {"absurd_claimed_size",
       [](const std::string&, Manifest& m) { m.checkpoints[0].weights.bytes = 1000000000000; },
       "manifest.json says 1000000000000"},
      {"absolute_file_name",
       [&](const std::string&, Manifest& m) { m.checkpoints[0].weights.file = outside; },
       "must be a path relative to the run directory"},
      {"dotdot_file_name",
       [](const std::string&, Manifest& m) { m.checkpoints[0].weights.file = "../outside.npy"; },
       "leaves the run directory ('..')"},
      {"symlink_out_of_run",
       [&](const std::string& run, Manifest& m) {
         fs::create_symlink(outside, run + "/checkpoints/link.npy");
         m.checkpoints[0].weights.file = "checkpoints/link.npy";
       },
       "outside the run directory (a symlink out of the run is refused)"},
      {"symlinked_directory_out_of_run",
       [&](const std::string& run, Manifest& m) {
         fs::create_directory_symlink(fs::path(outside).parent_path(), run + "/elsewhere");
         m.checkpoints[0].weights.file = "elsewhere/outside.npy";
       },
       "outside the run directory"},
      {"directory_as_file",
       [](const std::string&, Manifest& m) { m.checkpoints[0].weights.file = "checkpoints"; },
       "is not a regular file"},
      {"device_file",
       [](const std::string&, Manifest& m) { m.checkpoints[0].weights.file = "/dev/zero"; },
       "must be a path relative"},
      {"batch_index_past_training_set",
       [](const std::string& run, Manifest& m) {
         torch::Tensor b = read_npy(run + "/" + m.batches[0].indices.file);
         b[0][0] = 60;
         rewrite(run, m.batches[0].indices, npy_bytes(b));
       },
       "holds index 60, expected a training-set index in [0, 60)"},
      {"batch_log_int64",
       [](const std::string& run, Manifest& m) {
         torch::Tensor b = read_npy(run + "/" + m.batches[0].indices.file);
         rewrite(run, m.batches[0].indices, npy_bytes(b.to(torch::kInt64)));
       },
       "expected int32 of shape"},
      {"batch_log_negative_steps",
       [](const std::string&, Manifest& m) { m.batches[0].steps = -5; },
       "covers -5 steps, expected >= 1"},
      {"parameter_count_overflow",
       [](const std::string&, Manifest& m) {
         m.parameters[0].shape = {int64_t{1} << 62};
         m.parameters[0].numel = int64_t{1} << 62;
         m.parameters[1].shape = {int64_t{1} << 62};
         m.parameters[1].numel = int64_t{1} << 62;
         m.parameters[1].offset = int64_t{1} << 62;
       },
       "count overflows"},
      {"absurd_threads",
       [](const std::string&, Manifest& m) { m.threads = 1000000000; },
       "training.threads is 1000000000, expected 1 to 4096"},
  };
  for (const HostileCase& c : cases) {
    const std::string run = dir.file(c.name);
    fs::copy(source, run, fs::copy_options::recursive);
    Manifest m = Manifest::load(run);
    validate_run(run, m);  // the copy is valid before the corruption
    c.corrupt(run, m);
    m.save(run);
    const std::string message = error_message([&] { validate_run(run, Manifest::load(run)); });
    EXPECT_NE(message.find(c.message), std::string::npos) << c.name << ": " << message;
  }
}

TEST(HostileRun, NumbersTheirFieldsCannotHoldAreRefusedWithAClearError) {
  TempDir dir("hostile_numbers");
  const std::string source = train_source(dir);
  using ojson = nlohmann::ordered_json;
  const std::vector<std::pair<std::function<void(ojson&)>, std::string>> cases = {
      {[](ojson& j) { j["steps"] = 1e300; }, "field 'steps' of the manifest must be a whole number, got 1e+300"},
      {[](ojson& j) { j["training"]["batch_size"] = 2.5; }, "field 'batch_size' of training must be a whole number"},
      {[](ojson& j) { j["data"]["train_crc32"] = -1; }, "field 'train_crc32' of data must not be negative, got -1"},
      {[](ojson& j) { j["data"]["seed"] = -3; }, "field 'seed' of data must not be negative, got -3"},
      {[](ojson& j) { j["data"]["input_shape"] = ojson::array({2, 1e30}); },
       "field 'input_shape' of data element must be a whole number, got 1e+30"},
      {[](ojson& j) { j["learning_rates"][0] = "fast"; },
       "field 'learning_rates' of the manifest element must be a number, got \"fast\""},
      {[](ojson& j) { j["checkpoints"][0]["crc32"] = 4294967296.0; },
       "field 'crc32' of checkpoint 0 must be a whole number"},
      {[](ojson& j) { j["environment"]["blas_threads"] = 0; }, "environment.blas_threads is 0, expected 1 to 4096"},
  };
  for (const auto& [corrupt, expected] : cases) {
    ojson j = ojson::parse(read_file(source + "/manifest.json"));
    corrupt(j);
    const std::string run = dir.file("edited");
    fs::remove_all(run);
    fs::copy(source, run, fs::copy_options::recursive);
    write_file_atomic(run + "/manifest.json", j.dump(2));
    const std::string message = error_message([&] { Manifest::load(run); });
    EXPECT_NE(message.find(expected), std::string::npos) << expected << "\n got: " << message;
  }
}

// A number beyond double's range fails in the JSON parser itself (nlohmann
// throws out_of_range, not parse_error): still a clear pathkernel Error.
TEST(HostileRun, ANumberBeyondDoubleIsRefusedAsInvalidJson) {
  TempDir dir("hostile_overflow");
  const std::string source = train_source(dir);
  std::string text = read_file(source + "/manifest.json");
  const std::string steps = "\"steps\": ";
  const size_t at = text.find(steps);
  ASSERT_NE(at, std::string::npos);
  text.insert(at + steps.size(), "1e400, \"unused\": ");
  const std::string run = dir.file("edited");
  fs::copy(source, run, fs::copy_options::recursive);
  write_file_atomic(run + "/manifest.json", text);
  const std::string message = error_message([&] { Manifest::load(run); });
  EXPECT_NE(message.find("is not valid JSON"), std::string::npos) << message;
  EXPECT_NE(message.find("1e400"), std::string::npos) << message;
}

TEST(HostileRun, ManifestSymlinkedOutOfTheRunIsRefused) {
  TempDir dir("manifest_link");
  const std::string source = train_source(dir);
  const std::string run = dir.file("run");
  fs::copy(source, run, fs::copy_options::recursive);
  fs::rename(run + "/manifest.json", dir.file("elsewhere.json"));
  fs::create_symlink(dir.file("elsewhere.json"), run + "/manifest.json");
  EXPECT_CONTAINS(error_message([&] { Manifest::load(run); }), "outside the run directory");
  fs::remove(run + "/manifest.json");
  fs::create_symlink("/dev/zero", run + "/manifest.json");
  EXPECT_CONTAINS(error_message([&] { Manifest::load(run); }), "outside the run directory");
}

TEST(HostileRun, SymlinksInsideTheRunAndASymlinkedRunAreAccepted) {
  TempDir dir("inside_link");
  const std::string source = train_source(dir);
  const std::string run = dir.file("run");
  fs::copy(source, run, fs::copy_options::recursive);
  Manifest m = Manifest::load(run);
  const std::string real = m.checkpoints[0].weights.file;
  fs::create_symlink(fs::path(real).filename(), run + "/checkpoints/alias.npy");
  m.checkpoints[0].weights.file = "checkpoints/alias.npy";
  m.save(run);
  fs::create_directory_symlink(run, dir.file("link_to_run"));
  EXPECT_NO_THROW(validate_run(dir.file("link_to_run"), Manifest::load(dir.file("link_to_run"))));
}

TEST(HostileRun, PathReaderRefusesNaNCheckpoints) {
  TempDir dir("reader_nan");
  const std::string source = train_source(dir);
  const std::string run = dir.file("run");
  fs::copy(source, run, fs::copy_options::recursive);
  Manifest m = Manifest::load(run);
  torch::Tensor w = read_npy(run + "/" + m.checkpoints.back().weights.file);
  w[0] = std::numeric_limits<double>::infinity();
  rewrite(run, m.checkpoints.back().weights, npy_bytes(w));
  m.save(run);
  EXPECT_CONTAINS(error_message([&] { PathReader reader(run); }), "non-finite value (inf at index 0)");
}

}  // namespace
}  // namespace pathkernel

namespace pathkernel {
namespace {

// The training data's CRC is the CRC of the inputs' bytes followed by the
// labels' (what every run's manifest records), computed without a copy.
// A loop's OpenBLAS threads (which torch's count does not set) are kept
// where a recorder wrote them; the engine's own runs set both counts and
// write none.
TEST(Manifest, OpenBlasThreadsOfALoopAreKept) {
  TempDir dir("blas_threads");
  const std::string run = train_source(dir);
  Manifest m = Manifest::load(run);
  EXPECT_EQ(m.environment.blas_threads, 0);
  EXPECT_EQ(read_file(run + "/manifest.json").find("blas_threads"), std::string::npos);
  m.environment.blas_threads = 2;
  m.save(run);
  EXPECT_EQ(Manifest::load(run).environment.blas_threads, 2);
  EXPECT_EQ(Manifest::load(run).to_json()["environment"]["blas_threads"], 2);
}

TEST(Manifest, TrainingDataCrcIsTheCrcOfInputsThenLabels) {
  torch::manual_seed(0);
  const torch::Tensor x = torch::randn({7, 3, 2}, torch::kFloat64), y = torch::randint(0, 4, {7}, torch::kLong);
  const torch::Tensor xt = x.transpose(1, 2);  // not contiguous: its bytes as laid out contiguously
  auto bytes = [](const torch::Tensor& t) {
    const torch::Tensor c = t.contiguous();
    return std::string(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
  };
  EXPECT_EQ(training_data_crc32(x, y), crc32_of(bytes(x) + bytes(y)));
  EXPECT_EQ(training_data_crc32(xt, y), crc32_of(bytes(xt) + bytes(y)));
  EXPECT_NE(training_data_crc32(x, y), training_data_crc32(xt, y));
  const torch::Tensor none = torch::empty({0}, torch::kLong);
  EXPECT_EQ(training_data_crc32(x, none), crc32_of(bytes(x)));
  EXPECT_EQ(training_data_crc32(x.narrow(0, 0, 0), y), crc32_of(bytes(y)));
}

}  // namespace
}  // namespace pathkernel
