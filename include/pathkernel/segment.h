// Evaluating the network along a straight path segment w(t) = w_s + t dw_s,
// many (input, t) rows at once, with the per-layer signals the exact-kernel
// engine contracts.
//
// Rows: row r is input x[r] evaluated at weights w_s + t[r] dw_s. Because
// every parameterised layer is linear in its weights, a Linear or Conv2d
// layer at w(t) is layer(a; W_s) + t layer(a; dW): no per-row weights are
// ever materialised.
//
// A TorchScript module takes one of two routes:
//  - structured: its graph read as parameterised operations (script_graph.h),
//    each one a param layer with its rule (layer_rules.h); every row is
//    evaluated at its own t in one pass of the rewritten graph, and the
//    engine treats it as it treats its own layers. Taken when every
//    parameter has a rule and the rewritten graph agrees with the module.
//  - generic: one parameterised layer of kind Module whose "weight" is the
//    whole flat vector [P] (no bias). Its rows are evaluated by the module
//    itself at the formed weights w_s + t dw_s, one distinct t at a time, and
//    its per-row gradients come from autograd, one row at a time: see
//    module_jacobians() and module_gradients().
//
// For each parameterised layer l the evaluation keeps its input a_l (rows
// first: Linear [R, in], Conv2d [R, C_in, H, W]) and its pre-activation
// output y_l (Linear [R, out], Conv2d [R, C_out, H', W']). The backprop
// signal delta_l = d(c . f)/d y_l for a cotangent c on the outputs has y_l's
// shape.
#pragma once

#include <string>
#include <vector>

#include <torch/torch.h>

#include "pathkernel/model.h"
#include "pathkernel/module_route.h"

namespace pathkernel {

/// One parameterised layer's place in the flat parameter vector.
struct ParamLayer {
  LayerDesc desc;
  int64_t weight_offset = 0, weight_numel = 0;
  int64_t bias_offset = 0, bias_numel = 0;
  std::vector<int64_t> weight_shape;
};

/// The outcome of evaluating rows.
struct SegmentPass {
  torch::Tensor out;                  ///< [R, K] network outputs
  torch::Tensor logits;               ///< [R, K] the outputs before the output map (own and structured routes)
  std::vector<torch::Tensor> inputs;  ///< per param layer: a_l (rows first)
  std::vector<torch::Tensor> preacts; ///< per param layer: y_l (rows first)
  /// Own networks, rows off the segment's start: per param layer the
  /// output's change along the segment, layer(a_l; dW) + db (the forward
  /// pass forms it for y_l), which the certificate's J dw reuses. Empty
  /// otherwise.
  std::vector<torch::Tensor> directions;
  std::vector<torch::Tensor> sites;   ///< structured TorchScript route: its ReLUs' inputs (ScriptPass::sites)
  torch::Tensor t;                    ///< [R] each row's position on the segment (own networks)
  std::vector<torch::Tensor> layer_inputs;  ///< own networks: each layer's input, by layer index
  std::vector<torch::Tensor> argmax;        ///< own networks: a max-pool layer's window argmax, by layer index
};

/// The network `options` describe, built in float64 whatever its training
/// dtype: the engine evaluates in float64 (the recorded path is float64-exact).
Network engine_network(NetworkOptions options);

class SegmentEvaluator {
 public:
  /// `layers` and the flat order come from a built network (see model.h).
  /// A TorchScript module's evaluator sets the network's weights to points
  /// of the segment and remembers where it left them: give each evaluator
  /// a network of its own.
  explicit SegmentEvaluator(Network& net, ModuleRoute route = ModuleRoute::Auto);

  /// Sets the segment: w [P] and dw [P], in the network's dtype.
  void set_segment(const torch::Tensor& w, const torch::Tensor& dw);

  /// Evaluates rows x [R, *input_shape] at t [R]. With `track`, the pass
  /// keeps an autograd graph so signals() can be taken (not for a Module:
  /// its pass has outputs only).
  SegmentPass forward(const torch::Tensor& x, const torch::Tensor& t, bool track) const;

  /// Whether the network is one opaque Module (the generic route).
  bool generic() const { return generic_; }
  /// Whether the network is a TorchScript module on the structured route.
  bool script_structured() const { return script_structured_; }
  /// "own", "structured" or "generic", and for a TorchScript module on the
  /// generic route under ModuleRoute::Auto, why ("" otherwise).
  std::string route() const;
  const std::string& route_reason() const { return route_reason_; }
  /// Module only: per-row Jacobians J(w_s + t_r dw_s, x_r), [R, K, P], by
  /// one forward pass and K backward passes per row.
  torch::Tensor module_jacobians(const torch::Tensor& x, const torch::Tensor& t) const;
  /// Module only: per-row gradients of c_r · f(w_s, x_r) for cotangents
  /// c [R, K], [R, P], by one forward and one backward pass per row.
  torch::Tensor module_gradients(const torch::Tensor& x, const torch::Tensor& c) const;
  /// Module only: the values of its kink sites (Network::forward_with_sites)
  /// for one input x [1, *input_shape] at t, one tensor per site: [1, U_j],
  /// or [1, C, H, W] for a site fused with a max-pool (module_site_windows).
  /// One forward pass.
  std::vector<torch::Tensor> module_sites(const torch::Tensor& x, double t) const;
  /// Module only: per kink site, the window of the max-pool fused with it, or 0.
  const std::vector<int64_t>& module_site_windows() const { return net_->kink_site_windows(); }
  /// Module only: whether the module has kink sites.
  bool module_has_sites() const { return generic_ && net_->kink_sites() > 0; }

  /// Backprop signals of a tracked pass for cotangent c [R, K] on its
  /// outputs, or with `of_logits` on its logits (before the output map):
  /// one tensor per param layer, shaped like preacts. Keeps the graph for
  /// more calls.
  std::vector<torch::Tensor> signals(const SegmentPass& pass, const torch::Tensor& c, bool of_logits = false) const;
  /// Whether hand_signals() can be taken: pathkernel's own networks, whose
  /// layers each have a hand-written backward. Their passes then need no
  /// autograd graph.
  bool hand_backward() const { return !generic_ && !script_structured_; }
  /// Own networks: the signals for K cotangents at once, c [K, R, K_out] (on
  /// the outputs, or with `of_logits` on the logits), by one backward walk
  /// through the layers over all K·R rows: per param layer [K, R, ...], the
  /// same values as K calls of signals(). The pass may be untracked.
  std::vector<torch::Tensor> hand_signals(const SegmentPass& pass, const torch::Tensor& c,
                                          bool of_logits = false) const;

  /// The degree in t of the logits on a piece of the segment that crosses no
  /// kink, when the network is piecewise linear in its input (ReLU, max-pool,
  /// Flatten) and each of its L param layers (Linear, Conv2d) is linear in
  /// its weights: L. Their Jacobian then has degree L − 1 there. 0 when the
  /// network is not of that kind (smooth activations; the generic route).
  int polynomial_degree() const;
  /// Whether the outputs are the log-softmax of the logits.
  bool log_softmax_output() const { return log_softmax_; }

  const std::vector<ParamLayer>& param_layers() const { return params_; }
  int64_t num_outputs() const { return num_outputs_; }
  /// The segment's direction dw [P].
  const torch::Tensor& direction() const { return dw_; }
  /// The kink sites of a pass: tensors [R, ...] whose units' sign changes
  /// (and, with a pool window, argmax switches) are the integrand's kinks.
  /// Own models: every param layer's pre-activation (relu_after() says
  /// which feed a ReLU); the structured TorchScript route: its ReLUs' inputs,
  /// or their max-pools' (pool_after() gives the window).
  const std::vector<torch::Tensor>& kink_values(const SegmentPass& pass) const {
    return script_structured_ ? pass.sites : pass.preacts;
  }
  /// Per kink site: whether it feeds a ReLU.
  const std::vector<bool>& relu_after() const { return relu_after_; }
  /// Per kink site: the max-pool window following its ReLU, or 0.
  const std::vector<int64_t>& pool_after() const { return pool_after_; }
  /// Whether the first kink site is the first layer's pre-activation of the
  /// input itself, affine in t, so that its kinks are closed-form.
  bool first_site_affine() const { return !script_structured_ && !relu_after_.empty() && relu_after_[0]; }
  /// Whether the first param layer's input is the same at every point of a
  /// test point's segment: no parameter comes before it (in an own network's
  /// layer list, or in a TorchScript graph's order, which is topological), so
  /// its input is a function of x alone. Every route but the generic one.
  bool first_input_fixed() const { return !generic_; }
  int64_t parameter_count() const { return parameter_count_; }

  /// Views of flat vector v [P] as layer l's weight and bias (bias: empty
  /// [0] when the layer has none).
  torch::Tensor weight_of(const torch::Tensor& v, size_t l) const;
  torch::Tensor bias_of(const torch::Tensor& v, size_t l) const;
  /// The bias view, undefined when the layer has none.
  torch::Tensor bias_or_none(const torch::Tensor& v, size_t l) const;

 private:
  /// Sets the module's parameters to w_s + t dw_s (Module only).
  void place_module(double t) const;

  /// Whether the rewritten graph evaluates the module's own outputs: rows
  /// at t = 0.3 and 0.8 against the module at the formed weights.
  bool script_graph_agrees();

  std::vector<LayerDesc> layers_;
  std::vector<ParamLayer> params_;
  bool generic_ = false, script_structured_ = false, log_softmax_ = false;
  std::string route_reason_;
  Network net_;  ///< the evaluator's own network (Module only)
  mutable double placed_t_ = -1;  ///< the t whose weights net_ holds; -1: none
  std::vector<bool> relu_after_;
  std::vector<int64_t> pool_after_;
  int64_t num_outputs_ = 0, parameter_count_ = 0;
  torch::Tensor w_, dw_;
};

}  // namespace pathkernel
