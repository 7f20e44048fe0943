// The comparison of kernel methods: its rows against the methods called
// directly, its files, and its errors.
#include <gtest/gtest.h>

#include "../test_util.h"
#include "pathkernel/compare.h"
#include "pathkernel/files.h"
#include "pathkernel/svm_refit.h"
#include "pathkernel/text.h"

namespace pathkernel {
namespace {

CompareOptions quiet_options(const std::string& kernels) {
  CompareOptions o;
  o.kernels = CompareOptions::parse_kernel_list(kernels);
  o.decomposition.progress = false;
  return o;
}

TEST(Compare, RowsMatchTheMethodsCalledDirectly) {
  testing::TempDir dir;
  RunOptions r = testing::small_run(dir / "run", "gd", 4, 2);
  train_run(r);
  PathReader reader(r.out);
  const Dataset& data = reader.decoded_dataset();
  const torch::Tensor train = torch::arange(0, 40, 2, torch::kLong), test = torch::arange(0, 12, torch::kLong);
  const CompareOptions options = quiet_options("epk,dpk");
  const Comparison c = compare_kernel_methods(reader, train, test, options);

  // The network, the exact machine, SVM and regression per kernel, the NNGP (a ReLU MLP), the lazy dynamics.
  ASSERT_EQ(c.rows.size(), 8u);
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"trained network", "-"}, {"kernel machine (exact)", "epk"}, {"SVM refit", "epk"}, {"kernel regression", "epk"},
      {"SVM refit", "dpk"},     {"kernel regression", "dpk"},      {"kernel regression", "nngp"},
      {"lazy dynamics", "ntk:0"}};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(c.rows[i].method, expected[i].first) << i;
    EXPECT_EQ(c.rows[i].kernel, expected[i].second) << i;
  }
  EXPECT_EQ(c.train_points, 20);
  EXPECT_EQ(c.test_points, 12);
  EXPECT_EQ(c.steps, 4);

  // The network's own row, and the exact machine agreeing with it everywhere.
  const torch::Tensor x_test = data.x_test.index_select(0, test).to(torch::kFloat64);
  const torch::Tensor labels = data.y_test.index_select(0, test);
  const torch::Tensor net = reader.outputs(4, x_test).argmax(1);
  EXPECT_DOUBLE_EQ(c.rows[0].accuracy, net.eq(labels).to(torch::kFloat64).mean().item<double>());
  EXPECT_DOUBLE_EQ(c.rows[0].agreement, 1.0);
  EXPECT_DOUBLE_EQ(c.rows[1].agreement, 1.0);
  EXPECT_CONTAINS(c.rows[1].note, "all 60 training points");

  // The SVM row on dpk, against svm_refit on the same kernel matrices.
  GramOptions g;
  g.kernel = GramSpec::parse("dpk");
  g.progress = false;
  const KernelMatrices k =
      kernel_matrices(reader, data.x_train.index_select(0, train).to(torch::kFloat64), x_test, true, g, false);
  const SvmRefit fit = svm_refit(k.train, data.y_train.index_select(0, train), k.cross, {});
  EXPECT_DOUBLE_EQ(c.rows[4].accuracy, fit.predicted.eq(labels).to(torch::kFloat64).mean().item<double>());
  EXPECT_DOUBLE_EQ(c.rows[4].agreement, fit.predicted.eq(net).to(torch::kFloat64).mean().item<double>());
  EXPECT_CONTAINS(c.rows[4].note, std::to_string(fit.support_vectors) + " support vectors");

  // The files: one CSV line per row after the header, the markdown table.
  const std::string md = write_comparison(c, dir / "cmp");
  const std::string csv = read_file(dir / "cmp/compare.csv");
  EXPECT_EQ(csv, c.csv());
  EXPECT_EQ(read_file(md), c.markdown());
  EXPECT_EQ(split(csv, '\n').size(), c.rows.size() + 2);  // header, rows, the final empty piece
  EXPECT_CONTAINS(csv, "SVM refit,dpk,");
  EXPECT_CONTAINS(c.markdown(), "| lazy dynamics | ntk:0 |");
  EXPECT_EQ(c.rows_json().size(), c.rows.size());
}

TEST(Compare, BadOptionsAndIndicesAreNamed) {
  CompareOptions o;
  o.c = -1;
  EXPECT_CONTAINS(testing::error_message([&] { o.check(); }), "cost C must be > 0 (got -1)");
  o = CompareOptions();
  o.bias_scale = -0.5;
  EXPECT_CONTAINS(testing::error_message([&] { o.check(); }), "bias scale must be finite and >= 0 (got -0.5)");
  o = CompareOptions();
  o.kernels.clear();
  EXPECT_CONTAINS(testing::error_message([&] { o.check(); }), "list of kernels to compare is empty");
  EXPECT_CONTAINS(testing::error_message([] { CompareOptions::parse_kernel_list("epk,rbf"); }), "unknown kernel 'rbf'");
  EXPECT_EQ(CompareOptions().kernels.size(), 5u);

  testing::TempDir dir;
  RunOptions r = testing::small_run(dir / "run", "gd", 2, 1);
  train_run(r);
  PathReader reader(r.out);
  const torch::Tensor some = torch::arange(3, torch::kLong);
  EXPECT_CONTAINS(testing::error_message([&] {
                    compare_kernel_methods(reader, some, torch::tensor({0, 30}, torch::kLong), quiet_options("dpk"));
                  }),
                  "test index 30 is out of range [0, 30)");
  EXPECT_CONTAINS(testing::error_message([&] {
                    compare_kernel_methods(reader, torch::tensor({-1}, torch::kLong), some, quiet_options("dpk"));
                  }),
                  "training index -1 is out of range [0, 60)");
}

}  // namespace
}  // namespace pathkernel
