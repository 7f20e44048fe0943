// The attribution methods against slow references written here: per-point
// autograd gradients dotted along the replayed path, at the checkpoints and
// at the final weights; and the exact contributions' completeness.
#include "pathkernel/attribution_methods.h"

#include "evaluate_util.h"
#include "pathkernel/loss.h"
#include "pathkernel/model.h"

using namespace pathkernel;
using namespace pathkernel::testing;

namespace {

struct Fixture {
  TempDir dir;
  std::unique_ptr<PathReader> reader;
  torch::Tensor x, output;
  AttributionOptions options;
  Fixture() {
    SmallData(30).write(dir / "data");
    cli_train(dir / "data", dir / "run",
              "--model mlp:6 --seed 3 --steps 25 --optimizer sgd --batch 8 --lr 0.1 --checkpoint-every 5");
    reader = std::make_unique<PathReader>(dir / "run");
    x = reader->decoded_dataset().x_test;
    output = reader->outputs(reader->steps(), x).argmax(1);
    output[0] = (output[0] + 1) % 3;  // not only predicted classes
    options.progress = false;
    options.train_chunk = 7;  // several chunks
  }
  /// −weight ∇f_{output}(w, x)·∇ℓ_i(w) for every test row and training point, by autograd: [n, M].
  torch::Tensor dot_reference(const torch::Tensor& w, double weight, const torch::Tensor& points) {
    const Manifest& m = reader->manifest();
    Network net = build_network(m.network_options());
    const torch::Tensor& xt = reader->decoded_dataset().x_train;
    const torch::Tensor& yt = reader->decoded_dataset().y_train;
    torch::Tensor ref = torch::zeros({x.size(0), m.num_train}, torch::kFloat64);
    for (int64_t t = 0; t < x.size(0); ++t) {
      const int64_t k = output[t].item<int64_t>();
      const torch::Tensor jt = flat_grad(net, w, x.narrow(0, t, 1), [&](const torch::Tensor& f) { return f[0][k]; });
      for (int64_t i : std::vector<int64_t>(points.data_ptr<int64_t>(), points.data_ptr<int64_t>() + points.numel())) {
        const torch::Tensor gi = flat_grad(net, w, xt.narrow(0, i, 1), [&](const torch::Tensor& f) {
          return training_loss(f, yt.narrow(0, i, 1), m.network_options().output, m.network_options().loss);
        });
        ref[t][i] -= weight * jt.dot(gi).item<double>();
      }
    }
    return ref;
  }
};

double max_rel(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max()).item<double>();
}

}  // namespace

// dpk for SGD is TracIn at every step: −Σ_{s: i∈B_s} (η_s/|B_s|) ∇f(w_s, x)·∇ℓ_i(w_s).
TEST(AttributionMethods, DpkIsTracInAtEveryStep) {
  Fixture fx;
  torch::Tensor ref = torch::zeros({fx.x.size(0), 30}, torch::kFloat64);
  fx.reader->forward([&](const PathStep& st) {
    ref += fx.dot_reference(st.w, st.lr / static_cast<double>(st.batch.size(0)), st.batch);
  });
  const torch::Tensor dpk = attribution_scores(*fx.reader, "dpk", fx.x, fx.output, fx.options);
  EXPECT_LT(max_rel(dpk, ref), 1e-12);
}

// tracin-cp: the checkpoints 0, 5, ..., 20, each weighted by its interval's Σ η_s / M.
TEST(AttributionMethods, TracInCpDotsGradientsAtTheStoredCheckpoints) {
  Fixture fx;
  const Manifest& m = fx.reader->manifest();
  ASSERT_EQ(m.checkpoints.size(), 6u);
  const torch::Tensor all = torch::arange(30, torch::kLong);
  torch::Tensor ref = torch::zeros({fx.x.size(0), 30}, torch::kFloat64);
  for (size_t k = 0; k + 1 < m.checkpoints.size(); ++k) {
    ref += fx.dot_reference(fx.reader->checkpoint(k), 5 * 0.1 / 30, all);
  }
  EXPECT_LT(max_rel(attribution_scores(*fx.reader, "tracin-cp", fx.x, fx.output, fx.options), ref), 1e-12);
  const torch::Tensor grad_dot_ref = fx.dot_reference(fx.reader->checkpoint(5), 25 * 0.1 / 30, all);
  EXPECT_LT(max_rel(attribution_scores(*fx.reader, "grad-dot", fx.x, fx.output, fx.options), grad_dot_ref), 1e-12);
}

// epk's scores are the exact contributions: over all training points they
// sum to f(w_N, x) − f(w_0, x) of the chosen output (no weight decay here).
TEST(AttributionMethods, EpkScoresSumToTheOutputsChange) {
  Fixture fx;
  const torch::Tensor epk = attribution_scores(*fx.reader, "epk", fx.x, fx.output, fx.options);
  const torch::Tensor change = (fx.reader->outputs(25, fx.x) - fx.reader->outputs(0, fx.x))
                                   .gather(1, fx.output.view({-1, 1}))
                                   .squeeze(1);
  EXPECT_LT((epk.sum(1) - change).abs().max().item<double>(), 1e-12);
  // Saved progress does not change the bits.
  AttributionOptions with_progress = fx.options;
  with_progress.progress_dir = fx.dir / "progress";
  with_progress.checkpoint_seconds = 0;
  EXPECT_TRUE(same_bits(attribution_scores(*fx.reader, "epk", fx.x, fx.output, with_progress), epk));
}

TEST(AttributionMethods, RandomIsSeededAndNamesAreChecked) {
  Fixture fx;
  const torch::Tensor a = attribution_scores(*fx.reader, "random", fx.x, fx.output, fx.options);
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{9, 30}));
  EXPECT_TRUE(same_bits(a, attribution_scores(*fx.reader, "random", fx.x, fx.output, fx.options)));
  AttributionOptions other = fx.options;
  other.seed = 1;
  EXPECT_FALSE(same_bits(a, attribution_scores(*fx.reader, "random", fx.x, fx.output, other)));
  EXPECT_CONTAINS(error_message([&] { attribution_scores(*fx.reader, "influence", fx.x, fx.output, fx.options); }),
                  "unknown attribution method 'influence': expected one of epk, dpk, tracin-cp, grad-dot, metagradient, random");
  EXPECT_CONTAINS(error_message([&] {
                    attribution_scores(*fx.reader, "epk", fx.x, torch::full({9}, 3, torch::kLong), fx.options);
                  }),
                  "outputs must lie in [0, 3)");
}
