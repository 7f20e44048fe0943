// Locating the kinks of the integrand along a path segment (docs/math.md §7).
//
// Along w(t) = w_s + t dw_s the test feature's integrand J(w(t), x) is smooth
// except where a ReLU unit's pre-activation crosses 0 or a max-pool window's
// argmax switches. Kinks are detected by comparing activation patterns at
// sampled t, and each detected one is located by a bracketing root finder:
// Illinois false position with a bisection every fourth round, to a few ulp
// of t. Optionally (fit_polynomials), where no unit upstream switches a
// unit's pre-activation is a polynomial in t (degree l + 1 in param layer l,
// docs/math.md §7): once the finder holds that many + 1 samples of it on
// one piece, the fitted polynomial's root is the kink up to rounding, and a
// pair of evaluations either side of it, as wide as the unit's rounding
// noise, closes the bracket. All brackets are refined together: one
// batched forward pass per round.
//
// The first layer's pre-activation is affine in t, so its kinks are
// closed-form (first_layer_kinks) and the finder can skip that layer.
//
// Only switches the network sees are kinks: where a max-pool follows a ReLU,
// a unit's sign matters only while it is its window's maximum, so the flips
// of the other units are left out.
#pragma once

#include <functional>
#include <vector>

#include <torch/torch.h>

namespace pathkernel {

/// What the kink search evaluates: the kink sites of rows along a segment
/// (tensors [R, ...] whose units' sign changes, and with a pool window
/// argmax switches, are the integrand's kinks) and what is known of them.
/// The engine's segments implement it (segment.h).
class KinkSites {
 public:
  virtual ~KinkSites() = default;
  /// Per kink site: whether it feeds a ReLU.
  virtual const std::vector<bool>& relu_after() const = 0;
  /// Per kink site: the max-pool window following its ReLU, or 0.
  virtual const std::vector<int64_t>& pool_after() const = 0;
  /// Per kink site: whether its activation passes negative values on (a
  /// leaky ReLU of slope > 0), so that its pool's argmax switches are kinks
  /// at any sign. Shorter than the sites (empty by default): the rest are
  /// ReLUs.
  virtual const std::vector<bool>& leaky_after() const;
  /// Whether site l is leaky (leaky_after).
  bool leaky(size_t l) const { return l < leaky_after().size() && leaky_after()[l]; }
  /// The kink sites of rows x [R, *input_shape] at t [R], rows first.
  virtual std::vector<torch::Tensor> sites_at(const torch::Tensor& x, const torch::Tensor& t) const = 0;
};

/// A pair of evaluated rows of the same test point, t_a < t_b, to search for kinks.
struct KinkBracket {
  int64_t row_a = 0, row_b = 0;
};

/// A bracket [lo, hi] of a sign change of a function g, g(lo) = glo and
/// g(hi) = ghi of opposite signs, narrowed by Illinois false position.
struct SignBracket {
  double lo = 0, hi = 0, glo = 0, ghi = 0;
  int side = 0;  ///< the end moved last: −1 lo, +1 hi, 0 neither yet

  /// Moves the end whose sign v (≠ 0) shares to s, which lies in (lo, hi).
  /// When the same end moves twice running, the other end's value is halved
  /// (Illinois), so the next false-position point leaves the stale end.
  /// Returns the end moved: −1 lo, +1 hi.
  int narrow(double s, double v);

  /// The point to evaluate in round `round` of a search: the false-position
  /// point, or the midpoint every fourth round and whenever that point is
  /// not inside (lo, hi), so the bracket at least halves every four rounds.
  double next(int round) const;

  /// Whether the bracket is as narrow as t's own rounding: 4 ulp of its ends.
  bool closed() const;

  /// Narrows the bracket onto g's sign change, one call of g per round
  /// (next, then narrow), until it is closed or `max_rounds` are spent; an
  /// exact zero of g settles both ends there. Returns the rounds spent, that
  /// is the calls of g. The root is midpoint().
  int locate(const std::function<double(double)>& g, int max_rounds);

  double midpoint() const { return 0.5 * (lo + hi); }
};

/// A located kink: the bracket it was found in, where, and what switched:
/// in param layer `layer`'s pre-activation (flattened per row), ReLU unit
/// `plus` crossing 0 (minus = −1), or a max-pool window's argmax switching
/// from unit `minus` to unit `plus`.
struct Kink {
  int64_t bracket = 0;
  double t = 0;
  int64_t layer = 0, plus = 0, minus = -1;
};

struct KinkSearch {
  std::vector<Kink> kinks;          ///< sorted by bracket, then t
  int64_t forward_evaluations = 0;  ///< forward-only rows spent locating
};

/// What a max-pool of k x k windows after a ReLU sees change between the
/// pairs of samples of its input y [rows, C, H, W] at rows at_a[r] and
/// at_b[r] (the same test point; y is pooled once, whichever pairs share
/// a row): the ReLU flips of units that are their window's
/// positive maximum at a or at b (the flips of the others are not kinks of
/// the network), and the argmax switches of windows positive at both ends
/// (one into or out of a zero window is the flip of the unit that crosses 0).
/// After a `leaky` ReLU the pool passes negative maxima on too: the flips of
/// units that are their window's maximum at a or at b, and every argmax
/// switch.
/// Units are indexed in a row of y flattened; windows, in a row of the
/// pooled output flattened.
struct PooledSwitches {
  torch::Tensor flips;     ///< [R, C·H·W] bool
  torch::Tensor switches;  ///< [R, windows] bool
  torch::Tensor from, to;  ///< [R, windows]: the unit each window passes on at a, and at b
};
PooledSwitches pooled_switches(const torch::Tensor& y, const torch::Tensor& at_a, const torch::Tensor& at_b,
                               int64_t k, bool leaky = false);

/// Kinks inside every bracket. `preacts` are the kink sites of the evaluated
/// rows (KinkSites: own models' param layer
/// pre-activations, a TorchScript module's ReLU or fused max-pool inputs; rows first), `point` [rows] the test
/// point of each row (an index into x) and `t` [rows] its position. Every
/// unit whose pattern differs at a bracket's ends is located, so a bracket
/// may yield several kinks; an even number of flips of one unit inside a
/// bracket is not seen (hidden_switches looks for them). With `skip_first_layer`
/// the first layer's units are left out; sites past `preacts`' (a prefix of
/// the network's) are not searched. Without `fit_polynomials` every
/// round is Illinois false position (the reference the fits are tested
/// against). Evaluates at most `rows_per_pass` rows per forward pass.
KinkSearch find_kinks(const KinkSites& ev, const torch::Tensor& x, const std::vector<torch::Tensor>& preacts,
                      const std::vector<int64_t>& point, const std::vector<double>& t,
                      const std::vector<KinkBracket>& brackets, bool skip_first_layer, bool fit_polynomials = false,
                      int64_t rows_per_pass = 512);

/// Per kink site, each row's activation pattern [R, units] (int64): the sign
/// of every ReLU unit (1 or 0), or with a pool per window the unit it passes
/// on (−1 for none; after a leaky ReLU, −2 − the unit for a negative one).
/// Rows with equal patterns are on the same piece.
std::vector<torch::Tensor> activation_patterns(const KinkSites& ev, const std::vector<torch::Tensor>& sites);

/// Switches hidden between the evaluated rows of pieces of a piecewise-linear
/// network: a ReLU unit or a pool window's argmax that switches and switches
/// back between two rows shows the same pattern at both, and the
/// certificate cannot see it either (the nodes all lie on one branch, whose
/// polynomial meets f at the piece's ends). On a piece kink site l is a
/// polynomial of degree l + 1 in t; fitted through the piece's rows, it
/// tells where a unit (or a unit against its window's winner, or the zero
/// line) would cross over to the other side. `pieces` lists per piece its
/// rows of `sites` ascending in t (its ends first and last, its second row
/// the reference pattern), `t` the rows' positions. Returns per piece the t
/// where the fits predict the largest crossing, NaN for none: a candidate
/// for the network to confirm (sites with fewer rows than the degree + 1
/// are not fitted).
std::vector<double> hidden_switches(const KinkSites& ev, const std::vector<torch::Tensor>& sites,
                                    const std::vector<std::vector<int64_t>>& pieces, const std::vector<double>& t);

/// The kinks of the first param layer along the segment, in closed form, for
/// one test point: y0 and y1 are its pre-activations at t = 0 and t = 1
/// (that pre-activation is affine in t). Without a max-pool these are the
/// ReLU units' zero crossings; with one, every break of a window's
/// max(0, max_u y_u(t)), i.e. the ReLU kinks of its maximum and its argmax
/// switches while positive (after a leaky ReLU, every argmax switch and the
/// maximum's zero crossings). Sorted, in (0, 1), no duplicates; empty when no
/// ReLU follows the layer. Throws Error on mismatched shapes or non-finite
/// values.
std::vector<double> first_layer_kinks(const KinkSites& ev, const torch::Tensor& y0, const torch::Tensor& y1);

}  // namespace pathkernel
