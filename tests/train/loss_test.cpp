// The losses and output maps (loss.h): the per-example signal u_i = ∂ℓ_i/∂f
// against autograd of each example's own loss, the batch loss against its
// definition written out, and the combinations that are refused.
#include <gtest/gtest.h>

#include "../test_util.h"
#include "pathkernel/loss.h"

namespace pathkernel {
namespace {

using testing::error_message;

struct Case {
  LossKind loss;
  OutputMap map;
  bool targets;  ///< float targets [n, K] instead of class labels
};

const Case kCases[] = {{LossKind::CrossEntropy, OutputMap::LogSoftmax, false},
                       {LossKind::CrossEntropy, OutputMap::Logits, false},
                       {LossKind::Nll, OutputMap::Logits, false},
                       {LossKind::Mse, OutputMap::Logits, false},
                       {LossKind::Mse, OutputMap::Logits, true}};

// u_i must be the gradient of example i's own loss with respect to its own
// outputs, with the batch loss the mean of the examples' losses.
TEST(Loss, SignalIsEachExamplesLossGradient) {
  torch::manual_seed(3);
  const int64_t n = 5, K = 4;
  for (const Case& c : kCases) {
    torch::Tensor z = torch::randn({n, K}, torch::kFloat64);
    // nll's outputs are log-probabilities; the others take any outputs.
    torch::Tensor f = c.loss == LossKind::Nll || c.map == OutputMap::LogSoftmax ? torch::log_softmax(z, 1) : z;
    torch::Tensor y = c.targets ? torch::randn({n, K}, torch::kFloat64) : torch::tensor({0, 3, 1, 1, 2}, torch::kLong);
    const torch::Tensor u = loss_signal(f, y, c.map, c.loss);
    ASSERT_EQ(u.sizes(), f.sizes());
    double mean = 0;
    for (int64_t i = 0; i < n; ++i) {
      torch::Tensor fi = f.narrow(0, i, 1).detach().clone().requires_grad_(true);
      torch::Tensor li = training_loss(fi, y.narrow(0, i, 1), c.map, c.loss);
      li.backward();
      EXPECT_TRUE(torch::allclose(u[i], fi.grad()[0], 1e-14, 1e-15))
          << loss_name(c.loss) << " " << output_map_name(c.map) << " row " << i << ": " << u[i] << " vs "
          << fi.grad()[0];
      mean += li.item<double>() / n;
    }
    EXPECT_NEAR(training_loss(f, y, c.map, c.loss).item<double>(), mean, 1e-14) << loss_name(c.loss);
  }
}

// The definitions written out by hand, element by element.
TEST(Loss, MatchesItsDefinitionWrittenOut) {
  const torch::Tensor f = torch::tensor({{0.5, -1.0, 2.0}, {1.5, 0.25, -0.5}}, torch::kFloat64);
  const torch::Tensor y = torch::tensor({2, 0}, torch::kLong);
  // mse on class labels: one-hot targets, mean over n·K elements.
  double sq = 0;
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t k = 0; k < 3; ++k) {
      const double t = k == y[i].item<int64_t>() ? 1.0 : 0.0;
      sq += (f[i][k].item<double>() - t) * (f[i][k].item<double>() - t);
    }
  }
  EXPECT_NEAR(training_loss(f, y, OutputMap::Logits, LossKind::Mse).item<double>(), sq / 6, 1e-15);
  // nll: minus the output at the label, averaged.
  EXPECT_NEAR(training_loss(f, y, OutputMap::Logits, LossKind::Nll).item<double>(), -(2.0 + 1.5) / 2, 1e-15);
  // cross entropy on logits: log-sum-exp minus the label's logit.
  double ce = 0;
  for (int64_t i = 0; i < 2; ++i) {
    double s = 0;
    for (int64_t k = 0; k < 3; ++k) s += std::exp(f[i][k].item<double>());
    ce += std::log(s) - f[i][y[i].item<int64_t>()].item<double>();
  }
  EXPECT_NEAR(training_loss(f, y, OutputMap::Logits, LossKind::CrossEntropy).item<double>(), ce / 2, 1e-14);
}

TEST(Loss, RefusesWhatItCannotTrain) {
  EXPECT_CONTAINS(error_message([] { check_loss_output(LossKind::Nll, OutputMap::LogSoftmax); }), "needs the output map 'logits'");
  EXPECT_CONTAINS(error_message([] { check_loss_output(LossKind::Mse, OutputMap::LogSoftmax); }), "needs the output map 'logits'");
  EXPECT_NO_THROW(check_loss_output(LossKind::CrossEntropy, OutputMap::LogSoftmax));
  EXPECT_NO_THROW(check_loss_output(LossKind::CrossEntropy, OutputMap::Logits));
  const torch::Tensor f = torch::zeros({2, 3}, torch::kFloat64), targets = torch::zeros({2, 3}, torch::kFloat64);
  EXPECT_CONTAINS(error_message([&] { training_loss(f, targets, OutputMap::Logits, LossKind::CrossEntropy); }),
                  "needs class labels");
  EXPECT_CONTAINS(error_message([&] { training_loss(f, torch::zeros({2, 2}, torch::kFloat64), OutputMap::Logits, LossKind::Mse); }),
                  "expected the same [n, K]");
  EXPECT_EQ(parse_loss_kind("cross-entropy"), LossKind::CrossEntropy);
  EXPECT_EQ(parse_loss_kind("cross_entropy"), LossKind::CrossEntropy);
  EXPECT_EQ(parse_loss_kind("mse"), LossKind::Mse);
  for (const std::string& name : loss_names()) EXPECT_EQ(loss_name(parse_loss_kind(name)), name);
  EXPECT_CONTAINS(error_message([] { parse_loss_kind("hinge"); }), "expected one of cross_entropy");
}

// Sequences: ℓ_i is the mean of the sequence's T token losses; u_i [T, V]
// must be the gradient of example i's own loss in its outputs at every
// position, weighted or not, and the batch loss the mean over all n·T
// tokens, as F.cross_entropy of the flattened tokens computes it.
TEST(Loss, SequenceSignalIsEachSequencesMeanTokenLossGradient) {
  torch::manual_seed(5);
  const int64_t n = 4, T = 3, V = 5;
  const torch::Tensor y = torch::randint(0, V, {n, T}, torch::kLong), w = torch::rand({n}, torch::kFloat64);
  const Case cases[] = {{LossKind::CrossEntropy, OutputMap::Logits, false},
                        {LossKind::CrossEntropy, OutputMap::LogSoftmax, false},
                        {LossKind::Nll, OutputMap::Logits, false}};
  for (const Case& c : cases) {
    const torch::Tensor z = torch::randn({n, T, V}, torch::kFloat64);
    const torch::Tensor f = c.loss == LossKind::Nll || c.map == OutputMap::LogSoftmax ? torch::log_softmax(z, 2) : z;
    const torch::Tensor u = loss_signal(f, y, c.map, c.loss), uw = loss_signal(f, y, c.map, c.loss, w);
    ASSERT_EQ(u.sizes(), f.sizes());
    for (int64_t i = 0; i < n; ++i) {
      torch::Tensor fi = f.narrow(0, i, 1).detach().clone().requires_grad_(true);
      // example i's loss by autograd: the mean over its tokens of −log p(y_t)
      const torch::Tensor logp = c.loss == LossKind::Nll || c.map == OutputMap::LogSoftmax ? fi : torch::log_softmax(fi, 2);
      torch::Tensor li = -logp[0].gather(1, y[i].unsqueeze(1)).mean();
      li.backward();
      EXPECT_TRUE(torch::allclose(u[i], fi.grad()[0], 1e-14, 1e-15)) << loss_name(c.loss) << " row " << i;
      EXPECT_TRUE(torch::allclose(uw[i], w[i] * fi.grad()[0], 1e-14, 1e-15)) << "weighted, row " << i;
      EXPECT_NEAR(example_losses(f, y, c.map, c.loss)[i].item<double>(), li.item<double>(), 1e-14);
    }
    const torch::Tensor flat = c.loss == LossKind::Nll || c.map == OutputMap::LogSoftmax
                                   ? torch::nll_loss(f.reshape({-1, V}), y.reshape({-1}))
                                   : torch::cross_entropy_loss(f.reshape({-1, V}), y.reshape({-1}));
    EXPECT_TRUE(torch::equal(training_loss(f, y, c.map, c.loss), flat)) << loss_name(c.loss);  // bit for bit
    EXPECT_NEAR(training_loss(f, y, c.map, c.loss, w).item<double>(),
                (example_losses(f, y, c.map, c.loss) * w).mean().item<double>(), 1e-15);
  }
  // The last position's prediction counts as the sequence's.
  torch::Tensor f = torch::zeros({2, T, V}, torch::kFloat64);
  f[0][T - 1][y[0][T - 1].item<int64_t>()] = 1;
  f[1][T - 1][(y[1][T - 1].item<int64_t>() + 1) % V] = 1;  // wrong at the last position
  f[1][0][y[1][0].item<int64_t>()] = 1;                    // right elsewhere: not counted
  EXPECT_EQ(correct_predictions(f, y.narrow(0, 0, 2)), 1);
}

TEST(Loss, RefusesSequencesItCannotTrain) {
  const torch::Tensor y = torch::zeros({2, 3}, torch::kLong);
  EXPECT_CONTAINS(error_message([&] { training_loss(torch::zeros({2, 3, 4}, torch::kFloat64), y, OutputMap::Logits, LossKind::Mse); }),
                  "train with cross_entropy or nll");
  EXPECT_CONTAINS(error_message([&] { loss_signal(torch::zeros({2, 4}, torch::kFloat64), y, OutputMap::Logits); }),
                  "need outputs [n, T, V] = [2, 3, V], got [2, 4]");
  EXPECT_CONTAINS(error_message([&] { example_losses(torch::zeros({2, 2, 4}, torch::kFloat64), y, OutputMap::Logits); }),
                  "need outputs [n, T, V]");
}

}  // namespace
}  // namespace pathkernel
