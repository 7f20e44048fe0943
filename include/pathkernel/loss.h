// What a run explains and what it trains on: the output map (the function f
// the decomposition is exact for) and the loss (what the training steps
// descend). One definition of both, shared by training, replay and the engine.
//
// Output maps:
//   logsoftmax  f = log_softmax(z) of the model's raw output z (default)
//   logits      f = z
// Losses, per example, on f (the batch loss is their mean):
//   cross_entropy  ℓ = −log softmax(f)_y   (with logsoftmax: ℓ = −f_y)
//   nll            ℓ = −f_y, for a model whose output is already log-probabilities
//                  (a module that ends in log_softmax); needs the logits map
//   mse            ℓ = mean_k (f_k − t_k)², targets t [n, K] as given, or the
//                  one-hot rows of class labels; needs the logits map
// The per-example signal u_i = ∂ℓ_i/∂f is what the decomposition contracts
// with. For cross_entropy and nll it depends on the label only through f's
// class, so the kernel machine form with a fixed coefficient applies; for mse
// it changes along training with f itself (the ensemble form only).
#pragma once

#include <string>
#include <vector>

#include <torch/torch.h>

namespace pathkernel {

enum class OutputMap { LogSoftmax, Logits };
OutputMap parse_output_map(const std::string& name);
std::string output_map_name(OutputMap map);

enum class LossKind { CrossEntropy, Nll, Mse };

/// Parses "cross_entropy" (or "cross-entropy"), "nll" or "mse"; throws Error
/// listing the valid names.
LossKind parse_loss_kind(const std::string& name);
/// The name manifests record: "cross_entropy", "nll" or "mse".
std::string loss_name(LossKind loss);
/// The names parse_loss_kind accepts, as manifests write them.
std::vector<std::string> loss_names();

/// Throws Error when `loss` cannot be trained on the output map `map` (nll
/// and mse need the logits map: on log_softmax(z) they would not be the loss
/// the user asked for).
void check_loss_output(LossKind loss, OutputMap map);

/// Whether labels y are regression targets [n, K] (floating point) rather
/// than class numbers [n] (int64).
inline bool is_regression_target(const torch::Tensor& y) { return y.dim() == 2; }

/// The batch's mean loss of outputs f [n, K] (as the network returns them,
/// after the output map) against y: int64 labels [n], or float targets
/// [n, K] for mse. With per-example loss weights c [n] (float64), the
/// weighted mean (1/n) Σ_i c_i ℓ_i; undefined weights are all 1 and give
/// the plain mean bit for bit.
torch::Tensor training_loss(const torch::Tensor& f, const torch::Tensor& y, OutputMap map,
                            LossKind loss = LossKind::CrossEntropy, const torch::Tensor& weights = {});

/// u_i = ∂ℓ_i/∂f, the per-example loss derivative [n, K], in f's dtype;
/// with loss weights c [n], c_i ∂ℓ_i/∂f (the derivative of the weighted loss).
torch::Tensor loss_signal(const torch::Tensor& f, const torch::Tensor& y, OutputMap map,
                          LossKind loss = LossKind::CrossEntropy, const torch::Tensor& weights = {});

/// The per-example losses ℓ_i [n], unweighted, in f's dtype.
torch::Tensor example_losses(const torch::Tensor& f, const torch::Tensor& y, OutputMap map,
                             LossKind loss = LossKind::CrossEntropy);

/// Checks per-training-point loss weights for M points: a float [M] tensor,
/// finite and >= 0 (or, with allow_negative, any finite value: a retraining
/// may step a weight of 0 down to take a central difference). `what` names
/// them in the error (e.g. the file). Returns them as float64.
torch::Tensor checked_loss_weights(const torch::Tensor& weights, int64_t num_train, const std::string& what,
                                   bool allow_negative = false);

/// Correct predictions (argmax of f against the class label) in a batch;
/// 0 for regression targets, which have no classes.
int64_t correct_predictions(const torch::Tensor& f, const torch::Tensor& y);

}  // namespace pathkernel
