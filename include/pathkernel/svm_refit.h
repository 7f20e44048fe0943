// Refitting the kernel weights with a support vector machine on a precomputed
// kernel (paper Fig. 3), by Debian's libsvm: C-SVC, one-vs-one for several
// classes. The kernel machine's weights are learned again from the labels
// alone, so its accuracy beside the network's says how much of the network's
// behaviour the kernel carries.
#pragma once

#include <torch/torch.h>

namespace pathkernel {

struct SvmOptions {
  double c = 1.0;          ///< C-SVC's cost
  double tolerance = 1e-6; ///< libsvm's stopping tolerance (eps)
};

struct SvmRefit {
  torch::Tensor predicted;  ///< [n] int64: predicted labels of the test rows
  torch::Tensor decision;   ///< [n, L(L−1)/2]: libsvm's one-vs-one decision values (L labels seen)
  int64_t support_vectors = 0;
};

/// Trains on k_train [M, M] with labels y [M] and predicts the rows of
/// k_test [n, M] (test x train). Throws Error on mismatched shapes,
/// non-finite values, fewer than two classes or a bad option.
SvmRefit svm_refit(const torch::Tensor& k_train, const torch::Tensor& y, const torch::Tensor& k_test,
                   const SvmOptions& options);

}  // namespace pathkernel
