// Max-pooling in a TorchScript module's forward, by pathkernel's own loops.
//
// LibTorch 1.13's CPU max-pool takes about 10 ms for a batch of 128 float32
// maps of 16 × 28 × 28 on one thread (some 26 ns a window), the larger part
// of replaying a small CNN's training step. pathkernel rewrites each
// aten::max_pool2d call of the module's forward graph (the graph the
// network runs, not the one the kink sites are read from) into
// pathkernel::max_pool2d. That op pools non-overlapping square windows of a
// contiguous float32 or float64 [N, C, H, W] input by max_pool_with_indices
// (max_pool.h: the same values and argmax as LibTorch's, ties and NaNs
// included), and sends the gradient back through LibTorch's own
// max_pool2d_with_indices_backward with those indices, the call autograd
// makes after LibTorch's pool. Any other pool (overlapping or padded
// windows, dilation, ceil_mode, other layouts and types) is LibTorch's
// aten::max_pool2d. So the forward's values and every gradient are the same
// bits either way, and a replay still reproduces the recorded training.
#pragma once

#include <cstdint>

#include <torch/script.h>
#include <torch/torch.h>

namespace pathkernel {

/// aten::max_pool2d's arguments and result, by hand where the windows are
/// square, non-overlapping and unpadded on a contiguous float32 or float64
/// 4-D input (differentiable, as above); through at::max_pool2d otherwise.
torch::Tensor script_max_pool2d(const torch::Tensor& self, c10::IntArrayRef kernel_size, c10::IntArrayRef stride,
                                c10::IntArrayRef padding, c10::IntArrayRef dilation, bool ceil_mode);

/// The window of such a call by hand (its side), or 0 where LibTorch pools.
int64_t hand_pool_window(const torch::Tensor& self, c10::IntArrayRef kernel_size, c10::IntArrayRef stride,
                         c10::IntArrayRef padding, c10::IntArrayRef dilation, bool ceil_mode);

/// Rewrites every aten::max_pool2d node of `graph` (in nested blocks too)
/// into pathkernel::max_pool2d, which takes the same arguments. Returns how
/// many it rewrote.
int64_t hand_pools(torch::jit::Graph& graph);

}  // namespace pathkernel
