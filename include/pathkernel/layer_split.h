// Contributions split over the network's parameter tensors (explain
// --by-layer, docs/math.md §8, "Contributions by parameter tensor").
//
// Every contribution is a contraction over the flat parameter vector,
// <A_k(x), g_i> = Σ_p A_kp(x) g_ip (features.h: A = J̄_s on the forward walk,
// the accumulated A_s on the reverse walk), so it is the sum of the same
// contraction restricted to each parameter tensor's entries. The functions
// here give those L restrictions side by side, [n, B, K, L], with L the
// parameter tensors of parameter_layout() in its order (own networks: each
// layer's weight and bias; a TorchScript module: its named parameters). On
// the layered routes a param layer's weight and bias are each one tensor; on
// the generic route the one Module layer's flat vector is cut at the
// layout's offsets. A tensor no layer uses has zeros.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "pathkernel/features.h"
#include "pathkernel/model.h"
#include "pathkernel/route.h"

namespace pathkernel {

/// A stretch of a param layer's parameters that is (part of) one parameter tensor.
struct TensorPiece {
  int64_t tensor = 0;  ///< index into parameter_layout()
  int64_t start = 0;   ///< first entry within the layer's own vector (weight, then bias)
  int64_t offset = 0;  ///< first entry within the flat parameter vector
  int64_t numel = 0;
};

/// The pieces of param layer p: its weight's, then its bias's (a Module
/// layer's whole vector cut at the layout's tensors). Throws Error when a
/// piece falls outside every tensor of `layout`.
std::vector<TensorPiece> layer_pieces(const ParamLayer& p, const std::vector<ParamInfo>& layout);

/// contract() (features.h) split by parameter tensor: <J̄_k(x_n), g_i>
/// restricted to each tensor, [n, B, K, L]. Sums over the last axis to
/// contract() up to rounding.
torch::Tensor contract_by_tensor(const SegmentEvaluator& ev, const TestFeatures& f, const TrainSignals& t,
                                 const std::vector<ParamInfo>& layout);

/// contract_dense() (features.h) split by parameter tensor: <A_k(x_n), g_i>
/// for dense A [n, K, P] restricted to each tensor, [n, B, K, L].
torch::Tensor contract_dense_by_tensor(const SegmentEvaluator& ev, const torch::Tensor& a, const TrainSignals& t,
                                       const std::vector<ParamInfo>& layout);

}  // namespace pathkernel
