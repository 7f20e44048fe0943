// A module's running statistics as one vector, and the modes of its
// BatchNorm modules (batch_statistics.h).
#include "pathkernel/batch_statistics.h"

#include "pathkernel/error.h"

namespace pathkernel {

torch::Tensor flatten_buffers(const Network& net) {
  std::vector<torch::Tensor> parts;
  for (const torch::Tensor& b : net->module_buffers()) parts.push_back(b.detach().reshape({-1}).to(torch::kFloat64));
  if (parts.empty()) return torch::zeros({0}, torch::kFloat64);
  return torch::cat(parts);
}

void set_flat_buffers(Network& net, const torch::Tensor& flat) {
  const std::vector<torch::Tensor> buffers = net->module_buffers();
  int64_t total = 0;
  for (const torch::Tensor& b : buffers) total += b.numel();
  PK_CHECK(flat.dim() == 1 && flat.size(0) == total,
           "module buffers: got shape " << flat.sizes() << ", expected [" << total
                                        << "] (every buffer of the module, flattened in order)");
  torch::NoGradGuard guard;
  int64_t offset = 0;
  for (const torch::Tensor& b : buffers) {
    const_cast<torch::Tensor&>(b).copy_(flat.narrow(0, offset, b.numel()).view(b.sizes()));
    offset += b.numel();
  }
}

torch::Tensor test_outputs(Network& net, const torch::Tensor& w, const torch::Tensor& mu, const torch::Tensor& x) {
  torch::NoGradGuard no_grad;
  const auto dtype = net->parameters()[0].scalar_type();
  set_flat_parameters(net, w.to(dtype));
  if (mu.defined()) set_flat_buffers(net, mu);
  const RunningStatistics eval_mode(net);
  return net->forward_at_position(x.to(dtype)).to(torch::kFloat64);
}

RunningStatistics::RunningStatistics(Network& net) : net_(net), was_training_(net->batch_norm_training()) {
  if (was_training_) net_->set_batch_norm_training(false);
}

RunningStatistics::~RunningStatistics() {
  if (was_training_) net_->set_batch_norm_training(true);
}

BatchStatistics::BatchStatistics(Network& net) : net_(net), was_training_(net->batch_norm_training()) {
  if (!net_->batch_statistics()) return;
  saved_ = flatten_buffers(net_);
  net_->set_batch_norm_training(true);
}

BatchStatistics::~BatchStatistics() {
  if (!net_->batch_statistics()) return;
  set_flat_buffers(net_, saved_);
  net_->set_batch_norm_training(was_training_);
}

}  // namespace pathkernel
