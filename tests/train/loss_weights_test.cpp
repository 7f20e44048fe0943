// Per-training-point loss weights: the weighted loss and its signal, training
// and replay with them, the decomposition's contributions carrying them, and
// retraining with other weights.
#include <gtest/gtest.h>

#include <filesystem>

#include "../test_util.h"
#include "pathkernel/decomposition.h"
#include "pathkernel/loss.h"
#include "pathkernel/npy.h"
#include "pathkernel/path.h"
#include "pathkernel/retrain.h"

namespace pathkernel {
namespace {

using testing::error_message;
using testing::small_run;
using testing::TempDir;

TEST(LossWeights, WeightedLossIsTheWeightedMeanOfExampleLosses) {
  torch::manual_seed(3);
  const torch::Tensor f = torch::randn({5, 3}, torch::kFloat64);
  const torch::Tensor y = torch::tensor(std::vector<int64_t>{0, 2, 1, 1, 0}, torch::kLong);
  const torch::Tensor c = torch::tensor(std::vector<double>{1.0, 0.0, 2.5, 0.5, 3.0}, torch::kFloat64);
  for (LossKind loss : {LossKind::CrossEntropy, LossKind::Mse}) {
    const OutputMap map = loss == LossKind::Mse ? OutputMap::Logits : OutputMap::LogSoftmax;
    const torch::Tensor fm = map == OutputMap::LogSoftmax ? torch::log_softmax(f, 1) : f;
    // Explicit loop over the examples, each loss by its definition.
    double expected = 0;
    for (int64_t i = 0; i < 5; ++i) {
      const int64_t k = y[i].item<int64_t>();
      double l = 0;
      if (loss == LossKind::Mse) {
        for (int64_t j = 0; j < 3; ++j) l += std::pow(fm[i][j].item<double>() - (j == k ? 1.0 : 0.0), 2) / 3;
      } else {
        l = -fm[i][k].item<double>();
      }
      expected += c[i].item<double>() * l / 5;
    }
    EXPECT_NEAR(training_loss(fm, y, map, loss, c).item<double>(), expected, 1e-14) << loss_name(loss);
    // All ones: the plain mean.
    EXPECT_NEAR(training_loss(fm, y, map, loss, torch::ones({5}, torch::kFloat64)).item<double>(),
                training_loss(fm, y, map, loss).item<double>(), 1e-15);
    // The signal is the weighted loss's derivative, times n: by autograd.
    const torch::Tensor leaf = fm.detach().clone().requires_grad_(true);
    training_loss(leaf, y, map, loss, c).backward();
    EXPECT_TRUE(torch::allclose(loss_signal(fm, y, map, loss, c), leaf.grad() * 5, 1e-14, 1e-14)) << loss_name(loss);
  }
}

TEST(LossWeights, BadWeightsSayWhatIsWrong) {
  EXPECT_CONTAINS(error_message([] { checked_loss_weights(torch::ones({4}), 5, "w.npy"); }),
                  "expected one weight per training point, [5]");
  EXPECT_CONTAINS(error_message([] { checked_loss_weights(torch::ones({5, 1}), 5, "w.npy"); }), "[5, 1]");
  EXPECT_CONTAINS(error_message([] { checked_loss_weights(torch::ones({5}, torch::kLong), 5, "w.npy"); }),
                  "expected float32 or float64");
  torch::Tensor c = torch::ones({5}, torch::kFloat64);
  c[3] = -0.5;
  EXPECT_CONTAINS(error_message([&] { checked_loss_weights(c, 5, "w.npy"); }),
                  "the loss weight of training point 3 is -0.5; expected a finite number >= 0");
  EXPECT_EQ(checked_loss_weights(c, 5, "w.npy", true)[3].item<double>(), -0.5);  // retraining may go below 0
  c[3] = std::nan("");
  EXPECT_CONTAINS(error_message([&] { checked_loss_weights(c, 5, "w.npy"); }), "training point 3 is nan");
}

/// Loss weights from a file: recorded in the run, replayed bit for bit,
/// and doubling every weight at half the learning rate walks the same path.
TEST(LossWeights, TrainReplayAndScaleInvariance) {
  TempDir dir;
  torch::Tensor c = torch::ones({60}, torch::kFloat64);
  c.narrow(0, 0, 10).fill_(0.0);
  c.narrow(0, 10, 10).fill_(3.0);
  write_npy(dir / "w.npy", c);
  RunOptions r = small_run(dir / "run", "sgd", 10, 4);
  r.loss_weights_file = dir / "w.npy";
  const RunResult res = train_run(r);
  EXPECT_EQ(res.manifest.loss_weights.file, "loss_weights.npy");
  PathReader reader(dir / "run");
  ASSERT_TRUE(reader.loss_weights().defined());
  EXPECT_TRUE(torch::equal(reader.loss_weights(), c));
  const ReplayReport report = reader.check();
  EXPECT_TRUE(report.bitwise_equal);
  EXPECT_EQ(report.mismatches, 0);

  // Unweighted, the path differs: the weights were used.
  RunOptions plain = small_run(dir / "plain", "sgd", 10, 4);
  train_run(plain);
  PathReader plain_reader(dir / "plain");
  EXPECT_GT((plain_reader.weights(10) - reader.weights(10)).abs().max().item<double>(), 1e-6);

  // 2c at lr/2 is the same path as c at lr, up to rounding.
  RunOptions scaled = small_run(dir / "scaled", "sgd", 10, 4);
  scaled.train.loss_weights = 2 * c;
  scaled.train.optimizer.lr = r.train.optimizer.lr / 2;
  train_run(scaled);
  PathReader scaled_reader(dir / "scaled");
  EXPECT_LT((scaled_reader.weights(10) - reader.weights(10)).abs().max().item<double>(), 1e-13);
}

TEST(LossWeights, WrongFileIsRefusedAndTamperingIsCaught) {
  TempDir dir;
  write_npy(dir / "short.npy", torch::ones({59}, torch::kFloat64));
  RunOptions r = small_run(dir / "run", "sgd", 3, 3);
  r.loss_weights_file = dir / "short.npy";
  EXPECT_CONTAINS(error_message([&] { train_run(r); }), "loss weights file '" + (dir / "short.npy") + "'");
  EXPECT_CONTAINS(error_message([&] { train_run(r); }), "[60]");
  r.loss_weights_file = dir / "missing.npy";
  EXPECT_CONTAINS(error_message([&] { train_run(r); }), "does not exist");

  write_npy(dir / "w.npy", torch::full({60}, 0.5, torch::kFloat64));
  r.loss_weights_file = dir / "w.npy";
  train_run(r);
  write_npy(dir / "run/loss_weights.npy", torch::full({60}, 0.75, torch::kFloat64));
  EXPECT_CONTAINS(error_message([&] { PathReader reader(dir / "run"); }), "loss_weights.npy");
}

/// The decomposition of a weighted run is complete, and each point's
/// contribution carries its weight: weight 0 contributes exactly nothing.
TEST(LossWeights, ContributionsCarryTheirWeights) {
  for (const std::string optimizer : {"sgd", "momentum"}) {
    TempDir dir(optimizer);
    torch::Tensor c = torch::ones({60}, torch::kFloat64);
    c.narrow(0, 0, 10).fill_(0.0);
    c.narrow(0, 10, 10).fill_(2.0);
    RunOptions r = small_run(dir / "run", optimizer, 8, 4);
    r.train.loss_weights = c;
    train_run(r);
    PathReader reader(dir / "run");
    const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 3);
    for (bool replay_signals : {true, false}) {
      DecompositionOptions options;
      options.progress = false;
      options.replay_signals = replay_signals;
      const Decomposition d = decompose(reader, x, options);
      SCOPED_TRACE(optimizer + (replay_signals ? " replay signals" : " recomputed signals"));
      EXPECT_LT(summarize(d).max_rel_error, 1e-12);
      EXPECT_EQ(d.residuals.first_step, -1) << unexplained_update_message(d.residuals);
      EXPECT_EQ(d.contributions.narrow(1, 0, 10).abs().max().item<double>(), 0.0);
      EXPECT_GT(d.contributions.narrow(1, 10, 50).abs().max().item<double>(), 1e-6);
    }
  }
}

/// Retraining with a point's weight at 0 is removing it while the batch keeps
/// its size (RemovalScaling::Kept); other weights change the outputs.
TEST(LossWeights, RetrainingWithWeightZeroIsRemovalWithTheBatchSizeKept) {
  TempDir dir;
  train_run(small_run(dir / "run", "sgd", 10, 5));
  PathReader reader(dir / "run");
  const Retrainer retrainer(reader);
  RetrainJob zero;
  zero.weights = torch::ones({60}, torch::kFloat64);
  zero.weights[4] = 0;
  const torch::Tensor removed = retrainer.final_weights(removal_job(60, torch::tensor(std::vector<int64_t>{4})),
                                                        RemovalScaling::Kept);
  EXPECT_LT((retrainer.final_weights(zero, RemovalScaling::Reduced) - removed).abs().max().item<double>(), 1e-14);
  RetrainJob ones;
  ones.weights = torch::ones({60}, torch::kFloat64);
  EXPECT_LT((retrainer.final_weights(ones, RemovalScaling::Reduced) - reader.weights(10)).abs().max().item<double>(),
            1e-14);
  EXPECT_GT((retrainer.final_weights(zero, RemovalScaling::Reduced) - reader.weights(10)).abs().max().item<double>(),
            1e-8);
}

}  // namespace
}  // namespace pathkernel
