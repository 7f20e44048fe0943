// Helpers of the TorchScript tests: Python snippets run by Debian's
// python3-torch, and per-example autograd references.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "pathkernel/decomposition.h"
#include "pathkernel/model.h"
#include "pathkernel/npy.h"
#include "pathkernel/path.h"
#include "pathkernel/run.h"
#include "pathkernel/segment.h"
#include "../test_util.h"

namespace pathkernel::testing::script {

inline const std::string kPython = "/usr/bin/python3";

inline bool have_python_torch() {
  return std::system((kPython + " -c 'import torch, numpy' > /dev/null 2>&1").c_str()) == 0;
}

#define REQUIRE_PYTHON_TORCH()                                                            \
  if (!have_python_torch()) GTEST_SKIP() << "Debian's python3-torch is not installed " \
                                            "(make deps installs it)"

/// Runs a Python snippet (torch, nn and F imported), written into `dir`;
/// fails the test on error.
inline void python(const TempDir& dir, const std::string& code) {
  const std::string script = dir.write("snippet.py", "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n" + code);
  const auto r = run_shell(kPython + " " + script);
  ASSERT_EQ(r.status, 0) << r.out;
}

/// The Jacobian J(w, x) [n, K, P] by per-example autograd on net.
inline torch::Tensor reference_jacobian(Network& net, const torch::Tensor& w, const torch::Tensor& x) {
  set_flat_parameters(net, w);
  const int64_t n = x.size(0), K = net->options().num_classes, P = parameter_count(net);
  torch::Tensor jac = torch::zeros({n, K, P}, torch::kFloat64);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < K; ++k) {
      for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
      net->forward(x.narrow(0, i, 1))[0][k].backward();
      std::vector<torch::Tensor> g;
      for (auto& p : net->parameters()) g.push_back(p.grad().reshape({-1}));
      jac[i][k] = torch::cat(g);
    }
  }
  return jac;
}

/// How train_small_image_run trains: the optimizer and its settings, and
/// the seed the data is drawn from.
struct SmallImageTraining {
  std::string optimizer = "sgd";
  double lr = 0.2;
  double weight_decay = 0;
  uint64_t data_seed = 4;
};

/// Trains `model` (lr 0.2 SGD by default; batch 10, 6 steps, checkpoints
/// every 3) on 30 training and 6 test images [1, 4, 4] of 3 classes drawn
/// from `how.data_seed`, written as npy:DIR/data; the run is DIR/run.
/// Returns the run's result.
inline RunResult train_small_image_run(const TempDir& dir, const std::string& model,
                                       const SmallImageTraining& how = {}) {
  const std::string data = dir.path() + "/data";
  std::filesystem::create_directories(data);
  torch::manual_seed(how.data_seed);
  write_npy(data + "/train_x.npy", torch::randn({30, 1, 4, 4}, torch::kFloat64));
  write_npy(data + "/train_y.npy", torch::randint(0, 3, {30}, torch::kLong));
  write_npy(data + "/test_x.npy", torch::randn({6, 1, 4, 4}, torch::kFloat64));
  write_npy(data + "/test_y.npy", torch::randint(0, 3, {6}, torch::kLong));
  RunOptions o;
  o.data.spec = "npy:" + data;
  o.model = model;
  o.train.optimizer.name = how.optimizer;
  o.train.optimizer.lr = how.lr;
  o.train.optimizer.weight_decay = how.weight_decay;
  o.train.batch = 10;
  o.train.steps = 6;
  o.train.progress = false;
  o.checkpoint_every = 3;
  o.out = dir.path() + "/run";
  return train_run(o);
}

/// Decomposes `x` on a module's run by both routes: the structured route
/// must be the one chosen, both kernel machines exact (max_rel_error <=
/// 1e-12), and their contributions the same to 1e-12 of the largest.
inline void expect_both_routes_exact(PathReader& reader, const torch::Tensor& x) {
  DecompositionOptions d;
  d.progress = false;
  EXPECT_EQ(engine_route(reader, d).route, "structured") << engine_route(reader, d).reason;
  const Decomposition structured = decompose(reader, x, d);
  d.quadrature.route = ModuleRoute::Generic;
  const Decomposition generic = decompose(reader, x, d);
  EXPECT_LE(summarize(structured).max_rel_error, 1e-12);
  EXPECT_LE(summarize(generic).max_rel_error, 1e-12);
  const double scale = generic.contributions.abs().max().item<double>();
  EXPECT_LE((structured.contributions - generic.contributions).abs().max().item<double>(), 1e-12 * scale);
}

inline double max_rel(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item<double>();
}

}  // namespace pathkernel::testing::script
