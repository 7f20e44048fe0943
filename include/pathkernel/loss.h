// The losses a run trains on, computed: the batch loss, the per-example
// signal and the per-example losses of outputs f (after the output map,
// objective.h, which also names the loss kinds).
//
// Losses, per example, on f (the batch loss is their mean):
//   cross_entropy  ℓ = −log softmax(f)_y   (with logsoftmax: ℓ = −f_y)
//   nll            ℓ = −f_y, for a model whose output is already log-probabilities
//                  (a module that ends in log_softmax); needs the logits map
//   mse            ℓ = mean_k (f_k − t_k)², targets t [n, K] as given, or the
//                  one-hot rows of class labels; needs the logits map
// Sequences (sequence.h: int64 tokens y [n, T], outputs f [n, T, V]): with
// cross_entropy or nll, ℓ_i is the mean over the sequence's T tokens, so u_i
// is [T, V], (softmax(f_{i,t}) − onehot(y_{i,t}))/T at each position; the
// unweighted batch loss is the mean over all n·T tokens (F.cross_entropy of
// the flattened tokens); mse is refused.
// The per-example signal u_i = ∂ℓ_i/∂f is what the decomposition contracts
// with. For cross_entropy and nll it depends on the label only through f's
// class, so the kernel machine form with a fixed coefficient applies; for mse
// it changes along training with f itself (the ensemble form only).
#pragma once

#include <string>
#include <vector>

#include <torch/torch.h>

#include "pathkernel/objective.h"

namespace pathkernel {

/// Whether labels y are regression targets [n, K] (floating point) rather
/// than class numbers [n] (int64).
inline bool is_regression_target(const torch::Tensor& y) { return y.dim() == 2 && y.is_floating_point(); }

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
/// for sequences, at the last position; 0 for regression targets, which have
/// no classes.
int64_t correct_predictions(const torch::Tensor& f, const torch::Tensor& y);

}  // namespace pathkernel
