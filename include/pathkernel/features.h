// Test features along a path segment and their structured contractions.
//
// The test feature of step s is J̄_s(x) = ∫_0^1 J(w_s + t dw_s, x) dt (K x P
// per test point). It is never formed as a K x P matrix: it is kept as rows
// (test point, quadrature node t_r, weight ω_r) with, per parameterised
// layer, the layer input a_r and the backprop signals δ_{k,r} of every output
// k. For a Linear layer ∂f_k/∂W = δ_k a^T, so
//   <J̄_k(x), δ_i a_i^T + δ_i> = Σ_r ω_r (δ_{k,r}·δ_i)(a_r·a_i + 1),
// evaluated as GEMMs over rows and training points. Conv2d layers use the
// dense block per test point (C_out x C_in·k·k plus bias), contracted with
// per-sample im2col gradients, which are small.
//
// Quadrature (see quadrature.h): gauss, riemann:T, or dpk (one node at t = 0).
// gauss is adaptive Gauss–Legendre: [0,1] is split at every kink (the first
// layer's ReLU kinks in closed form, the others found by a forward-only scan
// and root finding, see kinks.h), then each piece is refined until the free
// certificate J̄_s(x) dw_s = f(w_{s+1},x) − f(w_s,x) holds on it, splitting
// at kinks the scan missed, else at the midpoint.
#pragma once

#include <vector>

#include <torch/torch.h>

#include "pathkernel/quadrature.h"
#include "pathkernel/segment.h"

namespace pathkernel {

/// One parameterised layer's part of J̄, in the form its rule keeps it. The
/// form is fixed per layer when the features are built (by the layer's kind
/// and input); every consumer switches on it.
struct LayerFeatures {
  enum class Form {
    /// A Linear layer after the first: its rows' inputs and signals, since
    /// ∂f_k/∂W = δ_k aᵀ is contracted faster than formed.
    Rows,
    /// The first Linear layer on flat rows, whose input is the same at
    /// every node of a test point (SegmentEvaluator::first_input_fixed):
    /// the rows collapse to Σ_r ω_r δ_r per test point. (A first layer of
    /// another kind sums its rows' signals the same way, then forms its
    /// Dense block once per point.)
    Summed,
    /// Any other layer (Conv2d, a Linear on a sequence, a module's whole
    /// parameter vector on the generic route): the block J̄ itself.
    Dense,
  };
  Form form = Form::Dense;
  torch::Tensor inputs;   ///< Rows: a_r [R, in]; Summed: the layer's input [n, in]; Dense: undefined
  torch::Tensor signals;  ///< Rows: δ_{k,r} [K, R, out]; Summed: Σ_r ω_r δ_{k,r} [K, n, out]; Dense: undefined
  torch::Tensor block;    ///< Dense: J̄ [K, n, Q], weight then bias; else undefined
  /// A held logits' layer (docs/math.md §7), kept Dense, also has its
  /// block's factors: output k's block is e_k ⊗ h − ph (weight, then bias),
  /// with held_h [n, in (+1 with a bias)] the rows ∫h (and the pieces'
  /// length) and held_ph [n, K, in (+1)] the rows ∫p hᵀ (and ∫p). The
  /// contractions take them, K times fewer products than the block.
  /// Undefined otherwise.
  torch::Tensor held_h, held_ph;
  /// Held through a hidden layer (QuadratureOptions::LastSite::Hidden),
  /// that hidden Linear layer keeps its block J̄ as factors and `block` is
  /// undefined. Per group g of one test point's pieces that share the
  /// layer's ReLU mask D_g, output k's part of the block is
  /// D_g (W[k] ⊗ h0 + dW[k] ⊗ h1 − Wᵀ p0 − dWᵀ p1) [H, in] (the bias the
  /// column of an input's 1), with W, dW [K, H] the logits' layer at the
  /// segment's start and its direction. Against a training batch the
  /// factors take products with the batch's inputs and signals alone,
  /// where the block ([K, n, H·in]: 8 MB a test point on a user CNN with a
  /// 64-unit layer of 1,568 inputs) took the batch's per-sample gradients
  /// [B, H·in] each step (docs/math.md §7, "Held through a hidden layer").
  struct HiddenFactors {
    torch::Tensor point;  ///< [G] each group's test point
    torch::Tensor mask;   ///< [G, H] D_g (1 where positive, else 0 or a leaky ReLU's slope)
    torch::Tensor h;      ///< [G, 2, cols] ∫h and ∫t h, then (with a bias) ∫1 and ∫t
    torch::Tensor p;      ///< [G, 2, K, cols] ∫p hᵀ and ∫t p hᵀ, then (with a bias) ∫p and ∫t p
    torch::Tensor w;      ///< [2, K, H] W and dW
    bool bias = false;    ///< whether the layer has a bias: cols = in + 1, else in
    bool defined() const { return point.defined(); }
  };
  HiddenFactors hidden;
};

/// What certifying test features cost and found, summed over test points
/// (and, in a Decomposition, over steps).
struct QuadratureCounts {
  int64_t evaluations = 0;          ///< integrand evaluations (rows), including refined-away ones
  int64_t forward_evaluations = 0;  ///< forward-only rows: kink scan and search, piece ends
  /// moment rows of log-softmax pieces: a forward pass and one backprop each
  /// (the softmax factor's extra interpolation nodes), including refined-away ones
  int64_t moment_evaluations = 0;
  int64_t kinks = 0;                ///< kinks located (ReLU flips and max-pool switches)
  /// Where a piece's first two param layers come from pairs of cotangents
  /// on layer 1 (QuadratureOptions::piece_pairs, and a held site at layer
  /// 1): of the rows' cotangents (K per integrand row, one per moment row),
  /// those walked back to layer 1 alone and those not walked back at all (a
  /// held site whose block comes from the pairs); the pieces whose pair was
  /// formed (its first-layer part of J dw: one row forward through layer
  /// 1); and the pairs' sums per test point and round, each walked through
  /// layer 1 (K cotangents) and, for a convolution, contracted with its
  /// input. Counted for the test side's arithmetic (arithmetic.h).
  int64_t short_cotangents = 0;
  int64_t unwalked_cotangents = 0;
  int64_t pair_pieces = 0;
  int64_t pair_sums = 0;
  /// The same kinks by site, where the route knows it (pathkernel's own
  /// layers and the structured route), kKinkKinds numbers per param layer l
  /// (the ReLU after it, and its max-pool): [3 l] ReLU flips, [3 l + 1]
  /// argmax switches, [3 l + 2] kinks found in closed form, which does not
  /// tell the two apart (the first layer's); empty if none.
  std::vector<int64_t> kinks_by_site;
  enum KinkKind { kReluFlip = 0, kPoolSwitch = 1, kClosedForm = 2, kKinkKinds = 3 };

  /// Counts n kinks of `kind` at the site after param layer `layer`, in
  /// `kinks` and in kinks_by_site.
  void count_kinks(int64_t layer, KinkKind kind, int64_t n = 1) {
    kinks += n;
    const size_t end = static_cast<size_t>(kKinkKinds * (layer + 1));
    if (kinks_by_site.size() < end) kinks_by_site.resize(end, 0);
    kinks_by_site[end - kKinkKinds + kind] += n;
  }

  /// Adds another's counts to these.
  void add_counts(const QuadratureCounts& o) {
    evaluations += o.evaluations;
    forward_evaluations += o.forward_evaluations;
    moment_evaluations += o.moment_evaluations;
    kinks += o.kinks;
    short_cotangents += o.short_cotangents;
    unwalked_cotangents += o.unwalked_cotangents;
    pair_pieces += o.pair_pieces;
    pair_sums += o.pair_sums;
    if (kinks_by_site.size() < o.kinks_by_site.size()) kinks_by_site.resize(o.kinks_by_site.size(), 0);
    for (size_t i = 0; i < o.kinks_by_site.size(); ++i) kinks_by_site[i] += o.kinks_by_site[i];
  }
};

/// Test features of one step for n test points, with their counts.
struct TestFeatures : QuadratureCounts {
  int64_t num_points = 0;
  torch::Tensor point;                 ///< [R] int64: the test point of row r
  torch::Tensor weight;                ///< [R]: the quadrature weight ω_r of row r
  std::vector<LayerFeatures> layers;   ///< per param layer (one Dense layer on the generic route)
  torch::Tensor f0, f1;                ///< [n, K]: f(w_s, x) and f(w_{s+1}, x)
  double certificate_gap = 0;          ///< max |J̄ dw − (f1 − f0)| / max(1, |f0|)
  torch::Tensor gap;                   ///< [n, K]: J̄ dw − (f1 − f0), the step's signed certificate gap
  /// gauss: per test point, the sorted ends of its accepted pieces (0, the
  /// kinks and refinement splits, 1); fixed rules: {0, 1}.
  std::vector<std::vector<double>> breaks;

  /// Whether no layer is Dense: every layer's features are factored.
  bool factored() const;
};

/// Per-sample training signals at w_s: per param layer a_i and δ_i for the
/// loss cotangent u_i = ∂ℓ_i/∂f (so Σ_layers δ_i a_i^T is the per-sample
/// gradient g_i, never formed).
struct TrainSignals {
  std::vector<torch::Tensor> inputs;   ///< per param layer: a_i [B, ...]
  std::vector<torch::Tensor> signals;  ///< per param layer: δ_i [B, ...]
  /// Per param layer: the per-sample gradients g_i [B, Q] where
  /// form_sample_gradients formed them, else empty or undefined (the
  /// contractions then form them for themselves).
  std::vector<torch::Tensor> gradients;
  /// Per param layer: a convolution's input patches u_i [B, C_in·kernel, L]
  /// where its forward pass took them (SegmentPass::patches), which its
  /// per-sample gradients are formed from, until they are; else empty or
  /// undefined.
  std::vector<torch::Tensor> patches;
};

/// Forms t's per-sample gradients for the layers whose contractions need
/// them (those not factored: convolutions, embeddings, Linear layers on
/// unflattened inputs) and t does not hold yet, so that contracting t
/// against several sets of test features forms them once; the patches they
/// were formed from go. Returns the doubles of those it formed less those
/// of the patches that went.
int64_t form_sample_gradients(const SegmentEvaluator& ev, TrainSignals& t);

/// The doubles of t's tensors: inputs, signals, per-sample gradients and patches.
int64_t signal_doubles(const TrainSignals& t);

/// Test features of the segment set in `ev` for test inputs x [n, *input_shape].
TestFeatures test_features(const SegmentEvaluator& ev, const torch::Tensor& x, const QuadratureOptions& options);

/// Training signals at t = 0 for rows x [B, ...] with labels y [B] (or mse
/// targets [B, K]): the per-example loss derivative u_i = ∂ℓ_i/∂f (loss.h)
/// pulled back through the network; with loss weights c [B] (float64),
/// c_i u_i.
TrainSignals train_signals(const SegmentEvaluator& ev, const torch::Tensor& x, const torch::Tensor& y,
                           OutputMap map, LossKind loss = LossKind::CrossEntropy, const torch::Tensor& weights = {});

/// Training signals for the cotangent e_k of every output k (the rows of
/// J(w_s + t_i dw_s, x_i)): K TrainSignals sharing one forward pass. t [B]
/// is each row's position on the segment; undefined means t = 0.
std::vector<TrainSignals> train_output_signals(const SegmentEvaluator& ev, const torch::Tensor& x,
                                               const torch::Tensor& t = {});

/// The tangent kernel J_a J_bᵀ between every row a of `a` and b of `b`
/// (both from train_output_signals): [A, B, K, K], from the layer inputs and
/// signals (per-sample Jacobians are formed for Conv2d layers only).
torch::Tensor tangent_kernel(const SegmentEvaluator& ev, const std::vector<TrainSignals>& a,
                             const std::vector<TrainSignals>& b);

/// The tangent kernel of each row with itself, J_r J_rᵀ: [R, K, K].
torch::Tensor tangent_kernel_rows(const SegmentEvaluator& ev, const std::vector<TrainSignals>& a);

/// The K x K kernel blocks J̄(x_n) J(w_s, x_i)ᵀ between the features and every
/// row of x [B, ...] at t = 0 (K backprops, one forward): [n, B, K, K].
torch::Tensor output_kernel(const SegmentEvaluator& ev, const TestFeatures& f, const torch::Tensor& x);

/// Σ_r ω_r X[:, r, ...] per test point: X [K, R, ...] -> [K, n, ...].
torch::Tensor aggregate(const TestFeatures& f, const torch::Tensor& x);

/// J̄ v for a flat vector v [P]: [n, K].
torch::Tensor apply_features(const SegmentEvaluator& ev, const TestFeatures& f, const torch::Tensor& v);

/// <J̄_k(x_n), g_i> for every test point n, training row i and output k: [n, B, K].
torch::Tensor contract(const SegmentEvaluator& ev, const TestFeatures& f, const TrainSignals& t);

/// J̄ as dense per-point matrices in the flat parameter order: [n, K, P].
torch::Tensor dense_features(const SegmentEvaluator& ev, const TestFeatures& f);

/// The angle in degrees between two test features of the same points as
/// flattened K x P matrices (e.g. the certified J̄_s(x) and the DPK's
/// J(w_s, x)), per test point: [n].
torch::Tensor feature_angle(const SegmentEvaluator& ev, const TestFeatures& a, const TestFeatures& b);

/// <A_k(x_n), g_i> for dense test-side matrices A [n, K, P] (flat parameter
/// order) and every training row i of t: [n, B, K]. Per-sample gradients are
/// never formed for Linear layers (δ_iᵀ A a_i); Conv2d layers use their small
/// per-sample weight gradients.
torch::Tensor contract_dense(const SegmentEvaluator& ev, const torch::Tensor& a, const TrainSignals& t);

/// The form layer l's test features take when its input is `a` (rows first):
/// Dense unless it is a Linear layer on flat rows; Summed for such a first
/// layer whose input is fixed along the segment; else Rows.
LayerFeatures::Form layer_form(const SegmentEvaluator& ev, size_t l, const torch::Tensor& a);

/// What one evaluated row of test features holds, found from one forward
/// pass of `example` [1, ...] at the segment set in `ev`.
struct FeatureLayout {
  /// Doubles one row holds (layer inputs, pre-activations and K signals),
  /// for sizing test-point chunks.
  int64_t doubles_per_row = 0;
  /// Whether every param layer keeps its features factored (Rows or
  /// Summed): a network of Linear layers on flat inputs, whose
  /// decomposition is mostly the contraction with the training rows rather
  /// than the test features.
  bool factored = false;
};

FeatureLayout feature_layout(const SegmentEvaluator& ev, const torch::Tensor& example);

}  // namespace pathkernel
