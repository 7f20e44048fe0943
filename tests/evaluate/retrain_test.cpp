// Counterfactual retraining against independent routes: a `train` run on the
// data set with the point deleted, the recorded run itself, a hand-written
// SGD loop, and a point whose gradient is exactly zero.
#include "pathkernel/retrain.h"

#include <cmath>

#include "evaluate_util.h"
#include "pathkernel/decomposition.h"
#include "pathkernel/loss.h"
#include "pathkernel/model.h"

using namespace pathkernel;
using namespace pathkernel::testing;

namespace {

const char* kModel = "--model mlp:6 --seed 3 --steps 25";

}  // namespace

// Full-batch optimizers: removing i from every batch is training on the data
// set without i, with the same batch membership (all the rest). The
// retraining must give the CLI's final weights bit for bit.
TEST(Retrain, LeaveOneOutEqualsTrainingWithThePointDeleted) {
  TempDir dir;
  const SmallData data(21);
  data.write(dir / "data");
  for (const std::string optimizer : {"gd --lr 0.2", "momentum --batch 0 --lr 0.05 --weight-decay 0.01",
                                      "adam --batch 0 --lr 0.01"}) {
    SCOPED_TRACE(optimizer);
    const std::string run = dir / "run";
    cli_train(dir / "data", run, std::string(kModel) + " --optimizer " + optimizer + " --force");
    PathReader reader(run);
    const Retrainer retrainer(reader);
    for (int64_t i : {0, 7, 20}) {
      const std::string deleted_data = dir / ("data_without_" + std::to_string(i));
      const std::string deleted_run = dir / ("run_without_" + std::to_string(i));
      data.write(deleted_data, {i});
      cli_train(deleted_data, deleted_run, std::string(kModel) + " --optimizer " + optimizer + " --force");
      const torch::Tensor w = retrainer.final_weights(removal_job(21, torch::tensor({i})), RemovalScaling::Reduced);
      EXPECT_TRUE(same_bits(w, final_checkpoint(deleted_run))) << "removed point " << i;
      EXPECT_FALSE(same_bits(w, final_checkpoint(run))) << "removing point " << i << " changed nothing";
    }
  }
}

// Removing nothing reproduces the recorded run (trained on one thread) bit
// for bit, with minibatches read from its batch log.
TEST(Retrain, RemovingNothingReproducesTheRecordedRun) {
  TempDir dir;
  SmallData(30).write(dir / "data");
  cli_train(dir / "data", dir / "run", std::string(kModel) + " --optimizer sgd --batch 8 --lr 0.1");
  PathReader reader(dir / "run");
  const Retrainer retrainer(reader);
  EXPECT_TRUE(same_bits(retrainer.final_weights(RetrainJob{}, RemovalScaling::Reduced), final_checkpoint(dir / "run")));
  EXPECT_TRUE(same_bits(retrainer.final_weights(removal_job(30, torch::zeros({0}, torch::kLong)),
                                                RemovalScaling::Kept),
                        final_checkpoint(dir / "run")));
}

// Minibatch SGD without point i, against SGD written out by hand: batches
// from the batch log minus i, the batch's mean loss (or, kept, the sum over
// the original batch size), w <- w - lr * autograd gradient.
TEST(Retrain, MinibatchLeaveOneOutMatchesAHandWrittenSgdLoop) {
  TempDir dir;
  SmallData(30).write(dir / "data");
  cli_train(dir / "data", dir / "run", std::string(kModel) + " --optimizer sgd --batch 8 --lr 0.1");
  PathReader reader(dir / "run");
  const Retrainer retrainer(reader);
  const Manifest& m = reader.manifest();
  const torch::Tensor& x = reader.decoded_dataset().x_train;
  const torch::Tensor& y = reader.decoded_dataset().y_train;
  Network net = build_network(m.network_options());
  for (RemovalScaling scaling : {RemovalScaling::Reduced, RemovalScaling::Kept}) {
    for (int64_t removed : {3, 29}) {
      torch::Tensor w = reader.checkpoint(0);
      int64_t batches_with_it = 0;
      for (int64_t s = 0; s < m.steps; ++s) {
        const torch::Tensor b = reader.batch(s);
        const torch::Tensor left = b.masked_select(b.ne(removed));
        batches_with_it += left.size(0) < b.size(0);
        const double weight = scaling == RemovalScaling::Kept ? static_cast<double>(left.size(0)) / b.size(0) : 1.0;
        const torch::Tensor g = flat_grad(net, w, x.index_select(0, left), [&](const torch::Tensor& out) {
          return training_loss(out, y.index_select(0, left), m.network_options().output, m.network_options().loss) *
                 weight;
        });
        w = w - m.learning_rates[s] * g;
      }
      ASSERT_GT(batches_with_it, 0) << "point " << removed << " was never in a batch";
      const torch::Tensor r = retrainer.final_weights(removal_job(30, torch::tensor({removed})), scaling);
      EXPECT_LT((r - w).abs().max().item<double>(), 1e-12)
          << "point " << removed << ", " << removal_scaling_name(scaling);
    }
  }
}

// A point whose loss gradient is exactly zero at every step (its margin is
// so large that softmax puts all of 1.0 on its label) contributes nothing:
// C_i = 0 exactly. Removing it with the other points' weights kept changes
// nothing beyond rounding; with the batch mean reduced to the remaining
// points, every other gradient is scaled by M/(M-1), which does change the path.
TEST(Retrain, RemovingAPointWithZeroContributionsChangesNothing) {
  TempDir dir;
  SmallData data(12);
  const int64_t far = 11;
  data.write(dir / "data");
  cli_train(dir / "data", dir / "probe", std::string(kModel) + " --optimizer gd --lr 0.2");
  {
    // Put point `far` far out along a direction and label it with the class
    // the initial network gives it there.
    PathReader probe(dir / "probe");
    const torch::Tensor directions =
        1e5 * torch::tensor({{1.0, 0.5, -0.25, 2.0}, {-1.0, 2.0, 1.0, -0.5}, {0.3, -1.0, 2.0, 1.0}, {2.0, 2.0, 2.0, 2.0}});
    const torch::Tensor f = probe.outputs(0, directions);
    const auto [top2, unused] = f.topk(2, 1);
    const int64_t pick = (top2.select(1, 0) - top2.select(1, 1)).argmax().item<int64_t>();
    ASSERT_GT((top2[pick][0] - top2[pick][1]).item<double>(), 1e4) << "no direction with a large margin";
    data.x_train[far] = directions[pick];
    data.y_train[far] = f[pick].argmax().item<int64_t>();
  }
  data.write(dir / "data");
  cli_train(dir / "data", dir / "run", std::string(kModel) + " --optimizer gd --lr 0.2 --force");
  PathReader reader(dir / "run");
  const Manifest& m = reader.manifest();
  // The precondition: its log-softmax is 0 at its label and below -800 (so
  // exp gives 0) elsewhere, at every step.
  const int64_t label = data.y_train[far].item<int64_t>();
  Network net = build_network(m.network_options());
  reader.forward([&](const PathStep& st) {
    torch::NoGradGuard no_grad;
    set_flat_parameters(net, st.w);
    torch::Tensor f = net->forward(reader.decoded_dataset().x_train.narrow(0, far, 1))[0];
    EXPECT_EQ(f[label].item<double>(), 0.0) << "step " << st.step;
    f[label] = -1e9;
    EXPECT_LT(f.max().item<double>(), -800.0) << "step " << st.step;
  });
  ASSERT_FALSE(HasFailure()) << "point " << far << " does not have a zero gradient at every step";
  DecompositionOptions d;
  d.progress = false;
  const Decomposition dec = decompose(reader, reader.decoded_dataset().x_test, d);
  EXPECT_EQ(dec.contributions.select(1, far).abs().max().item<double>(), 0.0);
  EXPECT_GT(dec.contributions.abs().max().item<double>(), 1e-3);

  const Retrainer retrainer(reader);
  const torch::Tensor w = final_checkpoint(dir / "run");
  const torch::Tensor kept = retrainer.final_weights(removal_job(12, torch::tensor({far})), RemovalScaling::Kept);
  const torch::Tensor reduced =
      retrainer.final_weights(removal_job(12, torch::tensor({far})), RemovalScaling::Reduced);
  const double scale = w.abs().max().item<double>();
  EXPECT_LT((kept - w).abs().max().item<double>(), 1e-13 * scale);
  EXPECT_GT((reduced - w).abs().max().item<double>(), 1e-4 * scale);
}

// Retraining in parallel gives the bits of retraining one at a time; saved
// work is reused by a rerun of the same jobs and ignored by other jobs.
TEST(Retrain, ParallelRetrainingIsDeterministicAndResumes) {
  TempDir dir;
  SmallData(30).write(dir / "data");
  cli_train(dir / "data", dir / "run", std::string(kModel) + " --optimizer sgd --batch 8 --lr 0.1");
  PathReader reader(dir / "run");
  const Retrainer retrainer(reader);
  std::vector<RetrainJob> jobs;
  for (int64_t i = 0; i < 6; ++i) jobs.push_back(removal_job(30, torch::tensor({i, i + 10})));
  const torch::Tensor x = reader.decoded_dataset().x_test;
  RetrainOptions one;
  one.workers = 1;
  one.progress = false;
  RetrainOptions two = one;
  two.workers = 2;
  const torch::Tensor a = retrainer.outputs(jobs, x, one);
  EXPECT_TRUE(same_bits(a, retrainer.outputs(jobs, x, two)));
  // Each job's outputs are its final weights' outputs.
  const torch::Tensor w3 = retrainer.final_weights(jobs[3], RemovalScaling::Reduced);
  Network net = build_network(reader.manifest().network_options());
  set_flat_parameters(net, w3);
  EXPECT_TRUE(same_bits(a[3], net->forward(x).detach()));

  two.work_file = dir / "work/loo";
  retrainer.outputs(jobs, x, two);
  // Marked values in the saved work come back: the rerun did not retrain.
  torch::Tensor saved = read_npy(dir / "work/loo.npy");
  saved[2].fill_(42.0);
  write_npy(dir / "work/loo.npy", saved);
  EXPECT_EQ(retrainer.outputs(jobs, x, two)[2].max().item<double>(), 42.0);
  // Other jobs: the saved work is not theirs.
  jobs.pop_back();
  EXPECT_TRUE(same_bits(retrainer.outputs(jobs, x, two), a.narrow(0, 0, 5)));
}

TEST(Retrain, BadJobsAreRefused) {
  TempDir dir;
  SmallData(12).write(dir / "data");
  cli_train(dir / "data", dir / "run", std::string(kModel) + " --optimizer gd --lr 0.2");
  PathReader reader(dir / "run");
  const Retrainer retrainer(reader);
  EXPECT_CONTAINS(error_message([&] { removal_job(12, torch::tensor({12})); }), "must lie in [0, 12) (got 12 .. 12)");
  RetrainJob bad;
  bad.keep = torch::ones({5}, torch::kBool);
  EXPECT_CONTAINS(error_message([&] { retrainer.final_weights(bad, RemovalScaling::Reduced); }), "bool mask [12]");
  RetrainJob labels;
  labels.labels = torch::full({12}, 3, torch::kLong);
  EXPECT_CONTAINS(error_message([&] { retrainer.final_weights(labels, RemovalScaling::Reduced); }),
                  "labels must lie in [0, 3)");
  EXPECT_CONTAINS(error_message([] { parse_removal_scaling("half"); }), "expected reduced or kept");
}

// A linear model f = W x + b with squared loss under gd is a linear
// recurrence: with x̃ = [x, 1], Θ = [W b] and c = 2η/(K M'),
// Θ_{s+1} = Θ_s A + c Tᵀ X̃ with A = I − c X̃ᵀX̃, so
// Θ_N = Θ_0 Aᴺ + c Tᵀ X̃ (c X̃ᵀX̃)⁻¹ (I − Aᴺ). Leaving point i out is the
// same with its row deleted (M' = M − 1). The retraining must match it.
TEST(Retrain, LeaveOneOutOnALinearModelWithSquaredLossMatchesItsClosedForm) {
  if (std::system("/usr/bin/python3 -c 'import torch' > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "Debian's python3-torch is not installed (make deps installs it)";
  }
  TempDir dir;
  const int64_t M = 15, d = 3, K = 2, N = 40;
  const double lr = 0.05;
  auto gen = at::detail::createCPUGenerator(11);
  const torch::Tensor x = torch::randn({M, d}, gen, torch::kFloat64);
  const torch::Tensor t = torch::randn({M, K}, gen, torch::kFloat64);
  std::filesystem::create_directories(dir / "data");
  write_npy(dir / "data/train_x.npy", x);
  write_npy(dir / "data/train_y.npy", t);
  write_npy(dir / "data/test_x.npy", x.narrow(0, 0, 4).contiguous());
  write_npy(dir / "data/test_y.npy", t.narrow(0, 0, 4).contiguous());
  const std::string script = dir.write(
      "linear.py", "import torch\ntorch.manual_seed(0)\nm = torch.nn.Linear(3, 2).double()\n"
                   "torch.jit.script(m).save('" + (dir / "linear.pt") + "')\n");
  const CommandOutput py = run_shell("/usr/bin/python3 " + script);
  ASSERT_EQ(py.status, 0) << py.out;
  cli_train(dir / "data", dir / "run",
            "--model torchscript:" + (dir / "linear.pt") + " --loss mse --output logits --optimizer gd --lr 0.05 "
            "--steps 40");
  PathReader reader(dir / "run");
  const Retrainer retrainer(reader);
  const torch::Tensor w0 = reader.checkpoint(0);  // [W (K x d, row-major), b (K)]
  const torch::Tensor theta0 = torch::cat({w0.narrow(0, 0, K * d).view({K, d}), w0.narrow(0, K * d, K).view({K, 1})}, 1);
  auto closed_form = [&](const torch::Tensor& rows) {
    const torch::Tensor xt = torch::cat({x.index_select(0, rows), torch::ones({rows.size(0), 1}, torch::kFloat64)}, 1);
    const torch::Tensor tt = t.index_select(0, rows);
    const double c = 2 * lr / static_cast<double>(K * rows.size(0));
    const torch::Tensor g = c * xt.t().matmul(xt);
    const torch::Tensor eye = torch::eye(d + 1, torch::kFloat64);
    const torch::Tensor an = torch::matrix_power(eye - g, N);
    const torch::Tensor theta = theta0.matmul(an) + c * tt.t().matmul(xt).matmul(torch::inverse(g)).matmul(eye - an);
    return torch::cat({theta.narrow(1, 0, d).reshape({-1}), theta.select(1, d)});
  };
  const torch::Tensor all = torch::arange(M, torch::kLong);
  const double scale = final_checkpoint(dir / "run").abs().max().item<double>();
  EXPECT_LT((closed_form(all) - final_checkpoint(dir / "run")).abs().max().item<double>(), 1e-12 * scale);
  for (int64_t i : {0, 6, 14}) {
    const torch::Tensor w = retrainer.final_weights(removal_job(M, torch::tensor({i})), RemovalScaling::Reduced);
    const torch::Tensor ref = closed_form(all.masked_select(all.ne(i)));
    EXPECT_LT((w - ref).abs().max().item<double>(), 1e-12 * scale) << "removed point " << i;
    EXPECT_GT((w - final_checkpoint(dir / "run")).abs().max().item<double>(), 1e-6 * scale) << "removed point " << i;
  }
}
