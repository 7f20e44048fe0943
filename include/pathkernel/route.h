// A route: one way of evaluating a network along a straight path segment
// w(t) = w_s + t dw_s, many (input, t) rows at once, with what the exact-
// kernel engine needs of it: the rows' outputs and per-layer inputs and
// pre-activations, the backprop signals for cotangents on the outputs, the
// kink sites and what is known of them, and the parameter layers.
//
// Three routes, one file each, chosen by make_route():
//  - own (own_route.cpp): pathkernel's own networks, their layers walked
//    forward and back by hand (every param layer is linear in its weights,
//    so a layer at w(t) is layer(a; W_s) + t layer(a; dW));
//  - structured (script_route.cpp): a TorchScript module whose graph reads
//    as parameterised operations with rules (script_graph.h), every row
//    evaluated at its own t in one pass of the rewritten graph; signals by
//    autograd through it;
//  - generic (autograd_route.cpp): any TorchScript module, one param layer
//    of kind Module whose "weight" is the whole flat vector [P]; rows are
//    evaluated by the module at the formed weights, and per-row Jacobians
//    come from autograd, one row at a time.
//
// Layouts (rows first): for each parameterised layer l a pass keeps its
// input a_l (Linear [R, in], Conv2d [R, C_in, H, W]) and its pre-activation
// output y_l (Linear [R, out], Conv2d [R, C_out, H', W']); signals
// δ_l = d(c · f)/d y_l have y_l's shape, with the cotangents first.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "pathkernel/model.h"
#include "pathkernel/module_route.h"

namespace pathkernel {

class SegmentEvaluator;
struct QuadratureOptions;
struct TestFeatures;
struct TrainSignals;
struct FeatureLayout;

/// One parameterised layer's place in the flat parameter vector.
struct ParamLayer {
  LayerDesc desc;
  int64_t weight_offset = 0, weight_numel = 0;
  int64_t bias_offset = 0, bias_numel = 0;
  std::vector<int64_t> weight_shape;
};

/// Pairs of cotangents g, g_dw on rows (Route::first_signals_of_pairs_summed)
/// summed by group of rows, [K, groups, ...] each; undefined where not formed.
struct PairSums {
  torch::Tensor g, g_dw;
};

/// The outcome of evaluating rows.
struct SegmentPass {
  torch::Tensor out;                  ///< [R, K] network outputs
  torch::Tensor logits;               ///< [R, K] the outputs before the output map (own and structured routes)
  /// A sequence model (sequence.h; the generic route): the outputs at every
  /// position [R, T, K], of which `out` is the decomposed position's.
  /// Undefined otherwise.
  torch::Tensor sequence;
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
  /// Own networks: a dropout layer's factor (dropout_scale), by layer index;
  /// undefined outside a DropoutStep, where it passes its input through.
  std::vector<torch::Tensor> dropout;
  /// Own networks, every row at the segment's start (the training side's
  /// passes): per param layer, a convolution's input patches [R,
  /// C_in·kernel, L] (layer_rules.h), which its product with the weight
  /// took and its per-sample gradients take again; undefined for others.
  std::vector<torch::Tensor> patches;
};

/// The rows `index` [R'] of a pass: every tensor it holds taken at those rows.
SegmentPass rows_of(const SegmentPass& pass, const torch::Tensor& index);

/// Test points x [n, ...] whose rows along the segment a pass evaluates
/// (Route::forward_points), with what a route forms of them once a segment:
/// where the first param layer's input is x itself (no parameter before
/// it), its products at the start (W_s, b_s) and along the direction
/// (dW_s, db_s), each [n, ...] in its output's shape, of which a row at t
/// takes start + t · direction instead of both products of its own.
struct SegmentPoints {
  torch::Tensor x;
  torch::Tensor start, direction;  ///< undefined: every row takes its own products
};

/// Rows `point` [R] of points x [n, ...]: a single point repeated as a view
/// (rows of stride 0, whose first convolution a route forms once), else a copy.
torch::Tensor rows_of_points(const torch::Tensor& x, const torch::Tensor& point);

/// What is known of a route's kink sites (the tensors whose units' sign
/// changes, and with a pool window argmax switches, are the integrand's
/// kinks), for the kink search (kinks.h) and the exact pieces.
struct KinkHints {
  /// Per kink site: whether it feeds a ReLU.
  std::vector<bool> relu_after;
  /// Per kink site: the max-pool window following its ReLU, or 0.
  std::vector<int64_t> pool_after;
  /// Per kink site: the average pool's window following its ReLU, or 0;
  /// empty when no site has one. Every unit's flip is a kink there (the
  /// pool passes each unit's share on); only a held site reads it.
  std::vector<int64_t> average_after;
  /// Per kink site: whether its activation passes negative values on (a
  /// leaky ReLU of slope above 0), so that its pool's argmax switches are
  /// kinks at any sign. Empty when none is (pathkernel's own layers).
  std::vector<bool> leaky_after;
  /// Per kink site: its leaky ReLU's slope, 0 for a ReLU; empty when no
  /// site is leaky. Only a held site (and the hidden layer it is held
  /// through) reads it: a negative unit passes on its slope's share.
  std::vector<double> slope_after;
  /// Site l's average pool window (average_after), 0 where it has none.
  int64_t average_at(size_t l) const { return l < average_after.size() ? average_after[l] : 0; }
  /// Site l's leaky ReLU's slope (slope_after), 0 where it has none.
  double slope_at(size_t l) const { return l < slope_after.size() ? slope_after[l] : 0.0; }
  /// The degree in t of the logits on a piece of the segment that crosses no
  /// kink, when the network is piecewise linear in its input (ReLU, max-pool,
  /// Flatten) and each of its L param layers is linear in its weights: L.
  /// 0 when it is not of that kind (smooth activations; the generic route).
  int polynomial_degree = 0;
  /// Whether the first kink site is the first layer's pre-activation of the
  /// input itself, affine in t, so that its kinks are closed-form.
  bool first_site_affine = false;
  /// Whether the first param layer's input is the same at every point of a
  /// test point's segment: no parameter comes before it, so its input is a
  /// function of x alone.
  bool first_input_fixed = false;
  /// Whether the last kink site can be held (docs/math.md §7, "The last
  /// site's switches, integrated locally"): at least 3 param layers, the
  /// logits are the last one, a Linear layer, whose input is param layer
  /// L − 2's pre-activation through its ReLU (or leaky ReLU), an optional
  /// max-pool or average pool and a flatten alone; the network is piecewise
  /// linear. Route::signals_from walks back from that site.
  bool last_site_local = false;
  /// Whether the site below the last hidden layer can be held (docs/math.md
  /// §7, "Held through a hidden layer"): at least 4 param layers, the logits
  /// a Linear layer fed by param layer L − 2's ReLU (or leaky ReLU) alone,
  /// layer L − 2 a Linear layer fed by param layer L − 3's pre-activation
  /// through its ReLU (or leaky ReLU), an optional max-pool or average pool
  /// and a flatten; the network is piecewise linear. Route::signals_from
  /// walks back from that site.
  bool hidden_site_local = false;
};

class Route {
 public:
  virtual ~Route() = default;

  /// "own", "structured" or "generic" (for the JSON a run writes).
  virtual std::string name() const = 0;
  /// Under ModuleRoute::Auto, why a TorchScript module took the generic
  /// route, or, on the structured route, why its rewritten graph is run
  /// instead of its layers walked as a chain ("" otherwise).
  const std::string& reason() const { return reason_; }
  void set_reason(std::string why) { reason_ = std::move(why); }

  /// Sets the segment: w [P] and dw [P], in the network's dtype.
  void set_segment(const torch::Tensor& w, const torch::Tensor& dw);
  /// The segment's start w [P] and direction dw [P].
  const torch::Tensor& start() const { return w_; }
  const torch::Tensor& direction() const { return dw_; }

  /// Evaluates rows x [R, *input_shape] at t [R]. With `track`, the pass
  /// keeps an autograd graph so SegmentEvaluator::signals() can be taken
  /// (not on the generic route: its pass has outputs only).
  virtual SegmentPass forward(const torch::Tensor& x, const torch::Tensor& t, bool track) const = 0;
  /// Test points x [n, ...] on the current segment, for forward_points.
  /// Here x alone; the own route forms its first layer's two products
  /// (SegmentPoints), once for all the rows the points take on the segment.
  virtual SegmentPoints segment_points(const torch::Tensor& x) const { return {x, {}, {}}; }
  /// forward() of rows of test points: row r is point point[r] of `points`
  /// (segment_points, on the current segment) at t[r]. Here forward() of
  /// rows_of_points; the own route takes its first layer from the points'
  /// products (the same values as forward() to rounding: a product of n
  /// rows and one of R may round differently).
  virtual SegmentPass forward_points(const SegmentPoints& points, const torch::Tensor& point, const torch::Tensor& t,
                                     bool track) const {
    return forward(rows_of_points(points.x, point), t, track);
  }
  /// Whether signals() needs the pass tracked (autograd through it).
  virtual bool needs_graph() const = 0;
  /// The signals of a pass for K cotangents at once, c [K, R, K_out] (on
  /// the outputs, or with `of_logits` on the logits): per param layer
  /// [K, R, ...]. The generic route has none (throws).
  virtual std::vector<torch::Tensor> signals(const SegmentPass& pass, const torch::Tensor& c, bool of_logits) const;
  /// The signals of a pass for K cotangents g [K, R, ...] on param layer
  /// `layer`'s pre-activation (its signal is g itself), walked back to the
  /// first param layer: per param layer [K, R, ...], undefined above
  /// `layer`. Routes whose layers are walked by hand (own, chain); the
  /// others throw.
  virtual std::vector<torch::Tensor> signals_from(const SegmentPass& pass, size_t layer, const torch::Tensor& g) const;
  /// signals() of param layers 1 and above, the first param layer's left
  /// undefined: its walk (through layer 1's input gradient) is not taken,
  /// for a caller that takes the first layer from pairs of cotangents summed
  /// over a piece's rows (first_signals_of_pairs_summed). Here signals()
  /// with the first dropped; the own route stops its walk at layer 1.
  virtual std::vector<torch::Tensor> signals_above_first(const SegmentPass& pass, const torch::Tensor& c,
                                                         bool of_logits) const;
  /// signals_from() of param layers 1 and above, the first param layer's
  /// left undefined, as signals_above_first: for a site held above layer 1
  /// whose pieces take their first layer from pairs. Here signals_from with
  /// the first dropped; the own route stops its walk at layer 1.
  virtual std::vector<torch::Tensor> signals_from_above_first(const SegmentPass& pass, size_t layer,
                                                              const torch::Tensor& g) const;
  /// The first param layer's signals of a pair of cotangents on param layer
  /// 1's pre-activation, [K, R, ...]: g taken through layer 1 at the
  /// segment's start W_s, g_dw at its direction dW (W_s g + dW g_dw, where
  /// signals_from takes g at each row's W_s + t dW). Walked back through the
  /// pass's masks, it gives a piece's sum over its nodes Σ_j of their
  /// signals from G_j in one walk, with g = Σ_j G_j and g_dw = Σ_j t_j G_j,
  /// wherever the nodes share their masks (a piece between the first site's
  /// kinks). Routes whose layers are walked by hand; the others throw.
  virtual torch::Tensor first_signals_of_pair(const SegmentPass& pass, const torch::Tensor& g,
                                              const torch::Tensor& g_dw) const;
  /// Where the layers between param layers 0 and 1 route each unit of layer
  /// 1's input, at rows `rows` of a pass: the S units of layer 0's output
  /// (flattened) whose mean it is, each −1 for none (a zero) and −2 − u for
  /// unit u scaled by a leaky ReLU's slope (selection_sources), [R, U1, S].
  /// S is 1 where those layers select (ReLU or leaky ReLU, max-pool,
  /// flatten) and the windows' k² of each average pool where they average
  /// too. Defined
  /// where they select or average alone and the route walks them by hand
  /// (own, chain); undefined otherwise.
  virtual torch::Tensor first_selection(const SegmentPass& /*pass*/, const torch::Tensor& /*rows*/) const {
    return torch::Tensor();
  }
  /// Per row r of `rows` (rows of `pass`), the first param layer's part of
  /// J dw, Σ over its units of first_signals_of_pair(rows_of(pass, rows), g,
  /// g_dw)[k, r] times the pass's first-layer direction: [K, R]. Here the
  /// reference: that walk. The own route, given the rows' `selection`
  /// (first_selection, taken once by the caller), takes it forward instead:
  /// the direction's tangent through the selection and layer 1 (one row
  /// where the walk has K); undefined, the walk.
  virtual torch::Tensor first_dot_of_pair(const SegmentPass& pass, const torch::Tensor& rows,
                                          const torch::Tensor& selection, const torch::Tensor& g,
                                          const torch::Tensor& g_dw) const;
  /// The first param layer's signals of pairs of cotangents (rows `rows` of
  /// `pass`, g and g_dw [K, R, ...] as in first_signals_of_pair), summed
  /// over the rows of each group: group [R] in [0, groups), [K, groups, ...].
  /// Here the reference: one walk per row. The own route, given the rows'
  /// `selection` (as first_dot_of_pair), walks each group's sums through
  /// layer 1 once and routes them by one row's selection, then mends the few
  /// units where the group's rows select differently (docs/math.md §7).
  /// `g_sums`, g's and g_dw's sums by group where the caller has them
  /// (sum_by_group: the same bits), else formed where needed.
  virtual torch::Tensor first_signals_of_pairs_summed(const SegmentPass& pass, const torch::Tensor& rows,
                                                      const torch::Tensor& selection, const torch::Tensor& g,
                                                      const torch::Tensor& g_dw, const torch::Tensor& group,
                                                      int64_t groups, const PairSums& g_sums = {}) const;
  /// The kink sites of a pass: tensors [R, ...] (KinkHints).
  virtual const std::vector<torch::Tensor>& kink_sites(const SegmentPass& pass) const { return pass.preacts; }
  const KinkHints& hints() const { return hints_; }
  /// Whether a step's test points may be integrated in concurrent groups
  /// (point_groups.h), each under inference mode: a route that says so
  /// needs no autograd in its test features.
  virtual bool concurrent_points() const { return false; }

  /// Test features of the segment for test inputs x [n, ...] (features.h).
  virtual TestFeatures test_features(const SegmentEvaluator& ev, const torch::Tensor& x,
                                     const QuadratureOptions& q) const = 0;
  /// Training signals of rows x [B, ...] for the loss cotangents u [B, K] on
  /// the outputs of their pass at t = 0 (from forward(x, 0, needs_graph())),
  /// or for a sequence model u [B, T, K] on the outputs at every position.
  virtual TrainSignals loss_signals(const SegmentEvaluator& ev, const torch::Tensor& x, const SegmentPass& pass,
                                    const torch::Tensor& u) const = 0;
  /// Whether a batch's training rows are coupled: BatchNorm in training mode
  /// (batch_statistics.h) makes each row's loss depend on the whole batch
  /// through its statistics, so the rows' signals come from one pass of the
  /// whole batch (batch_loss_signals), never from chunks of it.
  virtual bool couples_batch() const { return false; }
  /// A coupled route's training signals of a whole batch x [B, ...] with
  /// labels y and loss weights (undefined: all 1) at t = 0: per row i the
  /// total derivative of c_i ℓ_i through the batch's training-mode pass,
  /// statistics included; the rows' sum is the batch gradient. Throws for
  /// an uncoupled route.
  virtual TrainSignals batch_loss_signals(const torch::Tensor& x, const torch::Tensor& y, OutputMap map,
                                          LossKind loss, const torch::Tensor& weights) const;
  /// Training signals for every output's cotangent of rows x [B, ...] at t [B].
  virtual std::vector<TrainSignals> output_signals(const SegmentEvaluator& ev, const torch::Tensor& x,
                                                   const torch::Tensor& t) const = 0;
  /// What one evaluated row of test features holds (features.h).
  virtual FeatureLayout feature_layout(const SegmentEvaluator& ev, const torch::Tensor& example) const = 0;

  const std::vector<ParamLayer>& param_layers() const { return params_; }
  int64_t num_outputs() const { return num_outputs_; }
  int64_t parameter_count() const { return parameter_count_; }
  /// Whether the outputs are the log-softmax of the logits.
  bool log_softmax_output() const { return log_softmax_; }
  /// Views of flat vector v [P] as param layer l's weight and bias (bias:
  /// empty [0] when the layer has none).
  torch::Tensor weight_of(const torch::Tensor& v, size_t l) const;
  torch::Tensor bias_of(const torch::Tensor& v, size_t l) const;
  /// The bias view, undefined when the layer has none.
  torch::Tensor bias_or_none(const torch::Tensor& v, size_t l) const;

 protected:
  explicit Route(Network& net);
  /// Called when the segment changes.
  virtual void segment_changed() const {}

  std::vector<ParamLayer> params_;
  KinkHints hints_;
  std::string reason_;
  int64_t num_outputs_ = 0, parameter_count_ = 0;
  bool log_softmax_ = false;
  torch::Tensor w_, dw_;
};

/// The signals of a tracked pass for one cotangent c [R, K] on its outputs,
/// or with `of_logits` on its logits, by autograd: one tensor per param
/// layer, shaped like preacts (zeros for a layer the outputs do not depend
/// on). Keeps the graph for more calls.
std::vector<torch::Tensor> autograd_signals(const SegmentPass& pass, const torch::Tensor& c, bool of_logits = false);

/// The route for `net` (see above): pathkernel's own networks take the own
/// route; a TorchScript module the structured route under ModuleRoute::Auto
/// where its graph reads as rules and agrees with the module, else the
/// generic route (with the reason). A TorchScript module's route sets the
/// network's weights to points of the segment: give each route a network of
/// its own.
std::unique_ptr<Route> make_route(Network& net, ModuleRoute choice);

}  // namespace pathkernel
