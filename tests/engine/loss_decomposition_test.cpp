// The decomposition is exact for every loss (loss.h): completeness holds to
// rounding only if the contributions' per-example signals are the gradients
// of the loss training descended, since E is computed from the batch loss's
// own autograd gradient. Cross entropy is covered by the other tests; here
// mse on class labels (one-hot targets) and on float regression targets.
#include <gtest/gtest.h>

#include <filesystem>

#include "../test_util.h"
#include "pathkernel/decomposition.h"
#include "pathkernel/npy.h"

namespace pathkernel {
namespace {

namespace fs = std::filesystem;
using testing::error_message;
using testing::small_run;
using testing::TempDir;

void expect_exact(const std::string& run, const std::string& what) {
  PathReader reader(run);
  DecompositionOptions o;
  o.progress = false;
  const Decomposition d = decompose(reader, reader.decoded_dataset().x_test.narrow(0, 0, 3), o);
  const DecompositionSummary s = summarize(d);
  EXPECT_LT(s.max_rel_error, 1e-12) << what;
  EXPECT_LT(s.completeness_error, 1e-12) << what;
  EXPECT_GT(d.contributions.abs().max().item<double>(), 1e-6) << what << ": nothing was attributed";
  EXPECT_EQ(s.residuals.first_step, -1) << what;
}

TEST(LossDecomposition, MseOnClassLabelsIsExact) {
  for (const std::string opt : {"sgd", "momentum"}) {
    TempDir dir(opt);
    RunOptions r = small_run(dir / "run", opt, 6, 3);
    r.loss = LossKind::Mse;
    r.output = OutputMap::Logits;
    train_run(r);
    EXPECT_EQ(Manifest::load(r.out).loss, "mse");
    expect_exact(r.out, "mse " + opt);
  }
}

TEST(LossDecomposition, MseOnRegressionTargetsIsExact) {
  TempDir dir;
  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({40, 3}, torch::kFloat64);
  const torch::Tensor t = torch::stack({x.select(1, 0) * 2 - x.select(1, 1), torch::sin(x.select(1, 2))}, 1);
  fs::create_directories(dir / "data");
  write_npy(dir / "data/train_x.npy", x.narrow(0, 0, 30));
  write_npy(dir / "data/train_y.npy", t.narrow(0, 0, 30));
  write_npy(dir / "data/test_x.npy", x.narrow(0, 30, 10));
  write_npy(dir / "data/test_y.npy", t.narrow(0, 30, 10));
  RunOptions r = small_run(dir / "run", "adam", 6, 2);
  r.data.spec = "npy:" + (dir / "data");
  r.data.train_size = r.data.test_size = -1;
  r.loss = LossKind::Mse;
  r.output = OutputMap::Logits;
  train_run(r);
  const Manifest m = Manifest::load(r.out);
  EXPECT_EQ(m.num_classes, 2);  // K = the targets' width
  EXPECT_TRUE(m.summary["train_accuracy"].is_null());  // no classes, no accuracy
  expect_exact(r.out, "mse regression");

  // Only mse trains on float targets.
  r.loss = LossKind::CrossEntropy;
  r.output = OutputMap::LogSoftmax;
  r.out = dir / "ce";
  EXPECT_CONTAINS(error_message([&] { train_run(r); }), "only the loss mse trains on");
}

TEST(LossDecomposition, RefusesLossesTheModelCannotTrain) {
  TempDir dir;
  RunOptions r = small_run(dir / "run", "sgd", 3, 1);
  r.loss = LossKind::Mse;  // on log_softmax
  EXPECT_CONTAINS(error_message([&] { train_run(r); }), "needs the output map 'logits'");
  r.loss = LossKind::Nll;
  r.output = OutputMap::Logits;
  EXPECT_CONTAINS(error_message([&] { train_run(r); }), "outputs logits: use cross_entropy");
}

}  // namespace
}  // namespace pathkernel
