// The SVM refit on a precomputed kernel against libsvm's own linear kernel
// on the same data.
#include <gtest/gtest.h>
#include <svm.h>

#include "../test_util.h"
#include "pathkernel/svm_refit.h"

namespace pathkernel {
namespace {

void quiet(const char*) {}

/// libsvm with its built-in linear kernel on raw features: the reference.
std::pair<std::vector<double>, std::vector<double>> libsvm_linear(const torch::Tensor& xtr, const torch::Tensor& y,
                                                                  const torch::Tensor& xte, double c) {
  svm_set_print_string_function(&quiet);
  const int64_t M = xtr.size(0), d = xtr.size(1);
  auto rows = [&](const torch::Tensor& x) {
    std::vector<svm_node> nodes;
    for (int64_t i = 0; i < x.size(0); ++i) {
      for (int64_t j = 0; j < d; ++j) nodes.push_back({static_cast<int>(j + 1), x[i][j].item<double>()});
      nodes.push_back({-1, 0.0});
    }
    return nodes;
  };
  std::vector<svm_node> tr = rows(xtr), te = rows(xte);
  std::vector<svm_node*> ptr;
  std::vector<double> labels;
  for (int64_t i = 0; i < M; ++i) {
    ptr.push_back(&tr[static_cast<size_t>(i * (d + 1))]);
    labels.push_back(static_cast<double>(y[i].item<int64_t>()));
  }
  svm_problem prob{static_cast<int>(M), labels.data(), ptr.data()};
  svm_parameter param{};
  param.svm_type = C_SVC;
  param.kernel_type = LINEAR;
  param.C = c;
  param.eps = 1e-6;
  param.cache_size = 200;
  param.shrinking = 1;
  svm_model* model = svm_train(&prob, &param);
  const int nc = svm_get_nr_class(model);
  std::vector<double> predicted, decision;
  for (int64_t i = 0; i < xte.size(0); ++i) {
    std::vector<double> dv(static_cast<size_t>(nc * (nc - 1) / 2));
    predicted.push_back(svm_predict_values(model, &te[static_cast<size_t>(i * (d + 1))], dv.data()));
    decision.insert(decision.end(), dv.begin(), dv.end());
  }
  svm_free_and_destroy_model(&model);
  return {predicted, decision};
}

TEST(SvmRefit, ReproducesLibsvmsLinearKernel) {
  torch::manual_seed(8);
  const int64_t M = 60, n = 20;
  torch::Tensor y = torch::arange(M) % 3;
  torch::Tensor centres = torch::tensor({{2.0, 0.0, 0.0}, {0.0, 2.0, 0.0}, {0.0, 0.0, 2.0}}, torch::kFloat64);
  torch::Tensor xtr = centres.index_select(0, y) + torch::randn({M, 3}, torch::kFloat64);
  torch::Tensor yte = torch::arange(n) % 3;
  torch::Tensor xte = centres.index_select(0, yte) + torch::randn({n, 3}, torch::kFloat64);
  SvmRefit r = svm_refit(torch::matmul(xtr, xtr.t()), y, torch::matmul(xte, xtr.t()), SvmOptions{0.5, 1e-6});
  auto [predicted, decision] = libsvm_linear(xtr, y, xte, 0.5);
  ASSERT_EQ(r.decision.sizes(), (std::vector<int64_t>{n, 3}));
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(r.predicted[i].item<int64_t>(), static_cast<int64_t>(predicted[i])) << i;
    for (int64_t j = 0; j < 3; ++j) EXPECT_NEAR(r.decision[i][j].item<double>(), decision[i * 3 + j], 1e-6) << i;
  }
  EXPECT_GT(r.support_vectors, 0);
  // A separable-enough problem: most test points come out right.
  EXPECT_GE((r.predicted == yte).sum().item<int64_t>(), 15);
}

TEST(SvmRefit, RejectsBadInput) {
  torch::Tensor k = torch::eye(4, torch::kFloat64), y = torch::tensor({0, 1, 0, 1});
  EXPECT_CONTAINS(testing::error_message([&] { svm_refit(k, y, torch::zeros({2, 3}, torch::kFloat64), {}); }),
                  "test kernel must be [n, 4], got [2, 3]");
  EXPECT_CONTAINS(testing::error_message([&] { svm_refit(k, torch::zeros({4}, torch::kLong), k, {}); }),
                  "fewer than two classes");
  EXPECT_CONTAINS(testing::error_message([&] { svm_refit(k, y, k, SvmOptions{-1, 1e-6}); }), "C must be > 0");
}

}  // namespace
}  // namespace pathkernel
