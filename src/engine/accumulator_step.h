// One step of the reverse walk's accumulator algebra (decomposition_reverse.cpp,
// docs/math.md §4) in one pass over a group's dense features: internal to
// the engine.
#pragma once

#include <torch/torch.h>

namespace pathkernel {

/// A step's scalars of the update rule (StepCoefficients) the accumulator
/// takes: a_s = α j + γ Q_s Ã_s with Ã_s = β Ã_{s+1} + κ j.
struct AccumulatorScalars {
  double alpha = 0, beta = 0, kappa = 0, gamma = 0;
};

/// With jp [n, K, P] a group's dense features at step s, metric [P] the
/// step's P_s (undefined: the identity) and acc [n, K, P] the accumulator
/// Ã_{s+1} (undefined: the optimizer keeps no buffer): j = jp ⊙ metric,
/// then acc ← fma(κ, j, β acc) and jp ← fma(γ, acc, α j), or jp ← α j
/// without a buffer; with buffer_metric [P] the buffer's Q_s (RMSprop's
/// with momentum: each gradient enters the buffer scaled by it), jp ←
/// fma(γ, acc ⊙ Q_s, α j). Each element is rounded as written (a fused multiply-add
/// rounds once; every x86-64 machine gives the same bits). Returns jp,
/// now a_s [n, K, P]. One pass over the three blocks, where the tensor
/// expressions `jp.mul_(metric); a = α jp; acc.mul_(β).add_(jp, κ);
/// a.add_(acc, γ)` take five (and LibTorch's add_ with a scale is a fused
/// multiply-add only where its kernels find FMA instructions). jp and acc
/// must be contiguous float64.
torch::Tensor accumulator_step(torch::Tensor jp, const torch::Tensor& metric, const torch::Tensor& acc,
                               const AccumulatorScalars& c, const torch::Tensor& buffer_metric = torch::Tensor());

}  // namespace pathkernel
