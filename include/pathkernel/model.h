// Models: spec strings -> torch::nn modules, plus the layer description the
// exact-kernel engine walks.
//
// Spec strings:
//   mlp:H1[,H2...][:relu|tanh|gelu]   fully connected, e.g. "mlp:128", "mlp:256,128:tanh"
//   cnn:C1[,C2...]                     conv3x3(pad 1) -> ReLU -> 2x2 max-pool blocks,
//                                      then one linear layer, e.g. "cnn:8,16"
//   torchscript:PATH                   a user's PyTorch module, saved from Python with
//                                      torch.jit.script(model).save(PATH) or
//                                      torch.jit.trace(model, example).save(PATH); it maps
//                                      [n, *input_shape] to logits [n, K]
//   layers:L1,L2,...                   a network written as a list of layers (conv, linear,
//                                      pooling, layer norm, embedding, residual blocks...;
//                                      layer_spec.h), compiled to a TorchScript module
// The output map (log-softmax by default, or the raw logits) and the loss
// (cross entropy by default; nll; mse) are described in loss.h.
//
// Flat parameter order: the order of Network::named_parameters(), each tensor
// flattened row-major. The flat vector has length P = parameter_count().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "pathkernel/objective.h"

namespace pathkernel {

/// A parsed model spec string.
struct ModelSpec {
  std::string kind;             ///< "mlp", "cnn", "torchscript" or "layers"
  std::vector<int64_t> widths;  ///< hidden widths (mlp) or channels (cnn)
  std::string activation;       ///< "relu", "tanh" or "gelu" (cnn: "relu")
  std::string path;             ///< torchscript: the module file
  std::string layers;           ///< layers: the layer list (after "layers:")

  /// Whether the model is a user's TorchScript module (decomposed by the
  /// generic route: autograd instead of the structured layer rules).
  bool is_torchscript() const { return kind == "torchscript"; }
  /// Whether the network is a TorchScript module: a user's, or one compiled
  /// from a layer list. The engine reads both through the module's graph.
  bool is_module() const { return kind == "torchscript" || kind == "layers"; }

  /// Parses a spec string; throws Error naming the bad part and the grammar.
  static ModelSpec parse(const std::string& spec);
  /// The canonical spec string, e.g. "mlp:256,128:tanh".
  std::string str() const;
};

/// One layer as the engine sees it. Parameterised layers name their module.
struct LayerDesc {
  /// Parameterised: Linear, Conv2d, and, in a TorchScript module's graph
  /// (script_graph.h), Conv1d, LayerNorm, Embedding and Addend (a parameter added to
  /// a tensor). Module: a whole TorchScript module the engine does not look
  /// inside; its parameters are one block, taken by autograd (the generic
  /// route). Dropout: a module chain's seeded dropout (dropout.h), which
  /// drops only while a DropoutStep is on. AvgPool2d: a module chain's
  /// average pool of non-overlapping windows and no padding. LeakyReLU: a
  /// module chain's leaky ReLU of a constant slope ≥ 0.
  enum class Kind {
    Linear, Conv2d, ReLU, Tanh, GELU, MaxPool2d, Flatten, LogSoftmax, Module, LayerNorm, Embedding, Addend, Conv1d,
    Dropout, AvgPool2d, LeakyReLU
  };
  LayerDesc() = default;
  LayerDesc(Kind kind, std::string module, int64_t in, int64_t out, int64_t kernel, int64_t padding)
      : kind(kind), module(std::move(module)), in(in), out(out), kernel(kernel), padding(padding) {}

  Kind kind = Kind::Module;
  std::string module;    ///< for parameterised layers: the module name, e.g. "fc1"
  int64_t in = 0;        ///< Linear: in_features;  Conv2d: in_channels
  int64_t out = 0;       ///< Linear: out_features; Conv2d: out_channels
  int64_t kernel = 0;    ///< pathkernel's own Conv2d: kernel size; MaxPool2d, AvgPool2d: window (= stride)
  int64_t padding = 0;   ///< pathkernel's own Conv2d: padding
  /// Conv2d from a module's graph: per spatial dimension (empty: stride 1,
  /// padding `padding`, dilation 1), and the groups.
  std::vector<int64_t> stride, padding2, dilation;
  int64_t groups = 1;
  std::vector<int64_t> norm_shape;  ///< LayerNorm: the normalised trailing shape
  double eps = 0;                   ///< LayerNorm: the variance's epsilon
  int64_t padding_index = -1;       ///< Embedding: the row that receives no gradient (-1: none)
  double drop = 0;                  ///< Dropout: the probability of dropping an element
  double slope = 0;                 ///< LeakyReLU: the slope below 0
  int64_t site = -1;                ///< Dropout: its site, which its masks are drawn for

  bool convolution() const { return kind == Kind::Conv2d || kind == Kind::Conv1d; }
  /// A ReLU or a leaky ReLU: a kink site's activation, which commutes with a max-pool.
  bool rectifier() const { return kind == Kind::ReLU || kind == Kind::LeakyReLU; }
  bool parameterised() const {
    return kind == Kind::Linear || kind == Kind::Conv2d || kind == Kind::Module || kind == Kind::LayerNorm ||
           kind == Kind::Embedding || kind == Kind::Addend;
  }
};

/// Applies a parameter-free layer (activation, max-pool, flatten,
/// log-softmax) to x [n, ...]. The one definition of those layers, shared by
/// the network and the engine's segment evaluation.
torch::Tensor apply_parameter_free(const LayerDesc& layer, const torch::Tensor& x);

/// Everything that determines a network's architecture and initialisation.
struct NetworkOptions {
  ModelSpec spec;
  std::vector<int64_t> input_shape;  ///< per-example shape, e.g. {100} or {1,28,28}
  int64_t num_classes = 0;
  OutputMap output = OutputMap::LogSoftmax;
  /// The loss training descends (loss.h); it does not change the network,
  /// but every consumer of a network's outputs needs it beside the map.
  LossKind loss = LossKind::CrossEntropy;
  bool zero_last_layer = false;  ///< paper Remark 1: last layer starts at 0
  torch::Dtype dtype = torch::kFloat64;
  uint64_t seed = 0;  ///< initialisation seed (a TorchScript module brings its own weights)
  /// Inputs are integer codes (e.g. token ids for an embedding): a
  /// TorchScript module receives them as int64. They travel through
  /// pathkernel as floats, which hold integers below 2^53 exactly.
  bool integer_inputs = false;
  /// A sequence model's length T (sequence.h): its outputs are [n, T,
  /// num_classes] and its loss the mean over a sequence's tokens; 0: a model
  /// with outputs [n, num_classes]. TorchScript modules only.
  int64_t sequence_length = 0;
  /// A sequence model: the position whose outputs the engine decomposes
  /// (at_position(); −1: the last). Training does not use it.
  int64_t position = -1;
  /// Pieces each Linear layer's products are split into (pieced_linear.h):
  /// 1, or a run's recorded count (environment.linear_pieces), set where
  /// pathkernel's own MLP trains on several threads (training_linear_pieces).
  /// The bits of the run's products depend on it. Own networks only.
  int64_t linear_pieces = 1;
};

/// What a forward pass leaves behind when traced: per parameterised layer
/// (Linear, Conv2d) in order, its input a_l and, after the loss's backward,
/// the loss's backprop signal at its pre-activation output y_l. Tracing
/// changes no computed value.
struct LayerTrace {
  std::vector<torch::Tensor> inputs;  ///< a_l: Linear [n, in], Conv2d [n, C_in, H, W]
  /// ∂loss/∂y_l (Linear [n, out], Conv2d [n, C_out, H', W']) once the
  /// loss's backward has passed y_l, undefined before: the gradient autograd
  /// hands on to the layer's backward, held, not copied. (retain_grad on y_l
  /// would copy it and keep y_l, which no backward needs after a ReLU: two
  /// [n, out] tensors more for a step's replay.)
  std::vector<std::shared_ptr<torch::Tensor>> signals;
};

struct ScriptModule;
class ScriptGraph;

/// The network: a fixed sequence of layers described by layers(), or a
/// user's TorchScript module (layers() is then {Module[, LogSoftmax]}). A
/// TorchScript module's parameters are registered here under their own
/// names with '.' written as '/' (parameter_layout() shows the dots), and
/// share storage with the module, so the optimizers and the flat vector
/// reach them like any other parameter.
class NetworkImpl : public torch::nn::Module {
 public:
  explicit NetworkImpl(const NetworkOptions& options);

  /// x: [n, *input_shape] -> [n, num_classes] (log-probabilities or logits),
  /// or for a sequence model [n, T, num_classes]. Appends to the trace set by
  /// set_trace(), if any.
  torch::Tensor forward(torch::Tensor x);
  /// The outputs the engine decomposes: forward(x), or for a sequence model
  /// its outputs at options().position, [n, num_classes].
  torch::Tensor forward_at_position(const torch::Tensor& x);

  /// Traces the following forward passes into `trace` (nullptr: stop).
  void set_trace(LayerTrace* trace) { trace_ = trace; }

  const std::vector<LayerDesc>& layers() const { return layers_; }
  const NetworkOptions& options() const { return options_; }
  /// Splits the Linear layers' products into `pieces` from now on
  /// (NetworkOptions::linear_pieces).
  void set_linear_pieces(int64_t pieces) { options_.linear_pieces = pieces; }
  /// Whether this is a TorchScript module (the generic route).
  bool is_script() const { return script_ != nullptr; }

  /// TorchScript only: the outputs [n, K] (after the output map) and the
  /// inputs of every ReLU and leaky ReLU the module applies at its top
  /// level, or of the max-pool fused with one (script_graph.h,
  /// kink_site_values): the integrand's kinks are those units' sign changes
  /// and the pools' argmax switches (its "kink sites"). Each site is
  /// flattened per row [n, U_j], or [n, C, H, W] when pooled. No autograd
  /// graph is kept.
  std::pair<torch::Tensor, std::vector<torch::Tensor>> forward_with_sites(const torch::Tensor& x);
  /// TorchScript only: the number of kink sites forward_with_sites() returns.
  int64_t kink_sites() const;
  /// TorchScript only: per kink site, the window of the max-pool fused with
  /// it, or 0.
  const std::vector<int64_t>& kink_site_windows() const;
  /// TorchScript only: per kink site, whether it is a leaky ReLU of slope
  /// above 0 (its negative values pass on, so a fused pool's argmax
  /// switches count at any sign).
  const std::vector<bool>& kink_site_leaky() const;

  /// TorchScript only: the module's graph read as parameterised operations
  /// (the structured route, script_graph.h), or nullptr when some parameter
  /// is used in a way no rule covers; script_graph_refusal() then says why.
  const ScriptGraph* script_graph() const;
  const std::string& script_graph_refusal() const;

  /// TorchScript only: whether some BatchNorm module was in training mode
  /// when loaded, so that its batch statistics couple a batch's examples
  /// and its running statistics move along training (batch_statistics.h).
  bool batch_statistics() const;
  /// Puts those BatchNorm modules in training mode (batch statistics; a
  /// forward pass updates the running statistics) or eval mode (running
  /// statistics). They load in training mode.
  void set_batch_norm_training(bool on);
  bool batch_norm_training() const;
  /// TorchScript only: the module's buffers (running statistics, counters),
  /// sharing storage with it; empty for pathkernel's own networks.
  std::vector<torch::Tensor> module_buffers() const;
  /// TorchScript only: the structured route's pass over rows x at t [R]
  /// (see ScriptGraph::run), its logits mapped by the output map.
  struct SegmentOutputs {
    torch::Tensor out, logits;  ///< after and before the output map
    std::vector<torch::Tensor> inputs, outputs, sites;
  };
  SegmentOutputs forward_segment(const torch::Tensor& x, const torch::Tensor& t,
                                 const std::vector<torch::Tensor>& directions);

 private:
  void load_script();
  /// A TorchScript module's input: integer codes as int64, else x.
  torch::Tensor script_input(const torch::Tensor& x) const;
  /// A TorchScript module's logits through the output map.
  torch::Tensor script_output(const torch::Tensor& logits) const;
  /// Checks a TorchScript module's outputs for n inputs: [n, K], or [n, T, K].
  void check_output_shape(const torch::Tensor& y, int64_t n) const;

  NetworkOptions options_;
  std::shared_ptr<ScriptModule> script_;
  std::vector<LayerDesc> layers_;
  std::vector<torch::nn::Linear> linears_;
  std::vector<torch::nn::Conv2d> convs_;
  LayerTrace* trace_ = nullptr;
};
TORCH_MODULE(Network);

/// Builds and initialises a network (seeded; last layer zeroed if asked).
Network build_network(const NetworkOptions& options);

/// One parameter tensor's place in the flat vector.
struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;
  int64_t numel = 0;
};

std::vector<ParamInfo> parameter_layout(Network& net);
int64_t parameter_count(Network& net);

/// The flat parameter vector, shape [P], a copy.
torch::Tensor flatten_parameters(Network& net);

/// Copies a flat vector of shape [P] into the parameters (bit for bit).
void set_flat_parameters(Network& net, const torch::Tensor& flat);

}  // namespace pathkernel
