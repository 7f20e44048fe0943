// The softmax moments of log-softmax pieces (docs/math.md §7): internal to
// the engine's test features (layered_features.cpp).
#pragma once

#include <utility>

#include <torch/torch.h>

#include "pathkernel/integrator.h"

namespace pathkernel {

/// For log-softmax pieces of a piecewise-linear network of degree L, each
/// node's softmax moment v_j = ∫_a^b ℓ_j(t) p(t) dt [K], where ℓ_j is the
/// Lagrange basis polynomial of node t_j among all the piece's nodes (its
/// Gauss rows and its moment rows), p = softmax(z) and z the logits. On the
/// piece z is a polynomial of degree L, interpolated exactly through its
/// values at the nodes and the ends (`node_logits` [R, K], `moment_logits`
/// [R_m, K], undefined when there are none, `end_logits` [2 np, K]); the
/// integral is taken by composite Gauss–Legendre on sub-intervals, doubled
/// until two successive sums agree to rounding. No network evaluation is
/// needed. Returns the moments of the Gauss rows [R, K] and of the moment
/// rows [R_m, K].
std::pair<torch::Tensor, torch::Tensor> softmax_moments(const PieceRound& rd, const torch::Tensor& node_logits,
                                                        const torch::Tensor& moment_logits,
                                                        const torch::Tensor& end_logits);

}  // namespace pathkernel
