// Optimizers: a registry of LibTorch's torch::optim optimizers by name, and
// their state as flat vectors (for checkpoints and exact replay).
//
// Names: gd (SGD on the full batch), sgd, momentum (SGD with momentum),
// nesterov, adam, adamw, rmsprop (plain or centered, with or without
// momentum), adagrad. Updates are LibTorch's own, not re-implementations.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

namespace pathkernel {

/// The optimizers users pick by name, parsed once at the edge
/// (parse_optimizer_kind) and described by one traits table.
enum class OptimizerKind { Gd, Sgd, Momentum, Nesterov, Adam, AdamW, RMSprop, Adagrad };

struct OptimizerTraits {
  OptimizerKind kind;
  const char* name;      ///< as in manifests and on the command line, e.g. "adamw"
  bool full_batch;       ///< uses the whole training set at every step (gd)
  /// carries state across steps (momentum's buffer, Adam's moments, RMSprop's and Adagrad's squares)
  bool has_buffer;
  bool momentum_family;  ///< momentum, nesterov: `momentum` and `dampening` apply
  bool adam_family;      ///< adam, adamw: `beta1`, `beta2` and `eps` apply
  double default_lr;     ///< the learning rate when none is given
  double default_eps;    ///< the eps when none is given (0: eps does not apply)
};

/// Every kind's traits, in the order of optimizer_names().
const std::vector<OptimizerTraits>& optimizer_kinds();
/// The traits of `kind`.
const OptimizerTraits& optimizer_traits(OptimizerKind kind);
/// Parses a name; throws Error listing the valid names.
OptimizerKind parse_optimizer_kind(const std::string& name);

/// Optimizer hyper-parameters (PyTorch conventions). Fields that do not apply
/// to the chosen optimizer are ignored and not recorded.
struct OptimizerOptions {
  std::string name = "sgd";  ///< the kind's name, kept as written for the manifest
  double lr = 0;             ///< 0: the kind's default_lr (0.1; 1e-3 for adam, adamw; 1e-2 for rmsprop, adagrad)
  double momentum = 0;       ///< momentum, nesterov, rmsprop; 0: the kind's default (0.9; none for rmsprop)
  double dampening = 0.0;    ///< momentum
  double weight_decay = 0.0; ///< L2, coupled into the gradient for every kind but adamw (decoupled)
  double beta1 = 0.9;        ///< adam, adamw
  double beta2 = 0.999;      ///< adam, adamw
  double eps = 0;            ///< adam, adamw, rmsprop, adagrad; 0: the kind's default_eps (1e-8; 1e-10 for adagrad)
  double alpha = 0.99;       ///< rmsprop: the smoothing of the squared gradients' average
  bool centered = false;     ///< rmsprop: divide by the gradients' estimated deviation, not their root mean square
  double lr_decay = 0.0;     ///< adagrad: the rate at step t is lr / (1 + (t − 1) lr_decay)
  double initial_accumulator_value = 0.0;  ///< adagrad: the squares' sum before the first step

  /// The kind `name` names; throws Error listing the valid names.
  OptimizerKind kind() const { return parse_optimizer_kind(name); }
  const OptimizerTraits& traits() const { return optimizer_traits(kind()); }
  /// These options with the defaults filled in (lr, eps, momentum).
  OptimizerOptions resolved() const;
  /// Checks ranges and the name of resolved(); throws Error naming the bad value.
  void validate() const;
  /// The fields that apply to `name`, for the manifest.
  nlohmann::ordered_json to_json() const;
  static OptimizerOptions from_json(const nlohmann::ordered_json& j);
};

std::vector<std::string> optimizer_names();

/// Creates the LibTorch optimizer over `params` (with the defaults filled in).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerOptions& options,
                                                        const std::vector<torch::Tensor>& params);

/// Sets the learning rate of every parameter group.
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

/// Optimizer state flattened in the parameter order: each buffer has shape
/// [P]. Empty before the first step (LibTorch creates state lazily).
struct OptimizerState {
  int64_t step = 0;  ///< the step counter of adam, adamw, rmsprop and adagrad (0 for the SGD family)
  /// e.g. "momentum_buffer" (momentum, nesterov, rmsprop with momentum), "exp_avg",
  /// "exp_avg_sq", "square_avg", "grad_avg", "sum"
  std::map<std::string, torch::Tensor> buffers;
  bool empty() const { return buffers.empty(); }
};

OptimizerState export_state(torch::optim::Optimizer& optimizer, const std::string& name,
                            const std::vector<torch::Tensor>& params);

/// Replaces the optimizer's state by `state` (bit for bit); empty clears it.
void import_state(torch::optim::Optimizer& optimizer, const std::string& name,
                  const std::vector<torch::Tensor>& params, const OptimizerState& state);

}  // namespace pathkernel
