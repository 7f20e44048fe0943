// C-SVC on a precomputed kernel through libsvm.
#include "pathkernel/svm_refit.h"

#include <svm.h>

#include <cmath>
#include <memory>
#include <vector>

#include "pathkernel/error.h"

namespace pathkernel {

namespace {

void quiet(const char*) {}

/// libsvm's precomputed-kernel rows: node 0 holds the 1-based sample number,
/// nodes 1..M the kernel values, then the terminator.
std::vector<svm_node> kernel_rows(const torch::Tensor& k) {
  const int64_t rows = k.size(0), cols = k.size(1);
  auto a = k.accessor<double, 2>();
  std::vector<svm_node> nodes(static_cast<size_t>(rows * (cols + 2)));
  for (int64_t i = 0; i < rows; ++i) {
    svm_node* row = &nodes[static_cast<size_t>(i * (cols + 2))];
    row[0] = {0, static_cast<double>(i + 1)};
    for (int64_t j = 0; j < cols; ++j) row[j + 1] = {static_cast<int>(j + 1), a[i][j]};
    row[cols + 1] = {-1, 0.0};
  }
  return nodes;
}

}  // namespace

SvmRefit svm_refit(const torch::Tensor& k_train_in, const torch::Tensor& y_in, const torch::Tensor& k_test_in,
                   const SvmOptions& options) {
  const torch::Tensor kt = k_train_in.to(torch::kFloat64).contiguous(), ks = k_test_in.to(torch::kFloat64).contiguous();
  const torch::Tensor y = y_in.to(torch::kLong).contiguous();
  PK_CHECK(kt.dim() == 2 && kt.size(0) == kt.size(1), "svm: the train kernel must be square [M, M], got " << kt.sizes());
  const int64_t M = kt.size(0);
  PK_CHECK(y.dim() == 1 && y.size(0) == M, "svm: labels must be [" << M << "], got " << y.sizes());
  PK_CHECK(ks.dim() == 2 && ks.size(1) == M, "svm: the test kernel must be [n, " << M << "], got " << ks.sizes());
  PK_CHECK(torch::isfinite(kt).all().item<bool>() && torch::isfinite(ks).all().item<bool>(),
           "svm: a kernel holds a non-finite value");
  PK_CHECK(std::get<0>(at::_unique(y)).size(0) >= 2, "svm: the labels hold fewer than two classes");
  PK_CHECK(options.c > 0 && std::isfinite(options.c), "svm: C must be > 0 (got " << options.c << ")");
  PK_CHECK(options.tolerance > 0, "svm: tolerance must be > 0 (got " << options.tolerance << ")");
  svm_set_print_string_function(&quiet);

  std::vector<svm_node> train = kernel_rows(kt);
  std::vector<svm_node*> x(static_cast<size_t>(M));
  const torch::Tensor yd = y.to(torch::kFloat64).contiguous();
  std::vector<double> labels(yd.data_ptr<double>(), yd.data_ptr<double>() + M);
  for (int64_t i = 0; i < M; ++i) x[i] = &train[static_cast<size_t>(i * (M + 2))];
  svm_problem prob{static_cast<int>(M), labels.data(), x.data()};
  svm_parameter param{};
  param.svm_type = C_SVC;
  param.kernel_type = PRECOMPUTED;
  param.C = options.c;
  param.eps = options.tolerance;
  param.cache_size = 200;
  param.shrinking = 1;
  if (const char* err = svm_check_parameter(&prob, &param)) PK_THROW("svm: " << err);
  std::unique_ptr<svm_model, void (*)(svm_model*)> model(svm_train(&prob, &param),
                                                          [](svm_model* m) { svm_free_and_destroy_model(&m); });
  PK_CHECK(model != nullptr, "svm: libsvm did not return a model");

  SvmRefit out;
  const int64_t n = ks.size(0), classes = svm_get_nr_class(model.get());
  out.support_vectors = svm_get_nr_sv(model.get());
  out.predicted = torch::empty({n}, torch::kLong);
  out.decision = torch::empty({n, classes * (classes - 1) / 2}, torch::kFloat64);
  std::vector<svm_node> test = kernel_rows(ks);
  for (int64_t i = 0; i < n; ++i) {
    const double label = svm_predict_values(model.get(), &test[static_cast<size_t>(i * (M + 2))],
                                            out.decision[i].data_ptr<double>());
    out.predicted[i] = static_cast<int64_t>(std::llround(label));
  }
  return out;
}

}  // namespace pathkernel
