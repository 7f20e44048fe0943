// Tests of seeded dropout: the mask is a function of the run's seed, the
// step, the site and the example's input (not of its batch or its place in
// it); outside a training step the layer passes its input through; and a
// network with dropout trains, replays bit for bit, retrains to the same
// weights and decomposes exactly on both routes.
#include "pathkernel/dropout.h"

#include <gtest/gtest.h>

#include <string>

#include "pathkernel/decomposition.h"
#include "pathkernel/gram.h"
#include "pathkernel/path.h"
#include "pathkernel/retrain.h"
#include "pathkernel/run.h"
#include "pathkernel/segment.h"
#include "../evaluate/evaluate_util.h"
#include "../test_util.h"
#include "torchscript_util.h"

namespace {

using namespace pathkernel;
using pathkernel::testing::error_message;
using pathkernel::testing::final_checkpoint;
using pathkernel::testing::same_bits;
using pathkernel::testing::TempDir;
using pathkernel::testing::script::have_python_torch;
using pathkernel::testing::script::python;
using pathkernel::testing::script::reference_jacobian;
using pathkernel::testing::script::expect_both_routes_exact;
using pathkernel::testing::script::train_small_image_run;

torch::Tensor inputs() {
  torch::manual_seed(3);
  return torch::randn({6, 1, 4, 4}, torch::kFloat64);
}

torch::Tensor activations() { return torch::randn({6, 40}, torch::kFloat64); }

TEST(SeededDropout, PassesItsInputThroughOutsideATrainingStep) {
  const torch::Tensor x = inputs(), h = activations();
  EXPECT_TRUE(same_bits(seeded_dropout(h, 0.5, true, 0, x), h));  // no DropoutStep: eval mode
  const DropoutStep step(7, 3);
  EXPECT_TRUE(same_bits(seeded_dropout(h, 0.5, false, 0, x), h));  // the module's training flag is off
  EXPECT_TRUE(same_bits(seeded_dropout(h, 0.0, true, 0, x), h));
  EXPECT_FALSE(same_bits(seeded_dropout(h, 0.5, true, 0, x), h));
}

TEST(SeededDropout, DropsAboutPOfTheElementsAndScalesTheRest) {
  const DropoutStep step(7, 3);
  const torch::Tensor x = torch::arange(200, torch::kFloat64).view({200, 1});
  const torch::Tensor out = seeded_dropout(torch::ones({200, 500}, torch::kFloat64), 0.3, true, 0, x);
  const torch::Tensor kept = out.ne(0);
  // Every kept element is scaled by exactly 1 / (1 - p).
  EXPECT_TRUE(out.masked_select(kept).eq(1.0 / 0.7).all().item<bool>());
  // 100,000 draws: the dropped fraction's standard deviation is 0.0015.
  const double dropped = 1.0 - kept.to(torch::kFloat64).mean().item<double>();
  EXPECT_NEAR(dropped, 0.3, 0.01);
  // Rows and elements are not dropped alike.
  const torch::Tensor per_row = kept.to(torch::kFloat64).mean(1);
  EXPECT_GT((per_row.max() - per_row.min()).item<double>(), 0.0);
  EXPECT_FALSE(same_bits(kept.select(0, 0), kept.select(0, 1)));
}

TEST(SeededDropout, AnExamplesMaskIsItsOwnInAnyBatch) {
  const torch::Tensor x = inputs(), h = activations();
  const DropoutStep step(7, 3);
  const torch::Tensor batch = seeded_dropout(h, 0.5, true, 1, x);
  for (int64_t r = 0; r < x.size(0); ++r) {
    EXPECT_TRUE(same_bits(seeded_dropout(h.narrow(0, r, 1), 0.5, true, 1, x.narrow(0, r, 1)), batch.narrow(0, r, 1)))
        << "row " << r;
  }
  const torch::Tensor order = torch::tensor({4, 0, 5, 2, 1, 3}, torch::kLong);
  EXPECT_TRUE(same_bits(seeded_dropout(h.index_select(0, order), 0.5, true, 1, x.index_select(0, order)),
                        batch.index_select(0, order)));
  // A float32 copy of the data (a float32 run) draws the same masks.
  EXPECT_TRUE(same_bits(seeded_dropout(h, 0.5, true, 1, x.to(torch::kFloat32)), batch));
}

TEST(SeededDropout, TheSeedTheStepAndTheSiteEachChangeTheMask) {
  const torch::Tensor x = inputs(), h = activations();
  auto draw = [&](uint64_t seed, int64_t s, int64_t site) {
    const DropoutStep step(seed, s);
    return seeded_dropout(h, 0.5, true, site, x);
  };
  const torch::Tensor base = draw(7, 3, 0);
  EXPECT_TRUE(same_bits(draw(7, 3, 0), base));
  EXPECT_FALSE(same_bits(draw(8, 3, 0), base));
  EXPECT_FALSE(same_bits(draw(7, 4, 0), base));
  EXPECT_FALSE(same_bits(draw(7, 3, 1), base));
}

TEST(SeededDropout, AStepRestoresWhatWasBeforeIt) {
  const torch::Tensor x = inputs(), h = activations();
  torch::Tensor outer, inner_again;
  {
    const DropoutStep a(7, 3);
    outer = seeded_dropout(h, 0.5, true, 0, x);
    { const DropoutStep b(7, 9); }
    inner_again = seeded_dropout(h, 0.5, true, 0, x);
  }
  EXPECT_TRUE(same_bits(inner_again, outer));
  EXPECT_TRUE(same_bits(seeded_dropout(h, 0.5, true, 0, x), h));
}

TEST(SeededDropout, RefusesATensorWhoseFirstDimensionIsNotTheBatch) {
  const DropoutStep step(7, 3);
  const std::string message =
      error_message([&] { seeded_dropout(torch::ones({40, 6}, torch::kFloat64), 0.5, true, 2, inputs()); });
  EXPECT_CONTAINS(message, "dropout site 2");
  EXPECT_CONTAINS(message, "[40, 6]");
  EXPECT_CONTAINS(message, "first dimension");
  EXPECT_CONTAINS(error_message([&] { seeded_dropout(activations(), 1.5, true, 0, inputs()); }), "outside [0, 1]");
}

/// A network with dropout: the masks change training (the run differs from
/// the same network with p = 0), and training, replay, retraining and both
/// routes of the decomposition draw the same masks, so the path replays bit
/// for bit, retraining reproduces it, and the kernel machine is exact.
TEST(SeededDropout, ANetworkWithDropoutTrainsReplaysRetrainsAndDecomposesExactly) {
  TempDir dir("dropout"), plain("plain");
  const std::string model = "layers:conv(3,3,padding=1),relu,dropout(0.5),flatten,linear(8),relu,dropout(0.25)";
  train_small_image_run(dir, model);
  train_small_image_run(plain, "layers:conv(3,3,padding=1),relu,dropout(0),flatten,linear(8),relu,dropout(0)");
  EXPECT_FALSE(same_bits(final_checkpoint(dir.path() + "/run"), final_checkpoint(plain.path() + "/run")));

  PathReader reader(dir.path() + "/run");
  EXPECT_EQ(reader.check().mismatches, 0);
  EXPECT_TRUE(same_bits(Retrainer(reader).final_weights(RetrainJob{}, RemovalScaling::Reduced),
                        final_checkpoint(dir.path() + "/run")));

  expect_both_routes_exact(reader, reader.decoded_dataset().x_test.narrow(0, 0, 4));
}

/// A user's CNN with nn.Dropout after its pool and after its hidden layer's
/// ReLU is walked as a chain, the masks drawn by the walk on the training
/// side, and decomposes exactly, as the generic route does.
TEST(SeededDropout, AChainWithDropoutIsWalkedByHandAndDecomposesExactly) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  const std::string path = dir.path() + "/cnn.pt";
  python(dir, "import torch.nn.functional as F\n"
              "class M(nn.Module):\n"
              "    def __init__(self):\n"
              "        super().__init__()\n"
              "        self.conv = nn.Conv2d(1, 3, 3, padding=1)\n"
              "        self.fc = nn.Linear(12, 8)\n"
              "        self.out = nn.Linear(8, 3)\n"
              "        self.drop1 = nn.Dropout(0.25)\n"
              "        self.drop2 = nn.Dropout(0.5)\n"
              "    def forward(self, x):\n"
              "        h = self.drop1(F.max_pool2d(F.relu(self.conv(x)), 2)).flatten(1)\n"
              "        return self.out(self.drop2(F.relu(self.fc(h))))\n"
              "torch.manual_seed(1)\n"
              "torch.jit.script(M().double()).save('" + path + "')\n");
  train_small_image_run(dir, "torchscript:" + path);
  PathReader reader(dir.path() + "/run");
  DecompositionOptions d;
  EXPECT_EQ(engine_route(reader, d).reason, "");  // a chain
  expect_both_routes_exact(reader, reader.decoded_dataset().x_test.narrow(0, 0, 4));
}

/// The EPK's Gram matrix pairs each step's test feature with the training
/// point's Jacobian under that step's masks (per-example autograd inside a
/// DropoutStep); the DPK sees the network in eval mode.
TEST(SeededDropout, TheEpksTrainingSideHasTheStepsMasks) {
  TempDir dir;
  train_small_image_run(dir, "layers:flatten,linear(8),relu,dropout(0.5)");
  PathReader reader(dir.path() + "/run");
  Network net = engine_network(reader.manifest().network_options());
  const uint64_t seed = reader.manifest().init_seed;
  const torch::Tensor test = reader.decoded_dataset().x_test.narrow(0, 0, 2), train = reader.decoded_dataset().x_train.narrow(0, 0, 3);
  torch::Tensor epk = torch::zeros({2, 3, 3, 3}, torch::kFloat64), dpk = torch::zeros_like(epk),
                unmasked = torch::zeros_like(epk);
  reader.forward([&](const PathStep& st) {
    torch::Tensor jbar = torch::zeros({2, 3, st.w.size(0)}, torch::kFloat64);  // riemann:4 along the step
    for (double t : {0.0, 0.25, 0.5, 0.75}) jbar += reference_jacobian(net, st.w + t * st.delta, test) / 4;
    const torch::Tensor j_test = reference_jacobian(net, st.w, test), j_eval = reference_jacobian(net, st.w, train);
    torch::Tensor j_train;
    {
      const DropoutStep masks(seed, st.step);
      j_train = reference_jacobian(net, st.w, train);
    }
    epk += torch::einsum("akp,blp->abkl", {jbar, j_train});
    dpk += torch::einsum("akp,blp->abkl", {j_test, j_eval});
    unmasked += torch::einsum("akp,blp->abkl", {jbar, j_eval});
  });
  EXPECT_GT((epk - unmasked).abs().max().item<double>(), 1e-3 * epk.abs().max().item<double>());  // the masks matter
  GramOptions o;
  o.progress = false;
  o.kernel = GramSpec::parse("epk");
  o.quadrature.spec = QuadratureSpec::parse("riemann:4");
  const torch::Tensor got = gram(reader, test, true, train, false, o);
  EXPECT_LE((got - epk).abs().max().item<double>(), 1e-12 * epk.abs().max().item<double>());
  EXPECT_LE((gram(reader, train, false, test, true, o) - epk.permute({1, 0, 3, 2})).abs().max().item<double>(),
            1e-12 * epk.abs().max().item<double>());
  o.kernel = GramSpec::parse("dpk");
  EXPECT_LE((gram(reader, test, true, train, false, o) - dpk).abs().max().item<double>(),
            1e-12 * dpk.abs().max().item<double>());
}

/// nn.Dropout exported from Python in training mode is seeded; the dropouts
/// pathkernel does not seed are refused with the reason.
TEST(SeededDropout, TakesPytorchsDropoutAndRefusesItsVariants) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  const std::string ok = dir.path() + "/ok.pt", channels = dir.path() + "/channels.pt";
  python(dir, "class M(nn.Module):\n"
              "    def __init__(self, drop):\n"
              "        super().__init__()\n"
              "        self.fc = nn.Linear(16, 3)\n"
              "        self.drop = drop\n"
              "    def forward(self, x):\n"
              "        return self.fc(torch.flatten(self.drop(x), 1))\n"
              "torch.jit.script(M(nn.Dropout(0.5)).double()).save('" + ok + "')\n"
              "torch.jit.script(M(nn.Dropout2d(0.5)).double()).save('" + channels + "')\n");
  NetworkOptions o;
  o.spec = ModelSpec::parse("torchscript:" + ok);
  o.input_shape = {1, 4, 4};
  o.num_classes = 3;
  Network net = build_network(o);
  const torch::Tensor x = inputs();
  const torch::Tensor eval = net->forward(x);
  torch::Tensor train_a, train_b;
  {
    const DropoutStep step(7, 3);
    train_a = net->forward(x);
    train_b = net->forward(x.narrow(0, 2, 1));
  }
  // Up to the rounding of a one-row against a six-row matrix product, which
  // the BLAS may do differently; another mask would differ by O(1).
  const double scale = eval.abs().max().item<double>();
  EXPECT_GT((train_a - eval).abs().max().item<double>(), 1e-3 * scale);
  EXPECT_LE((train_b - train_a.narrow(0, 2, 1)).abs().max().item<double>(), 1e-12 * scale);
  EXPECT_LE((net->forward(x) - eval).abs().max().item<double>(), 1e-12 * scale);
  o.spec = ModelSpec::parse("torchscript:" + channels);
  const std::string message = error_message([&] { build_network(o); });
  EXPECT_CONTAINS(message, "'drop' (Dropout2d) is in training mode");
  EXPECT_CONTAINS(message, "nn.Dropout");
}

/// Randomness in a module's own code that pathkernel does not seed (channel
/// and alpha dropout called as functions, torch.randn_like) is refused at
/// load with the operation's name; a dropout whose training flag is off in
/// the exported module, or a constant False, passes and the module loads.
TEST(SeededDropout, RefusesRandomnessItCannotSeedUnlessItIsFixedOff) {
  REQUIRE_PYTHON_TORCH();
  TempDir dir;
  const std::string channels = dir.path() + "/channels.pt", channels_eval = dir.path() + "/channels_eval.pt",
                    alpha_off = dir.path() + "/alpha_off.pt", noise = dir.path() + "/noise.pt",
                    noise_eval = dir.path() + "/noise_eval.pt";
  python(dir, "import torch.nn.functional as F\n"
              "class Channels(nn.Module):\n"
              "    def __init__(self):\n"
              "        super().__init__()\n"
              "        self.fc = nn.Linear(16, 3)\n"
              "    def forward(self, x):\n"
              "        return self.fc(torch.flatten(F.dropout2d(x, 0.5, self.training), 1))\n"
              "class AlphaOff(nn.Module):\n"
              "    def __init__(self):\n"
              "        super().__init__()\n"
              "        self.fc = nn.Linear(16, 3)\n"
              "    def forward(self, x):\n"
              "        return self.fc(torch.flatten(F.alpha_dropout(x, 0.2, False), 1))\n"
              "class Noise(nn.Module):\n"
              "    def __init__(self):\n"
              "        super().__init__()\n"
              "        self.fc = nn.Linear(16, 3)\n"
              "    def forward(self, x):\n"
              "        return self.fc(torch.flatten(x + 0.01 * torch.randn_like(x), 1))\n"
              "torch.jit.script(Channels().double()).save('" + channels + "')\n"
              "torch.jit.script(Channels().double().eval()).save('" + channels_eval + "')\n"
              "torch.jit.script(AlphaOff().double()).save('" + alpha_off + "')\n"
              "torch.jit.script(Noise().double()).save('" + noise + "')\n"
              "torch.jit.script(Noise().double().eval()).save('" + noise_eval + "')\n");
  NetworkOptions o;
  o.input_shape = {1, 4, 4};
  o.num_classes = 3;
  auto refusal = [&](const std::string& file) {
    o.spec = ModelSpec::parse("torchscript:" + file);
    return error_message([&] { build_network(o); });
  };
  EXPECT_CONTAINS(refusal(channels), "draws random numbers with aten::feature_dropout");
  EXPECT_CONTAINS(refusal(channels), "pathkernel seeds aten::dropout only");
  EXPECT_CONTAINS(refusal(noise), "draws random numbers with aten::randn_like");
  EXPECT_CONTAINS(refusal(noise_eval), "draws random numbers with aten::randn_like");
  for (const std::string& file : {channels_eval, alpha_off}) {
    o.spec = ModelSpec::parse("torchscript:" + file);
    Network net = build_network(o);
    const torch::Tensor x = inputs();
    torch::Tensor in_step;
    {
      const DropoutStep step(7, 3);
      in_step = net->forward(x);
    }
    EXPECT_TRUE(torch::equal(in_step, net->forward(x))) << file << ": its dropout must pass its input through";
  }
}

}  // namespace
