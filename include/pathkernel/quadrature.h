// Quadrature in t along one segment: rules on [0,1], the --quadrature spec,
// and the root finding that locates kinks (docs/math.md §7).
//
// The test feature J̄_s(x) = ∫_0^1 J(w_s + tΔw_s, x) dt has kinks where a
// pre-activation crosses 0; between kinks it is smooth, so it is integrated
// with Gauss–Legendre piece by piece. Riemann and the single left point are
// kept to reproduce the paper and Domingos' discrete path kernel.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "pathkernel/module_route.h"

namespace pathkernel {

/// A quadrature rule: nodes t_j and weights w_j, both of length n, so that
/// ∫ f ≈ Σ_j w_j f(t_j). Rules on [0,1] have nodes in [0,1] and Σ_j w_j = 1;
/// a rule on [a,b] has Σ_j w_j = b − a.
struct QuadratureRule {
  std::vector<double> nodes;    ///< [n], ascending
  std::vector<double> weights;  ///< [n], positive
};

/// n-point Gauss–Legendre rule on [a,b]: n nodes, ascending, symmetric about
/// (a+b)/2, with positive weights summing to b − a. Exact for polynomials of
/// degree <= 2n−1. Nodes and weights are computed by Newton's method on the
/// Legendre recurrence in extended precision (long double) and rounded once,
/// so they are accurate to about an ulp; the rules are cached by n.
/// Throws Error unless 1 <= n <= 10000 and a < b are finite.
QuadratureRule gauss_legendre(int n, double a = 0.0, double b = 1.0);

/// Composite Gauss–Legendre: the n-point rule on each sub-interval
/// [breaks[k], breaks[k+1]], concatenated; (breaks.size() − 1)·n nodes,
/// ascending. `breaks` must be finite and strictly ascending, with at least
/// two entries (typically the output of breakpoints()). Throws Error otherwise.
QuadratureRule composite_gauss_legendre(int n, const std::vector<double>& breaks);

/// The paper's Riemann rule with T nodes on [0,1]: left endpoints t_j = j/T
/// and weights 1/T, j = 0..T−1. Converges like 1/T. Throws Error unless T >= 1.
QuadratureRule riemann(int T);

/// Domingos' discrete path kernel: one node at t = 0 with weight 1
/// (the same rule as riemann(1)).
QuadratureRule left_point();

/// A parsed --quadrature option: "gauss" (adaptive Gauss–Legendre, the
/// default), "riemann:T" (T in [1, 100000]) or "dpk".
struct QuadratureSpec {
  enum class Kind { Gauss, Riemann, Dpk } kind = Kind::Gauss;
  int nodes = 0;  ///< T for Kind::Riemann, 0 otherwise

  /// Parses a spec. Throws Error on an unknown name (the message lists
  /// "gauss, riemann:T, dpk") or a bad T (the message shows the value and
  /// says that T must be an integer in [1, 100000]).
  static QuadratureSpec parse(const std::string& text);

  /// The canonical text: "gauss", "riemann:100" or "dpk"; parse(str()) round-trips.
  std::string str() const;
};

/// How test features are integrated along a segment (integrator.h).
struct QuadratureOptions {
  QuadratureSpec spec;  ///< gauss (default), riemann:T, dpk
  double tol = 1e-14;   ///< certificate tolerance per step, relative to max(1, |f(w_s, x)|)
  /// When > 0, the certificate budget of a whole run, relative to max(1, |f|):
  /// each of its N steps gets run_tol / N in place of tol (for_run). The
  /// kernel machine's error is the sum of the steps' signed certificate gaps,
  /// so the budget bounds it, up to the floor of 8 ε per step below which a
  /// gap is the rounding of f itself (docs/math.md §7).
  double run_tol = 1e-12;
  int gauss_nodes = 8;  ///< Gauss–Legendre nodes on a piece of length 1 (ceil(n·√h) on length h)
  int min_nodes = 3;    ///< fewest nodes on a short piece
  /// For a piecewise-linear network (the route's polynomial_degree()
  /// L > 0), integrate each piece exactly with the nodes its polynomial
  /// structure needs, whatever its length: ⌈L/2⌉ Gauss nodes for logits,
  /// and for log-softmax L nodes with weights that integrate the softmax
  /// factor over the interpolated logits (docs/math.md §7); fewer on a
  /// short piece where the rule below takes fewer, all of them if that
  /// fails the certificate. false: the ⌈gauss_nodes·√h⌉ rule for every network.
  bool exact_pieces = true;
  int scan_intervals = 16;  ///< forward-only scan of [0,1] for kinks before integrating
  /// Locate kinks as roots of the fitted pre-activation polynomials (kinks.h):
  /// 40% fewer forward rows on the MNIST CNN at the same error, since the
  /// exact pieces and the run's budget (docs/math.md §7). false: Illinois
  /// false position alone, to a 4-ulp bracket (the reference).
  bool fit_kinks = true;
  /// Whether the last kink site is held (docs/math.md §7, "The last site's
  /// switches, integrated locally") where the route allows it
  /// (KinkHints::last_site_local) and the pieces are exact: pieces end at
  /// the earlier sites' kinks only, and the last site's switches inside a
  /// piece enter through scalar integrals over the piece's interpolants, at
  /// L − 1 nodes a piece. Hidden: the site of param layer L − 3 held through
  /// the hidden Linear layer L − 2 and its ReLU (KinkHints::hidden_site_local;
  /// docs/math.md §7, "Held through a hidden layer"): pieces end at the
  /// earlier sites' kinks and at the hidden layer's, which are found on the
  /// pieces' interpolants like the held site's switches; L − 2 nodes a piece. Auto: Local
  /// where that is no more nodes a piece than the pieces' own rule (L = 3),
  /// else Hidden where the route allows it and it is no more (L = 4, 5);
  /// Local: wherever the route allows it; Pieces: every kink ends a piece
  /// (the reference).
  enum class LastSite { Auto, Local, Hidden, Pieces };
  LastSite last_site = LastSite::Auto;
  /// Whether a piece's first two param layers are taken from the sums of
  /// its rows' signals at layer 1 (docs/math.md §7, "One walk per test
  /// point below layer 1"), where the first layer's input is fixed and the
  /// layers between it and layer 1 only select (the own and chain routes):
  /// the rows walk back to layer 1 alone, and layer 1's input gradient and
  /// a convolution's weight gradient are formed once per test point and
  /// step. false: every row walks back to the first layer (the reference).
  bool piece_pairs = true;
  int64_t max_rows = 512;  ///< integrand evaluations per batched pass (bounds memory)
  int max_depth = 30;   ///< halvings of a piece before it is accepted as is
  /// TorchScript modules: the structured route where every parameter has a
  /// rule (Auto), or autograd alone (Generic), as a reference or a fallback.
  ModuleRoute route = ModuleRoute::Auto;

  /// These options for a run of `steps` steps: tol = run_tol / steps when
  /// run_tol > 0, else unchanged.
  QuadratureOptions for_run(int64_t steps) const;
};

/// A root of a continuous scalar function g on [a,b] (a <= b, finite) where
/// g(a) and g(b) have opposite signs or one of them is 0 (then that end is
/// returned). Brent's method (inverse quadratic interpolation and secant
/// steps, safeguarded by bisection) keeps a bracket of the sign change and
/// stops when g is exactly 0 or the bracket is at most about 4 ulp wide; the
/// returned end of the bracket is the one with the smaller |g|.
/// Throws Error if there is no sign change or g returns a non-finite value.
/// Stores the number of evaluations of g in *evaluations when it is non-null
/// (also when it throws).
double find_root(const std::function<double(double)>& g, double a, double b,
                 int* evaluations = nullptr);

/// Zero crossings in the open interval (0,1) of the affine functions
/// p_u(t) = p0[u] + t·(p1[u] − p0[u]), u = 0..U−1 (a first-layer
/// pre-activation along a segment is affine in t). p0 and p1 are [U].
/// A unit crosses when p0[u] and p1[u] have strictly opposite signs; the
/// crossing t = p0/(p0 − p1) is computed in long double and rounded once.
/// Units with p1 == p0 and crossings at (or rounding to) t = 0 or t = 1 are
/// left out. Returns the crossings sorted, without duplicates. Throws Error on a size mismatch or a
/// non-finite value.
std::vector<double> affine_crossings(const std::vector<double>& p0, const std::vector<double>& p1);

/// Merges break points into the breaks of a composite rule on [0,1]: sorts,
/// drops points outside (0,1) (and NaN), and returns {0, ..., 1} in which
/// consecutive breaks are at least `min_gap` apart: in ascending order, a
/// point closer than `min_gap` to the last kept break (0 at first) or to 1 is
/// dropped, so every input point in (0,1) lies within `min_gap` of an output
/// break. Duplicates are merged even when min_gap is 0. Throws Error unless
/// min_gap >= 0 and finite.
std::vector<double> breakpoints(std::vector<double> points, double min_gap = 1e-12);

}  // namespace pathkernel
