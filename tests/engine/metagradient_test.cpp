// Tests of the metagradient (metagradient.h): against central finite
// differences of retraining with one point's loss weight at c_i ± h (replay
// is deterministic, so the differences carry no seed noise), and against
// the exact decomposition where the Hessian term vanishes.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <cmath>

#include "../test_util.h"
#include "pathkernel/decomposition.h"
#include "pathkernel/metagradient.h"
#include "pathkernel/metagradient_check.h"
#include "pathkernel/npy.h"
#include "pathkernel/retrain.h"

namespace pathkernel {
namespace {

using testing::error_message;
using testing::run_shell;
using testing::small_run;
using testing::TempDir;

/// d f(w_N, x)/d c_i for the training points `points` by central differences
/// of retraining with c_i ± h: [n, points, K].
torch::Tensor finite_differences(PathReader& reader, const torch::Tensor& x, const std::vector<int64_t>& points,
                                 double h) {
  const int64_t M = reader.manifest().num_train;
  const torch::Tensor base =
      reader.loss_weights().defined() ? reader.loss_weights() : torch::ones({M}, torch::kFloat64);
  std::vector<RetrainJob> jobs;
  for (int64_t i : points) {
    for (double sign : {1.0, -1.0}) {
      RetrainJob job;
      job.weights = base.clone();
      job.weights[i] += sign * h;
      jobs.push_back(job);
    }
  }
  RetrainOptions options;
  options.progress = false;
  options.workers = 1;
  const torch::Tensor f = Retrainer(reader).outputs(jobs, x, options);  // [2·points, n, K]
  std::vector<torch::Tensor> columns;
  for (size_t j = 0; j < points.size(); ++j) columns.push_back((f[2 * j] - f[2 * j + 1]) / (2 * h));
  return torch::stack(columns, 1);
}

/// The largest |a − b| relative to the largest |b|.
double max_rel(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max()).item<double>();
}

struct Setting {
  std::string optimizer;
  std::string model;
  double weight_decay;
};

void PrintTo(const Setting& s, std::ostream* os) {
  *os << s.optimizer << " " << s.model << " weight decay " << s.weight_decay;
}

class MetagradientFiniteDifferences : public ::testing::TestWithParam<Setting> {};

TEST_P(MetagradientFiniteDifferences, AgreesWithRetrainingToTheDifferencesError) {
  const Setting& s = GetParam();
  TempDir dir;
  RunOptions r = small_run(dir / "run", s.optimizer, 12, 5);  // "rmsprop-centered" etc.: testing::name_optimizer
  r.train.optimizer.lr_decay = 0.1;
  r.train.optimizer.initial_accumulator_value = 0.05;
  r.model = s.model;
  r.train.optimizer.weight_decay = s.weight_decay;
  if (s.model.rfind("cnn", 0) == 0) {
    r.data.spec = "mnist";
    r.data.train_size = 40;
    r.data.test_size = 10;
  }
  train_run(r);
  PathReader reader(dir / "run");
  const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 2);
  MetagradientOptions options;
  options.progress = false;
  const Metagradient mg = metagradient(reader, x, options);
  ASSERT_EQ(mg.values.sizes(), (torch::IntArrayRef{2, reader.manifest().num_train, reader.manifest().num_classes}));
  const std::vector<int64_t> points{0, 7, 33};
  const torch::Tensor ours = mg.values.index_select(1, torch::tensor(points, torch::kLong));
  // Central differences: truncation O(h²), rounding O(ε/h); the step
  // from h to h/2 shows how far the differences themselves are from the limit.
  const torch::Tensor fd = finite_differences(reader, x, points, 1e-5);
  const torch::Tensor fd_half = finite_differences(reader, x, points, 5e-6);
  const double fd_error = max_rel(fd_half, fd);
  const double error = max_rel(ours, fd_half);
  EXPECT_GT(ours.abs().max().item<double>(), 1e-4) << "a metagradient this small tests nothing";
  EXPECT_LT(error, 1e-6) << s.optimizer << " " << s.model << ": finite differences move by " << fd_error
                         << " from h to h/2";
}

INSTANTIATE_TEST_SUITE_P(Optimizers, MetagradientFiniteDifferences,
                         ::testing::Values(Setting{"gd", "mlp:6:tanh", 0.0}, Setting{"sgd", "mlp:6", 0.01},
                                           Setting{"momentum", "mlp:6:tanh", 0.01},
                                           Setting{"nesterov", "mlp:6", 0.0}, Setting{"adam", "mlp:6:tanh", 0.01},
                                           Setting{"adamw", "mlp:6", 0.05}, Setting{"sgd", "cnn:2", 0.0},
                                           Setting{"momentum", "cnn:2", 0.01}, Setting{"adam", "cnn:2", 0.0},
                                           Setting{"rmsprop", "mlp:6:tanh", 0.01}, Setting{"rmsprop-centered", "mlp:6", 0.0},
                                           Setting{"rmsprop-momentum", "mlp:6:tanh", 0.01},
                                           Setting{"adagrad", "mlp:6:tanh", 0.01}),
                         [](const ::testing::TestParamInfo<Setting>& info) {
                           std::string name = info.param.optimizer + "_" + info.param.model;
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

/// Differentiating one output per point gives that output's column of
/// differentiating all of them, bit for bit, and NaN elsewhere.
TEST(Metagradient, ChosenOutputIsItsColumnOfAllOutputs) {
  TempDir dir;
  train_run(small_run(dir / "run", "momentum", 6, 3));
  PathReader reader(dir / "run");
  const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 3);
  MetagradientOptions all;
  all.progress = false;
  const Metagradient full = metagradient(reader, x, all);
  MetagradientOptions chosen = all;
  chosen.outputs = torch::tensor(std::vector<int64_t>{2, 0, 1}, torch::kLong);
  const Metagradient part = metagradient(reader, x, chosen);
  EXPECT_EQ(part.adjoints, 3);
  EXPECT_EQ(full.adjoints, 3 * reader.manifest().num_classes);
  for (int64_t p = 0; p < 3; ++p) {
    const int64_t k = chosen.outputs[p].item<int64_t>();
    EXPECT_TRUE(torch::equal(part.values[p].select(1, k), full.values[p].select(1, k))) << "point " << p;
    for (int64_t j = 0; j < reader.manifest().num_classes; ++j) {
      if (j != k) EXPECT_TRUE(torch::isnan(part.values[p].select(1, j)).all().item<bool>());
    }
  }
}

/// With loss weights in the run, the metagradient is taken at those weights:
/// a point of weight 0 still has one (it would move the path if it counted).
TEST(Metagradient, TakenAtTheRunsOwnLossWeights) {
  TempDir dir;
  RunOptions r = small_run(dir / "run", "sgd", 10, 5);
  torch::Tensor c = torch::ones({60}, torch::kFloat64);
  c[7] = 0;
  c[33] = 2.5;
  r.train.loss_weights = c;
  train_run(r);
  PathReader reader(dir / "run");
  ASSERT_TRUE(reader.loss_weights().defined());
  const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 2);
  MetagradientOptions options;
  options.progress = false;
  const Metagradient mg = metagradient(reader, x, options);
  const std::vector<int64_t> points{7, 33};
  const torch::Tensor ours = mg.values.index_select(1, torch::tensor(points, torch::kLong));
  EXPECT_LT(max_rel(ours, finite_differences(reader, x, points, 1e-5)), 1e-6);
  EXPECT_GT(ours.select(1, 0).abs().max().item<double>(), 1e-4);
}

/// check_metagradient agrees with a right metagradient and catches a wrong one.
TEST(Metagradient, CheckAgainstRetrainingCatchesAWrongMetagradient) {
  TempDir dir;
  train_run(small_run(dir / "run", "nesterov", 8, 4));
  PathReader reader(dir / "run");
  const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 2);
  MetagradientOptions options;
  options.progress = false;
  options.outputs = torch::tensor(std::vector<int64_t>{1, 2}, torch::kLong);
  Metagradient mg = metagradient(reader, x, options);
  const std::vector<int64_t> points = strongest_points(mg, 3);
  ASSERT_EQ(points.size(), 3u);
  // The strongest first.
  const torch::Tensor size = torch::nan_to_num(mg.values, 0.0).abs().sum(torch::IntArrayRef{0, 2});
  EXPECT_EQ(size.argmax().item<int64_t>(), points[0]);
  MetagradientCheckOptions copt;
  copt.retrain.progress = false;
  copt.retrain.workers = 1;
  const MetagradientCheck good = check_metagradient(reader, x, mg, points, copt);
  EXPECT_EQ(good.retrainings, 12);
  EXPECT_LT(good.max_rel_error, 1e-6);
  EXPECT_LT(good.max_rel_spread, 1e-3);
  mg.values.mul_(1.001);
  EXPECT_GT(check_metagradient(reader, x, mg, points, copt).max_rel_error, 5e-4);
  copt.h = -1;
  EXPECT_CONTAINS(error_message([&] { check_metagradient(reader, x, mg, points, copt); }), "must be > 0");
}

/// The process's peak resident memory so far, in MB.
double peak_rss_mb() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // kilobytes on Linux
}

/// Memory is bounded like the reverse accumulation's: the adjoints and one
/// checkpoint segment of the path. On a 600-step run of a 53,251-parameter
/// MLP the whole path's weights and steps would take about 510 MB; one
/// segment (25 steps) about 21 MB.
TEST(Metagradient, MemoryHoldsOneSegmentOfThePath) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer keeps freed memory in quarantine, so the peak is not the program's";
#else
  TempDir dir;
  RunOptions r = small_run(dir / "run", "sgd", 600, 25);
  r.model = "mlp:512";
  train_run(r);
  PathReader reader(dir / "run");
  ASSERT_EQ(reader.manifest().parameter_count, 53251);
  const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 1);
  MetagradientOptions options;
  options.progress = false;
  options.outputs = torch::tensor(std::vector<int64_t>{0}, torch::kLong);
  const double before = peak_rss_mb();
  const Metagradient mg = metagradient(reader, x, options);
  const double growth = peak_rss_mb() - before;
  EXPECT_EQ(mg.steps, 600);
  EXPECT_GT(torch::nan_to_num(mg.values, 0.0).abs().max().item<double>(), 0.0);
  EXPECT_LT(growth, 150.0) << "the peak grew by " << growth << " MB: more than one segment of the path is held";
#endif
}

TEST(Metagradient, RefusesBadOutputs) {
  TempDir dir;
  train_run(small_run(dir / "run", "sgd", 3, 3));
  PathReader reader(dir / "run");
  const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 2);
  MetagradientOptions options;
  options.progress = false;
  options.outputs = torch::tensor(std::vector<int64_t>{0, 9}, torch::kLong);
  EXPECT_CONTAINS(error_message([&] { metagradient(reader, x, options); }), "must lie in [0, 3)");
  options.outputs = torch::tensor(std::vector<int64_t>{0}, torch::kLong);
  EXPECT_CONTAINS(error_message([&] { metagradient(reader, x, options); }), "one per test point");
}

const std::string kPython = "/usr/bin/python3";

/// One step of gd on a linear model with squared loss: the adjoint never
/// meets a Hessian, and the Jacobian is the same all along the step, so the
/// metagradient is the exact contribution C_i(x) itself.
TEST(Metagradient, EqualsTheExactContributionWhereTheHessianTermVanishes) {
  if (std::system((kPython + " -c 'import torch' > /dev/null 2>&1").c_str()) != 0) {
    GTEST_SKIP() << "Debian's python3-torch is not installed (make deps installs it)";
  }
  TempDir dir;
  const std::string module = dir / "linear.pt";
  const std::string script = dir.write("export.py",
                                       "import torch\n"
                                       "torch.manual_seed(5)\n"
                                       "torch.jit.script(torch.nn.Sequential(torch.nn.Flatten(), "
                                       "torch.nn.Linear(100, 3))).save('" + module + "')\n");
  const auto out = run_shell(kPython + " " + script);
  ASSERT_EQ(out.status, 0) << out.out;
  RunOptions r = small_run(dir / "run", "gd", 1, 1);
  r.model = "torchscript:" + module;
  r.output = OutputMap::Logits;
  r.loss = LossKind::Mse;
  train_run(r);
  PathReader reader(dir / "run");
  const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 4);
  MetagradientOptions options;
  options.progress = false;
  const Metagradient mg = metagradient(reader, x, options);
  DecompositionOptions dopt;
  dopt.progress = false;
  const Decomposition d = decompose(reader, x, dopt);
  EXPECT_GT(d.contributions.abs().max().item<double>(), 1e-4);
  EXPECT_LT(max_rel(mg.values, d.contributions), 1e-12);

  // Two steps: the second step's Hessian enters, and the two differ.
  TempDir dir2("two");
  RunOptions r2 = r;
  r2.out = dir2 / "run";
  r2.train.steps = 2;
  train_run(r2);
  PathReader reader2(dir2 / "run");
  const Metagradient mg2 = metagradient(reader2, x, options);
  const Decomposition d2 = decompose(reader2, x, dopt);
  EXPECT_GT(max_rel(mg2.values, d2.contributions), 1e-6);
}

}  // namespace
}  // namespace pathkernel
