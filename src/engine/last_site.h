// The last kink site's switches integrated inside the pieces rather than
// ending them (docs/math.md §7, "The last site's switches, integrated
// locally"): internal to the engine.
#pragma once

#include <utility>
#include <vector>

#include <torch/torch.h>

#include "pathkernel/integrator.h"
#include "pathkernel/segment.h"

namespace pathkernel {

/// What a round of pieces takes from the last site, the site of param layer
/// L − 2, whose ReLU (and max-pool) feeds the logits' Linear layer L − 1.
/// On a piece between the earlier sites' kinks the site's pre-activation y
/// is a polynomial of degree L − 1; its switches inside the piece change
/// only which of y's units pass on, so the piece's integral splits into
/// scalar integrals over the sub-pieces between them.
struct LastSiteTerms {
  /// Per node row, every output's cotangent on y, factored (the rows walk
  /// it back to the layers below, Route::signals_from, formed by
  /// cotangents_of): output k's on unit u (window w(u)) is
  /// w0u[k, u] e0[r, u] + dwu[k, u] e1[r, u] − e2[r, u], with
  /// fields = [e0, e1, e2] [3, R, U] and w0u, dwu [K, U] the logits' layer's
  /// weights at the start and its direction, taken at each unit's window.
  torch::Tensor fields, w0u, dwu;
  /// Per piece, the logits' layer's part of J̄ over the piece: for output k
  /// its weight block is e_k ⊗ h_sum − ph_sum and its bias e_k len − p_sum.
  torch::Tensor h_sum;   ///< [np, Hw]: ∫ h(t) dt, h the layer's input
  torch::Tensor ph_sum;  ///< [np, K, Hw]: ∫ p(t) h(t)ᵀ dt (zeros for logits)
  torch::Tensor p_sum;   ///< [np, K]: ∫ p(t) dt (zeros for logits)
  torch::Tensor len;     ///< [np]: b − a
  /// Per piece, the site's switches inside it (ascending t), and how many
  /// were a sign's (a ReLU unit's, or a pool window's maximum crossing 0)
  /// and a positive pool window's argmax's.
  std::vector<std::vector<double>> switches;
  std::vector<int64_t> flips, argmax;
};

/// The cotangents [K, R, ...] of fields [3, R, U] (LastSiteTerms::fields)
/// for a site of shape `shape` (its first entry, the rows, is not read).
torch::Tensor cotangents_of(const torch::Tensor& fields, const torch::Tensor& w0u, const torch::Tensor& dwu,
                            const std::vector<int64_t>& shape);

/// Per piece of round `rd`, the sums over its node rows of the cotangents
/// of `terms` (cotangents_of) and of them times the rows' t: [K, np, ...]
/// each, as cotangents_of of the fields summed by piece (each piece's rows
/// added in order), without forming the fields times t.
std::pair<torch::Tensor, torch::Tensor> piece_cotangent_sums(const LastSiteTerms& terms, const PieceRound& rd,
                                                             const torch::Tensor& t, const std::vector<int64_t>& shape);

/// The terms of round `rd` (one piece's nodes are its rows first[p] ..
/// first[p+1]−1; no moment rows) of a network whose last site is held:
/// `node_y` [R, ...] the site's pre-activation at the round's nodes, `end_y`
/// [2 np, ...] at its pieces' ends (the site's switches inside a piece are
/// found on their interpolant), `softmax` whether the outputs are the
/// log-softmax of the logits (p = softmax(z); else p = 0).
LastSiteTerms last_site_terms(const SegmentEvaluator& ev, const PieceRound& rd, const torch::Tensor& node_y,
                              const torch::Tensor& end_y, bool softmax);

}  // namespace pathkernel
