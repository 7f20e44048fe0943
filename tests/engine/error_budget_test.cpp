// The certificate's error budget (QuadratureOptions::run_tol): shared over the
// steps of a run, it bounds the kernel machine's error for a run of any
// length, and the bound the decomposition reports (error_bound, the steps'
// certificate gaps summed) holds against the network.
#include <gtest/gtest.h>

#include "../test_util.h"
#include "pathkernel/decomposition.h"

namespace pathkernel {
namespace {

using testing::small_run;
using testing::TempDir;

TEST(ErrorBudget, IsSharedOverTheSteps) {
  QuadratureOptions q;
  q.run_tol = 1e-12;
  EXPECT_DOUBLE_EQ(q.for_run(100).tol, 1e-14);
  EXPECT_DOUBLE_EQ(q.for_run(0).tol, 1e-12);
  q.run_tol = 0;  // no budget: the per-step tolerance as given
  q.tol = 3e-13;
  EXPECT_DOUBLE_EQ(q.for_run(100).tol, 3e-13);
}

// 2,000 steps at the defaults: the per-step tolerance of old (1e-14 each)
// could add up to 2e-11; the budget keeps the whole run within 1e-12.
TEST(ErrorBudget, HoldsOnARunOfTwoThousandSteps) {
  TempDir dir;
  RunOptions r = small_run(dir / "run", "sgd", 2000, 0);
  r.model = "mlp:6:tanh";  // smooth: every step needs quadrature, none is exact by luck
  train_run(r);
  PathReader reader(r.out);
  DecompositionOptions o;
  o.progress = false;
  const Decomposition d = decompose(reader, reader.decoded_dataset().x_test.narrow(0, 0, 3), o);
  const DecompositionSummary s = summarize(d);
  EXPECT_EQ(s.steps, 2000);
  EXPECT_LE(s.max_rel_error, 1e-12);
  EXPECT_LE(s.max_rel_error, s.error_bound + 1e-14);  // the reported bound holds
}

// A loose budget: the error is far above rounding, and still within the bound,
// which itself stays within the budget (the scales of f_s and f_N differ by
// little on this run).
TEST(ErrorBudget, TheReportedBoundHoldsForALooseBudget) {
  TempDir dir;
  RunOptions r = small_run(dir / "run", "momentum", 40, 0);
  r.model = "mlp:6:tanh";
  train_run(r);
  PathReader reader(r.out);
  DecompositionOptions o;
  o.progress = false;
  o.quadrature.run_tol = 1e-4;
  o.quadrature.gauss_nodes = 1;  // one node per piece: the error is the certificate's to catch
  o.quadrature.min_nodes = 1;
  const Decomposition d = decompose(reader, reader.decoded_dataset().x_test.narrow(0, 0, 4), o);
  const DecompositionSummary s = summarize(d);
  EXPECT_GT(s.max_rel_error, 1e-12);  // the budget was used
  EXPECT_LE(s.max_rel_error, s.error_bound + 1e-14);
  EXPECT_LE(s.error_bound, 2e-4);
}

}  // namespace
}  // namespace pathkernel
