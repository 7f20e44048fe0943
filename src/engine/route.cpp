// The route interface's shared parts, and the factory that picks a route.
#include "pathkernel/route.h"

#include "pathkernel/error.h"
#include "pathkernel/features.h"
#include "routes.h"

namespace pathkernel {

Route::Route(Network& net) {
  parameter_count_ = pathkernel::parameter_count(net);
  num_outputs_ = net->options().num_classes;
  log_softmax_ = net->options().output == OutputMap::LogSoftmax;
}

void Route::set_segment(const torch::Tensor& w, const torch::Tensor& dw) {
  PK_CHECK(w.dim() == 1 && w.size(0) == parameter_count_ && dw.sizes() == w.sizes(),
           "segment vectors have shapes " << w.sizes() << " and " << dw.sizes() << ", expected ["
                                          << parameter_count_ << "]");
  w_ = w;
  dw_ = dw;
  segment_changed();
}

std::vector<torch::Tensor> Route::signals(const SegmentPass&, const torch::Tensor&, bool) const {
  PK_CHECK(false, "the " << name() << " route gives no layer signals: its rows are differentiated whole");
  return {};
}

torch::Tensor Route::weight_of(const torch::Tensor& v, size_t l) const {
  const ParamLayer& p = params_[l];
  return v.narrow(0, p.weight_offset, p.weight_numel).view(p.weight_shape);
}

torch::Tensor Route::bias_of(const torch::Tensor& v, size_t l) const {
  const ParamLayer& p = params_[l];
  return v.narrow(0, p.bias_offset, p.bias_numel);
}

torch::Tensor Route::bias_or_none(const torch::Tensor& v, size_t l) const {
  return params_[l].bias_numel ? bias_of(v, l) : torch::Tensor();
}

std::vector<torch::Tensor> autograd_signals(const SegmentPass& pass, const torch::Tensor& c, bool of_logits) {
  const torch::Tensor& y = of_logits ? pass.logits : pass.out;
  PK_ASSERT(y.defined() && y.requires_grad());
  torch::Tensor scalar = (y * c).sum();
  std::vector<torch::Tensor> g =
      torch::autograd::grad({scalar}, pass.preacts, {}, /*retain_graph=*/true, false, /*allow_unused=*/true);
  // A layer the outputs do not depend on (a module's unused branch) has signal 0.
  for (size_t l = 0; l < g.size(); ++l) {
    if (!g[l].defined()) g[l] = torch::zeros_like(pass.preacts[l]);
  }
  return g;
}

TrainSignals Route::batch_loss_signals(const torch::Tensor&, const torch::Tensor&, OutputMap, LossKind,
                                       const torch::Tensor&) const {
  PK_THROW("the " << name() << " route's training rows are not coupled: take their signals chunk by chunk");
}

std::unique_ptr<Route> make_route(Network& net, ModuleRoute choice) {
  if (!net->is_script()) return make_own_route(net);
  if (net->options().sequence_length > 0) {
    return make_autograd_route(net, choice == ModuleRoute::Auto ? "a sequence model's outputs [n, T, V] are "
                                                                  "differentiated by autograd alone" : "");
  }
  if (net->batch_statistics()) {  // the structured route has no rule for BatchNorm in training mode
    return make_autograd_route(net, "BatchNorm in training mode: each training point's gradient is its loss's "
                                    "total derivative through the batch statistics, by autograd");
  }
  std::string reason;
  if (choice == ModuleRoute::Auto && net->script_graph()) {
    if (std::unique_ptr<Route> structured = make_script_route(net)) return structured;
    reason = "its graph, rewritten to evaluate rows at their own points of a segment, does not reproduce "
             "the module's outputs (an operation with parameters does not keep the examples on its first "
             "dimension)";
  }
  if (choice == ModuleRoute::Auto && reason.empty()) reason = net->script_graph_refusal();
  return make_autograd_route(net, reason);
}

}  // namespace pathkernel
