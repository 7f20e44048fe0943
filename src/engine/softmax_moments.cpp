// The softmax moments of log-softmax pieces, by barycentric interpolation of
// the logits and composite Gauss–Legendre.
#include "softmax_moments.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace pathkernel {

namespace {

constexpr int kFine = 16;        // Gauss nodes per sub-interval
constexpr int kMaxHalvings = 8;  // up to 256 sub-intervals

/// One piece's interpolation points: its nodes (Gauss rows, then moment
/// rows), then a and b; their logits [K] each, the barycentric weights, and
/// where each node's moment goes.
struct PieceNodes {
  int64_t m = 0, K = 0;  ///< nodes, outputs
  double a = 0, b = 0;
  std::vector<double> xs, bary;
  std::vector<const double*> zs;
  std::vector<double*> out;
};

/// What piece_moments reuses across its calls on one piece: the
/// differences x_j − x_j2 of its nodes, each τ's differences τ − x_i, and
/// the logits' and exponentials' buffers (the sub-intervals' cuts and the
/// composite rule are still formed per call).
struct PieceScratch {
  std::vector<double> node_gaps;  ///< [m · m]: x_j − x_j2 for nodes j, j2
  std::vector<double> tau_gaps;   ///< [xs]: τ − x_i at the current τ
  std::vector<double> z, p;       ///< [K]: the logits at τ and their exponentials
};

/// Σ over the nodes of kFine-node Gauss on S equal sub-intervals of [a, b]:
/// per node j and output k, ∫ ℓ_j p_k, [m · K], into `sum`.
void piece_moments(const PieceNodes& pn, int64_t S, PieceScratch& sc, std::vector<double>& sum) {
  const int64_t m = pn.m, K = pn.K;
  const double a = pn.a, b = pn.b;
  const std::vector<double>& xs = pn.xs;
  std::vector<double>& z = sc.z;
  std::vector<double>& p = sc.p;
  std::vector<double>& d = sc.tau_gaps;
  sum.assign(static_cast<size_t>(m * K), 0.0);
  std::vector<double> cuts(S + 1);
  for (int64_t s = 0; s <= S; ++s) cuts[s] = s == S ? b : a + (b - a) * static_cast<double>(s) / S;
  const QuadratureRule fine = composite_gauss_legendre(kFine, cuts);
  for (size_t f = 0; f < fine.nodes.size(); ++f) {
    const double tau = fine.nodes[f], omega = fine.weights[f];
    for (size_t i = 0; i < xs.size(); ++i) d[i] = tau - xs[i];
    // z(τ) by the barycentric formula (exactly a data point if τ is one).
    double den = 0;
    std::fill(z.begin(), z.end(), 0.0);
    size_t hit = xs.size();
    for (size_t i = 0; i < xs.size() && hit == xs.size(); ++i) {
      if (tau == xs[i]) hit = i;
    }
    if (hit < xs.size()) {
      std::copy(pn.zs[hit], pn.zs[hit] + K, z.begin());
    } else {
      for (size_t i = 0; i < xs.size(); ++i) {
        const double c = pn.bary[i] / d[i];
        den += c;
        const double* zi = pn.zs[i];
        for (int64_t k = 0; k < K; ++k) z[k] += c * zi[k];
      }
      for (int64_t k = 0; k < K; ++k) z[k] /= den;
    }
    const double zmax = *std::max_element(z.begin(), z.end());
    double total = 0;
    for (int64_t k = 0; k < K; ++k) total += p[k] = std::exp(z[k] - zmax);
    for (int64_t j = 0; j < m; ++j) {
      double l = 1;  // ℓ_j(τ) on the nodes alone (the first m points)
      const double* gaps = sc.node_gaps.data() + j * m;
      for (int64_t j2 = 0; j2 < m; ++j2) {
        if (j2 != j) l *= d[j2] / gaps[j2];
      }
      const double scale = omega * l / total;
      double* row = sum.data() + j * K;
      for (int64_t k = 0; k < K; ++k) row[k] += scale * p[k];
    }
  }
}

/// The moments of one piece, sub-intervals doubled until two successive
/// sums agree to rounding, written where its nodes' moments go. Rounding
/// here is that of the nodes' places: a node τ is a double, within
/// ε·|τ|/2 of where the rule puts it, and so are the sub-intervals' cuts,
/// so the sums can be trusted no closer than about ε·max(|a|, |b|) (the
/// integrand is at most about 1: p ≤ 1 and ℓ_j of a few nodes). On a piece
/// much shorter than its distance from 0 the sums differ by that much at
/// every doubling and never agree to ε (b − a): 0.3 % of the real-size
/// run's pieces went to 256 sub-intervals, and the 13 % past 2 took 60 %
/// of the evaluations.
void integrate_piece(const PieceNodes& pn, PieceScratch& sc) {
  constexpr double kEps = kMachineEps;
  const double a = pn.a, b = pn.b;
  const int64_t m = pn.m;
  sc.node_gaps.resize(static_cast<size_t>(m * m));
  for (int64_t j = 0; j < m; ++j) {
    for (int64_t j2 = 0; j2 < m; ++j2) sc.node_gaps[j * m + j2] = pn.xs[j] - pn.xs[j2];
  }
  sc.tau_gaps.resize(pn.xs.size());
  std::vector<double> coarse, finer;
  piece_moments(pn, 1, sc, coarse);
  for (int64_t S = 2, halving = 1;; S *= 2, ++halving) {
    piece_moments(pn, S, sc, finer);
    double diff = 0;
    for (size_t i = 0; i < finer.size(); ++i) diff = std::max(diff, std::abs(finer[i] - coarse[i]));
    // Stop at rounding, or before sub-intervals too short to be distinct.
    const bool too_short = (b - a) / static_cast<double>(2 * S) <= 16 * kEps * std::max(std::abs(a), std::abs(b));
    if (diff <= 4 * kEps * std::max({b - a, std::abs(a), std::abs(b)}) || halving >= kMaxHalvings || too_short) break;
    std::swap(coarse, finer);
  }
  for (int64_t j = 0; j < pn.m; ++j) std::copy(finer.begin() + j * pn.K, finer.begin() + (j + 1) * pn.K, pn.out[j]);
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> softmax_moments(const PieceRound& rd, const torch::Tensor& node_logits,
                                                        const torch::Tensor& moment_logits,
                                                        const torch::Tensor& end_logits) {
  const torch::Tensor zn = node_logits.contiguous(), ze = end_logits.contiguous();
  const torch::Tensor zm = moment_logits.defined() ? moment_logits.contiguous() : torch::Tensor();
  const int64_t K = zn.size(1);
  const double* zn_p = zn.data_ptr<double>();
  const double* ze_p = ze.data_ptr<double>();
  const double* zm_p = zm.defined() ? zm.data_ptr<double>() : nullptr;
  torch::Tensor v = torch::zeros({rd.rows, K}, zn.options()), vm = torch::zeros({rd.moment_rows, K}, zn.options());
  PieceScratch sc;
  sc.z.resize(K);
  sc.p.resize(K);
  for (int64_t pc = 0; pc < rd.np; ++pc) {
    const int64_t r0 = rd.first[pc], g = rd.first[pc + 1] - r0;
    const int64_t m0 = rd.mfirst[pc], e = rd.mfirst[pc + 1] - m0;
    PieceNodes pn;
    pn.m = g + e;
    pn.K = K;
    pn.a = rd.ends[2 * pc];
    pn.b = rd.ends[2 * pc + 1];
    for (int64_t j = 0; j < g; ++j) {
      pn.xs.push_back(rd.t[r0 + j]);
      pn.zs.push_back(zn_p + (r0 + j) * K);
      pn.out.push_back(v.data_ptr<double>() + (r0 + j) * K);
    }
    for (int64_t j = 0; j < e; ++j) {
      pn.xs.push_back(rd.mt[m0 + j]);
      pn.zs.push_back(zm_p + (m0 + j) * K);
      pn.out.push_back(vm.data_ptr<double>() + (m0 + j) * K);
    }
    pn.xs.push_back(pn.a);
    pn.zs.push_back(ze_p + 2 * pc * K);
    pn.xs.push_back(pn.b);
    pn.zs.push_back(ze_p + (2 * pc + 1) * K);
    pn.bary.assign(pn.xs.size(), 1.0);
    for (size_t i = 0; i < pn.xs.size(); ++i) {
      for (size_t i2 = 0; i2 < pn.xs.size(); ++i2) {
        if (i2 != i) pn.bary[i] /= pn.xs[i] - pn.xs[i2];
      }
    }
    integrate_piece(pn, sc);
  }
  return {v, vm};
}

}  // namespace pathkernel
