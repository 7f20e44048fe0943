// Max-pooling of non-overlapping windows and its gradient, by hand: own
// networks' forward and backward passes (own_route.cpp) and the kink search
// (kinks.cpp) pool every row they evaluate, a TorchScript module's forward
// pools every step it replays (script_pool.h), and LibTorch's kernel takes
// about 8 ms for a batch of 128 images of 16 × 28 × 28 in float64, 10 ms in
// float32 (one thread), several times the memory's pace.
#pragma once

#include <tuple>

#include <torch/torch.h>

namespace pathkernel {

/// Each k × k window's maximum (stride k, no padding, windows past the last
/// whole one dropped) of x [N, C, H, W] and its argmax, the index in the input
/// plane (row · W + column) of the window's first maximum in row-major order,
/// a NaN taking the place of any number: the values and indices
/// torch::max_pool2d_with_indices(x, k) gives, for any x (a float32 or
/// float64 contiguous x by hand, others through LibTorch).
std::tuple<torch::Tensor, torch::Tensor> max_pool_with_indices(const torch::Tensor& x, int64_t k);

/// Whether max_pool_with_indices and max_unpool take x by their own loops
/// (float32 or float64, contiguous, on the CPU) rather than LibTorch's.
bool pooled_by_hand(const torch::Tensor& x);

/// The same loop on C planes of H × W at x, held in the caller's memory
/// (one row's, last_site.cpp): each window's maximum into out and its
/// argmax in the plane into index, [C, H / k, W / k] row-major.
void pool_windows(const double* x, int64_t C, int64_t H, int64_t W, int64_t k, double* out, int64_t* index);
void pool_windows(const float* x, int64_t C, int64_t H, int64_t W, int64_t k, float* out, int64_t* index);

/// The gradient through such a pool of k × k windows: g [K, N, C, H', W']
/// (the pooled gradients of K outputs) goes to each window's argmax `index`
/// [N, C, H', W'] in an input plane of H × W, zero elsewhere; where `positive` [N, C,
/// H', W'] is defined (the pooled values, a ReLU before the pool), only
/// windows whose pooled value is above 0 pass theirs. Returns [K, N, C, H, W].
torch::Tensor max_unpool(const torch::Tensor& g, const torch::Tensor& index, int64_t k, int64_t H, int64_t W,
                         const torch::Tensor& positive);

}  // namespace pathkernel
