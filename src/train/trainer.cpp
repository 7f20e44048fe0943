// The training loop, schedules, batch sampling and divergence checks.
#include "pathkernel/trainer.h"

#include "pathkernel/batch_statistics.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>

#include "pathkernel/batch_statistics.h"
#include "pathkernel/dropout.h"
#include "pathkernel/error.h"
#include "pathkernel/loss.h"
#include "pathkernel/progress.h"
#include "pathkernel/text.h"

namespace pathkernel {

namespace {

constexpr const char* kScheduleHelp =
    "constant, step[:EVERY[:GAMMA]], cosine, linear, warmup[:STEPS]";

/// The numeric fields after a schedule's name ("step:50:0.5" -> {50, 0.5}).
std::vector<double> schedule_args(const std::string& schedule, const std::string& name, size_t max_args) {
  const std::vector<std::string> fields = split(schedule, ':');
  std::vector<double> args;
  for (size_t i = 1; i < fields.size(); ++i) {
    double v = 0;
    PK_CHECK(parse_number(fields[i], v) && std::isfinite(v),
             "bad schedule '" << schedule << "': '" << fields[i] << "' is not a number");
    args.push_back(v);
  }
  PK_CHECK(args.size() <= max_args, "bad schedule '" << schedule << "': " << name << " takes at most " << max_args
                                                     << " numbers, got " << args.size());
  return args;
}

bool has_name(const std::string& schedule, const std::string& name) {
  return schedule == name || schedule.rfind(name + ":", 0) == 0;
}

}  // namespace

std::vector<std::string> schedule_names() { return {"constant", "step", "cosine", "linear", "warmup"}; }

std::vector<double> learning_rate_schedule(const std::string& schedule, double lr, int64_t steps) {
  std::vector<double> rates(static_cast<size_t>(steps), lr);
  const double pi = std::acos(-1.0);
  if (has_name(schedule, "step")) {
    std::vector<double> a = schedule_args(schedule, "step", 2);
    const double every = a.size() > 0 ? a[0] : std::ceil(static_cast<double>(steps) / 3.0);
    const double gamma = a.size() > 1 ? a[1] : 0.1;
    PK_CHECK(every >= 1 && every == std::floor(every),
             "bad schedule '" << schedule << "': EVERY must be a whole number of steps >= 1 (got " << every << ")");
    PK_CHECK(gamma > 0 && gamma <= 1, "bad schedule '" << schedule << "': GAMMA must be in (0, 1] (got " << gamma << ")");
    for (int64_t s = 0; s < steps; ++s) {
      rates[s] = lr * std::pow(gamma, std::floor(static_cast<double>(s) / every));
    }
  } else if (has_name(schedule, "warmup")) {
    std::vector<double> a = schedule_args(schedule, "warmup", 1);
    const double warm = a.empty() ? std::max(1.0, std::floor(static_cast<double>(steps) / 10.0)) : a[0];
    PK_CHECK(warm >= 1 && warm == std::floor(warm),
             "bad schedule '" << schedule << "': STEPS must be a whole number >= 1 (got " << warm << ")");
    for (int64_t s = 0; s < steps; ++s) rates[s] = lr * std::min(1.0, static_cast<double>(s + 1) / warm);
  } else {
    PK_CHECK(schedule == "constant" || schedule == "cosine" || schedule == "linear",
             "unknown schedule '" << schedule << "': expected one of " << kScheduleHelp);
    for (int64_t s = 0; s < steps; ++s) {
      const double frac = static_cast<double>(s) / static_cast<double>(steps);
      if (schedule == "cosine") rates[s] = lr * 0.5 * (1 + std::cos(pi * frac));
      if (schedule == "linear") rates[s] = lr * (1 - frac);
    }
  }
  return rates;
}

TrainOptions TrainOptions::resolved() const {
  TrainOptions t = *this;
  t.optimizer = optimizer.resolved();
  if (t.batch == -1) t.batch = optimizer.traits().full_batch ? 0 : 100;
  if (t.steps == -1 && t.epochs == -1) t.epochs = 1;
  return t;
}

void TrainOptions::validate(int64_t num_train) const {
  const TrainOptions t = resolved();
  t.optimizer.validate();
  PK_CHECK(num_train >= 1, "training set is empty");
  PK_CHECK(t.batch >= 0, "batch size must be >= 1, or 0 for the full batch (got " << t.batch << ")");
  PK_CHECK(!(t.optimizer.traits().full_batch && t.batch != 0 && t.batch < num_train),
           "optimizer '" << t.optimizer.name << "' uses the full batch; got batch size " << t.batch << " of "
                         << num_train << " training points (use optimizer 'sgd' for minibatches)");
  PK_CHECK((t.steps == -1) != (t.epochs == -1), "give exactly one of a step count and an epoch count (got steps "
                                                    << t.steps << ", epochs " << t.epochs << "; -1 is unset)");
  if (t.steps != -1) PK_CHECK(t.steps >= 1, "the number of steps must be >= 1 (got " << t.steps << ")");
  if (t.epochs != -1) PK_CHECK(t.epochs >= 1, "the number of epochs must be >= 1 (got " << t.epochs << ")");
  PK_CHECK(t.divergence_factor > 1, "divergence factor must be > 1 (got " << t.divergence_factor << ")");
  learning_rate_schedule(t.schedule, t.optimizer.lr, 1);  // checks the name
  if (loss_weights.defined()) checked_loss_weights(loss_weights, num_train, "training");
}

int64_t TrainOptions::total_steps(int64_t num_train) const {
  const TrainOptions t = resolved();
  if (t.steps != -1) return t.steps;
  int64_t b = (t.batch == 0 || t.batch >= num_train) ? num_train : t.batch;
  int64_t per_epoch = (num_train + b - 1) / b;
  return mul_no_overflow(t.epochs, per_epoch, "steps (epochs x batches per epoch)");
}

BatchSampler::BatchSampler(int64_t num_train, int64_t batch, uint64_t seed)
    : num_train_(num_train), batch_(batch == 0 || batch >= num_train ? 0 : batch), seed_(seed) {
  steps_per_epoch_ = batch_ == 0 ? 1 : (num_train_ + batch_ - 1) / batch_;
}

torch::Tensor BatchSampler::batch(int64_t step) {
  if (batch_ == 0) return {};
  int64_t epoch = step / steps_per_epoch_;
  if (epoch != epoch_) {
    // One generator per epoch, seeded from (seed, epoch), so any step's batch
    // is a function of the seed alone.
    auto gen = at::detail::createCPUGenerator(seed_ * 1000003ull + static_cast<uint64_t>(epoch));
    permutation_ = torch::randperm(num_train_, gen, torch::kLong);
    epoch_ = epoch;
  }
  int64_t start = (step % steps_per_epoch_) * batch_;
  return permutation_.narrow(0, start, std::min(batch_, num_train_ - start));
}

StepResult take_step(Network& net, torch::optim::Optimizer& optimizer, const StepBatch& batch,
                     const std::function<bool(double)>& accept) {
  const DropoutStep dropout(net->options().seed, batch.step);  // the step's masks, for its update only
  StepResult r;
  for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
  torch::Tensor out = net->forward(batch.x);
  torch::Tensor loss = training_loss(out, batch.y, net->options().output, net->options().loss, batch.weights);
  if (batch.scale != 1) loss = loss * batch.scale;
  r.loss = loss.item<double>();
  r.correct = correct_predictions(out, batch.y);
  r.count = batch.y.size(0);
  if (accept && !accept(r.loss)) return r;
  loss.backward();
  if (batch.clip != 1) {
    // A recorded loop's clipping by norm: torch multiplies every gradient by the factor.
    for (auto& p : net->parameters()) {
      if (p.grad().defined()) p.mutable_grad().mul_(batch.clip);
    }
  }
  set_learning_rate(optimizer, batch.lr);
  optimizer.step();
  r.taken = true;
  return r;
}

namespace {

/// A split's inputs as the loop and the accuracy read them: `count` rows;
/// rows(index) those of `index` ([k] int64), every row for an undefined
/// index; range(first, n) rows first .. first+n-1.
struct InputRows {
  int64_t count = 0;
  std::function<torch::Tensor(const torch::Tensor& index)> rows;
  std::function<torch::Tensor(int64_t first, int64_t n)> range;
};

/// Accuracy of net on the rows of `inputs` against `y`, in chunks.
double accuracy_of_rows(Network& net, const InputRows& inputs, const torch::Tensor& y) {
  if (is_regression_target(y)) return std::numeric_limits<double>::quiet_NaN();  // no classes
  if (inputs.count == 0) return 0;
  torch::NoGradGuard guard;
  const RunningStatistics eval_mode(net);  // BatchNorm as at test time, its running statistics unmoved
  int64_t correct = 0;
  const int64_t chunk = 4096;
  for (int64_t i = 0; i < inputs.count; i += chunk) {
    int64_t n = std::min(chunk, inputs.count - i);
    correct += correct_predictions(net->forward(inputs.range(i, n)), y.narrow(0, i, n));
  }
  return static_cast<double>(correct) / static_cast<double>(inputs.count);
}

/// Rows of a split's inputs as held: read where they are when whole, decoded
/// as read when coded, the whole split decoded once for a full batch.
InputRows rows_of(const HeldInputs& split) {
  auto whole = std::make_shared<torch::Tensor>();
  return {split.count(),
          [split, whole](const torch::Tensor& index) {
            if (index.defined()) return split.rows(index);
            if (!whole->defined()) *whole = split.rows({});
            return *whole;
          },
          [split](int64_t first, int64_t n) { return split.range(first, n); }};
}

TrainSummary train_rows(Network& net, const InputRows& train_x, const torch::Tensor& y_train,
                        const InputRows& test_x, const torch::Tensor& y_test, const TrainOptions& given,
                        TrainingObserver& observer, const ResumePoint* resume) {
  const TrainOptions options = given.resolved();
  const int64_t m = train_x.count;
  options.validate(m);
  const int64_t steps = options.total_steps(m);
  std::vector<torch::Tensor> params = net->parameters();
  auto optimizer = make_optimizer(options.optimizer, params);
  std::vector<double> rates = learning_rate_schedule(options.schedule, options.optimizer.lr, steps);
  BatchSampler sampler(m, options.batch, options.seed);
  const torch::Tensor lw =
      options.loss_weights.defined() ? checked_loss_weights(options.loss_weights, m, "training") : torch::Tensor();

  auto t0 = std::chrono::steady_clock::now();
  double first_loss = std::nan(""), running_acc = 0, last_loss = 0;
  int64_t start = 0;
  if (resume != nullptr) {
    PK_CHECK(resume->step >= 0 && resume->step <= steps,
             "cannot resume at step " << resume->step << ": the run has " << steps << " steps");
    import_state(*optimizer, options.optimizer.name, params, resume->state);
    start = resume->step;
    first_loss = resume->first_loss;
    last_loss = resume->last_loss;
  } else {
    observer.on_start(net, *optimizer, rates);
  }
  ProgressBar bar(steps, "train", options.progress);
  if (start > 0) bar.update(start, "resumed");
  for (int64_t s = start; s < steps; ++s) {
    torch::Tensor idx = sampler.batch(s);
    torch::Tensor xb = train_x.rows(idx);
    torch::Tensor yb = idx.defined() ? y_train.index_select(0, idx) : y_train;
    torch::Tensor wb = lw.defined() ? (idx.defined() ? lw.index_select(0, idx) : lw) : torch::Tensor();
    auto accept = [&](double loss) {
      if (s == 0) first_loss = loss;
      return std::isfinite(loss) && loss <= options.divergence_factor * std::max(1.0, first_loss);
    };
    const StepResult r = take_step(net, *optimizer, {xb, yb, wb, s, rates[s]}, accept);
    if (!r.taken) {
      std::ostringstream msg;
      msg << "training diverged at step " << s << ": loss " << r.loss << " (first loss "
          << first_loss << ", limit " << options.divergence_factor << " x max(1, first loss))"
          << "; try a smaller learning rate (got " << options.optimizer.lr << ")";
      bar.finish("diverged");
      observer.on_stop(s, "diverged", msg.str(), net, *optimizer);
      throw Error(msg.str() + "; the run is kept, valid up to step " + std::to_string(s));
    }
    last_loss = r.loss;
    double batch_acc = static_cast<double>(r.correct) / static_cast<double>(r.count);
    running_acc = s == start ? batch_acc : 0.9 * running_acc + 0.1 * batch_acc;
    observer.on_step(s, idx, r, net, *optimizer);
    char status[96];
    std::snprintf(status, sizeof status, "loss %.4f acc %.3f", r.loss, running_acc);
    bar.update(s + 1, status);
  }
  TrainSummary summary;
  summary.steps = steps;
  summary.final_loss = last_loss;
  summary.train_accuracy = accuracy_of_rows(net, train_x, y_train);
  char status[96];
  if (test_x.count > 0) {
    summary.test_accuracy = accuracy_of_rows(net, test_x, y_test);
    std::snprintf(status, sizeof status, "loss %.4f train acc %.3f test acc %.3f", last_loss,
                  summary.train_accuracy, summary.test_accuracy);
  } else {
    summary.test_accuracy = std::numeric_limits<double>::quiet_NaN();
    std::snprintf(status, sizeof status, "loss %.4f train acc %.3f, no test points", last_loss,
                  summary.train_accuracy);
  }
  bar.finish(status);
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  observer.on_summary(summary);
  observer.on_stop(steps, "complete", "", net, *optimizer);
  return summary;
}

}  // namespace

double accuracy(Network& net, const torch::Tensor& x, const torch::Tensor& y) {
  return accuracy_of_rows(net, rows_of(HeldInputs(x, {})), y);
}

TrainSummary train(Network& net, const torch::Tensor& x_train, const torch::Tensor& y_train,
                   const torch::Tensor& x_test, const torch::Tensor& y_test,
                   const TrainOptions& options, TrainingObserver& observer, const ResumePoint* resume) {
  return train_rows(net, rows_of(HeldInputs(x_train, {})), y_train, rows_of(HeldInputs(x_test, {})), y_test, options,
                    observer, resume);
}

TrainSummary train(Network& net, const Dataset& data, const TrainOptions& options, TrainingObserver& observer,
                   const ResumePoint* resume) {
  return train_rows(net, rows_of(held_train_inputs(data)), data.y_train, rows_of(held_test_inputs(data)), data.y_test,
                    options, observer, resume);
}

}  // namespace pathkernel
