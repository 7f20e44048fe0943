// The layer kinds in one table (docs/math.md §8). An entry is the one place
// a kind of layer lives: its names (the kind's own, and the TorchScript
// operation it matches), and for a parameterised kind everything the engine
// needs of it:
//   - which inputs of its graph operation hold the weight and the bias;
//   - its geometry, read from the operation's constant arguments;
//   - its graph rewrite: the IR that evaluates the operation at W_s + t dW
//     (script_graph.h inserts y + t ⊙ op_dir(a; dW, db) after it);
//   - its direction op_dir(a; vw, vb), the change of its output along a
//     parameter direction (every parameterised layer is linear in its own
//     parameters: y(t) = op(a; W_s, b_s) + t op_dir(a; dW, db));
//   - its per-sample gradient factors from the input a and the backprop
//     signal δ = ∂(c·f)/∂y, and, for a convolution, the patches (im2col)
//     the dense blocks are contracted with;
//   - whether it keeps the network piecewise linear in its input.
// A parameter-free kind of pathkernel's own networks carries how it applies.
// A second, smaller table lists the parameter-free operations of a module's
// graph that keep the network piecewise linear, and the max-pools whose
// argmax switches are kinks when fused with a ReLU (their kink behaviour:
// how the kink search reads a pooled site).
//
// Adding a kind of layer: one entry here, its name in LayerDesc::Kind, one
// row of tests/engine/layer_rules_test.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "pathkernel/model.h"

namespace torch::jit {
struct Graph;
struct Node;
struct Value;
}  // namespace torch::jit

namespace pathkernel {

/// Where a graph rewrite inserts a parameterised operation's direction: the
/// graph, the operation, the new graph inputs of its weight's and bias's
/// directions (db nullptr without a bias), a None constant, and the input
/// of the operation that holds the weight. The insertion point is set to
/// just after the operation.
struct DirectionSite {
  torch::jit::Graph* graph;
  torch::jit::Node* node;
  torch::jit::Value* dw;
  torch::jit::Value* db;
  torch::jit::Value* none;
  size_t weight_input;
};

/// What a graph rewrite inserted: the operation's layer input a (for an
/// embedding, the token ids) and the value op_dir(a; dW, db).
struct DirectionValues {
  torch::jit::Value* input;
  torch::jit::Value* direction;
};

/// Per-sample gradients of one layer, rows first after the K signal sets:
/// the weight's [K, R, Qw] and the bias's [K, R, Qb] (undefined: no bias).
struct GradientFactors {
  torch::Tensor weight, bias;
};

/// One kind of layer. Function members are nullptr where the kind has no
/// such rule: parameter-free kinds have only `apply`; the Module kind (a
/// whole module taken by autograd) has none.
struct LayerRule {
  LayerDesc::Kind kind;
  const char* name;  ///< the kind's name, e.g. "conv2d"
  const char* op;    ///< the graph operation it matches, e.g. "aten::conv2d"; nullptr: none
  bool parameterised = false;
  /// Whether its output is piecewise linear in its input (false: layer norm).
  bool piecewise_linear = true;
  /// Whether its per-sample gradients stay factored as (δ, a) when its input
  /// is rows [R, in] (a Linear layer: docs/math.md §8).
  bool factored_rows = false;

  /// Whether input `offset` of operation `n` is the weight (0) or the bias
  /// (1) when parameter `param` enters there; -1 when no rule covers it.
  /// Throws Error for a use the kind refuses by name.
  int (*param_input)(const torch::jit::Node* n, size_t offset, const std::string& param) = nullptr;
  /// Reads the operation's constant arguments into `d`; throws Error
  /// naming an argument without a rule.
  void (*read)(const torch::jit::Node* n, LayerDesc& d) = nullptr;
  /// Inserts op_dir(a; dW, db) after the operation.
  DirectionValues (*rewrite)(const DirectionSite& at) = nullptr;
  /// op_dir(a; vw, vb) for input a [R, ...] (vb undefined without a bias).
  torch::Tensor (*direction)(const LayerDesc& d, const torch::Tensor& a, const torch::Tensor& vw,
                             const torch::Tensor& vb) = nullptr;
  /// Per-sample gradients for input a [R, ...] and signals delta [K, R, ...].
  GradientFactors (*gradients)(const LayerDesc& d, const torch::Tensor& a, const torch::Tensor& delta,
                               const std::vector<int64_t>& weight_shape, int64_t bias_numel) = nullptr;
  /// A convolution's patches of input a [R, C_in, ...]: [R, C_in·kernel, L].
  torch::Tensor (*patches)(const LayerDesc& d, const torch::Tensor& a,
                           const std::vector<int64_t>& weight_shape) = nullptr;
  /// A convolution's per-sample gradients from its input's patches u [R,
  /// C_in·kernel, L] (`patches`) where a pass formed them already.
  GradientFactors (*gradients_of_patches)(const LayerDesc& d, const torch::Tensor& u, const torch::Tensor& delta,
                                          const std::vector<int64_t>& weight_shape, int64_t bias_numel) = nullptr;
  /// A parameter-free layer of pathkernel's own networks applied to x [n, ...].
  torch::Tensor (*apply)(const LayerDesc& d, const torch::Tensor& x) = nullptr;
};

/// Every kind of layer, one entry each.
const std::vector<LayerRule>& layer_table();

/// The entry of a kind.
const LayerRule& layer_rule(LayerDesc::Kind kind);

/// The entry whose graph operation is `op` (e.g. "aten::linear"), or nullptr.
const LayerRule* layer_rule_for_op(const std::string& op);

/// A parameter-free operation of a module's graph that the structured route
/// reads as piecewise linear, or a max-pool.
struct GraphOpRule {
  const char* op;  ///< unqualified aten name, e.g. "avg_pool2d"
  /// Keeps the network piecewise linear in its input with its switches at
  /// kink sites, wherever it stands.
  bool piecewise_linear = true;
  /// A max-pool over this many trailing dimensions (0: not a max-pool).
  /// Fused with a ReLU, non-overlapping windows keep the network piecewise
  /// linear and their argmax switches are kinks of the ReLU's site.
  int pool_dims = 0;
  /// A pooled site [R, C, ...] with `pool_dims` trailing dimensions as the
  /// kink search reads it: [R, C, H, W], pooled in k x k windows with k the
  /// window, each window holding the values of one of the pool's windows.
  torch::Tensor (*kink_rows)(const torch::Tensor& site, int64_t window) = nullptr;
};

/// Every such operation, one entry each.
const std::vector<GraphOpRule>& graph_op_table();

/// The entry of an unqualified aten operation name, or nullptr.
const GraphOpRule* graph_op_rule(const std::string& op);

}  // namespace pathkernel
