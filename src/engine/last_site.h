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
/// L − 2, whose ReLU (and max-pool or average pool) feeds the logits'
/// Linear layer L − 1.
/// On a piece between the earlier sites' kinks the site's pre-activation y
/// is a polynomial of degree L − 1; its switches inside the piece change
/// only which of y's units pass on, so the piece's integral splits into
/// scalar integrals over the sub-pieces between them.
struct LastSiteTerms {
  /// Per node row, every output's cotangent on y, factored (the rows walk
  /// it back to the layers below, Route::signals_from, formed by
  /// site_cotangents): output k's on unit u (window w(u)) is
  /// w0u[k, u] e0[r, u] + dwu[k, u] e1[r, u] − e2[r, u] (under an average
  /// pool the fields carry each unit's share, 1 / k², of its window's), with
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

  /// Held through a hidden layer (QuadratureOptions::LastSite::Hidden: the
  /// site of param layer L − 3, then the hidden Linear layer L − 2 and its
  /// ReLU, then the logits). The fields are then [4, R, U]: e0, e1, e2 the
  /// sums of ∫ σ_u tᵃ ℓ_j, e3 the softmax's part; output k's cotangent on
  /// unit u of node row r (of piece p) is Σ_a eu[p, a, k, w(u)] e_a[r, u] −
  /// e3[r, u], with eu [np, 3, K, Hw] the tᵃ terms of W(t) D W_h(t) (the
  /// logits' layer, the hidden layer's ReLU mask D on the piece (1 where
  /// positive, else 0 or its leaky ReLU's slope), the
  /// hidden layer) and w_of_u [U] each unit's window. h_sum, ph_sum, p_sum
  /// and len are the logits' layer's, whose input is D y_h.
  torch::Tensor eu, w_of_u;
  /// Per piece: the hidden layer's mask D [np, H], the integrals of its
  /// input h, ∫ h and ∫ t h [np, Hw], ∫ p hᵀ and ∫ t p hᵀ [np, K, Hw], ∫ t
  /// [np], ∫ p and ∫ t p [np, K] (LayerFeatures::HiddenFactors keep its part of J̄ from
  /// them), and that part times the direction, [np, K].
  torch::Tensor mask, h0, h1, p0, p1, t1, p0s, p1s, hidden_dot;
  /// Per piece, the hidden layer's switches inside it (t, ascending), found
  /// on the interpolants: the piece must end there (its terms are not used).
  std::vector<std::vector<double>> hidden_kinks;

  bool hidden() const { return eu.defined(); }
};

/// Every output's cotangent [K, R, ...] on the held site of `fields` [F, R,
/// U] (LastSiteTerms::fields, or sums of them), row r's weights those of
/// piece piece_of[r] (held through a hidden layer; else not read), for a
/// site of shape `shape` (its first entry, the rows, is not read).
torch::Tensor site_cotangents(const LastSiteTerms& terms, const torch::Tensor& fields,
                              const std::vector<int64_t>& piece_of, const std::vector<int64_t>& shape);

/// The held site's part of J̄ dw per node row [K, R]: the rows' cotangents
/// (site_cotangents of terms.fields) against the site's direction
/// [R, U] (a pass's `directions` at the site).
torch::Tensor site_dot(const LastSiteTerms& terms, const torch::Tensor& direction,
                       const std::vector<int64_t>& piece_of);

/// Per piece of round `rd`, the sums over its node rows of the cotangents
/// of `terms` (site_cotangents) and of them times the rows' t: [K, np, ...]
/// each, as site_cotangents of the fields summed by piece (each piece's rows
/// added in order), without forming the fields times t.
std::pair<torch::Tensor, torch::Tensor> piece_cotangent_sums(const LastSiteTerms& terms, const PieceRound& rd,
                                                             const torch::Tensor& t, const std::vector<int64_t>& shape);

/// The terms of round `rd` (one piece's nodes are its rows first[p] ..
/// first[p+1]−1; no moment rows) of a network whose last site is held:
/// `node_y` [R, ...] the site's pre-activation at the round's nodes, `end_y`
/// [2 np, ...] at its pieces' ends (the site's switches inside a piece are
/// found on their interpolant), `softmax` whether the outputs are the
/// log-softmax of the logits (p = softmax(z); else p = 0), `hidden` whether
/// the site is held through a hidden layer (param layer L − 3's; else L − 2's).
LastSiteTerms last_site_terms(const SegmentEvaluator& ev, const PieceRound& rd, const torch::Tensor& node_y,
                              const torch::Tensor& end_y, bool softmax, bool hidden = false);

}  // namespace pathkernel
