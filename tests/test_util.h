// Helpers shared by the tests: temporary directories and small runs.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include "pathkernel/run.h"

namespace pathkernel::testing {

/// A fresh directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(std::filesystem::temp_directory_path() /
              ("pathkernel_test_" + name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& child) const { return (path_ / child).string(); }

 private:
  std::filesystem::path path_;
};

/// A small, fast run on gaussians3: 60 training points, mlp:6.
inline RunOptions small_run(const std::string& out, const std::string& optimizer, int64_t steps,
                            int64_t checkpoint_every) {
  RunOptions r;
  r.data.spec = "gaussians3";
  r.data.train_size = 60;
  r.data.test_size = 30;
  r.model = "mlp:6";
  r.train.optimizer.name = optimizer;
  r.train.optimizer.lr = (optimizer == "adam" || optimizer == "adamw") ? 0.01 : 0.05;
  r.train.steps = steps;
  r.train.batch = optimizer == "gd" ? 0 : 16;
  r.train.progress = false;
  r.checkpoint_every = checkpoint_every;
  r.out = out;
  return r;
}

}  // namespace pathkernel::testing
