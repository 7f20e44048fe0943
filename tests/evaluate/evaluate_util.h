// Small data sets and runs for the evaluate tests: an npy:DIR data set that
// can be written with rows deleted, and runs trained through the CLI.
#pragma once

#include <string>

#include <torch/torch.h>

#include "../test_util.h"
#include "pathkernel/manifest.h"
#include "pathkernel/npy.h"

namespace pathkernel::testing {

/// A 3-class set of 4-D points: M training and 9 test points around three
/// centres, seeded.
struct SmallData {
  torch::Tensor x_train, y_train, x_test, y_test;
  explicit SmallData(int64_t m, uint64_t seed = 5) {
    auto gen = at::detail::createCPUGenerator(seed);
    const torch::Tensor centres = torch::tensor({{2.0, 0.0, 0.0, 1.0}, {0.0, 2.0, 1.0, 0.0}, {-1.0, -1.0, 2.0, 2.0}});
    y_train = torch::arange(m, torch::kLong).remainder(3);
    y_test = torch::arange(9, torch::kLong).remainder(3);
    x_train = centres.index_select(0, y_train) + torch::randn({m, 4}, gen, torch::kFloat64);
    x_test = centres.index_select(0, y_test) + torch::randn({9, 4}, gen, torch::kFloat64);
  }
  /// Writes DIR/{train,test}_{x,y}.npy, without training rows `deleted`.
  void write(const std::string& dir, const std::vector<int64_t>& deleted = {}) const {
    std::filesystem::create_directories(dir);
    torch::Tensor keep = torch::ones({x_train.size(0)}, torch::kBool);
    for (int64_t i : deleted) keep[i] = false;
    const torch::Tensor rows = torch::arange(x_train.size(0), torch::kLong).masked_select(keep);
    write_npy(dir + "/train_x.npy", x_train.index_select(0, rows).contiguous());
    write_npy(dir + "/train_y.npy", y_train.index_select(0, rows).contiguous());
    write_npy(dir + "/test_x.npy", x_test);
    write_npy(dir + "/test_y.npy", y_test);
  }
};

/// Trains with the CLI on one thread: `pathkernel train --data npy:DATA ARGS --out RUN`.
inline void cli_train(const std::string& data, const std::string& run, const std::string& args) {
  const CommandOutput r = run_shell(pathkernel::testing::binary_path() + " train --quiet --threads 1 --data npy:" + data +
                                    " " + args + " --out " + run);
  ASSERT_EQ(r.status, 0) << r.out;
}

/// The final weights w_N a run directory holds, float64 [P].
inline torch::Tensor final_checkpoint(const std::string& run) {
  const Manifest m = Manifest::load(run);
  return read_npy(run + "/" + m.checkpoints.back().weights.file);
}

}  // namespace pathkernel::testing
