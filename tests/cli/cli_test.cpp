// End-to-end tests of the pathkernel command line: train, info, check-path,
// exit codes, error messages, and loading a run with numpy alone.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "pathkernel/blas_kernels.h"
#include "pathkernel/dataset.h"
#include "pathkernel/files.h"
#include "pathkernel/manifest.h"
#include "pathkernel/npy.h"
#include "pathkernel/path.h"
#include "pathkernel/text.h"

namespace pathkernel {
namespace {

using Output = testing::CommandOutput;

Output run(const std::string& args) {
  return testing::run_shell(pathkernel::testing::binary_path() + " --threads 1 " + args);
}

/// The last line of the output parsed as JSON.
nlohmann::json last_json(const std::string& out) {
  std::string s = out;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return nlohmann::json::parse(s.substr(s.rfind('\n') == std::string::npos ? 0 : s.rfind('\n') + 1));
}

TEST(Cli, TrainInfoCheckPathOnMnist) {
  testing::TempDir dir("cli");
  std::string r = dir / "R";
  Output t = run("train --data mnist --train-size 500 --model mlp:16 --optimizer sgd --batch 50 --steps 60 --quiet --json --out " + r);
  ASSERT_EQ(t.status, 0) << t.out;
  nlohmann::json tj = last_json(t.out);
  EXPECT_EQ(tj["steps"], 60);
  EXPECT_GT(tj["test_accuracy"].get<double>(), 0.5);

  Output info = run("info --json " + r);
  ASSERT_EQ(info.status, 0) << info.out;
  nlohmann::json ij = last_json(info.out);
  const int64_t p = 784 * 16 + 16 + 16 * 10 + 10;
  EXPECT_EQ(ij["steps"], 60);
  EXPECT_EQ(ij["parameters"], p);
  EXPECT_EQ(ij["every_step_bytes"], 61 * p * 8);
  // Recount path_bytes from the files on disk.
  Manifest m = Manifest::load(r);
  int64_t on_disk = 0;
  for (auto& e : std::filesystem::recursive_directory_iterator(r)) {
    std::string rel = std::filesystem::relative(e.path(), r).string();
    if (e.is_regular_file() && rel != "manifest.json" && rel != "metrics.csv" && rel != "timing.json") {
      on_disk += e.file_size();
    }
  }
  EXPECT_EQ(ij["path_bytes"], on_disk);
  EXPECT_LE(ij["path_bytes"].get<int64_t>() * 4, ij["every_step_bytes"].get<int64_t>());

  EXPECT_EQ(ij["environment"]["blas_kernels"], m.environment.blas_kernels);
  EXPECT_CONTAINS(run("info " + r).out, "  trained   on " + m.environment.cpu + ", 1 thread, OpenBLAS's " +
                                            m.environment.blas_kernels + " kernels (its replays use them");

  Output check = run("check-path --json --quiet " + r);
  EXPECT_EQ(check.status, 0) << check.out;
  nlohmann::json cj = last_json(check.out);
  EXPECT_EQ(cj["steps_replayed"], 60);
  EXPECT_EQ(cj["bitwise_equal"], true);

  // Image data: explain draws the test digit beside its proponents and
  // opponents, a PNG that decodes to 2 rows of 9 framed 28x28 tiles at zoom 3.
  Output ex = run("explain " + r + " --test-index 3 --top 8 --kernel off --quiet --out " + (dir / "ex"));
  ASSERT_EQ(ex.status, 0) << ex.out;
  EXPECT_FALSE(std::filesystem::exists(dir / "ex/kernel.npy"));
  const std::string png = read_file(dir / "ex/explain_3.png");
  ASSERT_GT(png.size(), 24u);
  EXPECT_EQ(png.substr(1, 3), "PNG");
  auto be32 = [&](size_t at) {
    return (uint32_t(uint8_t(png[at])) << 24) | (uint32_t(uint8_t(png[at + 1])) << 16) |
           (uint32_t(uint8_t(png[at + 2])) << 8) | uint32_t(uint8_t(png[at + 3]));
  };
  const uint32_t cell = 28 * 3 + 2 * 2, gap = 4;
  EXPECT_EQ(be32(16), 9 * (cell + gap) + gap);  // IHDR width
  EXPECT_EQ(be32(20), 2 * (cell + gap) + gap);  // IHDR height

  // A run a replay cannot reproduce: check-path says so and exits non-zero.
  CheckpointRecord& ck = m.checkpoints[1];
  torch::Tensor w = read_npy(r + "/" + ck.weights.file);
  w[0] += 1e-9;
  std::string bytes = npy_bytes(w);
  write_file_atomic(r + "/" + ck.weights.file, bytes);
  ck.weights.crc32 = crc32_of(bytes);
  m.save(r);
  Output bad = run("check-path --json --quiet " + r);
  EXPECT_NE(bad.status, 0) << bad.out;
  EXPECT_EQ(last_json(bad.out)["bitwise_equal"], false);
}

// A run trained on kernels narrower than this CPU's best (a user's
// OPENBLAS_CORETYPE) says so: every replay of it is bound to them.
TEST(Cli, InfoNamesWiderKernelsThanTheRunsOwn) {
  const std::string best = best_blas_kernels(CpuFeatures::current());
  if (best.empty()) GTEST_SKIP() << "this CPU has no AVX2: Prescott is its best";
  testing::TempDir dir("cli-kernels");
  const std::string r = dir / "R";
  Output t = testing::run_shell("OPENBLAS_CORETYPE=Prescott " + testing::binary_path() +
                                " --threads 1 train --data gaussians3 --train-size 60 --model mlp:4 --steps 2 --quiet "
                                "--out " + r);
  ASSERT_EQ(t.status, 0) << t.out;
  ASSERT_EQ(Manifest::load(r).environment.blas_kernels, "Prescott");
  EXPECT_CONTAINS(run("info " + r).out, "OpenBLAS's Prescott kernels (its replays use them; this CPU runs " + best + ")");
  // A float32 run's walks run their float64 work on the wider kernels.
  const std::string r32 = dir / "R32";
  t = testing::run_shell("OPENBLAS_CORETYPE=Prescott " + testing::binary_path() +
                         " --threads 1 train --data gaussians3 --train-size 60 --model mlp:4 --steps 2 --dtype float32 "
                         "--quiet --out " + r32);
  ASSERT_EQ(t.status, 0) << t.out;
  EXPECT_CONTAINS(run("info " + r32).out, "OpenBLAS's Prescott kernels (its replays use them; this CPU runs " + best +
                                              ", for the walks' float64 work)");
  // Verified through the launcher, which loads the run's kernels (in an environment that names none): the
  // replay on Prescott's, bit for bit (verify fails otherwise), beside the walk's float64 work on the wider
  // ones, and the kernel machine exact.
  const Output v = testing::run_shell("env -u OPENBLAS_CORETYPE -u " + std::string(kBlasKernelsChosenVariable) + " " +
                                      testing::binary_path() + " --threads 2 verify " + r32 + " --test 3 --json --quiet");
  ASSERT_EQ(v.status, 0) << v.out;
  EXPECT_LE(last_json(v.out)["max_rel_error"].get<double>(), 1e-12) << v.out;
  // Mixed, not switched: the steps are walked on two threads, which a switch at every step holds to one.
  EXPECT_EQ(last_json(v.out)["step_threads"], 2) << v.out;
}

TEST(Cli, NumpyLoadsARunWithoutPathkernel) {
  if (std::system("/usr/bin/python3 -c 'import numpy' > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3-numpy is not installed (make deps installs it)";
  }
  testing::TempDir dir("numpy");
  std::string r = dir / "R";
  ASSERT_EQ(run("train --data gaussians3 --train-size 90 --model mlp:5 --optimizer adam --batch 30 --steps 12 --quiet --out " + r).status, 0);
  std::string cmd = "/usr/bin/python3 " + pathkernel::testing::source_dir() + "/examples/load_path.py " + r;
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  char buf[4096] = {0};
  size_t n = fread(buf, 1, sizeof buf - 1, pipe);
  ASSERT_EQ(pclose(pipe), 0) << std::string(buf, n);
  nlohmann::json j = nlohmann::json::parse(std::string(buf, n));
  EXPECT_EQ(j["steps"], 12);
  EXPECT_EQ(j["P"], 100 * 5 + 5 + 5 * 3 + 3);
  EXPECT_EQ(j["first_tensor"], "fc1.weight");
  EXPECT_EQ(j["first_tensor_shape"], nlohmann::json::array({5, 100}));
  EXPECT_GT(j["moved"].get<double>(), 0);
}

TEST(Cli, VerifyReportsTheKernelMachineAgainstTheNetwork) {
  testing::TempDir dir("verify");
  std::string r = dir / "R";
  ASSERT_EQ(run("train --data gaussians3 --train-size 90 --model mlp:8 --optimizer sgd --batch 30 --lr 0.2 --steps 15 --quiet --out " + r).status, 0);
  Output v = run("verify " + r + " --test 12 --json --quiet");
  ASSERT_EQ(v.status, 0) << v.out;
  nlohmann::json j = last_json(v.out);
  for (const char* key : {"max_abs_error", "max_rel_error", "completeness_error", "certificate_max_gap",
                          "mean_evaluations_per_step", "test_points", "steps", "quadrature", "seconds"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  for (const char* part : {"test_features", "training_signals", "contraction", "replay"}) {
    EXPECT_GE(j["seconds_by_part"][part].get<double>(), 0.0) << part;
  }
  // The test side's arithmetic, from the shapes: 100 → 8 → 3, each product
  // at W_s and dW_s, 2 flop a multiply-add.
  EXPECT_DOUBLE_EQ(j["arithmetic"]["forward_mflop_per_row"].get<double>(), 4.0 * (100 * 8 + 8 * 3) / 1e6);
  EXPECT_GT(j["arithmetic"]["test_side_gflop"].get<double>(), 0.0);
  EXPECT_EQ(j["test_points"], 12);
  EXPECT_EQ(j["steps"], 15);
  EXPECT_EQ(j["quadrature"], "gauss");
  EXPECT_LE(j["max_rel_error"].get<double>(), 1e-12);
  EXPECT_LE(j["completeness_error"].get<double>(), 1e-12);
  // The DPK is not exact, and --fail-above turns that into a non-zero exit.
  Output dpk = run("verify " + r + " --test-index 0,3 --quadrature dpk --json --quiet --fail-above 1e-9");
  EXPECT_NE(dpk.status, 0) << dpk.out;
  nlohmann::json dj = last_json(dpk.out);
  EXPECT_EQ(dj["test_points"], 2);
  EXPECT_GT(dj["max_rel_error"].get<double>(), 1e-9);
  EXPECT_EQ(dj["mean_evaluations_per_step"], 1.0);
  // The point of the largest error, named by its test index.
  const nlohmann::json worst = dj["worst_point"];
  EXPECT_TRUE(worst["test_index"] == 0 || worst["test_index"] == 3) << dj;
  EXPECT_EQ(worst["max_rel_error"], dj["max_rel_error"]);
  EXPECT_LE(worst["error_bound"].get<double>(), dj["error_bound"].get<double>());
  EXPECT_GT(worst["cancellation"].get<double>(), 0.0);
  EXPECT_LE(worst["cancellation"].get<double>(), dj["cancellation"].get<double>());
  Output bad = run("verify " + r + " --test-index 0,9999 --quiet");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.out.find("test index list: test index 9999 is out of range [0, 900)"), std::string::npos) << bad.out;
  // The same points from a file of indices, and the three ways are exclusive.
  const std::string file = dir.write("points.txt", "0\n3\n");
  Output fromfile = run("verify " + r + " --test-file " + file + " --quadrature dpk --json --quiet");
  ASSERT_EQ(fromfile.status, 0) << fromfile.out;
  EXPECT_EQ(last_json(fromfile.out)["max_rel_error"], dj["max_rel_error"]);
  Output both = run("verify " + r + " --test 3 --test-index 0,3 --quiet");
  EXPECT_NE(both.status, 0);
  EXPECT_NE(both.out.find("excludes"), std::string::npos) << both.out;
  Output badq = run("verify " + r + " --quadrature simpson --quiet");
  EXPECT_NE(badq.status, 0);
  EXPECT_NE(badq.out.find("unknown quadrature 'simpson'"), std::string::npos) << badq.out;
}

// A float32 run (mlp:16:tanh, momentum, 40 steps) decomposes to float64
// precision against the float64 network at its weights; the float32
// network's own difference is reported beside it.
TEST(Cli, VerifyOfAFloat32RunIsExactToFloat64Precision) {
  testing::TempDir dir("verify32");
  std::string r = dir / "R";
  Output t = run("train --data gaussians3 --train-size 90 --model mlp:16:tanh --optimizer momentum --batch 30 "
                 "--lr 0.1 --steps 40 --dtype float32 --quiet --out " + r);
  ASSERT_EQ(t.status, 0) << t.out;
  Output v = run("verify " + r + " --test 10 --json --quiet");
  ASSERT_EQ(v.status, 0) << v.out;
  nlohmann::json j = last_json(v.out);
  EXPECT_EQ(j["dtype"], "float32");
  EXPECT_LE(j["max_rel_error"].get<double>(), 1e-12) << v.out;
  EXPECT_GT(j["max_abs_run_dtype_difference"].get<double>(), 0) << v.out;
  EXPECT_LT(j["max_abs_run_dtype_difference"].get<double>(), 1e-4) << v.out;
  EXPECT_GT(j["max_abs_rounding"].get<double>(), 1e-12) << "E holds the float32 rounding: " << v.out;
}

// Labels {0, 1, 5}: a warning names the classes with no data. Four rows per
// class leave the test split empty: train says so instead of an accuracy.
TEST(Cli, TrainWarnsAboutEmptyClassesAndAnEmptyTestSplit) {
  testing::TempDir dir("gaps");
  std::string csv;
  for (int i = 0; i < 4; ++i) {
    for (int label : {0, 1, 5}) csv += std::to_string(label) + "," + std::to_string(label + 0.1 * i) + ",1\n";
  }
  const std::string path = dir.write("gaps.csv", csv);
  Output t = run("train --data csv:" + path + " --model mlp:4 --optimizer gd --steps 3 --quiet --out " + (dir / "R"));
  ASSERT_EQ(t.status, 0) << t.out;
  EXPECT_NE(t.out.find("warning: dataset 'csv:" + path + "': 3 of 6 classes have no training points (class 2, 3, 4"),
            std::string::npos) << t.out;
  EXPECT_NE(t.out.find("no test points"), std::string::npos) << t.out;
  EXPECT_EQ(t.out.find("test accuracy"), std::string::npos) << t.out;
  Output tj = run("train --data csv:" + path + " --model mlp:4 --optimizer gd --steps 3 --quiet --json --out " +
                  (dir / "J"));
  ASSERT_EQ(tj.status, 0) << tj.out;
  EXPECT_TRUE(last_json(tj.out)["test_accuracy"].is_null()) << tj.out;
}

TEST(Cli, ExplainWritesExactPerTrainingPointContributions) {
  testing::TempDir dir("explain");
  std::string r = dir / "R";
  ASSERT_EQ(run("train --data gaussians3 --train-size 90 --model mlp:8 --optimizer sgd --batch 30 --lr 0.2 --steps 9 --quiet --out " + r).status, 0);
  Output e = run("explain " + r + " --test-index 4,7 --top 3 --quiet --out " + (dir / "ex"));
  ASSERT_EQ(e.status, 0) << e.out;
  EXPECT_NE(e.out.find("proponents"), std::string::npos) << e.out;
  torch::Tensor c = read_npy(dir / "ex/contributions.npy");
  ASSERT_EQ(c.sizes(), (std::vector<int64_t>{2, 90, 3}));
  nlohmann::json j = nlohmann::json::parse(read_file(dir / "ex/explain.json"));
  ASSERT_EQ(j["points"].size(), 2u);
  for (int n = 0; n < 2; ++n) {
    const auto& p = j["points"][n];
    EXPECT_EQ(p["test_index"], n == 0 ? 4 : 7);
    // f_final = f_initial + Σ_i C_i + R + E, recomputed here from the .npy.
    for (int k = 0; k < 3; ++k) {
      double sum = c[n].select(1, k).sum().item<double>();
      double rebuilt = p["f_initial"][k].get<double>() + sum + p["regularization"][k].get<double>() +
                       p["rounding"][k].get<double>();
      EXPECT_NEAR(rebuilt, p["f_final"][k].get<double>(), 1e-12) << "point " << n << " output " << k;
    }
    // Proponents are the largest contributions to the predicted class, in order.
    int64_t predicted = p["predicted"];
    torch::Tensor col = c[n].select(1, predicted);
    EXPECT_EQ(p["proponents"][0]["index"].get<int64_t>(), col.argmax().item<int64_t>());
    EXPECT_EQ(p["opponents"][0]["index"].get<int64_t>(), col.argmin().item<int64_t>());
    EXPECT_GE(p["proponents"][0]["value"].get<double>(), p["proponents"][1]["value"].get<double>());
  }
  // kernel.npy: log-softmax, constant η and even batches make it a single
  // kernel machine, C_i = weight · K(x, x_i) e_{y_i}.
  torch::Tensor kernel = read_npy(dir / "ex/kernel.npy");
  ASSERT_EQ(kernel.sizes(), (std::vector<int64_t>{2, 90, 3, 3}));
  EXPECT_EQ(j["kernel"]["single_kernel"], true);
  EXPECT_DOUBLE_EQ(j["kernel"]["weight"].get<double>(), 0.2 / 30);
  DataOptions data;
  data.spec = "gaussians3";
  data.train_size = 90;
  torch::Tensor y = load_dataset(data).y_train;
  torch::Tensor single = kernel.gather(3, y.view({1, -1, 1, 1}).expand({2, 90, 3, 1})).squeeze(3) * (0.2 / 30);
  EXPECT_LT((single - c).abs().max().item<double>(), 1e-12 * c.abs().max().item<double>());
}

/// train --loss-weights, then explain --method metagradient with --check:
/// the check's retrainings agree with the metagradient, proponents come from
/// the differentiated column, and the other columns are NaN.
TEST(Cli, LossWeightsAndTheMetagradient) {
  testing::TempDir dir("metagradient");
  const std::string r = dir / "R";
  torch::Tensor c = torch::ones({60}, torch::kFloat64);
  c.narrow(0, 0, 5).fill_(0.0);
  write_npy(dir / "w.npy", c);
  write_npy(dir / "short.npy", torch::ones({59}, torch::kFloat64));
  Output bad = run("train --data gaussians3 --train-size 60 --model mlp:6 --optimizer momentum --batch 20 --steps 6 "
                   "--quiet --loss-weights " + (dir / "short.npy") + " --out " + r);
  EXPECT_EQ(bad.status, 1) << bad.out;
  EXPECT_CONTAINS(bad.out, "expected one weight per training point, [60]");
  ASSERT_EQ(run("train --data gaussians3 --train-size 60 --model mlp:6 --optimizer momentum --batch 20 --steps 6 "
                "--quiet --loss-weights " + (dir / "w.npy") + " --out " + r).status, 0);
  Output info = run("info " + r);
  EXPECT_CONTAINS(info.out, "per-point loss weights (loss_weights.npy): min 0, mean 0.9167, max 1, 5 zero");
  Output e = run("explain " + r + " --method metagradient --test-index 1,2 --check 2 --quiet --json");
  ASSERT_EQ(e.status, 0) << e.out;
  const nlohmann::json j = last_json(e.out);
  EXPECT_EQ(j["method"], "metagradient");
  EXPECT_EQ(j["out"], r + "/metagradient");
  EXPECT_LT(j["check"]["max_rel_error"].get<double>(), 1e-6);
  EXPECT_EQ(j["check"]["retrainings"], 8);
  const torch::Tensor mg = read_npy(r + "/metagradient/contributions.npy");
  ASSERT_EQ(mg.sizes(), (std::vector<int64_t>{2, 60, 3}));
  for (int n = 0; n < 2; ++n) {
    const int64_t k = j["points"][n]["output"];
    EXPECT_EQ(k, j["points"][n]["predicted"].get<int64_t>());
    EXPECT_EQ(j["points"][n]["proponents"][0]["index"].get<int64_t>(), mg[n].select(1, k).argmax().item<int64_t>());
    EXPECT_EQ(torch::isnan(mg[n]).sum().item<int64_t>(), 60 * 2);
  }
  // A point of weight 0 has a metagradient too (it would move the run if it counted), checked across c = 0.
  Output zero = run("explain " + r + " --method metagradient --test-index 1 --quiet --json");
  ASSERT_EQ(zero.status, 0) << zero.out;
  const torch::Tensor mg0 = read_npy(r + "/metagradient/contributions.npy");
  const int64_t k0 = last_json(zero.out)["points"][0]["output"];
  EXPECT_GT(mg0[0].select(1, k0).narrow(0, 0, 5).abs().max().item<double>(), 1e-6);
}

TEST(Cli, MomentumExplainAndGram) {
  testing::TempDir dir("momentum");
  std::string r = dir / "R";
  ASSERT_EQ(run("train --data gaussians3 --train-size 90 --model mlp:8 --optimizer momentum --batch 30 --lr 0.05 "
                "--weight-decay 0.01 --schedule warmup:3 --steps 6 --quiet --out " + r).status, 0);
  // explain takes the reverse route; the kernel output is for gd and sgd only.
  Output e = run("explain " + r + " --test-index 1 --quiet --out " + (dir / "ex"));
  ASSERT_EQ(e.status, 0) << e.out;
  EXPECT_FALSE(std::filesystem::exists(dir / "ex/kernel.npy"));
  nlohmann::json j = nlohmann::json::parse(read_file(dir / "ex/explain.json"));
  EXPECT_LE(j["points"][0]["completeness_error"].get<double>(), 1e-12);
  EXPECT_GT(std::abs(j["points"][0]["regularization"][0].get<double>()), 0.0);
  Output forced = run("explain " + r + " --test-index 1 --kernel on --quiet --out " + (dir / "ex2"));
  EXPECT_NE(forced.status, 0);
  EXPECT_CONTAINS(forced.out, "kernel output is built for gd and sgd");

  // gram: a symmetric train x train trace Gram matrix and its sidecar.
  Output g = run("gram " + r + " --kernel dpk --rows train --cols train --row-count 10 --col-count 10 --outputs trace "
                 "--quiet --out " + (dir / "g/dpk.npy"));
  ASSERT_EQ(g.status, 0) << g.out;
  torch::Tensor k = read_npy(dir / "g/dpk.npy");
  ASSERT_EQ(k.sizes(), (std::vector<int64_t>{10, 10}));
  EXPECT_LE((k - k.t()).abs().max().item<double>(), 1e-12 * k.abs().max().item<double>());
  nlohmann::json side = nlohmann::json::parse(read_file(dir / "g/dpk.json"));
  EXPECT_EQ(side["kernel"], "dpk");
  EXPECT_EQ(side["shape"], nlohmann::json({10, 10}));
  EXPECT_EQ(side["axes"], nlohmann::json({"row", "col"}));
  EXPECT_EQ(side["file"], "dpk.npy");
  Output bad = run("gram " + r + " --kernel rbf --quiet");
  EXPECT_NE(bad.status, 0);
  EXPECT_CONTAINS(bad.out, "unknown kernel 'rbf'");
}

TEST(Cli, GpRefitAndCompare) {
  testing::TempDir dir("kernel_methods");
  std::string r = dir / "R";
  ASSERT_EQ(run("train --data toy2d --train-size 60 --test-size 30 --model mlp:8 --optimizer gd --lr 0.5 --steps 8 "
                "--quiet --out " + r).status, 0);
  // gp at test points: the reported accuracy is the posterior mean's, recomputed here.
  Output g = run("gp " + r + " --train-count 40 --test-count 20 --samples 200 --quiet --out " + (dir / "gp"));
  ASSERT_EQ(g.status, 0) << g.out;
  torch::Tensor mean = read_npy(dir / "gp/mean.npy"), var = read_npy(dir / "gp/variance.npy");
  torch::Tensor ps = read_npy(dir / "gp/prob_std.npy"), idx = read_npy(dir / "gp/test_indices.npy");
  ASSERT_EQ(mean.sizes(), (std::vector<int64_t>{20, 3}));
  ASSERT_EQ(var.sizes(), (std::vector<int64_t>{20}));
  EXPECT_GE(var.min().item<double>(), -1e-9 * var.abs().max().item<double>());
  EXPECT_TRUE(ps.ge(0).all().item<bool>() && ps.le(0.5).all().item<bool>());
  nlohmann::json j = nlohmann::json::parse(read_file(dir / "gp/gp.json"));
  torch::Tensor labels = PathReader(r).decoded_dataset().y_test.index_select(0, idx.to(torch::kLong));
  EXPECT_NEAR(j["gp_accuracy"].get<double>(), mean.argmax(1).eq(labels).to(torch::kFloat64).mean().item<double>(), 1e-12);
  // On a grid: N x N points over the inputs.
  Output grid = run("gp " + r + " --train-count 40 --grid 4 --samples 0 --quiet --out " + (dir / "grid"));
  ASSERT_EQ(grid.status, 0) << grid.out;
  EXPECT_EQ(read_npy(dir / "grid/points.npy").sizes(), (std::vector<int64_t>{16, 2}));
  // The test–test EPK through gram: symmetric.
  Output tt = run("gram " + r + " --rows test --cols test --row-count 5 --col-count 5 --outputs trace --quiet --out " + (dir / "tt.npy"));
  ASSERT_EQ(tt.status, 0) << tt.out;
  torch::Tensor k = read_npy(dir / "tt.npy");
  EXPECT_LE((k - k.t()).abs().max().item<double>(), 1e-12 * k.abs().max().item<double>());
  // refit: the SVM's accuracy beside the network's.
  Output f = run("refit " + r + " --train-count 40 --test-count 20 --quiet --out " + (dir / "refit.json"));
  ASSERT_EQ(f.status, 0) << f.out;
  nlohmann::json fj = nlohmann::json::parse(read_file(dir / "refit.json"));
  EXPECT_GE(fj["svm_accuracy"].get<double>(), 0.5);  // three well-separated classes: far above chance
  EXPECT_CONTAINS(f.out, "on the same 20 test points");
  // compare: the exact kernel machine agrees with the network on every point.
  Output c = run("compare " + r + " --train-count 40 --test-count 20 --kernels epk,ntk:0 --quiet --out " + (dir / "cmp"));
  ASSERT_EQ(c.status, 0) << c.out;
  const std::string csv = read_file(dir / "cmp/compare.csv");
  EXPECT_CONTAINS(csv, "kernel machine (exact),epk,");
  const size_t at = csv.find("kernel machine (exact),epk,");
  EXPECT_EQ(split(csv.substr(at), ',')[3], "1.0000");
  EXPECT_CONTAINS(csv, "lazy dynamics,ntk:0,");
  // Unknown kernels are named.
  Output bad = run("gp " + r + " --kernel rbf --quiet");
  EXPECT_NE(bad.status, 0);
  EXPECT_CONTAINS(bad.out, "unknown kernel 'rbf'");
}

// Every command that reports takes --json, before or after its name, and
// prints one JSON object that agrees with what it wrote.
TEST(Cli, EveryReportingCommandPrintsJson) {
  testing::TempDir dir("json");
  std::string r = dir / "R";
  ASSERT_EQ(run("--quiet train --data toy2d --train-size 60 --test-size 30 --model mlp:6 --optimizer gd --lr 0.5 "
                "--steps 5 --out " + r).status, 0);
  struct Case {
    std::string args, key;
  };
  for (const Case& c : std::vector<Case>{
           {"--json info " + r, "parameters"},
           {"check-path " + r + " --json", "bitwise_equal"},
           {"verify " + r + " --test 3 --json", "max_rel_error"},
           {"explain " + r + " --test 2 --json --out " + (dir / "ex"), "points"},
           {"gram " + r + " --kernel dpk --row-count 4 --col-count 4 --outputs trace --json --out " + (dir / "g.npy"),
            "shape"},
           {"gp " + r + " --train-count 20 --test-count 10 --samples 0 --json --out " + (dir / "gp"), "jitter"},
           {"refit " + r + " --train-count 20 --test-count 10 --json --out " + (dir / "refit.json"), "svm_accuracy"},
           {"compare " + r + " --train-count 20 --test-count 10 --kernels epk --json --out " + (dir / "cmp"), "rows"},
           {"report " + r + " --test 3 --gram-points 0 --grid 0 --json --out " + (dir / "r.html"), "bytes"},
       }) {
    Output o = run("--quiet " + c.args);
    ASSERT_EQ(o.status, 0) << c.args << "\n" << o.out;
    nlohmann::json j;
    ASSERT_NO_THROW(j = last_json(o.out)) << c.args << "\n" << o.out;
    EXPECT_TRUE(j.contains(c.key)) << c.args << "\n" << o.out;
  }
  // What explain and gram print is what they wrote.
  nlohmann::json ex = last_json(run("--quiet explain " + r + " --test-index 1 --json --out " + (dir / "ex1")).out);
  nlohmann::json written = nlohmann::json::parse(read_file(dir / "ex1/explain.json"));
  EXPECT_EQ(ex["points"], written["points"]);
  EXPECT_EQ(ex["out"], dir / "ex1");
  EXPECT_EQ(written["points"].size(), 1u);
  EXPECT_EQ(written["points"][0]["test_index"], 1);
  nlohmann::json gram = nlohmann::json::parse(read_file(dir / "g.json"));
  EXPECT_EQ(gram["shape"], nlohmann::json({4, 4}));
}

// Every command that takes test points takes them with the same options; the
// old spellings still work and say what replaces them.
TEST(Cli, OneVocabularyForTestPoints) {
  testing::TempDir dir("vocabulary");
  std::string r = dir / "R";
  ASSERT_EQ(run("--quiet train --data toy2d --train-size 60 --test-size 30 --model mlp:6 --optimizer gd --lr 0.5 "
                "--steps 4 --out " + r).status, 0);
  const std::string note = "pathkernel: --test-count is deprecated; use --test-balanced N";
  // refit: --test-balanced N is the old --test-count N, and the default is a balanced 100 (all 30 here).
  Output now = run("--quiet refit " + r + " --train-count 20 --test-balanced 9 --subset-seed 2 --json --out " + (dir / "a.json"));
  Output old = run("--quiet refit " + r + " --train-count 20 --test-count 9 --subset-seed 2 --json --out " + (dir / "b.json"));
  ASSERT_EQ(now.status, 0) << now.out;
  ASSERT_EQ(old.status, 0) << old.out;
  EXPECT_EQ(now.out.find("deprecated"), std::string::npos) << now.out;
  EXPECT_CONTAINS(old.out, note);
  EXPECT_EQ(last_json(now.out)["svm_accuracy"], last_json(old.out)["svm_accuracy"]);
  EXPECT_EQ(last_json(now.out)["test_points"], 9);
  // gp: an index list is taken as given.
  Output gp = run("--quiet gp " + r + " --train-count 20 --test-index 5,1,5 --samples 0 --out " + (dir / "gp"));
  ASSERT_EQ(gp.status, 0) << gp.out;
  EXPECT_TRUE(torch::equal(read_npy(dir / "gp/test_indices.npy").to(torch::kLong), torch::tensor({5, 1, 5}, torch::kLong)));
  // gram: test rows by the same options, training columns by --train N; the sidecar lists them.
  Output g = run("--quiet gram " + r + " --kernel dpk --test-index 3,0 --train 5 --outputs trace --out " + (dir / "g.npy"));
  ASSERT_EQ(g.status, 0) << g.out;
  nlohmann::json side = nlohmann::json::parse(read_file(dir / "g.json"));
  EXPECT_EQ(side["rows"]["indices"], nlohmann::json({3, 0}));
  EXPECT_EQ(side["cols"]["indices"], nlohmann::json({0, 1, 2, 3, 4}));
  EXPECT_EQ(side["shape"], nlohmann::json({2, 5}));
  Output gold = run("--quiet gram " + r + " --kernel dpk --row-count 2 --outputs trace --out " + (dir / "h.npy"));
  ASSERT_EQ(gold.status, 0) << gold.out;
  EXPECT_CONTAINS(gold.out, "pathkernel: --row-count is deprecated; use --test N or --train N");
  EXPECT_EQ(nlohmann::json::parse(read_file(dir / "h.json"))["shape"], nlohmann::json({2, 60}));
  // Two ways at once are refused.
  Output both = run("--quiet verify " + r + " --test 2 --test-balanced 3");
  EXPECT_NE(both.status, 0);
  EXPECT_CONTAINS(both.out, "excludes");
  // report: --tracked, and --top as its deprecated spelling.
  Output rep = run("--quiet report " + r + " --test 2 --top 3 --gram-points 0 --grid 0 --out " + (dir / "r.html"));
  ASSERT_EQ(rep.status, 0) << rep.out;
  EXPECT_CONTAINS(rep.out, "pathkernel: --top is deprecated; use --tracked N");
}

TEST(Cli, BadInputGetsAClearErrorAndANonZeroExit) {
  testing::TempDir dir("cli_errors");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"train --data nosuch --out " + (dir / "a"), "unknown dataset 'nosuch'"},
      {"train --data gaussians3 --model mlp:x --out " + (dir / "b"), "width 'x'"},
      {"train --data gaussians3 --optimizer adadelta --steps 2 --out " + (dir / "c"), "unknown optimizer 'adadelta'"},
      {"train --data gaussians3 --lr -1 --steps 2 --out " + (dir / "d"), "learning rate must be > 0 (got -1)"},
      {"train --data gaussians3 --optimizer sgd --momentum 0.5 --steps 2 --out " + (dir / "e"),
       "--momentum applies to --optimizer momentum, nesterov or rmsprop (got --optimizer sgd)"},
      {"train --data gaussians3 --optimizer momentum --momentum 0 --steps 2 --out " + (dir / "e"),
       "--momentum must be in (0, 1) for --optimizer momentum (got 0; without momentum, use --optimizer sgd)"},
      {"train --data gaussians3 --optimizer rmsprop --dampening 0.1 --steps 2 --out " + (dir / "e"),
       "--dampening applies to --optimizer momentum or nesterov (got --optimizer rmsprop)"},
      {"train --data gaussians3 --optimizer rmsprop --momentum 1.5 --steps 2 --out " + (dir / "e"),
       "momentum must be in [0, 1) (got 1.5)"},
      {"train --data gaussians3 --optimizer sgd --eps 1e-6 --steps 2 --out " + (dir / "e"),
       "--eps applies to --optimizer adam, adamw, rmsprop or adagrad (got --optimizer sgd)"},
      {"train --data gaussians3 --optimizer adam --alpha 0.9 --steps 2 --out " + (dir / "e"),
       "--alpha applies to --optimizer rmsprop (got --optimizer adam)"},
      {"train --data gaussians3 --optimizer rmsprop --lr-decay 0.1 --steps 2 --out " + (dir / "e"),
       "--lr-decay applies to --optimizer adagrad (got --optimizer rmsprop)"},
      {"train --data gaussians3 --optimizer adagrad --eps 0 --steps 2 --out " + (dir / "e"), "--eps must be > 0 (got 0)"},
      {"train --data gaussians3 --model cnn:4 --steps 2 --out " + (dir / "f"), "needs image inputs"},
      {"train --data gaussians3 --train-size 99999 --steps 2 --out " + (dir / "g"), "99999"},
      {"info " + (dir / "missing"), "does not exist"},
      {"check-path " + dir.str(), "has no manifest.json"},
      {"frobnicate", "A subcommand is required"},
  };
  for (const auto& [args, message] : cases) {
    Output o = run(args);
    EXPECT_NE(o.status, 0) << args;
    EXPECT_NE(o.out.find(message), std::string::npos) << args << "\n" << o.out;
  }
}

}  // namespace
}  // namespace pathkernel
