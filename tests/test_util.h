// Helpers shared by the tests: temporary directories, environment overrides,
// error-message checks, and small runs.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <vector>
#include <string>

#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/manifest.h"
#include "pathkernel/model.h"
#include "pathkernel/npy.h"
#include "pathkernel/objective.h"
#include "pathkernel/run.h"
#include "test_paths.h"

namespace pathkernel::testing {

/// One of pathkernel's own networks for a test: its spec, its input shape
/// (without the rows) and its output map.
struct NetworkCase {
  std::string spec;
  std::vector<int64_t> shape;
  OutputMap map;

  /// "spec/map", for failure messages.
  std::string name() const { return spec + "/" + output_map_name(map); }
  /// Its options for `classes` classes, initialised from `seed`.
  NetworkOptions options(int64_t classes, uint64_t seed) const {
    NetworkOptions o;
    o.spec = ModelSpec::parse(spec);
    o.input_shape = shape;
    o.num_classes = classes;
    o.output = map;
    o.seed = seed;
    return o;
  }
};

/// A shell command's exit status (-1 if it did not exit) and its standard
/// output and error, together.
struct CommandOutput {
  int status;
  std::string out;
};

/// Runs `cmd` in the shell with its standard error joined to its output.
inline CommandOutput run_shell(const std::string& cmd) {
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  EXPECT_NE(pipe, nullptr) << cmd;
  if (pipe == nullptr) return {-1, ""};
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace pathkernel::testing

/// Expects `part` to occur in `text`, showing both on failure.
#define EXPECT_CONTAINS(text, part)                          \
  EXPECT_NE(std::string(text).find(part), std::string::npos) \
      << "expected to find \"" << (part) << "\" in:\n  " << (text)

namespace pathkernel::testing {

/// Whether a and b hold the same bits: both undefined, or the same shape,
/// dtype and bytes.
inline bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.numel() * a.element_size()) == 0;
}

/// Expects got and expect of the same shape to agree to `rel` relative to
/// max(1, max |expect|), naming `what` on failure.
inline void expect_close(const torch::Tensor& got, const torch::Tensor& expect, double rel, const std::string& what) {
  ASSERT_EQ(got.sizes(), expect.sizes()) << what;
  const double scale = std::max(1.0, expect.abs().max().item<double>());
  EXPECT_LE((got - expect).abs().max().item<double>(), rel * scale) << what;
}

/// The message of the pathkernel::Error that `f` throws ("" and a failure if
/// it throws nothing; other exception types propagate and fail the test).
template <class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const pathkernel::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a pathkernel::Error";
  return "";
}

/// A fresh directory under the system temp dir, named after the running test
/// (plus `name`), removed on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& name = "") {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string test = info ? std::string(info->test_suite_name()) + "_" + info->name() : "none";
    path_ = std::filesystem::temp_directory_path() /
            ("pathkernel_test_" + test + (name.empty() ? "" : "_" + name) + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string str() const { return path_.string(); }
  std::string path() const { return path_.string(); }
  /// The path of `child` inside the directory.
  std::string file(const std::string& child) const { return (path_ / child).string(); }
  std::string operator/(const std::string& child) const { return file(child); }
  /// Writes `text` to a file in the directory and returns its path.
  std::string write(const std::string& child, const std::string& text) const {
    std::ofstream(file(child), std::ios::binary) << text;
    return file(child);
  }

 private:
  std::filesystem::path path_;
};

/// Sets (or unsets, for nullptr) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_old_ = old != nullptr;
    if (had_old_) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_old_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_old_ = false;
  std::string old_;
};

/// Flat gradient of scalar(net(x)) at flat weights w, by autograd: the slow
/// reference the engine's tests compare against.
inline torch::Tensor flat_grad(Network& net, const torch::Tensor& w, const torch::Tensor& x,
                               const std::function<torch::Tensor(const torch::Tensor&)>& scalar) {
  set_flat_parameters(net, w);
  for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
  scalar(net->forward(x)).backward();
  std::vector<torch::Tensor> g;
  for (auto& p : net->parameters()) g.push_back(p.grad().reshape(-1));
  return torch::cat(g);
}

/// Names the optimizer `name` in `o`: a kind's name, or one of RMSprop's
/// forms "rmsprop-centered", "rmsprop-momentum" and
/// "rmsprop-centered-momentum" (with momentum `rmsprop_momentum`).
inline void name_optimizer(OptimizerOptions& o, const std::string& name, double rmsprop_momentum = 0.5) {
  const bool rmsprop = name.rfind("rmsprop", 0) == 0;
  o.name = rmsprop ? "rmsprop" : name;
  o.centered = rmsprop && name.find("centered") != std::string::npos;
  o.momentum = rmsprop && name.find("momentum") != std::string::npos ? rmsprop_momentum : 0.0;
}

/// A small, fast run on gaussians3: 60 training points, mlp:6, `optimizer`
/// named as name_optimizer takes it.
inline RunOptions small_run(const std::string& out, const std::string& optimizer, int64_t steps,
                            int64_t checkpoint_every) {
  RunOptions r;
  r.data.spec = "gaussians3";
  r.data.train_size = 60;
  r.data.test_size = 30;
  r.model = "mlp:6";
  name_optimizer(r.train.optimizer, optimizer);
  const std::string& kind = r.train.optimizer.name;
  r.train.optimizer.lr = (kind == "adam" || kind == "adamw" || kind == "rmsprop") ? 0.01 : 0.05;
  r.train.steps = steps;
  r.train.batch = optimizer == "gd" ? 0 : 16;
  r.train.progress = false;
  r.checkpoint_every = checkpoint_every;
  r.out = out;
  return r;
}

/// small_run of `model` on 40 training points of `data` and `test_size` test points.
inline RunOptions small_run_of(const std::string& out, const std::string& optimizer, const std::string& data,
                               const std::string& model, int64_t steps, int64_t checkpoint_every,
                               int64_t test_size) {
  RunOptions r = small_run(out, optimizer, steps, checkpoint_every);
  r.data.spec = data;
  r.data.train_size = 40;
  r.data.test_size = test_size;
  r.model = model;
  return r;
}

/// Rewrites the checkpoint file of step `step` of run `run` with `w` and
/// lists its new size and CRC-32 in the manifest.
inline void rewrite_checkpoint(const std::string& run, int64_t step, const torch::Tensor& w) {
  Manifest m = Manifest::load(run);
  for (CheckpointRecord& c : m.checkpoints) {
    if (c.step != step) continue;
    const std::string path = (std::filesystem::path(run) / c.weights.file).string();
    write_npy(path, w);
    const std::string bytes = read_file(path);
    c.weights.bytes = static_cast<int64_t>(bytes.size());
    c.weights.crc32 = crc32_of(bytes);
  }
  m.save(run);
}

}  // namespace pathkernel::testing
