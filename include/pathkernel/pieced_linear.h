// A Linear layer's products split into a fixed number of pieces, for the
// training of pathkernel's own networks on several threads.
//
// OpenBLAS splits a product over its threads by the product's shape and
// the thread count, and its kernels for the edges of a split add in
// another order: a full-batch MLP trained with OpenBLAS on two threads gave
// other bits on one, so its replay had to run at the run's count, in turn
// with the walk. Split here instead, into `pieces` fixed by the run, each
// piece one product on one OpenBLAS thread, the pieces over LibTorch's
// threads: the bits depend on the pieces alone, never on the threads that
// run them. What that gains, measured by the repo's commands, is in
// docs/math.md §12 ("A Linear layer's products in pieces").
//
// The pieces: the forward pass and the input's gradient by rows of the
// batch (every leading index of an input [..., in] a row), the weight's and
// the bias's gradients by output units, so that no sum is split. With one
// piece, torch::linear itself.
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace pathkernel {

/// x·wᵀ + b for x [..., in] (a vector: torch::linear), w [out, in] and b
/// [out] (or undefined), its products in `pieces` (≥ 1) as above;
/// differentiable in x, w and b (twice: the gradients are formed from
/// differentiable operations where a graph of them is asked for).
torch::Tensor pieced_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, int64_t pieces);

/// Piece p's range [first, first + count) of `size` rows or units split
/// into `pieces`: the first size % pieces pieces one larger.
struct PieceRange {
  int64_t first = 0, count = 0;
};
PieceRange piece_range(int64_t size, int64_t pieces, int64_t p);

}  // namespace pathkernel
