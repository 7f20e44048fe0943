// The certified integrator along one segment (docs/math.md §7): the pieces
// of [0,1] per test point, split at kinks, the exact-piece and adaptive
// Gauss–Legendre rules, the certificate test of each piece and its share of
// the error budget, and the refinement of pieces that fail it.
//
// The integrator knows nothing of networks. What it integrates is an
// Integrand: it evaluates a round of pieces (their Gauss nodes as rows, and
// their ends), reports each piece's certificate gap |Σ ω J dw − (f(b) −
// f(a))|, finds the kinks inside failed pieces and keeps the rows of
// accepted ones. Test features (features.h) on every route are integrands;
// the test–test product kernel (product_kernel.h) integrates on the pieces
// they were accepted on, with the rules here.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "pathkernel/quadrature.h"

namespace pathkernel {

/// Unit roundoff of double, times 2 (machine epsilon).
constexpr double kMachineEps = 2.220446049250313e-16;
/// Kinks closer than this (in t) to a piece end or to each other are merged:
/// the integral over such a sliver is below the rounding of f(b) − f(a).
constexpr double kMinPiece = 64 * kMachineEps;
/// Splits after which a piece's gap that no longer halves is taken as
/// rounding up to 64 ε of its scale (up to 16 ε before): piece_accepted.
constexpr int kStuckDepth = 4;

/// A sub-interval [a, b] of one test point's segment.
struct Piece {
  int64_t point;
  double a, b;
  int depth;
  double parent_gap = std::numeric_limits<double>::infinity();  ///< certificate gap of the piece it was split from
  bool full = false;  ///< take the exact nodes (nodes_for), after fewer failed without a kink
};

/// One round of adaptive Gauss: the pieces it evaluates, laid out as rows.
/// Piece p owns rows first[p] .. first[p+1]-1 (its nodes) and end rows 2p,
/// 2p+1 (its ends a and b). With split moments (log-softmax pieces of a
/// piecewise-linear network), it also owns moment rows mfirst[p] ..
/// mfirst[p+1]-1 (none for a piece that is not split): nodes where only the
/// softmax factor's single cotangent is walked back (docs/math.md §7).
struct PieceRound {
  int64_t np = 0, rows = 0, moment_rows = 0;
  std::vector<int64_t> first;                     ///< [np + 1]
  std::vector<int64_t> point, piece_of;           ///< per row: test point, piece
  std::vector<double> t, w;                       ///< per row: node and weight
  std::vector<int64_t> end_point;                 ///< [2 np]: test point of each end
  std::vector<double> ends;                       ///< [2 np]: a, b of each piece
  std::vector<int64_t> mfirst;                    ///< [np + 1]
  std::vector<int64_t> mpoint, mpiece_of;         ///< per moment row: test point, piece
  std::vector<double> mt;                         ///< per moment row: its node
};

/// The fixed rule of a riemann:T or dpk spec (not for gauss).
QuadratureRule fixed_rule(const QuadratureSpec& spec);

/// The adaptive rule's Gauss–Legendre nodes on a piece of length h:
/// ⌈gauss_nodes·√h⌉, between min(min_nodes, gauss_nodes) and gauss_nodes.
int64_t adaptive_nodes(const QuadratureOptions& q, double h);

/// Gauss–Legendre nodes for a piece: adaptive_nodes of its length. When
/// `exact` > 0 (the nodes that integrate a piece of a piecewise-linear
/// network exactly, whatever its length) never more than that, and that
/// many on a piece marked `full`: on a network with many kinks most pieces
/// are short enough for fewer nodes to pass the certificate, and one that
/// fails without a kink inside is retried with all of them rather than split.
int64_t nodes_for(const QuadratureOptions& q, const Piece& pc, int64_t exact);

/// A piece's nodes when its log-softmax integrand is split (docs/math.md §7):
/// of a budget of m interpolation nodes, ⌈m/2⌉ Gauss–Legendre nodes carry
/// the logits' Jacobian (every output's cotangent) and the others, the
/// Gauss nodes of the next lower order for odd m and of the next higher for
/// even m (the zeros of consecutive Legendre polynomials interlace, so no
/// node repeats), carry the softmax factor alone.
int64_t logit_nodes(int64_t m);
int64_t moment_nodes(int64_t m);

/// Whether splitting a piece of m nodes and K outputs saves work, counting
/// a forward pass and each cotangent walked back as one: m (K + 1) whole,
/// against ⌈m/2⌉ (K + 1) + 2 · moment nodes split (not for m = 2 and K ≤ 3).
bool split_pays(int64_t m, int64_t outputs);

/// Takes the pieces of the next round from the front of `pending`: at most
/// max_rows nodes, at least one piece. `pending` keeps them, `next` receives
/// the others (to wait for the next round), so memory stays bounded.
/// `split_outputs` > 0 (log-softmax pieces with that many outputs): pieces
/// are split into Gauss and moment nodes where that saves work.
PieceRound next_round(std::vector<Piece>& pending, std::vector<Piece>& next, const QuadratureOptions& q,
                      int64_t max_rows, int64_t exact_nodes, int64_t split_outputs);

/// Splits `pc` at the sorted points `cuts` (those inside it), else at its
/// midpoint, appending the parts to `out` one level deeper, with `gap` as
/// their parent's gap.
void split(const Piece& pc, double gap, const std::vector<double>& cuts, std::vector<Piece>& out);

/// Whether a piece's certificate gap |Σ ω J dw − (f(b) − f(a))| is accepted;
/// `scale` is max(1, |f(w_s, x)|) of its test point. The piece's share of
/// the budget is tol · scale by length, with a floor of 8 ε · scale for the
/// rounding of f(b) − f(a) itself; a gap at rounding level (64 ε · scale)
/// that splitting no longer halves, and a piece max_depth deep, pass too.
bool piece_accepted(const QuadratureOptions& q, const Piece& pc, double gap, double scale);

/// What the integrator integrates over n test points' segments [0,1].
class Integrand {
 public:
  virtual ~Integrand() = default;

  /// Test points (segments) integrated.
  virtual int64_t points() const = 0;
  /// Integrates with a fixed rule (riemann:T, dpk): every point at every node.
  virtual void integrate_fixed(const QuadratureRule& rule) = 0;
  /// Per test point, max(1, |f(w_s, x)|): the scale of its certificate.
  virtual std::vector<double> scales() = 0;
  /// Per test point, the kinks found before integrating (any order; the
  /// integrator merges them into breaks).
  virtual std::vector<std::vector<double>> initial_kinks() = 0;
  /// Nodes that integrate a piece exactly (nodes_for), 0 for none.
  virtual int64_t exact_nodes() const { return 0; }
  /// Outputs of log-softmax pieces split into Gauss and moment nodes
  /// (next_round), 0 for none.
  virtual int64_t split_outputs() const { return 0; }
  /// Node rows per round at most.
  virtual int64_t max_rows() const = 0;
  /// Evaluates a round's rows and ends: per piece, its certificate gap (the
  /// largest over the outputs).
  virtual std::vector<double> certificate_gaps(const PieceRound& rd) = 0;
  /// The kinks inside the round's pieces `failed` (ascending piece indices),
  /// sorted, one list per failed piece.
  virtual std::vector<std::vector<double>> kinks_in(const PieceRound& rd, const std::vector<int64_t>& failed) = 0;
  /// Keeps the rows (nodes and moment rows) of the round's pieces `accepted`.
  virtual void accept(const PieceRound& rd, const std::vector<int64_t>& accepted) = 0;
};

/// Integrates `f` with the rule q.spec: a fixed rule once, or adaptive Gauss
/// (pieces split at the initial kinks, each round's failed pieces split at
/// the kinks inside them, else retried with the exact nodes, else halved)
/// until every piece is accepted. Returns, per test point, the sorted ends of
/// its accepted pieces ({0, 1} for a fixed rule).
std::vector<std::vector<double>> integrate(Integrand& f, const QuadratureOptions& q);

}  // namespace pathkernel
