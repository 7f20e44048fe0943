// Contributions by parameter tensor (layer_split.h, DecompositionOptions::
// by_layer): each tensor's slice against a per-example autograd reference
// restricted to that tensor, and the slices' sum against the contributions,
// on both walks, every route and the layer forms (Summed, Rows, Dense).
#include <gtest/gtest.h>

#include <filesystem>

#include "../test_util.h"
#include "pathkernel/decomposition.h"
#include "pathkernel/layer_split.h"
#include "pathkernel/loss.h"
#include "pathkernel/npy.h"
#include "pathkernel/update_rule.h"

namespace pathkernel {
namespace {

using testing::flat_grad;

/// Expects layer_contributions [n, M, K, L] to sum over L to contributions,
/// to 1e-12 of the largest contribution, and to be of the run's L tensors.
void expect_sums_to_contributions(const Decomposition& d, const Manifest& m) {
  ASSERT_TRUE(d.layer_contributions.defined());
  ASSERT_EQ(d.layer_contributions.dim(), 4);
  EXPECT_EQ(d.layer_contributions.size(3), static_cast<int64_t>(m.parameters.size()));
  EXPECT_EQ(d.layer_contributions.sizes().slice(0, 3), d.contributions.sizes());
  const double scale = d.contributions.abs().max().item<double>();
  EXPECT_GT(scale, 1e-8);
  EXPECT_LE((d.layer_contributions.sum(3) - d.contributions).abs().max().item<double>(), 1e-12 * scale);
}

// With dpk (J̄_s = J(w_s, x)) the reference is a per-sample gradient
// contracted with a per-example Jacobian, both by autograd, restricted to
// each tensor's entries of the flat vector; the buffers carried forward in
// time per training point (decomposition_test.cpp's reference).
TEST(LayerSplit, EachTensorMatchesAutogradRestrictedToIt) {
  for (const std::string opt : {"sgd", "momentum", "adam"}) {
    testing::TempDir dir(opt);
    RunOptions r = testing::small_run(dir / "run", opt, 5, 2);
    r.model = "mlp:5,4";
    train_run(r);
    PathReader reader(r.out);
    const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 2);
    DecompositionOptions options;
    options.progress = false;
    options.by_layer = true;
    options.quadrature.spec = QuadratureSpec::parse("dpk");
    const Decomposition d = decompose(reader, x, options);
    const Manifest& m = reader.manifest();
    SCOPED_TRACE(opt);
    expect_sums_to_contributions(d, m);

    const UpdateRule rule(m.optimizer);
    Network ref = build_network(m.network_options());
    const torch::Tensor& xt = reader.decoded_dataset().x_train;
    const torch::Tensor& yt = reader.decoded_dataset().y_train;
    const int64_t M = xt.size(0), P = m.parameter_count, L = static_cast<int64_t>(m.parameters.size());
    torch::Tensor buffers = torch::zeros({M, P}, torch::kFloat64);
    torch::Tensor expect = torch::zeros({2, M, 3, L}, torch::kFloat64);
    reader.forward([&](const PathStep& st) {
      const StepCoefficients c = rule.step(st.step, st.lr, st.w, st.state);
      torch::Tensor per_sample = torch::zeros({M, P}, torch::kFloat64);
      for (int64_t bi = 0; bi < st.batch.size(0); ++bi) {
        const int64_t i = st.batch[bi].item<int64_t>();
        per_sample[i] = flat_grad(ref, st.w, xt.narrow(0, i, 1), [&](const torch::Tensor& f) {
                          return training_loss(f, yt.narrow(0, i, 1), OutputMap::LogSoftmax);
                        }) / static_cast<double>(st.batch.size(0));
      }
      buffers = rule.beta() * buffers + c.gamma * per_sample;
      StepCoefficients no_rho = c;
      no_rho.rho = torch::Tensor();
      const torch::Tensor moves = UpdateRule::update(no_rho, per_sample, buffers);  // [M, P]
      for (int64_t n = 0; n < 2; ++n) {
        for (int64_t k = 0; k < 3; ++k) {
          const torch::Tensor j = flat_grad(ref, st.w, x.narrow(0, n, 1), [&](const torch::Tensor& f) { return f[0][k]; });
          for (int64_t t = 0; t < L; ++t) {
            const ParamInfo& p = m.parameters[static_cast<size_t>(t)];
            expect[n].select(1, k).select(1, t).add_(
                torch::matmul(moves.narrow(1, p.offset, p.numel), j.narrow(0, p.offset, p.numel)));
          }
        }
      }
    });
    const double scale = expect.abs().max().item<double>();
    EXPECT_GT(scale, 1e-4);
    for (int64_t t = 0; t < L; ++t) {
      const torch::Tensor got = d.layer_contributions.select(3, t), want = expect.select(3, t);
      EXPECT_GT(want.abs().max().item<double>(), 0) << m.parameters[static_cast<size_t>(t)].name;
      EXPECT_LE((got - want).abs().max().item<double>(), 1e-12 * scale) << m.parameters[static_cast<size_t>(t)].name;
    }
  }
}

// The certified quadrature, on both walks, for Linear layers (Summed and
// Rows forms) and convolutions (Dense), with weight decay: the slices sum
// to the contributions, and the contributions are those of a walk without
// the split, bit for bit.
TEST(LayerSplit, SumsToTheContributionsOnBothWalks) {
  struct Case {
    std::string optimizer, data, model;
  };
  for (const Case& c : {Case{"gd", "gaussians3", "mlp:5,4"}, Case{"sgd", "gaussians3", "mlp:5,4"},
                        Case{"adamw", "gaussians3", "mlp:6"},
                        Case{"sgd", "mnist", "cnn:2,3"}, Case{"nesterov", "mnist", "cnn:2,3"}}) {
    testing::TempDir dir(c.optimizer);
    RunOptions r = testing::small_run_of(dir / "run", c.optimizer, c.data, c.model, 4, 2, 10);
    r.train.optimizer.weight_decay = 1e-2;
    train_run(r);
    PathReader reader(r.out);
    const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 3);
    DecompositionOptions options;
    options.progress = false;
    const Decomposition plain = decompose(reader, x, options);
    options.by_layer = true;
    const Decomposition split = decompose(reader, x, options);
    SCOPED_TRACE(c.optimizer + " " + c.model);
    expect_sums_to_contributions(split, reader.manifest());
    EXPECT_TRUE(torch::equal(plain.contributions, split.contributions));
    EXPECT_FALSE(plain.layer_contributions.defined());
  }
}

/// Trains `model` with SGD on npy:DIR/data: token ids [30, 4] in [0, 10)
/// (integer codes) or images [30, 1, 4, 4], 3 classes; the run is DIR/run.
std::string train_npy_run(const testing::TempDir& dir, const std::string& model, bool tokens) {
  const std::string data = dir / "data";
  std::filesystem::create_directories(data);
  torch::manual_seed(5);
  auto x = [&](int64_t n) {
    return tokens ? torch::randint(0, 10, {n, 4}, torch::kLong) : torch::randn({n, 1, 4, 4}, torch::kFloat64);
  };
  write_npy(data + "/train_x.npy", x(30));
  write_npy(data + "/train_y.npy", torch::randint(0, 3, {30}, torch::kLong));
  write_npy(data + "/test_x.npy", x(6));
  write_npy(data + "/test_y.npy", torch::randint(0, 3, {6}, torch::kLong));
  RunOptions o;
  o.data.spec = "npy:" + data;
  o.model = model;
  o.train.optimizer.name = "sgd";
  o.train.optimizer.lr = 0.2;
  o.train.batch = 10;
  o.train.steps = 6;
  o.train.progress = false;
  o.checkpoint_every = 3;
  o.out = dir / "run";
  train_run(o);
  return o.out;
}

// A TorchScript module (a layers: network, which pathkernel compiles to
// one) on the structured route (its layers' weights and biases: a
// convolution, Linear layers, an embedding, a layer norm) and on the generic
// route (one flat vector cut at the layout's tensors): both sum to their
// contributions, the two splits agree, and every tensor carries a part.
TEST(LayerSplit, StructuredAndGenericRoutesAgree) {
  struct Case {
    std::string model;
    bool tokens;
  };
  for (const Case& c : {Case{"layers:conv(3,3,padding=1),relu,flatten,linear(5),tanh,layernorm", false},
                        Case{"layers:embed(10,3),flatten,linear(5),relu", true}}) {
    testing::TempDir dir("routes");
    PathReader reader(train_npy_run(dir, c.model, c.tokens));
    const torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 2);
    DecompositionOptions options;
    options.progress = false;
    options.by_layer = true;
    SCOPED_TRACE(c.model);
    ASSERT_EQ(engine_route(reader, options).route, "structured") << engine_route(reader, options).reason;
    const Decomposition structured = decompose(reader, x, options);
    options.quadrature.route = ModuleRoute::Generic;
    const Decomposition generic = decompose(reader, x, options);
    expect_sums_to_contributions(structured, reader.manifest());
    expect_sums_to_contributions(generic, reader.manifest());
    const double scale = structured.contributions.abs().max().item<double>();
    EXPECT_LE((structured.layer_contributions - generic.layer_contributions).abs().max().item<double>(),
              1e-12 * scale);
    for (int64_t t = 0; t < structured.layer_contributions.size(3); ++t) {
      EXPECT_GT(structured.layer_contributions.select(3, t).abs().max().item<double>(), 0)
          << reader.manifest().parameters[static_cast<size_t>(t)].name;
    }
  }
}

// A layer whose parameters lie outside the layout is an error, not a slice lost.
TEST(LayerSplit, PiecesCoverTheLayerOrSayWhy) {
  ParamLayer p;
  p.weight_offset = 0;
  p.weight_numel = 6;
  p.bias_offset = 6;
  p.bias_numel = 2;
  const std::vector<ParamInfo> layout{{"a.weight", {2, 3}, 0, 6}, {"a.bias", {2}, 6, 2}};
  const std::vector<TensorPiece> pieces = layer_pieces(p, layout);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[1].tensor, 1);
  EXPECT_EQ(pieces[1].start, 6);
  EXPECT_EQ(pieces[1].offset, 6);
  p.bias_numel = 3;
  EXPECT_CONTAINS(testing::error_message([&] { layer_pieces(p, layout); }), "lie outside the network's parameter tensors");
}

}  // namespace
}  // namespace pathkernel
