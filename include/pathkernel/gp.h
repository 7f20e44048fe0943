// Gaussian-process regression on a precomputed kernel (docs/math.md §9, paper
// §4.2): each of the K outputs is an independent GP with the same prior
// covariance, the train x train kernel. The posterior at test points comes
// from a Cholesky factorisation; when the kernel is singular to rounding, the
// smallest jitter on its diagonal that lets the factorisation through is
// added and reported. Sampling the posterior and pushing the samples through
// softmax gives the standard deviation of the class probabilities (Fig. 5).
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace pathkernel {

struct GpOptions {
  double noise = 0.0;         ///< observation noise variance added to the diagonal
  double max_jitter = 1e-6;   ///< largest jitter tried, relative to the mean diagonal
  int64_t samples = 1000;     ///< Monte-Carlo samples for the probabilities' std (0: none)
  uint64_t seed = 0;
};

struct GpPosterior {
  torch::Tensor mean;      ///< [n, K] posterior mean of each output
  torch::Tensor variance;  ///< [n] posterior variance (the same for every output)
  torch::Tensor prob_std;  ///< [n, K] std of softmax(sample) over the samples (undefined with 0 samples)
  double jitter = 0;       ///< added to the diagonal, absolute (0 if none was needed)
};

/// The posterior at n test points from k_train [M, M], k_cross [n, M]
/// (test x train), k_test [n] (the test points' own kernel values) and
/// targets y [M, K]. Throws Error on mismatched shapes, non-finite values, or
/// a kernel that stays not positive definite up to max_jitter.
GpPosterior gp_posterior(const torch::Tensor& k_train, const torch::Tensor& k_cross, const torch::Tensor& k_test,
                         const torch::Tensor& y, const GpOptions& options);

}  // namespace pathkernel
