// Adding a block of rows into a larger tensor at given rows of its second
// axis (the step sums into the contributions): internal to the engine.
#pragma once

#include <torch/torch.h>

namespace pathkernel {

/// target[:, index[i], ...] += source[:, i, ...] for every i, in increasing
/// i (so repeated rows add in order): the same bits as
/// `target.index_add_(1, index, source)`. LibTorch's index_add_ along an
/// axis other than the first walks the index one row at a time, each an
/// operation of its own over a strided slice (a step block's 2,816 rows into
/// the real-size run's [100, 60000, 10] contributions took 23 ms a block,
/// on the program's own thread); for float64 tensors whose rows are
/// contiguous this is one loop over memory, split over the first axis.
/// Other dtypes and layouts go to index_add_.
void add_at_rows(torch::Tensor target, const torch::Tensor& index, const torch::Tensor& source);

}  // namespace pathkernel
