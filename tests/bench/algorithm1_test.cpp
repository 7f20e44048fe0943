// The benchmark's Algorithm 1 (per-sample autograd Jacobians, Riemann sum)
// against pathkernel's structured decomposition with the same Riemann rule:
// two independent computations of the same contributions. This is what
// makes the benchmark's speed ratio a comparison of equals.
#include <gtest/gtest.h>

#include "../../bench/algorithm1.h"
#include "../test_util.h"
#include "pathkernel/decomposition.h"

namespace pathkernel {
namespace {

TEST(Algorithm1, EqualsTheStructuredDecompositionWithTheSameRule) {
  for (const std::string opt : {"gd", "sgd"}) {
    testing::TempDir dir(opt);
    RunOptions r = testing::small_run(dir / "run", opt, 6, 3);
    train_run(r);
    PathReader reader(r.out);
    torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 3);
    bench::Algorithm1Result a = bench::algorithm1(reader, x, 5);
    DecompositionOptions options;
    options.progress = false;
    options.quadrature.spec = QuadratureSpec::parse("riemann:5");
    Decomposition d = decompose(reader, x, options);
    const double scale = d.contributions.abs().max().item<double>();
    SCOPED_TRACE(opt);
    EXPECT_GT(scale, 1e-6);
    EXPECT_LE((a.contributions - d.contributions).abs().max().item<double>(), 1e-12 * scale);
    EXPECT_LE((a.f0 - d.f0).abs().max().item<double>(), 1e-14);
    // A different rule gives different contributions: the comparison can fail.
    bench::Algorithm1Result coarse = bench::algorithm1(reader, x, 1);
    EXPECT_GT((coarse.contributions - d.contributions).abs().max().item<double>(), 1e-9 * scale);
  }
}

TEST(Algorithm1, RefusesBufferedOptimizers) {
  testing::TempDir dir;
  RunOptions r = testing::small_run(dir / "run", "momentum", 2, 1);
  train_run(r);
  PathReader reader(r.out);
  torch::Tensor x = reader.decoded_dataset().x_test.narrow(0, 0, 1);
  EXPECT_CONTAINS(testing::error_message([&] { bench::algorithm1(reader, x, 4); }), "covers gd and sgd");
}

}  // namespace
}  // namespace pathkernel
