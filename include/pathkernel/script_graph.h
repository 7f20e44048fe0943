// A TorchScript module's forward graph read as parameterised operations, and
// rewritten to evaluate many rows, each at its own point of a path segment,
// in one pass (the structured route for users' own models, docs/math.md §8).
//
// Every parameter must enter the graph through one operation the engine has
// a rule for (layer_rules.h):
//   aten::linear      weight, bias           any leading dimensions (tokens)
//   aten::conv2d      weight, bias           any kernel, stride, padding, dilation, groups
//   aten::layer_norm  weight, bias           (elementwise affine)
//   aten::embedding   weight                 token ids
//   aten::add         the parameter added to a tensor (a learned position or offset)
// Each such operation is one parameterised layer of the engine. Its output is
// linear in its own parameters, so at w_s + t dw_s it equals
// op(a; W_s) + t op_dir(a; dW): the rewritten graph takes a position t per row
// and the direction of every parameter, and returns the module's logits, every
// layer's input a_l and output y_l (the backprop signals are the gradients at
// y_l), and the inputs of its ReLUs and leaky ReLUs, whose sign changes are
// the integrand's kinks. Everything else in the module (residual additions,
// pooling, attention, activations, reshapes) runs as the module wrote it.
//
// A parameter used any other way, or by two operations (tied weights), leaves
// the module to the generic route; read() says which and why.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/script.h>

#include "pathkernel/model.h"

namespace pathkernel {

/// A copy of `module`'s forward graph with every method and function call
/// inlined, constant branches folded and its dropout seeded (dropout.h): the
/// graph the network runs (with its max-pools by hand, script_pool.h) when
/// it has dropout or a max-pool, and the graph both the
/// structured route and the generic route's kink sites read. The number of
/// dropout sites goes to `dropout_sites` when given.
std::shared_ptr<torch::jit::Graph> inlined_forward(const torch::jit::Module& module,
                                                   int64_t* dropout_sites = nullptr);

/// The nodes of `graph` of any of `kinds`, in its nested blocks too: the
/// calls a rewrite replaces (dropout.h, script_pool.h).
std::vector<torch::jit::Node*> nodes_of_kinds(torch::jit::Graph& graph, const std::vector<c10::Symbol>& kinds);

/// The kink sites of an inlined forward graph `g` (inlined_forward), in
/// graph order: the inputs of its top-level ReLUs and leaky ReLUs, or of the
/// plain max-pool fused with one (ReLU then pool or pool then ReLU, as
/// ScriptGraph pairs them), read where the first of the two reads them (a
/// copy, inserted into g, before an in-place ReLU overwrites it). Per site,
/// the fused pool's window, or 0, goes to `windows`, and to `leaky` whether
/// its activation is a leaky ReLU of a constant slope above 0 (a pool is
/// fused with a leaky ReLU of slope ≥ 0 only: the two commute because it is
/// nondecreasing). Folds g's `is None` tests of constants first
/// (nn.MaxPool2d's default stride is one).
std::vector<torch::jit::Value*> kink_site_values(std::shared_ptr<torch::jit::Graph>& g, std::vector<int64_t>& windows,
                                                 std::vector<bool>& leaky);

/// A kink site's value for `rows` rows as the kink search reads it:
/// flattened per row [rows, U], or, fused with a max-pool (window > 0), as
/// it is, [rows, C, H, W]. Throws Error if a pooled site has another shape.
torch::Tensor site_rows(const torch::Tensor& site, int64_t rows, int64_t window);

/// One parameterised operation of the graph, in graph order.
struct ScriptLayer {
  LayerDesc desc;      ///< kind and geometry; desc.module names the operation
  std::string weight;  ///< the parameter's qualified name, e.g. "blocks.0.conv1.weight"
  std::string bias;    ///< "" when the operation has none
};

/// What one pass of the rewritten graph returns, rows first.
struct ScriptPass {
  torch::Tensor logits;                ///< [R, K], before the output map
  std::vector<torch::Tensor> inputs;   ///< per layer: a_l (Embedding: the token ids)
  std::vector<torch::Tensor> outputs;  ///< per layer: y_l at each row's t
  std::vector<torch::Tensor> sites;    ///< per ReLU / leaky ReLU: its input, [R, U_j] ([R, C, H, W] when pooled)
};

/// Whether every row of a segment pass is at t = 0 (t [R], none counts),
/// where the weights are w_s alone and the directions' products add nothing.
bool rows_at_start(const torch::Tensor& t);

class ScriptGraph {
 public:
  /// Reads `module`'s forward graph. Returns nullptr, with the reason in
  /// `why_not`, when a parameter is used in a way no rule covers.
  static std::unique_ptr<ScriptGraph> read(const torch::jit::Module& module, std::string& why_not);

  const std::vector<ScriptLayer>& layers() const { return layers_; }
  int64_t sites() const { return sites_; }
  /// Per kink site: the window of the max-pool fused with its ReLU, or 0.
  /// Such a site is the ReLU's (or the pool's) input [R, C, H, W], and the
  /// argmax switches of its windows are kinks too.
  const std::vector<int64_t>& site_windows() const { return site_windows_; }
  /// Per kink site: whether its activation is a leaky ReLU of slope > 0,
  /// which passes its negative values on: a fused pool's argmax switches
  /// are then kinks at any sign, not only above 0.
  const std::vector<bool>& site_leaky() const { return site_leaky_; }
  /// The number of parameterised operations when every other operation of
  /// the graph keeps the network piecewise linear in its input with its
  /// switches at kink sites (ReLU, leaky ReLU, average pooling, sums,
  /// scaling by constants, shape operations, max-pooling of non-overlapping
  /// windows next to a ReLU): its logits are then a polynomial in t of at
  /// most that degree on a piece between kinks. 0 otherwise (smooth
  /// operations, products of activations, any other max-pool, whose
  /// switches are not kink sites here, branches).
  int64_t polynomial_degree() const { return degree_; }
  /// The graph as a plain chain of pathkernel's own layers, when it is one:
  /// each operation reads the one before it, and each is a Linear, a
  /// stride-1 Conv2d with square kernel and padding (with or without a
  /// bias, their parameters a module's "weight" and "bias"), a ReLU after one of those,
  /// a max-pool of non-overlapping windows beside such a ReLU (before it or
  /// after it: the two commute, and the chain puts the ReLU first) or a
  /// flattening to rows, and last, optionally, a log-softmax over the
  /// classes (a module trained with F.nll_loss). Such a module's rows
  /// are walked layer by layer like pathkernel's own networks (own_route.cpp),
  /// without running the graph. Empty for any other graph.
  const std::vector<LayerDesc>& chain() const { return chain_; }
  /// Why chain() is empty: the operation that breaks the chain ("" for a chain).
  const std::string& chain_refusal() const { return chain_refusal_; }

  /// Evaluates rows x [R, ...] (already the module's input dtype) at t [R]:
  /// the module's parameters hold w_s, and `directions` holds per layer its
  /// weight's and then, if it has one, its bias's direction. Autograd
  /// records the pass when grad mode is on. Rows all at t = 0 take a graph
  /// without the directions' products.
  ScriptPass run(const torch::jit::Module& module, const torch::Tensor& x, const torch::Tensor& t,
                 const std::vector<torch::Tensor>& directions) const;

 private:
  std::vector<ScriptLayer> layers_;
  int64_t sites_ = 0;
  std::vector<int64_t> site_windows_;
  std::vector<bool> site_leaky_;
  int64_t degree_ = 0;
  std::vector<LayerDesc> chain_;
  std::string chain_refusal_;
  std::shared_ptr<torch::jit::Graph> graph_;
  std::unique_ptr<torch::jit::GraphExecutor> executor_;
  /// The graph for rows all at t = 0, without the directions' products
  /// (the training side's passes): the same values, half the products.
  std::shared_ptr<torch::jit::Graph> graph_at_start_;
  std::unique_ptr<torch::jit::GraphExecutor> executor_at_start_;
};

}  // namespace pathkernel
