// Output maps and losses (loss.h).
#include "pathkernel/loss.h"

#include "pathkernel/error.h"
#include "pathkernel/sequence.h"

namespace pathkernel {

namespace {

/// Targets [n, K] for mse: float targets as given, or one-hot class labels.
torch::Tensor mse_targets(const torch::Tensor& f, const torch::Tensor& y) {
  if (is_regression_target(y)) {
    PK_CHECK(y.sizes() == f.sizes(), "mse: targets have shape " << y.sizes() << ", outputs " << f.sizes()
                                                               << "; expected the same [n, K]");
    return y.to(f.scalar_type());
  }
  return torch::zeros_like(f).scatter_(1, y.view({-1, 1}), 1.0);
}

void check_class_labels(const torch::Tensor& y, LossKind loss) {
  PK_CHECK(!is_regression_target(y), "the loss '" << loss_name(loss)
                                                  << "' needs class labels [n], got float targets of shape "
                                                  << y.sizes() << " (use the loss mse for targets)");
}

/// Sequences: outputs f [n, T, V] against tokens y [n, T], checked.
void check_sequence(const torch::Tensor& f, const torch::Tensor& y, LossKind loss) {
  PK_CHECK(loss != LossKind::Mse, "the loss mse is for regression targets [n, K]; sequence labels (tokens of shape "
                                      << y.sizes() << ") train with cross_entropy or nll");
  PK_CHECK(f.dim() == 3 && f.size(0) == y.size(0) && f.size(1) == y.size(1),
           "sequence labels of shape " << y.sizes() << " need outputs [n, T, V] = [" << y.size(0) << ", "
                                       << y.size(1) << ", V], got " << f.sizes());
}

/// Log-probabilities of outputs f (per position for sequences: the last dimension).
torch::Tensor log_probabilities(const torch::Tensor& f, OutputMap map, LossKind loss) {
  return loss == LossKind::Nll || map == OutputMap::LogSoftmax ? f : torch::log_softmax(f, -1);
}

/// ℓ_i = (1/T) Σ_t −log p(y_{i,t}) of a sequence [n].
torch::Tensor sequence_losses(const torch::Tensor& f, const torch::Tensor& y, OutputMap map, LossKind loss) {
  check_sequence(f, y, loss);
  const torch::Tensor logp = log_probabilities(f, map, loss);
  return -logp.gather(2, y.unsqueeze(2)).squeeze(2).mean(1);
}

}  // namespace

torch::Tensor example_losses(const torch::Tensor& f, const torch::Tensor& y, OutputMap map, LossKind loss) {
  const auto none = at::Reduction::None;
  if (is_sequence_labels(y)) return sequence_losses(f, y, map, loss);
  switch (loss) {
    case LossKind::CrossEntropy:
      check_class_labels(y, loss);
      return torch::nll_loss(map == OutputMap::LogSoftmax ? f : torch::log_softmax(f, 1), y, {}, none);
    case LossKind::Nll:
      check_class_labels(y, loss);
      return torch::nll_loss(f, y, {}, none);
    case LossKind::Mse:
      return torch::mse_loss(f, mse_targets(f, y), none).mean(1);
  }
  PK_THROW("unknown loss kind");
}

torch::Tensor training_loss(const torch::Tensor& f, const torch::Tensor& y, OutputMap map, LossKind loss,
                            const torch::Tensor& weights) {
  if (weights.defined()) {
    PK_CHECK(weights.dim() == 1 && weights.size(0) == f.size(0),
             "loss weights have shape " << weights.sizes() << "; expected one per example, [" << f.size(0) << "]");
    return (example_losses(f, y, map, loss) * weights.to(f.scalar_type())).sum() / static_cast<double>(f.size(0));
  }
  if (is_sequence_labels(y)) {  // the mean over all n·T tokens, as F.cross_entropy of the flattened tokens
    check_sequence(f, y, loss);
    return torch::nll_loss(log_probabilities(f, map, loss).reshape({-1, f.size(2)}), y.reshape({-1}));
  }
  switch (loss) {
    case LossKind::CrossEntropy:
      check_class_labels(y, loss);
      return torch::nll_loss(map == OutputMap::LogSoftmax ? f : torch::log_softmax(f, 1), y);
    case LossKind::Nll:
      check_class_labels(y, loss);
      return torch::nll_loss(f, y);
    case LossKind::Mse:
      return torch::mse_loss(f, mse_targets(f, y));
  }
  PK_THROW("unknown loss kind");
}

namespace {

/// Sequences: u_{i,t} = ∂ℓ_i/∂f_{i,t} = (p_{i,t} − onehot(y_{i,t})) / T, [n, T, V].
torch::Tensor sequence_signal(const torch::Tensor& out, const torch::Tensor& y, OutputMap map, LossKind loss) {
  check_sequence(out, y, loss);
  torch::Tensor onehot = torch::zeros_like(out).scatter_(2, y.unsqueeze(2), 1.0);
  const double T = static_cast<double>(out.size(1));
  if (loss == LossKind::Nll || map == OutputMap::LogSoftmax) return -onehot / T;
  return (torch::softmax(out, -1) - onehot) / T;
}

torch::Tensor unweighted_signal(const torch::Tensor& out, const torch::Tensor& y, OutputMap map, LossKind loss) {
  if (is_sequence_labels(y)) return sequence_signal(out, y, map, loss);
  if (loss == LossKind::Mse) return (out - mse_targets(out, y)) * (2.0 / static_cast<double>(out.size(1)));
  check_class_labels(y, loss);
  torch::Tensor onehot = torch::zeros_like(out).scatter_(1, y.view({-1, 1}), 1.0);
  // NLL on log-probabilities, or cross entropy on logits.
  if (loss == LossKind::Nll || map == OutputMap::LogSoftmax) return -onehot;
  return torch::softmax(out, 1) - onehot;
}

}  // namespace

torch::Tensor loss_signal(const torch::Tensor& f, const torch::Tensor& y, OutputMap map, LossKind loss,
                          const torch::Tensor& weights) {
  torch::Tensor u = unweighted_signal(f.detach(), y, map, loss);
  if (!weights.defined()) return u;
  PK_CHECK(weights.dim() == 1 && weights.size(0) == u.size(0),
           "loss weights have shape " << weights.sizes() << "; expected one per example, [" << u.size(0) << "]");
  std::vector<int64_t> shape(u.dim(), 1);
  shape[0] = -1;
  return u * weights.to(u.scalar_type()).view(shape);
}

torch::Tensor checked_loss_weights(const torch::Tensor& weights, int64_t num_train, const std::string& what,
                                   bool allow_negative) {
  PK_CHECK(weights.defined() && weights.dim() == 1 && weights.size(0) == num_train,
           what << ": loss weights have shape " << (weights.defined() ? weights.sizes() : c10::IntArrayRef{})
                << "; expected one weight per training point, [" << num_train << "]");
  PK_CHECK(weights.is_floating_point(), what << ": loss weights have dtype " << weights.scalar_type()
                                             << "; expected float32 or float64");
  const torch::Tensor w = weights.to(torch::kFloat64).contiguous();
  const torch::Tensor bad = allow_negative ? (~torch::isfinite(w)).nonzero()
                                           : (~torch::isfinite(w)).logical_or(w < 0).nonzero();
  if (bad.numel() > 0) {
    const int64_t i = bad[0][0].item<int64_t>();
    PK_THROW(what << ": the loss weight of training point " << i << " is " << w[i].item<double>()
                  << "; expected a finite number" << (allow_negative ? "" : " >= 0") << " (" << bad.size(0)
                  << " weight(s) are not)");
  }
  return w;
}

int64_t correct_predictions(const torch::Tensor& f, const torch::Tensor& y) {
  if (is_regression_target(y)) return 0;
  if (is_sequence_labels(y)) return at_position(f, -1).argmax(1).eq(labels_at_position(y, -1)).sum().item<int64_t>();
  return f.argmax(1).eq(y).sum().item<int64_t>();
}

}  // namespace pathkernel
