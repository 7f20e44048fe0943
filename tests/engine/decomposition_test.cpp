// The decomposition for optimizers with a buffer or a metric (momentum,
// Nesterov, Adam, AdamW, RMSprop, Adagrad), computed by reverse accumulation,
// against a brute-force forward-in-time computation that keeps one buffer per
// training point.
#include <gtest/gtest.h>

#include "../test_util.h"
#include "pathkernel/blas_kernels.h"
#include "pathkernel/blas_switch.h"
#include "pathkernel/context.h"
#include "pathkernel/decomposition.h"
#include "pathkernel/loss.h"
#include "pathkernel/update_rule.h"

namespace pathkernel {
namespace {

using testing::flat_grad;

/// A run of `optimizer` (as testing::name_optimizer takes it) with weight
/// decay and a changing rate.
RunOptions buffered_run(const std::string& dir, const std::string& optimizer, int64_t steps) {
  RunOptions r = testing::small_run(dir, optimizer, steps, 3);
  r.train.optimizer.weight_decay = 1e-2;
  r.train.optimizer.dampening = optimizer == "momentum" ? 0.2 : 0.0;
  r.train.optimizer.alpha = 0.9;
  r.train.optimizer.lr_decay = 0.1;
  r.train.optimizer.initial_accumulator_value = 0.05;
  r.train.schedule = "cosine";
  return r;
}

/// The optimizers walked in reverse: a buffer (momentum, nesterov, adam,
/// adamw, rmsprop with momentum), a metric (adam, adamw, rmsprop, adagrad).
const char* const kBuffered[] = {"momentum", "nesterov",         "adam",    "adamw", "rmsprop", "rmsprop-centered",
                                 "rmsprop-centered-momentum", "adagrad"};

// With dpk (J̄_s = J(w_s, x)) both sides use the same test features, so this
// checks the accumulation itself: per-sample buffers walked forward in time
// (M x P memory, fine at this size) against the reverse accumulators.
TEST(ReverseAccumulation, EqualsPerSampleBuffersForwardInTime) {
  for (const std::string opt : kBuffered) {
    testing::TempDir dir(opt);
    RunOptions r = buffered_run(dir / "run", opt, 7);
    train_run(r);
    PathReader reader(r.out);
    const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 2);
    DecompositionOptions options;
    options.progress = false;
    options.quadrature.spec = QuadratureSpec::parse("dpk");
    Decomposition d = decompose(reader, x, options);

    const Manifest& m = reader.manifest();
    const UpdateRule rule(m.optimizer);
    Network ref = build_network(m.network_options());
    const torch::Tensor& xt = reader.decoded_dataset().x_train;
    const torch::Tensor& yt = reader.decoded_dataset().y_train;
    const int64_t M = xt.size(0), P = m.parameter_count;
    torch::Tensor buffers = torch::zeros({M, P}, torch::kFloat64), reg_buffer = torch::zeros({P}, torch::kFloat64);
    torch::Tensor expect = torch::zeros({2, M, 3}, torch::kFloat64), expect_reg = torch::zeros({2, 3}, torch::kFloat64);
    reader.forward([&](const PathStep& st) {
      const StepCoefficients c = rule.step(st.step, st.lr, st.w, st.state);
      torch::Tensor per_sample = torch::zeros({M, P}, torch::kFloat64);  // d_{i,s}
      for (int64_t bi = 0; bi < st.batch.size(0); ++bi) {
        const int64_t i = st.batch[bi].item<int64_t>();
        per_sample[i] = flat_grad(ref, st.w, xt.narrow(0, i, 1), [&](const torch::Tensor& f) {
                          return training_loss(f, yt.narrow(0, i, 1), OutputMap::LogSoftmax);
                        }) / static_cast<double>(st.batch.size(0));
      }
      const torch::Tensor reg = rule.coupled_decay() * st.w;
      // b_s = β b_{s−1} + γ_s Q_s d_s, each training point's share kept apart
      const torch::Tensor q = c.buffer_metric.defined() ? c.buffer_metric : torch::ones({P}, torch::kFloat64);
      buffers = rule.beta() * buffers + c.gamma * per_sample * q;
      reg_buffer = rule.beta() * reg_buffer + c.gamma * reg * q;
      StepCoefficients no_rho = c;
      no_rho.rho = torch::Tensor();
      torch::Tensor moves = UpdateRule::update(no_rho, per_sample, buffers);  // [M, P]: each point's share of Δw_s
      torch::Tensor reg_move = UpdateRule::update(c, reg, reg_buffer);
      for (int64_t n = 0; n < 2; ++n) {
        for (int64_t k = 0; k < 3; ++k) {
          torch::Tensor j = flat_grad(ref, st.w, x.narrow(0, n, 1), [&](const torch::Tensor& f) { return f[0][k]; });
          expect.select(0, n).select(1, k).add_(torch::matmul(moves, j));
          expect_reg[n][k] += j.dot(reg_move).item<double>();
        }
      }
    });
    const double scale = expect.abs().max().item<double>();
    EXPECT_GT(scale, 1e-4) << opt;
    EXPECT_LE((d.contributions - expect).abs().max().item<double>(), 1e-12 * scale) << opt;
    EXPECT_GT(expect_reg.abs().max().item<double>(), 1e-8) << opt;
    EXPECT_LE((d.regularization - expect_reg).abs().max().item<double>(), 1e-12 * scale) << opt;
  }
}

// Completeness with the certified quadrature, for every optimizer with a
// buffer, under weight decay and a changing learning rate.
TEST(ReverseAccumulation, CompletenessHoldsToMachinePrecision) {
  for (const std::string opt : kBuffered) {
    testing::TempDir dir(opt);
    RunOptions r = buffered_run(dir / "run", opt, 10);
    train_run(r);
    PathReader reader(r.out);
    DecompositionOptions options;
    options.progress = false;
    torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 6);
    Decomposition d = decompose(reader, x, options);
    const double rel = ((d.prediction() - d.fN).abs() / d.fN.abs().clamp_min(1)).max().item<double>();
    const double completeness = d.completeness_gap().abs().max().item<double>();
    EXPECT_LE(rel, 1e-12) << opt;
    EXPECT_LE(completeness, 1e-12) << opt;
    EXPECT_LE(d.rounding.abs().max().item<double>(), 1e-13) << opt;
    EXPECT_GT(d.regularization.abs().max().item<double>(), 1e-8) << opt;
    EXPECT_GT((d.fN - d.f0).abs().max().item<double>(), 1e-2) << opt;
  }
}

// For sgd the reverse route and the forward route are independent
// computations of the same decomposition.
TEST(ReverseAccumulation, AgreesWithTheForwardRouteOnSgd) {
  testing::TempDir dir;
  RunOptions r = buffered_run(dir / "run", "sgd", 8);
  train_run(r);
  PathReader reader(r.out);
  torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 4);
  DecompositionOptions options;
  options.progress = false;
  Decomposition fwd = decompose(reader, x, options);
  options.reverse = true;
  Decomposition rev = decompose(reader, x, options);
  const double scale = fwd.contributions.abs().max().item<double>();
  EXPECT_GT(scale, 1e-4);
  EXPECT_LE((fwd.contributions - rev.contributions).abs().max().item<double>(), 1e-13 * scale);
  EXPECT_LE((fwd.regularization - rev.regularization).abs().max().item<double>(), 1e-13 * scale);
  EXPECT_LE((fwd.rounding - rev.rounding).abs().max().item<double>(), 1e-14);
}

// The replay's own signals (PathReader::set_capture, with the per-sample
// gradients formed where the steps are replayed) against signals
// recomputed by a separate pass of every batch through the engine's network:
// two independent sources of the same per-sample gradients, for both routes,
// an MLP under full-batch GD and a CNN (max-pools) under momentum.
TEST(ReplaySignals, AgreeWithRecomputedSignals) {
  struct Case {
    std::string optimizer, data, model;
    int64_t train;
  };
  for (const Case& c : {Case{"gd", "gaussians3", "mlp:6", 60}, Case{"sgd", "gaussians3", "mlp:5,4", 60},
                        Case{"momentum", "mnist", "cnn:2,3", 40}}) {
    testing::TempDir dir(c.optimizer);
    RunOptions r = buffered_run(dir / "run", c.optimizer, 5);
    r.data.spec = c.data;
    r.data.train_size = c.train;
    r.model = c.model;
    train_run(r);
    PathReader reader(r.out);
    torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 2);
    DecompositionOptions options;
    options.progress = false;
    options.quadrature.spec = QuadratureSpec::parse("riemann:3");
    Decomposition replayed = decompose(reader, x, options);
    options.replay_signals = false;
    Decomposition recomputed = decompose(reader, x, options);
    const double scale = recomputed.contributions.abs().max().item<double>();
    SCOPED_TRACE(c.optimizer + " " + c.model);
    EXPECT_GT(scale, 1e-6);
    EXPECT_LE((replayed.contributions - recomputed.contributions).abs().max().item<double>(), 1e-12 * scale);
    EXPECT_LE((replayed.regularization - recomputed.regularization).abs().max().item<double>(), 1e-12 * scale);
    EXPECT_LE((replayed.rounding - recomputed.rounding).abs().max().item<double>(), 1e-13);
    // The reader is left as it was found: no capture.
    reader.forward([](const PathStep& st) { EXPECT_TRUE(st.layer_inputs.empty() && st.layer_gradients.empty()); });
  }
}

// The forward walk contracts a network with factored features (Linear
// layers on flat rows) against as many training rows at once as the memory
// budget allows: the whole batch, or chunks of train_chunk when the budget
// is tiny. Either way every row gets the same contributions. Rows whose
// signals are recomputed (not the replay's) are contracted in the chunks
// of train_chunk rows their sum G_s was formed from, kept for the step.
TEST(TrainingChunks, AnyChunkingOfTheBatchGivesTheSameDecomposition) {
  for (const std::string optimizer : {"gd", "sgd"}) {
    testing::TempDir dir(optimizer);
    RunOptions r = testing::small_run(dir / "run", optimizer, 4, 2);
    r.model = "mlp:6,5";
    r.train.batch = optimizer == "sgd" ? 25 : 0;
    train_run(r);
    PathReader reader(r.out);
    const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 3);
    std::vector<Decomposition> walked;  // with the replay's signals, then with recomputed ones
    for (const bool replay_signals : {true, false}) {
      DecompositionOptions options;
      options.progress = false;
      options.point_block = 1;
      options.train_chunk = 7;
      options.replay_signals = replay_signals;
      const Decomposition whole = decompose(reader, x, options);  // the budget holds every row: one chunk
      options.memory_doubles = 1;                                   // chunks of 7 rows
      const Decomposition chunked = decompose(reader, x, options);
      const double scale = whole.contributions.abs().max().item<double>();
      SCOPED_TRACE(optimizer + (replay_signals ? " replayed" : " recomputed"));
      EXPECT_GT(scale, 1e-6);
      EXPECT_LE((whole.contributions - chunked.contributions).abs().max().item<double>(), 1e-13 * scale);
      EXPECT_LE((whole.rounding - chunked.rounding).abs().max().item<double>(), 1e-13);
      EXPECT_LT(summarize(whole).max_rel_error, 1e-12);
      EXPECT_LT(summarize(chunked).max_rel_error, 1e-12);
      walked.push_back(chunked);
    }
    // Recomputed, G_s is the sum of the signals the contractions take: the
    // rounding term E (the recorded update against −η G_s) is the replay's.
    const double scale = walked[0].contributions.abs().max().item<double>();
    EXPECT_LE((walked[0].contributions - walked[1].contributions).abs().max().item<double>(), 1e-13 * scale);
    EXPECT_LE((walked[0].rounding - walked[1].rounding).abs().max().item<double>(), 1e-13);
  }
}

// A step's training rows, with their per-sample convolution gradients, are
// formed once and kept across the step's blocks of test points. Kept (the
// default budget) or formed for every block (a budget of nothing), every
// block gets the same contributions: for the replay's signals and for
// recomputed ones, walking forward (sgd) and in reverse (momentum), with the
// batch in several chunks of rows.
TEST(TrainingChunks, RowsKeptAcrossBlocksOfTestPointsGiveTheSameDecomposition) {
  for (const std::string optimizer : {"sgd", "momentum"}) {
    testing::TempDir dir(optimizer);
    RunOptions r = testing::small_run(dir / "run", optimizer, 3, 3);
    r.data.spec = "mnist";
    r.data.train_size = 40;
    r.model = "cnn:2,3";
    train_run(r);
    PathReader reader(r.out);
    const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 2);
    for (const bool replay_signals : {true, false}) {
      DecompositionOptions options;
      options.progress = false;
      options.quadrature.spec = QuadratureSpec::parse("riemann:3");
      options.replay_signals = replay_signals;
      options.point_block = 1;  // two blocks a step
      options.train_chunk = 7;  // the batch of 16 in chunks of 7, 7 and 2
      const Decomposition kept = decompose(reader, x, options);
      options.memory_doubles = 1;  // nothing kept: one point per walk, rows formed for each
      const Decomposition formed = decompose(reader, x, options);
      const double scale = formed.contributions.abs().max().item<double>();
      SCOPED_TRACE(optimizer + (replay_signals ? " replayed" : " recomputed"));
      EXPECT_GT(scale, 1e-6);
      EXPECT_LE((kept.contributions - formed.contributions).abs().max().item<double>(), 1e-13 * scale);
      EXPECT_LE((kept.rounding - formed.rounding).abs().max().item<double>(), 1e-13);
    }
  }
}

// With several threads both walks give each test point a group of its own
// (src/engine/point_groups.h): the threads take the points in turn, each
// forming a point's features and contracting them with the training rows on
// its own thread (the reverse walk updating the point's accumulator too),
// and the rows a step forms are shared between the groups. With 3 threads
// the decomposition is that of one thread, and so are the per-step
// observations, which arrive once per group: for the replay's signals and
// recomputed ones, on an MLP with weight decay (with the kernel output for
// gd and sgd) and on a CNN whose rows carry per-sample gradients, forward
// (gd, sgd) and reverse (momentum, adam). Without an
// observer, the groups of every block are taken in one turn, with the same
// bits; and 2 threads make the same groups as 3, so the same bits too.
TEST(PointGroups, GiveTheDecompositionOfOneThread) {
  struct Case {
    std::string optimizer, data, model;
  };
  for (const Case& c : {Case{"gd", "gaussians3", "mlp:6,5"}, Case{"sgd", "gaussians3", "mlp:6,5"},
                        Case{"sgd", "mnist", "cnn:2,3"}, Case{"momentum", "gaussians3", "mlp:6,5"},
                        Case{"adam", "mnist", "cnn:2,3"}}) {
    testing::TempDir dir(c.optimizer);
    RunOptions r = testing::small_run_of(dir / "run", c.optimizer, c.data, c.model, 4, 2, 40);
    r.train.optimizer.weight_decay = 1e-2;
    train_run(r);
    PathReader reader(r.out);
    // A CNN's points are groups of one; an MLP's factored features, at least
    // two groups a block of up to 16 points each (kFactoredGroupPoints):
    // blocks of 34 and 3 make three and two.
    const bool mlp = c.model[0] == 'm';
    const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, mlp ? 37 : 11);
    const int64_t M = reader.manifest().num_train, K = reader.manifest().num_classes;
    for (const bool replay_signals : {true, false}) {
      DecompositionOptions options;
      options.progress = false;
      options.point_block = mlp ? 34 : 5;
      options.train_chunk = 7;
      options.replay_signals = replay_signals;
      options.kernel = c.data == "gaussians3" && (c.optimizer == "gd" || c.optimizer == "sgd");
      struct Walked {
        Decomposition d;
        torch::Tensor observed;  // the observations' contributions, summed over steps
        int64_t calls = 0;
      };
      auto walk = [&](int threads, bool observe = true) {
        ThreadScope scope(threads);
        Walked w;
        w.observed = torch::zeros({x.size(0), M, K}, torch::kFloat64);
        DecompositionOptions o = options;
        // Replayed in turn: with a replay on one thread allowed, gd and sgd
        // take their blocks of steps on threads instead (step_range_test.cpp).
        o.replay_ahead = false;
        if (observe) o.on_step = [&](const StepObservation& ob) {
          ++w.calls;
          EXPECT_EQ(ob.x->size(0), ob.contributions.size(0));
          EXPECT_TRUE(torch::equal(*ob.x, x.narrow(0, ob.first_point, ob.x->size(0))));
          w.observed.narrow(0, ob.first_point, ob.contributions.size(0))
              .index_add_(1, ob.train_index, ob.contributions);
        };
        w.d = decompose(reader, x, o);
        return w;
      };
      const Walked one = walk(1), groups = walk(3), unobserved = walk(3, false), two = walk(2, false);
      SCOPED_TRACE(c.optimizer + " " + c.model + (replay_signals ? " replayed" : " recomputed"));
      EXPECT_EQ(one.calls, 4 * (mlp ? 2 : 3));             // steps x blocks (34, 3 or 5, 5, 1 points)
      EXPECT_EQ(groups.calls, 4 * (mlp ? 3 + 2 : 5 + 5 + 1));  // steps x groups of the blocks
      const double scale = one.d.contributions.abs().max().item<double>();
      EXPECT_GT(scale, 1e-6);
      auto close = [](const torch::Tensor& got, const torch::Tensor& expect, double scale, const char* what) {
        ASSERT_EQ(got.sizes(), expect.sizes()) << what;
        EXPECT_LE((got - expect).abs().max().item<double>(), 1e-12 * std::max(1.0, scale)) << what;
      };
      close(groups.d.contributions, one.d.contributions, scale, "contributions");
      close(groups.d.rounding, one.d.rounding, 1, "rounding");
      close(groups.d.regularization, one.d.regularization, 1, "regularization");
      close(groups.d.f0, one.d.f0, 1, "f0");
      close(groups.d.fN, one.d.fN, 1, "fN");
      if (options.kernel) close(groups.d.kernel, one.d.kernel, one.d.kernel.abs().max().item<double>(), "kernel");
      close(groups.observed, one.d.contributions, scale, "observed contributions");
      close(one.observed, one.d.contributions, scale, "observed contributions, one thread");
      EXPECT_LT(summarize(groups.d).max_rel_error, 1e-12);
      // Without an observer the threads take the groups of all blocks in
      // turn (not one block's at a time): the same groups, each one-threaded
      // (the last block's one point too), so the same bits.
      EXPECT_EQ(unobserved.calls, 0);
      EXPECT_EQ(unobserved.d.step_threads, 1);
      EXPECT_TRUE(torch::equal(unobserved.d.contributions, groups.d.contributions));
      EXPECT_TRUE(torch::equal(unobserved.d.rounding, groups.d.rounding));
      EXPECT_TRUE(torch::equal(unobserved.d.regularization, groups.d.regularization));
      EXPECT_TRUE(torch::equal(unobserved.d.gap_abs, groups.d.gap_abs));
      if (options.kernel) EXPECT_TRUE(torch::equal(unobserved.d.kernel, groups.d.kernel));
      EXPECT_EQ(unobserved.d.evaluations, groups.d.evaluations);
      EXPECT_EQ(unobserved.d.forward_evaluations, groups.d.forward_evaluations);
      EXPECT_EQ(unobserved.d.moment_evaluations, groups.d.moment_evaluations);
      EXPECT_EQ(unobserved.d.kinks, groups.d.kinks);
      EXPECT_EQ(unobserved.d.kinks_by_site, groups.d.kinks_by_site);
      EXPECT_EQ(one.d.kinks_by_site, groups.d.kinks_by_site);
      // Every kink is counted at its site, and a CNN's are found past its first layer too.
      int64_t by_site = 0, past_first = 0;
      for (size_t i = 0; i < one.d.kinks_by_site.size(); ++i) {
        by_site += one.d.kinks_by_site[i];
        if (i >= QuadratureCounts::kKinkKinds) past_first += one.d.kinks_by_site[i];
      }
      EXPECT_EQ(by_site, one.d.kinks);
      if (!mlp) EXPECT_GT(past_first, 0);
      EXPECT_EQ(unobserved.d.certificate_max_gap, groups.d.certificate_max_gap);
      EXPECT_TRUE(torch::equal(two.d.contributions, unobserved.d.contributions));
      EXPECT_TRUE(torch::equal(two.d.rounding, unobserved.d.rounding));
    }
  }
}

// With two threads the reverse walk forms step s−1's training side (the
// batch's signals, per-sample gradients and c_s G_s) on a task of its own,
// by a second evaluator, while it works on step s's test points
// (DecompositionOptions::training_ahead): the decomposition is the one
// formed in turn, contributions by layer included, for recomputed and
// replayed signals, on a CNN (per-sample gradients kept for two steps at
// once) and an MLP. Breaking the step the task evaluates at (the test
// side's evaluator, a step later) fails it. With one point (fewer groups
// than threads) every other step's test features are formed ahead as well:
// evaluating those at the step after fails it.
TEST(TrainingAhead, GivesTheDecompositionFormedInTurn) {
  struct Case {
    std::string optimizer, data, model;
  };
  for (const Case& c : {Case{"adam", "mnist", "cnn:2,3"}, Case{"momentum", "gaussians3", "mlp:6,5"}}) {
    testing::TempDir dir(c.optimizer);
    RunOptions r = testing::small_run_of(dir / "run", c.optimizer, c.data, c.model, 5, 2, 10);
    train_run(r);
    PathReader reader(r.out);
    // One point, fewer than the threads: every other step's test features
    // are formed ahead too.
    for (const std::pair<int64_t, bool>& run : std::vector<std::pair<int64_t, bool>>{{3, true}, {3, false}, {1, true}, {1, false}}) {
      const int64_t points = run.first;
      const bool replay_signals = run.second;
      const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, points);
      auto walk = [&](bool ahead) {
        ThreadScope scope(2);
        DecompositionOptions o;
        o.progress = false;
        o.train_chunk = 7;
        o.by_layer = true;
        o.replay_signals = replay_signals;
        o.training_ahead = ahead;
        return decompose(reader, x, o);
      };
      const Decomposition in_turn = walk(false), ahead = walk(true);
      SCOPED_TRACE(c.optimizer + " " + c.model + (replay_signals ? " replayed" : " recomputed") + ", " +
                   std::to_string(points) + " points");
      const double scale = std::max(1.0, in_turn.contributions.abs().max().item<double>());
      EXPECT_GT(in_turn.contributions.abs().max().item<double>(), 1e-6);
      EXPECT_LE((ahead.contributions - in_turn.contributions).abs().max().item<double>(), 1e-12 * scale);
      EXPECT_LE((ahead.layer_contributions - in_turn.layer_contributions).abs().max().item<double>(), 1e-12 * scale);
      EXPECT_LE((ahead.rounding - in_turn.rounding).abs().max().item<double>(), 1e-12);
      EXPECT_LE((ahead.regularization - in_turn.regularization).abs().max().item<double>(), 1e-12);
      EXPECT_EQ(ahead.evaluations, in_turn.evaluations);
      EXPECT_LT(summarize(ahead).max_rel_error, 1e-12);
    }
  }
}

/// A small float32 run of `opt`, trained into `dir`/run.
RunOptions float32_run(const testing::TempDir& dir, const std::string& opt) {
  RunOptions r = testing::small_run(dir / "run", opt, 40, 10);
  r.model = "mlp:16:tanh";
  r.data.dtype = torch::kFloat32;
  train_run(r);
  return r;
}

// A float32 run is decomposed against the float64 network at its float32
// weights and inputs (exactly representable in float64): f(w_0), f(w_N) and
// the rounding term are float64, so the kernel machine matches that network
// to float64 precision, for a forward walk (sgd) and a reverse one
// (momentum). f(w_N) is checked against a float64 network built here, and
// the float32 network's own output is reported beside it.
TEST(Float32Runs, DecomposeToFloat64Precision) {
  for (const std::string opt : {"sgd", "momentum"}) {
    testing::TempDir dir(opt);
    const RunOptions r = float32_run(dir, opt);
    PathReader reader(r.out);
    ASSERT_EQ(reader.manifest().dtype, "float32");
    const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 5);
    ASSERT_EQ(x.scalar_type(), torch::kFloat32);
    DecompositionOptions options;
    options.progress = false;
    Decomposition d = decompose(reader, x, options);

    NetworkOptions o64 = reader.manifest().network_options();
    o64.dtype = torch::kFloat64;
    Network net64 = build_network(o64);
    const torch::Tensor wN = reader.checkpoint(reader.manifest().checkpoints.size() - 1);
    torch::Tensor f64, f32;
    {
      torch::NoGradGuard guard;
      set_flat_parameters(net64, wN);
      f64 = net64->forward(x.to(torch::kFloat64));
      Network net32 = build_network(reader.manifest().network_options());
      set_flat_parameters(net32, wN.to(torch::kFloat32));
      f32 = net32->forward(x).to(torch::kFloat64);
    }
    SCOPED_TRACE(opt);
    EXPECT_TRUE(torch::equal(d.fN, f64)) << "f(w_N) is the float64 network at the float32 weights";
    EXPECT_TRUE(torch::equal(d.fN_run, f32)) << "fN_run is the float32 network's own output";
    const double dtype_diff = (d.fN_run - d.fN).abs().max().item<double>();
    EXPECT_GT(dtype_diff, 0) << "float32 rounding shows in the float32 network's output";
    EXPECT_LT(dtype_diff, 1e-4);
    const double rel = ((d.prediction() - d.fN).abs() / d.fN.abs().clamp_min(1)).max().item<double>();
    EXPECT_LE(rel, 1e-12);
    EXPECT_LE(d.completeness_gap().sub(d.rounding).abs().max().item<double>(), 1e-12);
    // E holds the float32 rounding of the recorded updates: far above float64's.
    EXPECT_GT(d.rounding.abs().max().item<double>(), 1e-12);
  }
}

// A float32 run trained on OpenBLAS's oldest kernels: its reader mixes the
// widest float64 kernels in (blas_switch.h), the replay still reproduces
// every checkpoint bit for bit (decompose checks each) and the walks, forward
// and reverse, are exact; a float64 run's reader ends the mix.
TEST(Float32Runs, ReplayTheRunsKernelsBesideTheWidestFloat64Ones) {
  const std::string start = active_blas_kernels();
  const std::string wider = wider_blas_kernels("Prescott", CpuFeatures::current());
  if (start.empty() || wider.empty() || !switch_blas_kernels("Prescott")) {
    GTEST_SKIP() << "OpenBLAS does not switch its kernels here, or this CPU runs none wider than Prescott";
  }
  struct Restore {
    std::string kernels;
    ~Restore() { switch_blas_kernels(kernels); }
  } restore{start};
  for (const std::string opt : {"sgd", "adam"}) {
    SCOPED_TRACE(opt);
    testing::TempDir dir(opt);
    PathReader reader(float32_run(dir, opt).out);
    ASSERT_EQ(reader.manifest().environment.blas_kernels, "Prescott");
    EXPECT_EQ(mixed_float64_kernels(), wider);
    EXPECT_EQ(active_blas_kernels(), "Prescott");
    const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 5);
    DecompositionOptions options;
    options.progress = false;
    const Decomposition d = decompose(reader, x, options);
    EXPECT_LE(summarize(d).max_rel_error, 1e-12);
    EXPECT_LE(d.completeness_gap().sub(d.rounding).abs().max().item<double>(), 1e-12);
  }
  testing::TempDir dir("float64");
  RunOptions r = testing::small_run(dir / "run", "sgd", 40, 10);
  train_run(r);
  PathReader reader(r.out);  // trained after the mix: on Prescott's float64 kernels, as it records
  EXPECT_EQ(mixed_float64_kernels(), "");
  EXPECT_EQ(active_blas_kernels(), "Prescott");
  DecompositionOptions options;
  options.progress = false;
  const Decomposition d = decompose(reader, reader.decoded_dataset().x_test.narrow(0, 0, 5), options);
  EXPECT_LE(summarize(d).max_rel_error, 1e-12);
}

// summarize() against explicit loops over a hand-made decomposition.
TEST(Summarize, MatchesExplicitLoops) {
  Decomposition d;
  d.f0 = torch::tensor({{0.5, -2.0}, {0.0, 3.0}}, torch::kFloat64);
  d.fN = torch::tensor({{0.25, -4.0}, {0.5, 2.0}}, torch::kFloat64);
  // Offsets that are powers of two, so that fN_run − fN is exact.
  d.fN_run = d.fN + torch::tensor({{std::ldexp(1.0, -22), 0.0}, {0.0, -std::ldexp(1.0, -21)}}, torch::kFloat64);
  d.contributions = torch::zeros({2, 3, 2}, torch::kFloat64);
  d.contributions[0][1][1] = -1.5;
  d.contributions[1][2][0] = 0.5;
  d.contributions[1][0][1] = -1.0;
  d.regularization = torch::tensor({{-0.25, 0.0}, {0.0, 0.0}}, torch::kFloat64);
  d.rounding = torch::tensor({{0.0, -0.5}, {0.0, 1e-3}}, torch::kFloat64);
  d.steps = 4;
  d.evaluations = 24;
  d.forward_evaluations = 8;
  d.kinks = 2;
  d.kinks_by_site = {0, 0, 1, 1, 0, 0};  // one closed-form kink after layer 0, one ReLU flip after layer 1
  d.certificate_max_gap = 1e-15;
  d.gap_abs = torch::tensor({{9e-14, 2e-14}, {3e-14, 8e-14}}, torch::kFloat64);
  double max_abs = 0, max_rel = 0, completeness = 0, worst_bound = 0, bound = 0;
  int64_t worst = -1;
  for (int n = 0; n < 2; ++n) {
    for (int k = 0; k < 2; ++k) {
      double c = 0;
      for (int i = 0; i < 3; ++i) c += d.contributions[n][i][k].item<double>();
      const double f0 = d.f0[n][k].item<double>(), fN = d.fN[n][k].item<double>();
      const double r = d.regularization[n][k].item<double>(), e = d.rounding[n][k].item<double>();
      const double err = std::abs(f0 + c + r + e - fN);
      max_abs = std::max(max_abs, err);
      if (err / std::max(1.0, std::abs(fN)) > max_rel) worst = n;
      max_rel = std::max(max_rel, err / std::max(1.0, std::abs(fN)));
      completeness = std::max(completeness, std::abs(fN - f0 - c - r));
      bound = std::max(bound, d.gap_abs[n][k].item<double>() / std::max(1.0, std::abs(fN)));
    }
  }
  for (int k = 0; k < 2; ++k) {
    const double fN = d.fN[worst][k].item<double>();
    worst_bound = std::max(worst_bound, d.gap_abs[worst][k].item<double>() / std::max(1.0, std::abs(fN)));
  }
  const DecompositionSummary s = summarize(d);
  EXPECT_EQ(s.test_points, 2);
  EXPECT_EQ(s.steps, 4);
  EXPECT_DOUBLE_EQ(s.max_abs_error, max_abs);
  EXPECT_DOUBLE_EQ(s.max_rel_error, max_rel);
  EXPECT_EQ(s.worst_point, worst);
  EXPECT_EQ(worst, 1);  // its second output's 1e-3 is the only error
  EXPECT_DOUBLE_EQ(s.error_bound, bound);
  EXPECT_DOUBLE_EQ(s.worst_point_error_bound, worst_bound);
  EXPECT_LT(s.worst_point_error_bound, s.error_bound);
  EXPECT_DOUBLE_EQ(s.completeness_error, completeness);
  EXPECT_DOUBLE_EQ(s.max_abs_rounding, 0.5);
  EXPECT_DOUBLE_EQ(s.max_abs_regularization, 0.25);
  EXPECT_DOUBLE_EQ(s.mean_evaluations_per_step, 3.0);
  EXPECT_DOUBLE_EQ(s.mean_forward_evaluations_per_step, 1.0);
  EXPECT_DOUBLE_EQ(s.mean_kinks_per_step, 0.25);
  EXPECT_EQ(s.mean_kinks_per_step_by_site, (std::vector<double>{0, 0, 0.125, 0.125, 0, 0}));
  EXPECT_EQ(s.max_abs_run_dtype_difference, std::ldexp(1.0, -21));
  EXPECT_EQ(s.certificate_max_gap, 1e-15);
  EXPECT_CONTAINS(testing::error_message([&] { relative_error(d.f0, d.contributions); }), "differ in shape");
}

// Both walks say where their time went: each part measured, none more than
// the threads could have spent in the walk's wall time.
TEST(TimeSplit, AccountsForBothWalksWithinTheirThreadsTime) {
  for (const std::string opt : {"sgd", "adam"}) {
    testing::TempDir dir(opt);
    RunOptions r = buffered_run(dir / "run", opt, 5);
    train_run(r);
    PathReader reader(r.out);
    DecompositionOptions options;
    options.progress = false;
    const Decomposition d = decompose(reader, reader.decoded_dataset().x_test.narrow(0, 0, 3), options);
    const TimeSplit& t = d.time_split;
    EXPECT_GT(t.test_features, 0) << opt;
    EXPECT_GT(t.training_signals, 0) << opt;
    EXPECT_GT(t.contraction, 0) << opt;
    EXPECT_GE(t.replay, 0) << opt;
    const double parts = t.test_features + t.training_signals + t.contraction + t.replay;
    EXPECT_LE(parts, std::max(1, current_threads()) * d.seconds + 1e-3) << opt;
    EXPECT_EQ(summarize(d).time_split.test_features, t.test_features) << opt;
  }
}

TEST(ReverseAccumulation, RefusesTheKernelOutput) {
  testing::TempDir dir;
  RunOptions r = buffered_run(dir / "run", "momentum", 3);
  train_run(r);
  PathReader reader(r.out);
  DecompositionOptions options;
  options.progress = false;
  options.kernel = true;
  EXPECT_CONTAINS(testing::error_message([&] { decompose(reader, reader.decoded_dataset().x_test.narrow(0, 0, 1), options); }),
                  "kernel output is built for gd and sgd");
}

// verify's cancellation: the terms' magnitudes summed over max(1, |f(w_N)|),
// at the largest output, and the worst point's own.
TEST(Summary, CancellationIsTheTermsMagnitudesOverTheOutput) {
  Decomposition d;
  d.f0 = torch::tensor({{0.5, -2.0}, {1.0, 0.0}}, torch::kFloat64);                   // [n = 2, K = 2]
  d.contributions = torch::tensor({{{3.0, 1.0}, {-2.5, -1.0}, {0.0, 0.5}},            // [n, M = 3, K]
                                   {{100.0, 0.0}, {-100.0, 0.0}, {0.25, 0.0}}},
                                  torch::kFloat64);
  d.regularization = torch::tensor({{0.0, 0.25}, {0.0, 0.0}}, torch::kFloat64);
  d.rounding = torch::tensor({{1e-16, 0.0}, {0.0, 0.0}}, torch::kFloat64);
  d.fN = d.f0 + d.contributions.sum(1) + d.regularization + d.rounding;              // [[1, -1.25], [1.25, 0]]
  const DecompositionSummary s = summarize(d);
  // Point 1, output 0: (1 + 100 + 100 + 0.25) / 1.25.
  EXPECT_DOUBLE_EQ(s.cancellation, 201.25 / 1.25);
  // Both points' errors are 0; the first is named, its larger output (0.5 + 3 + 2.5) / 1.
  ASSERT_EQ(s.worst_point, 0);
  EXPECT_DOUBLE_EQ(s.worst_point_cancellation, 6.0);
  // Nothing cancels: each output is its terms' sum, the ratio 1 where |f| >= 1.
  d.contributions = d.contributions.abs();
  d.f0 = d.f0.abs();
  d.regularization = d.regularization.abs();
  d.fN = d.f0 + d.contributions.sum(1) + d.regularization + d.rounding;
  EXPECT_DOUBLE_EQ(summarize(d).cancellation, 1.0);
}

}  // namespace
}  // namespace pathkernel
