// Helpers of the TorchScript tests: Python snippets run by Debian's
// python3-torch, and per-example autograd references.
#pragma once

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "pathkernel/model.h"
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

inline double max_rel(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item<double>();
}

}  // namespace pathkernel::testing::script
