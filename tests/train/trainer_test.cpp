// Tests of the training loop, the batch sampler, schedules, optimizers and
// divergence handling.
#include <gtest/gtest.h>

#include <cmath>

#include "../test_util.h"
#include "pathkernel/dataset.h"
#include "pathkernel/error.h"
#include "pathkernel/trainer.h"

namespace pathkernel {
namespace {

/// Records what the trainer reports, in memory.
class Recorder : public TrainingObserver {
 public:
  void on_start(Network& net, torch::optim::Optimizer&, const std::vector<double>& rates) override {
    weights.push_back(flatten_parameters(net));
    this->rates = rates;
  }
  void on_step(int64_t, const torch::Tensor& batch, const StepResult& r, Network& net,
               torch::optim::Optimizer&) override {
    losses.push_back(r.loss);
    batches.push_back(batch);
    weights.push_back(flatten_parameters(net));
  }
  void on_stop(int64_t steps, const std::string& status, const std::string&, Network&,
               torch::optim::Optimizer&) override {
    stopped_at = steps;
    this->status = status;
  }
  std::vector<torch::Tensor> weights, batches;
  std::vector<double> losses, rates;
  int64_t stopped_at = -1;
  std::string status;
};

struct Problem {
  Dataset data;
  Network net{nullptr};
};

Problem gaussians(const std::string& spec = "mlp:8", int64_t train = 150) {
  DataOptions d;
  d.spec = "gaussians3";
  d.train_size = train;
  d.test_size = 60;
  Problem p;
  p.data = load_dataset(d);
  NetworkOptions o;
  o.spec = ModelSpec::parse(spec);
  o.input_shape = p.data.input_shape;
  o.num_classes = p.data.num_classes;
  p.net = build_network(o);
  return p;
}

TrainOptions options(const std::string& optimizer, double lr, int64_t steps, int64_t batch) {
  TrainOptions t;
  t.optimizer.name = optimizer;
  t.optimizer.lr = lr;
  t.steps = steps;
  t.batch = batch;
  t.progress = false;
  return t;
}

TEST(Train, ReducesTheLossOnGaussians3ForEveryOptimizer) {
  for (const std::string opt :
       {"gd", "sgd", "momentum", "nesterov", "adam", "adamw", "rmsprop", "rmsprop-momentum", "adagrad"}) {
    Problem p = gaussians();
    Recorder rec;
    const bool rmsprop = opt.rfind("rmsprop", 0) == 0;
    double lr = (opt == "adam" || opt == "adamw" || opt == "rmsprop") ? 0.01 : opt == "rmsprop-momentum" ? 0.002 : 0.05;
    TrainOptions t = options(rmsprop ? "rmsprop" : opt, lr, 60, opt == "gd" ? 0 : 30);
    if (opt == "rmsprop-momentum") t.optimizer.momentum = 0.8;
    TrainSummary s = train(p.net, p.data.x_train, p.data.y_train, p.data.x_test, p.data.y_test, t, rec);
    ASSERT_EQ(rec.losses.size(), 60u) << opt;
    // Full-set loss before and after, computed independently of the trainer.
    torch::NoGradGuard guard;
    Problem fresh = gaussians();
    double before = training_loss(fresh.net->forward(p.data.x_train), p.data.y_train, OutputMap::LogSoftmax).item<double>();
    double after = training_loss(p.net->forward(p.data.x_train), p.data.y_train, OutputMap::LogSoftmax).item<double>();
    EXPECT_LT(after, 0.5 * before) << opt << ": loss " << before << " -> " << after;
    EXPECT_GT(s.test_accuracy, 0.5) << opt;  // chance is 1/3
    EXPECT_EQ(rec.status, "complete");
    EXPECT_EQ(rec.stopped_at, 60);
  }
}

TEST(Train, OneSgdStepIsWMinusLrTimesTheGradient) {
  Problem p = gaussians();
  torch::Tensor w0 = flatten_parameters(p.net);
  // Reference gradient by autograd on a separate copy, reassembled by hand.
  Problem ref = gaussians();
  torch::Tensor loss = training_loss(ref.net->forward(p.data.x_train), p.data.y_train, OutputMap::LogSoftmax);
  loss.backward();
  std::vector<torch::Tensor> grads;
  for (auto& q : ref.net->parameters()) grads.push_back(q.grad().reshape(-1));
  torch::Tensor expected = w0 - 0.3 * torch::cat(grads);

  Recorder rec;
  train(p.net, p.data.x_train, p.data.y_train, p.data.x_test, p.data.y_test, options("gd", 0.3, 1, 0), rec);
  EXPECT_LT((flatten_parameters(p.net) - expected).abs().max().item<double>(), 1e-15);
}

TEST(Train, MomentumMatchesAnExplicitRecursion) {
  // b_0 = G_0, b_s = mu b_{s-1} + (1-d) G_s, w_{s+1} = w_s - lr b_s (PyTorch's convention).
  Problem p = gaussians("mlp:4", 60);
  Problem ref = gaussians("mlp:4", 60);
  TrainOptions t = options("momentum", 0.05, 5, 0);
  t.optimizer.momentum = 0.8;
  t.optimizer.dampening = 0.25;
  Recorder rec;
  train(p.net, p.data.x_train, p.data.y_train, p.data.x_test, p.data.y_test, t, rec);
  torch::Tensor w = flatten_parameters(ref.net), b;
  for (int s = 0; s < 5; ++s) {
    set_flat_parameters(ref.net, w);
    for (auto& q : ref.net->parameters()) q.mutable_grad() = torch::Tensor();
    training_loss(ref.net->forward(p.data.x_train), p.data.y_train, OutputMap::LogSoftmax).backward();
    std::vector<torch::Tensor> g;
    for (auto& q : ref.net->parameters()) g.push_back(q.grad().reshape(-1));
    torch::Tensor grad = torch::cat(g);
    b = s == 0 ? grad : 0.8 * b + 0.75 * grad;
    w = w - 0.05 * b;
    EXPECT_LT((rec.weights[s + 1] - w).abs().max().item<double>(), 1e-13) << "step " << s;
  }
}

TEST(Train, DivergenceStopsWithAClearErrorAndReportsTheLastGoodStep) {
  Problem p = gaussians();
  Recorder rec;
  try {
    train(p.net, p.data.x_train, p.data.y_train, p.data.x_test, p.data.y_test, options("gd", 1e4, 50, 0), rec);
    FAIL() << "no divergence error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("diverged at step"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("smaller learning rate"), std::string::npos) << e.what();
  }
  EXPECT_EQ(rec.status, "diverged");
  EXPECT_GE(rec.stopped_at, 1);
  EXPECT_LT(rec.stopped_at, 50);
  EXPECT_EQ(static_cast<int64_t>(rec.losses.size()), rec.stopped_at);
}

TEST(BatchSampler, EachEpochCoversEveryPointOnceAndIsDeterministic) {
  const int64_t m = 23, b = 5;
  BatchSampler a(m, b, 7), again(m, b, 7), other(m, b, 8);
  ASSERT_EQ(a.steps_per_epoch(), 5);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int> seen(m, 0);
    for (int64_t i = 0; i < 5; ++i) {
      int64_t s = epoch * 5 + i;
      torch::Tensor idx = a.batch(s);
      EXPECT_EQ(idx.size(0), i < 4 ? 5 : 3);
      EXPECT_TRUE(torch::equal(idx, again.batch(s)));
      for (int64_t j = 0; j < idx.size(0); ++j) seen[idx[j].item<int64_t>()]++;
    }
    for (int64_t j = 0; j < m; ++j) EXPECT_EQ(seen[j], 1) << "epoch " << epoch << " point " << j;
  }
  EXPECT_FALSE(torch::equal(BatchSampler(m, b, 7).batch(0), other.batch(0)));
  EXPECT_FALSE(BatchSampler(m, 0, 7).batch(3).defined());   // full batch
  EXPECT_FALSE(BatchSampler(m, 50, 7).batch(0).defined());  // batch >= M is the full batch
}

TEST(Schedule, MatchesItsFormulas) {
  const double pi = std::acos(-1.0);
  auto cosine = learning_rate_schedule("cosine", 0.2, 10);
  auto linear = learning_rate_schedule("linear", 0.2, 10);
  auto constant = learning_rate_schedule("constant", 0.2, 10);
  for (int s = 0; s < 10; ++s) {
    EXPECT_DOUBLE_EQ(cosine[s], 0.1 * (1 + std::cos(pi * s / 10.0)));
    EXPECT_DOUBLE_EQ(linear[s], 0.2 * (10 - s) / 10.0);
    EXPECT_EQ(constant[s], 0.2);
  }
  // step: 0.2 for steps 0-3, 0.1 for 4-7, 0.05 for 8-9.
  const std::vector<double> step = learning_rate_schedule("step:4:0.5", 0.2, 10);
  const std::vector<double> step_expect{0.2, 0.2, 0.2, 0.2, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05};
  for (int s = 0; s < 10; ++s) EXPECT_DOUBLE_EQ(step[s], step_expect[s]) << s;
  // step's defaults: every ceil(10/3) = 4 steps, times 0.1.
  EXPECT_DOUBLE_EQ(learning_rate_schedule("step", 0.2, 10)[4], 0.02);
  EXPECT_DOUBLE_EQ(learning_rate_schedule("step", 0.2, 10)[3], 0.2);
  // warmup: 0.05, 0.1, 0.15, 0.2, then 0.2.
  const std::vector<double> warm = learning_rate_schedule("warmup:4", 0.2, 10);
  for (int s = 0; s < 10; ++s) EXPECT_DOUBLE_EQ(warm[s], s < 4 ? 0.05 * (s + 1) : 0.2) << s;
  EXPECT_DOUBLE_EQ(learning_rate_schedule("warmup", 0.2, 30)[0], 0.2 / 3);  // default: N/10 = 3 steps
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"exponential", "expected one of constant, step[:EVERY[:GAMMA]], cosine, linear, warmup[:STEPS]"},
      {"step:0", "EVERY must be a whole number of steps >= 1 (got 0)"},
      {"step:2.5", "EVERY must be a whole number"},
      {"step:3:1.5", "GAMMA must be in (0, 1] (got 1.5)"},
      {"step:3:x", "'x' is not a number"},
      {"step:1:0.5:2", "step takes at most 2 numbers, got 3"},
      {"warmup:-1", "STEPS must be a whole number >= 1 (got -1)"},
      {"warmup:", "'' is not a number"},
      {"cosine:3", "expected one of"},
  };
  for (const auto& [spec, message] : bad) {
    try {
      learning_rate_schedule(spec, 0.1, 3);
      ADD_FAILURE() << spec << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << spec << ": " << e.what();
    }
  }
}

TEST(TrainOptions, RejectsBadOptions) {
  const std::vector<std::pair<std::function<void(TrainOptions&)>, std::string>> cases = {
      {[](TrainOptions& t) { t.optimizer.lr = -0.1; }, "learning rate must be > 0 (got -0.1)"},
      {[](TrainOptions& t) { t.optimizer.name = "lbfgs"; }, "unknown optimizer 'lbfgs'"},
      {[](TrainOptions& t) { t.optimizer.name = "gd"; t.batch = 10; }, "uses the full batch"},
      {[](TrainOptions& t) { t.steps = 0; }, "the number of steps must be >= 1"},
      {[](TrainOptions& t) { t.epochs = 2; }, "exactly one of a step count and an epoch count"},
      {[](TrainOptions& t) { t.batch = -2; }, "batch size must be >= 1"},
      {[](TrainOptions& t) { t.optimizer.name = "momentum"; t.optimizer.momentum = 1.5; }, "momentum must be in (0, 1)"},
      {[](TrainOptions& t) { t.optimizer.name = "adam"; t.optimizer.beta2 = 1; }, "beta2 must be in [0, 1)"},
      {[](TrainOptions& t) { t.optimizer.name = "adam"; t.optimizer.eps = -1e-8; }, "eps must be > 0 (got -1e-08)"},
      {[](TrainOptions& t) { t.optimizer.name = "rmsprop"; t.optimizer.alpha = 1; }, "alpha must be in [0, 1) (got 1)"},
      {[](TrainOptions& t) { t.optimizer.name = "rmsprop"; t.optimizer.momentum = 1; },
       "momentum must be in [0, 1) (got 1)"},
      {[](TrainOptions& t) { t.optimizer.name = "adagrad"; t.optimizer.lr_decay = -0.5; },
       "lr_decay must be >= 0 (got -0.5)"},
      {[](TrainOptions& t) { t.optimizer.name = "adagrad"; t.optimizer.initial_accumulator_value = -1; },
       "initial_accumulator_value must be >= 0 (got -1)"},
      {[](TrainOptions& t) { t.schedule = "warm"; }, "unknown schedule 'warm'"},
  };
  for (const auto& [mutate, message] : cases) {
    TrainOptions t = options("sgd", 0.1, 10, 5);
    mutate(t);
    try {
      t.validate(100);
      ADD_FAILURE() << "no error, expected: " << message;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

TEST(TrainOptions, EpochsBecomeSteps) {
  TrainOptions t = options("sgd", 0.1, -1, 30);
  t.epochs = 3;
  EXPECT_EQ(t.total_steps(100), 12);  // ceil(100/30) = 4 per epoch
  t.batch = 0;
  EXPECT_EQ(t.total_steps(100), 3);
}

}  // namespace
}  // namespace pathkernel

namespace pathkernel {
namespace {

TEST(OptimizerKinds, EveryNameParsesToItsTraits) {
  struct Case {
    std::string name;
    OptimizerKind kind;
    bool full_batch, has_buffer, momentum_family, adam_family;
    double default_lr, default_eps;
  };
  for (const Case& c : std::vector<Case>{{"gd", OptimizerKind::Gd, true, false, false, false, 0.1, 0},
                                         {"sgd", OptimizerKind::Sgd, false, false, false, false, 0.1, 0},
                                         {"momentum", OptimizerKind::Momentum, false, true, true, false, 0.1, 0},
                                         {"nesterov", OptimizerKind::Nesterov, false, true, true, false, 0.1, 0},
                                         {"adam", OptimizerKind::Adam, false, true, false, true, 1e-3, 1e-8},
                                         {"adamw", OptimizerKind::AdamW, false, true, false, true, 1e-3, 1e-8},
                                         {"rmsprop", OptimizerKind::RMSprop, false, true, false, false, 1e-2, 1e-8},
                                         {"adagrad", OptimizerKind::Adagrad, false, true, false, false, 1e-2, 1e-10}}) {
    ASSERT_EQ(parse_optimizer_kind(c.name), c.kind) << c.name;
    const OptimizerTraits& t = optimizer_traits(c.kind);
    EXPECT_EQ(std::string(t.name), c.name);
    EXPECT_EQ(t.full_batch, c.full_batch) << c.name;
    EXPECT_EQ(t.has_buffer, c.has_buffer) << c.name;
    EXPECT_EQ(t.momentum_family, c.momentum_family) << c.name;
    EXPECT_EQ(t.adam_family, c.adam_family) << c.name;
    EXPECT_EQ(t.default_lr, c.default_lr) << c.name;
    EXPECT_EQ(t.default_eps, c.default_eps) << c.name;
  }
  EXPECT_EQ(optimizer_kinds().size(), optimizer_names().size());
  EXPECT_CONTAINS(testing::error_message([] { parse_optimizer_kind("Adam"); }),
                  "unknown optimizer 'Adam': expected one of gd, sgd, momentum, nesterov, adam, adamw, rmsprop, adagrad");
}

// A library caller with default options gets what `pathkernel train` does:
// lr 0.1 (1e-3 for adam and adamw), batch 100 (the full batch for gd), one epoch.
TEST(OptimizerKinds, LibraryDefaultsAreTheCommandLinesDefaults) {
  struct Case {
    std::string name;
    double lr;
    int64_t batch;
  };
  for (const Case& c : std::vector<Case>{{"gd", 0.1, 0}, {"sgd", 0.1, 100}, {"momentum", 0.1, 100},
                                         {"adam", 1e-3, 100}, {"adamw", 1e-3, 100}, {"rmsprop", 1e-2, 100},
                                         {"adagrad", 1e-2, 100}}) {
    TrainOptions t;
    t.optimizer.name = c.name;
    const TrainOptions r = t.resolved();
    EXPECT_EQ(r.optimizer.lr, c.lr) << c.name;
    EXPECT_EQ(r.batch, c.batch) << c.name;
    EXPECT_EQ(r.epochs, 1) << c.name;
    EXPECT_EQ(r.steps, -1) << c.name;
    EXPECT_NO_THROW(t.validate(1000)) << c.name;
    EXPECT_EQ(t.total_steps(1000), c.batch == 0 ? 1 : 10) << c.name;
    EXPECT_EQ(t.optimizer.to_json()["lr"], c.lr) << c.name;
  }
  // Given values are kept.
  TrainOptions t;
  t.optimizer.name = "adam";
  t.optimizer.lr = 0.5;
  t.batch = 7;
  t.steps = 3;
  EXPECT_EQ(t.resolved().optimizer.lr, 0.5);
  EXPECT_EQ(t.resolved().batch, 7);
  EXPECT_EQ(t.resolved().epochs, -1);
}

// eps defaults to PyTorch's for the kind (1e-10 for adagrad), and the
// manifest's optimizer entry carries each kind's own fields and reads back.
TEST(OptimizerOptions, EachKindsFieldsRoundTripThroughTheManifest) {
  OptimizerOptions a;
  a.name = "adagrad";
  a.lr_decay = 0.25;
  a.initial_accumulator_value = 0.5;
  EXPECT_EQ(a.resolved().eps, 1e-10);
  nlohmann::ordered_json j = a.to_json();
  EXPECT_EQ(j.dump(), R"({"name":"adagrad","lr":0.01,"lr_decay":0.25,"initial_accumulator_value":0.5,"eps":1e-10,)"
                      R"("weight_decay":0.0})");
  OptimizerOptions b = OptimizerOptions::from_json(j);
  EXPECT_EQ(b.to_json().dump(), j.dump());
  OptimizerOptions r;
  r.name = "rmsprop";
  r.alpha = 0.9;
  r.centered = true;
  r.eps = 1e-6;
  j = r.to_json();
  EXPECT_EQ(j.dump(), R"({"name":"rmsprop","lr":0.01,"alpha":0.9,"centered":true,"eps":1e-06,"weight_decay":0.0})");
  EXPECT_EQ(OptimizerOptions::from_json(j).to_json().dump(), j.dump());
  r.momentum = 0.5;  // RMSprop's momentum is written only where it has some
  j = r.to_json();
  EXPECT_EQ(j.dump(), R"({"name":"rmsprop","lr":0.01,"alpha":0.9,"centered":true,"momentum":0.5,"eps":1e-06,)"
                      R"("weight_decay":0.0})");
  EXPECT_EQ(OptimizerOptions::from_json(j).momentum, 0.5);
  OptimizerOptions momentum;  // the momentum family's default, written out
  momentum.name = "momentum";
  EXPECT_EQ(momentum.to_json().dump(), R"({"name":"momentum","lr":0.1,"momentum":0.9,"dampening":0.0,)"
                                       R"("weight_decay":0.0})");
  OptimizerOptions adam;
  adam.name = "adam";
  EXPECT_EQ(adam.to_json().dump(),
            R"({"name":"adam","lr":0.001,"beta1":0.9,"beta2":0.999,"eps":1e-08,"weight_decay":0.0})");
  OptimizerOptions sgd;
  EXPECT_EQ(sgd.to_json().dump(), R"({"name":"sgd","lr":0.1,"weight_decay":0.0})");
}

}  // namespace
}  // namespace pathkernel
