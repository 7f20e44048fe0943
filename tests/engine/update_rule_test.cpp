// The optimizers' updates as linear maps of per-sample gradients, against
// LibTorch's own optimizer steps.
#include <gtest/gtest.h>

#include "../test_util.h"
#include "pathkernel/trainer.h"
#include "pathkernel/update_rule.h"

namespace pathkernel {
namespace {

/// The mean-loss gradient at the network's current weights, flat [P].
torch::Tensor mean_gradient(Network& net, const torch::Tensor& x, const torch::Tensor& y) {
  for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
  training_loss(net->forward(x), y, net->options().output).backward();
  std::vector<torch::Tensor> g;
  for (auto& p : net->parameters()) g.push_back(p.grad().reshape(-1));
  return torch::cat(g);
}

/// The options of `name` (as testing::name_optimizer takes it; RMSprop's
/// momentum 0.6).
OptimizerOptions optimizer(const std::string& name) {
  OptimizerOptions o;
  testing::name_optimizer(o, name, 0.6);
  o.lr = o.name == "adam" || o.name == "adamw" || o.name == "rmsprop" ? 0.02 : 0.1;
  o.weight_decay = 0.05;
  o.dampening = name == "momentum" ? 0.3 : 0.0;
  o.alpha = 0.9;
  o.lr_decay = 0.2;
  o.initial_accumulator_value = 0.1;
  return o;
}

// Step by step with LibTorch's optimizer: the recorded buffer follows
// b_s = β b_{s−1} + γ_s Q_s d_s and the update equals P_s(α d_s + κ b_s) + ρ_s,
// both to rounding.
TEST(UpdateRule, ReconstructsLibTorchsSteps) {
  for (const std::string name : {"gd", "sgd", "momentum", "nesterov", "adam", "adamw", "rmsprop", "rmsprop-centered",
                                 "rmsprop-momentum", "rmsprop-centered-momentum", "adagrad"}) {
    NetworkOptions no;
    no.spec = ModelSpec::parse("mlp:6");
    no.input_shape = {4};
    no.num_classes = 3;
    no.seed = 1;
    Network net = build_network(no);
    net->to(torch::kFloat64);
    const OptimizerOptions o = optimizer(name);
    auto opt = make_optimizer(o, net->parameters());
    const UpdateRule rule(o);
    torch::manual_seed(5);
    torch::Tensor b_prev;
    for (int64_t s = 0; s < 6; ++s) {
      torch::Tensor x = torch::randn({8, 4}, torch::kFloat64), y = torch::randint(0, 3, {8});
      const double lr = o.lr * (1.0 - 0.1 * static_cast<double>(s));  // a changing rate
      set_learning_rate(*opt, lr);
      torch::Tensor w = flatten_parameters(net).clone();
      torch::Tensor d = mean_gradient(net, x, y) + rule.coupled_decay() * w;
      take_step(net, *opt, {x, y, {}, s, lr});
      torch::Tensor dw = flatten_parameters(net) - w;
      OptimizerState after = export_state(*opt, o.name, net->parameters());
      StepCoefficients c = rule.step(s, lr, w, after);
      torch::Tensor b = rule.buffer(after);
      ASSERT_EQ(b.defined(), rule.has_buffer()) << name;
      if (b.defined()) {
        const torch::Tensor qd = c.buffer_metric.defined() ? d * c.buffer_metric : d;
        torch::Tensor expect = c.gamma * qd + (b_prev.defined() ? rule.beta() * b_prev : torch::zeros_like(d));
        EXPECT_LE((b - expect).abs().max().item<double>(), 1e-15 * b.abs().max().item<double>() + 1e-300)
            << name << " step " << s;
      }
      torch::Tensor rec = UpdateRule::update(c, d, b);
      EXPECT_GT(dw.abs().max().item<double>(), 1e-4) << name;
      // e_s: the rounding of w_{s+1} = w_s + Δw_s itself, a few ulp of w.
      const double ulp_w = 2.220446049250313e-16 * w.abs().max().item<double>();
      EXPECT_LE((rec - dw).abs().max().item<double>(), 4 * ulp_w + 1e-14 * dw.abs().max().item<double>())
          << name << " step " << s;
      b_prev = b;
    }
  }
}

TEST(UpdateRule, Coefficients) {
  EXPECT_EQ(UpdateRule(optimizer("sgd")).beta(), 0.0);
  EXPECT_EQ(UpdateRule(optimizer("momentum")).beta(), 0.9);
  EXPECT_EQ(UpdateRule(optimizer("adam")).coupled_decay(), 0.05);
  EXPECT_EQ(UpdateRule(optimizer("adamw")).coupled_decay(), 0.0);  // decoupled: it is ρ_s
  OptimizerState none;
  const StepCoefficients m0 = UpdateRule(optimizer("momentum")).step(0, 0.1, torch::zeros({3}), none);
  const StepCoefficients m1 = UpdateRule(optimizer("momentum")).step(1, 0.1, torch::zeros({3}), none);
  EXPECT_EQ(m0.gamma, 1.0);  // the first buffer is the gradient itself
  EXPECT_EQ(m1.gamma, 1.0 - 0.3);
  // RMSprop with momentum: a buffer with the step's metric inside it, the update the buffer alone.
  const UpdateRule rm(optimizer("rmsprop-momentum"));
  EXPECT_EQ(rm.beta(), 0.6);
  EXPECT_TRUE(rm.walks_in_reverse());
  OptimizerState after;
  after.step = 1;
  after.buffers["square_avg"] = torch::full({3}, 4.0, torch::kFloat64);
  after.buffers["momentum_buffer"] = torch::ones({3}, torch::kFloat64);
  const StepCoefficients r = rm.step(0, 0.1, torch::zeros({3}), after);
  EXPECT_FALSE(r.metric.defined());
  ASSERT_TRUE(r.buffer_metric.defined());
  EXPECT_DOUBLE_EQ(r.buffer_metric[0].item<double>(), 1 / (2 + 1e-8));
  EXPECT_EQ(r.alpha, 0.0);
  EXPECT_EQ(r.kappa, -0.1);
  EXPECT_EQ(r.gamma, 1.0);
  EXPECT_EQ(UpdateRule(optimizer("rmsprop")).beta(), 0.0);  // no momentum, no buffer
}

TEST(UpdateRule, RejectsWhatItCannotRepresent) {
  OptimizerOptions o = optimizer("sgd");
  o.name = "lbfgs";
  EXPECT_CONTAINS(testing::error_message([&] { UpdateRule r(o); }), "no update rule for optimizer 'lbfgs'");
  OptimizerState empty;
  EXPECT_CONTAINS(testing::error_message([&] { UpdateRule(optimizer("momentum")).buffer(empty); }),
                  "no 'momentum_buffer' buffer");
  EXPECT_CONTAINS(testing::error_message([&] { UpdateRule(optimizer("adam")).step(0, 0.1, torch::zeros({3}), empty); }),
                  "step count 0");
  EXPECT_CONTAINS(testing::error_message([&] { UpdateRule(optimizer("adagrad")).step(0, 0.1, torch::zeros({3}), empty); }),
                  "step count 0");
  EXPECT_CONTAINS(testing::error_message([&] { UpdateRule(optimizer("rmsprop")).step(0, 0.1, torch::zeros({3}), empty); }),
                  "no 'square_avg' buffer");
  OptimizerState plain;
  plain.step = 1;
  plain.buffers["square_avg"] = torch::ones({3}, torch::kFloat64);
  EXPECT_CONTAINS(
      testing::error_message([&] { UpdateRule(optimizer("rmsprop-centered")).step(0, 0.1, torch::zeros({3}), plain); }),
      "no 'grad_avg' buffer");
}

}  // namespace
}  // namespace pathkernel
