// Gram matrices against per-sample autograd Jacobians, their symmetry and
// positive semi-definiteness, and their errors.
#include <gtest/gtest.h>

#include "../test_util.h"
#include "pathkernel/gram.h"

namespace pathkernel {
namespace {

using testing::flat_grad;

/// J(w, x) [K, P] for one input, by autograd.
torch::Tensor jacobian(Network& net, const torch::Tensor& w, const torch::Tensor& x, int64_t K) {
  std::vector<torch::Tensor> rows;
  for (int64_t k = 0; k < K; ++k) rows.push_back(flat_grad(net, w, x.unsqueeze(0), [&](const torch::Tensor& f) { return f[0][k]; }));
  return torch::stack(rows);
}

struct Small {
  testing::TempDir dir;
  RunOptions r;
  std::unique_ptr<PathReader> reader;
  torch::Tensor test, train;
  Small() {
    r = testing::small_run(dir / "run", "sgd", 3, 2);
    train_run(r);
    reader = std::make_unique<PathReader>(r.out);
    test = reader->decoded_dataset().x_test.narrow(0, 0, 2);
    train = reader->decoded_dataset().x_train.narrow(0, 0, 3);
  }
};

GramOptions quiet(const std::string& kernel) {
  GramOptions o;
  o.kernel = GramSpec::parse(kernel);
  o.progress = false;
  return o;
}

TEST(Gram, DpkEpkAndNtkEqualPerSampleAutograd) {
  Small s;
  Network net = build_network(s.reader->manifest().network_options());
  const int64_t K = 3;
  torch::Tensor dpk = torch::zeros({2, 3, K, K}, torch::kFloat64), epk = torch::zeros_like(dpk);
  s.reader->forward([&](const PathStep& st) {
    for (int64_t r = 0; r < 2; ++r) {
      torch::Tensor jr = jacobian(net, st.w, s.test[r], K);
      torch::Tensor jbar = torch::zeros_like(jr);  // riemann:4 along the step
      for (double t : {0.0, 0.25, 0.5, 0.75}) jbar += jacobian(net, st.w + t * st.delta, s.test[r], K) / 4;
      for (int64_t c = 0; c < 3; ++c) {
        torch::Tensor jc = jacobian(net, st.w, s.train[c], K);
        dpk[r][c] += torch::matmul(jr, jc.t());
        epk[r][c] += torch::matmul(jbar, jc.t());
      }
    }
  });
  torch::Tensor w1 = s.reader->weights(1), ntk = torch::zeros_like(dpk);
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t c = 0; c < 3; ++c) ntk[r][c] = torch::matmul(jacobian(net, w1, s.test[r], K), jacobian(net, w1, s.train[c], K).t());
  }
  auto close = [](const torch::Tensor& a, const torch::Tensor& b) {
    return (a - b).abs().max().item<double>() <= 1e-12 * b.abs().max().item<double>();
  };
  EXPECT_TRUE(close(gram(*s.reader, s.test, true, s.train, false, quiet("dpk")), dpk));
  EXPECT_TRUE(close(gram(*s.reader, s.test, true, s.train, false, quiet("ntk:1")), ntk));
  GramOptions e = quiet("epk");
  e.quadrature.spec = QuadratureSpec::parse("riemann:4");
  EXPECT_TRUE(close(gram(*s.reader, s.test, true, s.train, false, e), epk));
  // Training rows and test columns: the same kernel, transposed.
  EXPECT_TRUE(close(gram(*s.reader, s.train, false, s.test, true, e), epk.permute({1, 0, 3, 2})));
  // The EPK differs from the DPK (the steps are not tiny).
  EXPECT_FALSE(close(epk, dpk));
  // trace: Σ_k K[.., k, k].
  GramOptions t = quiet("dpk");
  t.trace = true;
  EXPECT_TRUE(close(gram(*s.reader, s.test, true, s.train, false, t), dpk.diagonal(0, 2, 3).sum(2)));
}

TEST(Gram, TrainTrainKernelsAreSymmetricPositiveSemidefinite) {
  Small s;
  const torch::Tensor x = s.reader->decoded_dataset().x_train.narrow(0, 0, 12);
  for (const char* kernel : {"epk", "ntk:0", "ntk-inf"}) {
    GramOptions o = quiet(kernel);
    o.trace = true;
    o.block = 5;  // several blocks
    torch::Tensor g = gram(*s.reader, x, false, x, false, o);
    const double scale = g.abs().max().item<double>();
    EXPECT_LE((g - g.t()).abs().max().item<double>(), 1e-12 * scale) << kernel;
    EXPECT_GE(torch::linalg::eigvalsh(0.5 * (g + g.t()), "L").min().item<double>(), -1e-10 * scale) << kernel;
  }
}

// The test–test EPK with riemann:4 against autograd: Σ_s Σ_j J(t_j, x) J(t_j, x')ᵀ / 4.
TEST(Gram, TestTestEpkEqualsPerSampleAutograd) {
  Small s;
  Network net = build_network(s.reader->manifest().network_options());
  const int64_t K = 3;
  torch::Tensor expect = torch::zeros({2, 2, K, K}, torch::kFloat64);
  s.reader->forward([&](const PathStep& st) {
    for (double t : {0.0, 0.25, 0.5, 0.75}) {
      for (int64_t r = 0; r < 2; ++r) {
        for (int64_t c = 0; c < 2; ++c) {
          expect[r][c] += torch::matmul(jacobian(net, st.w + t * st.delta, s.test[r], K),
                                        jacobian(net, st.w + t * st.delta, s.test[c], K).t()) / 4;
        }
      }
    }
  });
  GramOptions e = quiet("epk");
  e.quadrature.spec = QuadratureSpec::parse("riemann:4");
  torch::Tensor got = gram(*s.reader, s.test, true, s.test, true, e);
  EXPECT_LE((got - expect).abs().max().item<double>(), 1e-12 * expect.abs().max().item<double>());
  // The diagonal alone, by its own route.
  torch::Tensor diag = gram_diagonal(*s.reader, s.test, true, e);
  EXPECT_LE((diag - expect.diagonal(0, 0, 1).permute({2, 0, 1})).abs().max().item<double>(),
            1e-12 * expect.abs().max().item<double>());
}

// Gauss on the test–test EPK: symmetric, positive semi-definite, its diagonal
// equal to gram_diagonal's (different pieces: each point's own), and the
// limit the Riemann sums approach.
TEST(Gram, TestTestEpkIsSymmetricPsdAndRiemannConverges) {
  Small s;
  const torch::Tensor x = s.reader->decoded_dataset().x_test.narrow(0, 0, 7);
  GramOptions o = quiet("epk");
  o.trace = true;
  o.block = 3;  // several blocks, off-diagonal ones among them
  torch::Tensor g = gram(*s.reader, x, true, x, true, o);
  const double scale = g.abs().max().item<double>();
  EXPECT_LE((g - g.t()).abs().max().item<double>(), 1e-12 * scale);
  EXPECT_GE(torch::linalg::eigvalsh(0.5 * (g + g.t()), "L").min().item<double>(), -1e-10 * scale);
  EXPECT_LE((gram_diagonal(*s.reader, x, true, o) - g.diagonal()).abs().max().item<double>(), 1e-12 * scale);
  double last = 1e300;
  for (const char* rule : {"riemann:10", "riemann:100", "riemann:1000"}) {
    GramOptions r = o;
    r.quadrature.spec = QuadratureSpec::parse(rule);
    const double err = (gram(*s.reader, x, true, x, true, r) - g).abs().max().item<double>() / scale;
    EXPECT_LT(err, last / 5) << rule;  // Riemann converges like 1/T
    last = err;
  }
  EXPECT_LT(last, 1e-3);
}

// gram_diagonal equals the diagonal of gram for every kernel.
TEST(Gram, DiagonalEqualsTheGramsDiagonal) {
  Small s;
  const torch::Tensor x = s.reader->decoded_dataset().x_train.narrow(0, 0, 5);
  for (const char* kernel : {"epk", "dpk", "ntk:2", "ntk-inf"}) {
    GramOptions o = quiet(kernel);
    o.block = 2;
    torch::Tensor g = gram(*s.reader, x, false, x, false, o);
    torch::Tensor d = gram_diagonal(*s.reader, x, false, o);
    // ntk-inf's arccos turns the rounding of x·x' into ~1e-8 near θ = 0; the
    // diagonal itself is the exact θ = 0 recursion.
    const double tol = std::string(kernel) == "ntk-inf" ? 1e-7 : 1e-12;
    EXPECT_LE((d - g.diagonal(0, 0, 1).permute({2, 0, 1})).abs().max().item<double>(),
              tol * g.abs().max().item<double>())
        << kernel;
  }
}

TEST(Gram, RefusesWhatItCannotCompute) {
  Small s;
  EXPECT_CONTAINS(testing::error_message([&] { GramSpec::parse("ntk:x"); }), "must be a whole number");
  EXPECT_CONTAINS(testing::error_message([&] { GramSpec::parse("rbf"); }), "unknown kernel 'rbf'");
  EXPECT_CONTAINS(testing::error_message([&] { gram(*s.reader, s.test, true, s.train, false, quiet("ntk:9")); }),
                  "the run has steps 0..3");
  EXPECT_EQ(GramSpec::parse("ntk:7").str(), "ntk:7");
  EXPECT_EQ(GramSpec::parse("ntk-inf").str(), "ntk-inf");
  EXPECT_CONTAINS(testing::error_message([&] { GramSpec::parse("epk:3"); }), "only ntk takes a step");
  EXPECT_CONTAINS(testing::error_message([&] { GramSpec::parse("ntk-inf:3"); }), "only ntk takes a step");
}

/// Every kernel of the registry is written, parsed and built by its name,
/// and the messages list them all.
TEST(Gram, BuildsEveryKernelOfTheRegistryByName) {
  const std::string unknown = testing::error_message([&] { GramSpec::parse("rbf"); });
  std::vector<std::string> names;
  for (const KernelEntry& e : kernel_registry()) {
    names.push_back(e.name);
    EXPECT_CONTAINS(unknown, e.syntax);
    EXPECT_FALSE(e.meaning.empty()) << e.name;
    const GramSpec spec = GramSpec::parse(e.name);
    EXPECT_EQ(spec.str(), e.name);
    EXPECT_NE(make_kernel(spec), nullptr) << e.name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"epk", "dpk", "ntk", "ntk-inf"}));
  // What the distributed split and the Gram file ask of a kernel.
  EXPECT_TRUE(make_kernel(GramSpec::parse("epk"))->integrates_test_side());
  EXPECT_FALSE(make_kernel(GramSpec::parse("dpk"))->integrates_test_side());
  EXPECT_FALSE(make_kernel(GramSpec::parse("ntk:2"))->integrates_test_side());
  EXPECT_TRUE(make_kernel(GramSpec::parse("ntk-inf"))->closed_form());
  EXPECT_FALSE(make_kernel(GramSpec::parse("epk"))->closed_form());
}

}  // namespace
}  // namespace pathkernel
