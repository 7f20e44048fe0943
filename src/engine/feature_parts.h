// The parts of test features shared by their integrands (features.cpp,
// layered_features.cpp, module_features.cpp): internal to the engine.
#pragma once

#include <vector>

#include <torch/torch.h>

#include "pathkernel/features.h"
#include "pathkernel/segment.h"

namespace pathkernel {

/// Per-row J(w(t_r), x_r) dw of a pass, [K, R], for its signals: the
/// directions its forward pass formed where it kept them.
torch::Tensor segment_dot(const SegmentEvaluator& ev, const SegmentPass& pass,
                          const std::vector<torch::Tensor>& signals);

/// Signals of a pass for K cotangents at once, c [K, R, K_out] (on the
/// outputs, or with `of_logits` on the logits): per param layer [K, R, ...].
std::vector<torch::Tensor> batched_signals(const SegmentEvaluator& ev, const SegmentPass& pass,
                                           const torch::Tensor& c, bool of_logits = false);

/// The cotangents e_k of every output k on every row: [K, R, K].
torch::Tensor unit_cotangents(const SegmentEvaluator& ev, int64_t rows, const torch::TensorOptions& opts);

/// Signals for every output k (with `of_logits`, every logit) of a pass,
/// per layer as [K, R, ...].
std::vector<torch::Tensor> all_signals(const SegmentEvaluator& ev, const SegmentPass& pass, bool of_logits = false);

/// δ_iᵀ W a_i of a Linear layer on flat rows for every test row's weight
/// block W: w [n, K, out, in] (the layer's part of dense features [n, K,
/// P]), training rows' inputs a [B, in] and signals δ [B, out]: [n, B, K].
/// W a_i as n·K products that share a's matrix (no copy of w, which a
/// product of w as one [n·K·out, in] matrix would make).
torch::Tensor linear_rows_contraction(const torch::Tensor& w, const torch::Tensor& a, const torch::Tensor& delta);

/// Per-sample gradients of layer l (weight, then bias) from training
/// signals t: [B, Q], those form_sample_gradients kept when it did. A
/// Module's signals are its per-sample gradients [B, P] already.
torch::Tensor layer_sample_gradients(const SegmentEvaluator& ev, const TrainSignals& t, size_t l);

/// The output positions of a convolution (stride 1, dilation 1, padding
/// `padding`, kernel kh × kw) that read input unit (y[m], x[m]), each with
/// the kernel offset it reads it through: v [K, R, C', Ho, Wo] (values on
/// the output, K first) at row row[m] and output position (y + padding − i,
/// x + padding − j), [M, kh, kw, K, C'], zero where that position falls
/// outside the output. Gathered from v, no copy of it.
torch::Tensor conv_windows(const torch::Tensor& v, const torch::Tensor& row, const torch::Tensor& y,
                           const torch::Tensor& x, int64_t padding, int64_t kh, int64_t kw);

/// v [K, R, ...] summed over the rows of each group: group [R] in [0,
/// groups), [K, groups, ...].
torch::Tensor sum_by_group(const torch::Tensor& v, const torch::Tensor& group, int64_t groups);

/// Mends of a selection (units a piece routes elsewhere than its test
/// point's first piece) taken together: each takes kh · kw · K · C' values of
/// a convolution's windows (23 KB on the user CNN's second convolution), and
/// a step of many first-site kinks has thousands.
constexpr int64_t kMendChunk = 256;

/// v over a first selection's S slots (Route::first_selection): v itself
/// where S is 1 (the same bits, without a pass over v).
torch::Tensor over_slots(const torch::Tensor& v, int64_t S);

/// A first selection's entries (Route::first_selection) as units of layer
/// 0's output and their weights: an entry u ≥ 0 is unit u at weight 1, −1
/// none (unit 0 at weight 0), −2 − u unit u at `slope` (a leaky ReLU's
/// negative unit). Weights of 1 and 0 multiply exactly.
struct SelectionSources {
  torch::Tensor unit;    ///< int64, the entries' shape
  torch::Tensor weight;  ///< float64, the entries' shape
};
SelectionSources selection_sources(const torch::Tensor& selection, double slope);

/// Layer 0's output v [R, U0] at layer 1's input as a first selection
/// `selection` [R, U1, S] routes it (Route::first_selection; `slope` its
/// leaky ReLU's, selection_sources): per unit the mean of its S units'
/// weighted values, [R, U1].
torch::Tensor routed_by_selection(const torch::Tensor& v, const torch::Tensor& selection, double slope = 0);

/// Each group's first row, [groups]: group [R] in [0, groups); row 0 for a
/// group without rows (whose sums are zero).
torch::Tensor first_of_each_group(const torch::Tensor& group, int64_t groups);

/// Layer features' block J̄ [K, n, Q]: `block`, or the one its hidden
/// factors give (LayerFeatures::HiddenFactors) for n test points.
torch::Tensor dense_block(const LayerFeatures& lf, int64_t n);

/// Hidden factors against K' sets of training signals sig [B, H] of rows
/// whose inputs, with the bias's column of ones, are a [B, cols]:
/// Σ_{h,j} J̄_k[h, j] δ_h a_j per test point, [K, n, K', B].
torch::Tensor hidden_contract(const LayerFeatures::HiddenFactors& hf, const torch::Tensor& a,
                              const std::vector<torch::Tensor>& sig, int64_t n);

/// Hidden factors against a direction of the layer, v [H, cols] (its
/// weight, then its bias's column): J̄ v per test point, [K, n].
torch::Tensor hidden_dot(const LayerFeatures::HiddenFactors& hf, const torch::Tensor& v, int64_t n);

/// Whether passes must keep an autograd graph for their signals.
bool track_passes(const SegmentEvaluator& ev);

/// Measures the certificate of assembled features f along dw [P]: f.gap
/// [n, K] = J̄ dw − (f1 − f0), and its largest entry relative to
/// max(1, |f0|) in f.certificate_gap.
void measure_certificate(const SegmentEvaluator& ev, TestFeatures& f, const torch::Tensor& dw);

/// Test features of points x [n, ...] on a route whose layers give their
/// signals (own networks, the structured TorchScript route), all on this
/// thread (layered_features.cpp).
TestFeatures layered_test_features(const SegmentEvaluator& ev, const torch::Tensor& x, const QuadratureOptions& q);

/// layered_test_features of x in one group of points per thread where the
/// route allows it (point_groups.h), joined.
TestFeatures layered_features_in_groups(const SegmentEvaluator& ev, const torch::Tensor& x,
                                       const QuadratureOptions& q);

/// Layered routes' training signals for loss cotangents u [B, K] of a pass at t = 0.
TrainSignals layered_loss_signals(const SegmentEvaluator& ev, const SegmentPass& pass, const torch::Tensor& u);

/// Layered routes' training signals for every output of rows x at t [B].
std::vector<TrainSignals> layered_output_signals(const SegmentEvaluator& ev, const torch::Tensor& x,
                                                 const torch::Tensor& t);

/// Layered routes' feature layout (features.h).
FeatureLayout layered_feature_layout(const SegmentEvaluator& ev, const torch::Tensor& example);

class AutogradRoute;

/// Test features of points x [n, ...] on the generic route `route` (ev's):
/// per-row Jacobians by autograd, one dense block (module_features.cpp).
TestFeatures module_test_features(const SegmentEvaluator& ev, const AutogradRoute& route, const torch::Tensor& x,
                                  const QuadratureOptions& q);

}  // namespace pathkernel
