// Evaluating the network along a straight path segment w(t) = w_s + t dw_s,
// many (input, t) rows at once, with the per-layer signals the exact-kernel
// engine contracts: a segment (w_s, dw_s) and the route that evaluates the
// network on it (route.h: own networks, the structured TorchScript route,
// the generic autograd route).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pathkernel/kinks.h"
#include "pathkernel/model.h"
#include "pathkernel/module_route.h"
#include "pathkernel/route.h"

namespace pathkernel {

/// The network `options` describe, built in float64 whatever its training
/// dtype: the engine evaluates in float64 (the recorded path is float64-exact).
Network engine_network(NetworkOptions options);

class SegmentEvaluator : public KinkSites {
 public:
  /// The route make_route() picks for `net`. A TorchScript module's route
  /// sets the network's weights to points of the segment and remembers
  /// where it left them: give each evaluator a network of its own.
  explicit SegmentEvaluator(Network& net, ModuleRoute route = ModuleRoute::Auto);

  /// Sets the segment: w [P] and dw [P], in the network's dtype.
  void set_segment(const torch::Tensor& w, const torch::Tensor& dw) { route_->set_segment(w, dw); }

  /// Evaluates rows x [R, *input_shape] at t [R]. With `track`, the pass
  /// keeps an autograd graph so signals() can be taken (not on the generic
  /// route: its pass has outputs only).
  SegmentPass forward(const torch::Tensor& x, const torch::Tensor& t, bool track) const {
    return route_->forward(x, t, track);
  }
  /// Test points x [n, ...] on the current segment (Route::segment_points).
  SegmentPoints segment_points(const torch::Tensor& x) const { return route_->segment_points(x); }
  /// Rows `point` of test points at t (Route::forward_points).
  SegmentPass forward_points(const SegmentPoints& points, const torch::Tensor& point, const torch::Tensor& t,
                             bool track) const {
    return route_->forward_points(points, point, t, track);
  }

  /// The route that evaluates the network.
  const Route& path_route() const { return *route_; }
  /// "own", "structured" or "generic", and for a TorchScript module on the
  /// generic route under ModuleRoute::Auto, why ("" otherwise).
  std::string route() const { return route_->name(); }
  const std::string& route_reason() const { return route_->reason(); }

  /// Backprop signals of a tracked pass for cotangent c [R, K] on its
  /// outputs, or with `of_logits` on its logits (before the output map):
  /// one tensor per param layer, shaped like preacts, by autograd. Keeps
  /// the graph for more calls.
  std::vector<torch::Tensor> signals(const SegmentPass& pass, const torch::Tensor& c, bool of_logits = false) const {
    return autograd_signals(pass, c, of_logits);
  }
  /// The signals for K cotangents at once, c [K, R, K_out], the route's
  /// way (own networks: one backward walk over all K·R rows, the pass may be
  /// untracked; the structured route: autograd per cotangent, the pass
  /// tracked): per param layer [K, R, ...].
  std::vector<torch::Tensor> batched_signals(const SegmentPass& pass, const torch::Tensor& c,
                                             bool of_logits = false) const {
    return route_->signals(pass, c, of_logits);
  }

  /// batched_signals() of param layers 1 and above, the first's undefined
  /// (Route::signals_above_first).
  std::vector<torch::Tensor> batched_signals_above_first(const SegmentPass& pass, const torch::Tensor& c,
                                                         bool of_logits = false) const {
    return route_->signals_above_first(pass, c, of_logits);
  }

  /// Signals walked back from cotangents g [K, R, ...] on param layer
  /// `layer`'s pre-activation (Route::signals_from).
  std::vector<torch::Tensor> signals_from(const SegmentPass& pass, size_t layer, const torch::Tensor& g) const {
    return route_->signals_from(pass, layer, g);
  }
  /// signals_from() of param layers 1 and above, the first's undefined
  /// (Route::signals_from_above_first).
  std::vector<torch::Tensor> signals_from_above_first(const SegmentPass& pass, size_t layer,
                                                      const torch::Tensor& g) const {
    return route_->signals_from_above_first(pass, layer, g);
  }
  /// The first param layer's signals of a pair of cotangents on param layer
  /// 1 (Route::first_signals_of_pair).
  torch::Tensor first_signals_of_pair(const SegmentPass& pass, const torch::Tensor& g, const torch::Tensor& g_dw) const {
    return route_->first_signals_of_pair(pass, g, g_dw);
  }
  /// Where the layers between param layers 0 and 1 route layer 1's input
  /// units (Route::first_selection).
  torch::Tensor first_selection(const SegmentPass& pass, const torch::Tensor& rows) const {
    return route_->first_selection(pass, rows);
  }
  /// The first param layer's part of J dw per row of a pair of cotangents
  /// (Route::first_dot_of_pair).
  torch::Tensor first_dot_of_pair(const SegmentPass& pass, const torch::Tensor& rows, const torch::Tensor& selection,
                                  const torch::Tensor& g, const torch::Tensor& g_dw) const {
    return route_->first_dot_of_pair(pass, rows, selection, g, g_dw);
  }
  /// The first param layer's signals of pairs of cotangents summed per
  /// group of rows (Route::first_signals_of_pairs_summed).
  torch::Tensor first_signals_of_pairs_summed(const SegmentPass& pass, const torch::Tensor& rows,
                                              const torch::Tensor& selection, const torch::Tensor& g,
                                              const torch::Tensor& g_dw, const torch::Tensor& group, int64_t groups,
                                              const PairSums& g_sums = {}) const {
    return route_->first_signals_of_pairs_summed(pass, rows, selection, g, g_dw, group, groups, g_sums);
  }
  /// Whether the last kink site can be held (KinkHints::last_site_local).
  bool last_site_local() const { return route_->hints().last_site_local; }
  /// Whether the site below the last hidden layer can be held (KinkHints::hidden_site_local).
  bool hidden_site_local() const { return route_->hints().hidden_site_local; }
  /// The segment's start w [P].
  const torch::Tensor& start() const { return route_->start(); }
  /// The degree in t of the logits on a piece of the segment that crosses
  /// no kink (KinkHints::polynomial_degree).
  int polynomial_degree() const { return route_->hints().polynomial_degree; }
  /// Whether the outputs are the log-softmax of the logits.
  bool log_softmax_output() const { return route_->log_softmax_output(); }

  const std::vector<ParamLayer>& param_layers() const { return route_->param_layers(); }
  int64_t num_outputs() const { return route_->num_outputs(); }
  /// The segment's direction dw [P].
  const torch::Tensor& direction() const { return route_->direction(); }
  /// The kink sites of a pass: tensors [R, ...] whose units' sign changes
  /// (and, with a pool window, argmax switches) are the integrand's kinks.
  const std::vector<torch::Tensor>& kink_values(const SegmentPass& pass) const { return route_->kink_sites(pass); }
  /// Per kink site: whether it feeds a ReLU.
  const std::vector<bool>& relu_after() const override { return route_->hints().relu_after; }
  /// Per kink site: the max-pool window following its ReLU, or 0.
  const std::vector<int64_t>& pool_after() const override { return route_->hints().pool_after; }
  const std::vector<bool>& leaky_after() const override { return route_->hints().leaky_after; }
  /// Site l's average pool window after its ReLU, or 0 (KinkHints::average_after).
  int64_t average_after(size_t l) const { return route_->hints().average_at(l); }
  /// Site l's leaky ReLU's slope, 0 for a ReLU (KinkHints::slope_after).
  double slope_after(size_t l) const { return route_->hints().slope_at(l); }
  /// The kink sites of rows x at t: kink_values of an untracked pass.
  std::vector<torch::Tensor> sites_at(const torch::Tensor& x, const torch::Tensor& t) const override {
    return kink_values(forward(x, t, false));
  }
  /// Whether the first kink site is affine in t (KinkHints).
  bool first_site_affine() const { return route_->hints().first_site_affine; }
  /// Whether the first param layer's input is fixed along a segment (KinkHints).
  bool first_input_fixed() const { return route_->hints().first_input_fixed; }
  int64_t parameter_count() const { return route_->parameter_count(); }

  /// Views of flat vector v [P] as layer l's weight and bias (bias: empty
  /// [0] when the layer has none).
  torch::Tensor weight_of(const torch::Tensor& v, size_t l) const { return route_->weight_of(v, l); }
  torch::Tensor bias_of(const torch::Tensor& v, size_t l) const { return route_->bias_of(v, l); }
  /// The bias view, undefined when the layer has none.
  torch::Tensor bias_or_none(const torch::Tensor& v, size_t l) const { return route_->bias_or_none(v, l); }

 private:
  std::unique_ptr<Route> route_;
};

}  // namespace pathkernel
