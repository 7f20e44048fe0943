// The generic route: a TorchScript module evaluated at the formed weights
// and differentiated by autograd, row by row.
#include "autograd_route.h"

#include "feature_parts.h"
#include "pathkernel/batch_statistics.h"
#include "pathkernel/context.h"
#include "pathkernel/error.h"
#include "pathkernel/loss.h"
#include "pathkernel/sequence.h"
#include "routes.h"

namespace pathkernel {

namespace {

/// Writes per-tensor gradients into `row` [P] in the flat parameter order.
void copy_flat(const std::vector<torch::Tensor>& grads, torch::Tensor row) {
  int64_t offset = 0;
  for (const torch::Tensor& g : grads) {
    row.narrow(0, offset, g.numel()).copy_(g.reshape({-1}));
    offset += g.numel();
  }
}

}  // namespace

AutogradRoute::AutogradRoute(Network& net, const std::string& reason) : Route(net), net_(net) {
  reason_ = reason;
  // Test points are evaluated as at test time: BatchNorm by its running
  // statistics (the caller holds μ_s in the module's buffers).
  net_->set_batch_norm_training(false);
  ParamLayer p;
  p.desc = net->layers()[0];
  p.weight_numel = parameter_count_;
  p.weight_shape = {parameter_count_};
  p.bias_offset = parameter_count_;
  params_.push_back(p);
  hints_.relu_after.push_back(false);
  hints_.pool_after.push_back(0);
}

void AutogradRoute::place(double t) const {
  PK_ASSERT(w_.defined());
  if (t == placed_t_) return;
  set_flat_parameters(const_cast<Network&>(net_), t == 0 ? w_ : w_ + t * dw_);
  placed_t_ = t;
}

SegmentPass AutogradRoute::forward(const torch::Tensor& x, const torch::Tensor& t, bool track) const {
  PK_ASSERT(w_.defined());
  PK_CHECK(t.dim() == 1 && t.size(0) == x.size(0),
           "segment rows: " << x.size(0) << " inputs but t has shape " << t.sizes());
  PK_ASSERT(!track && "a Module's rows are differentiated by row_jacobians()");
  SegmentPass pass;
  torch::NoGradGuard guard;
  Network& net = const_cast<Network&>(net_);
  const int64_t rows = x.size(0);
  pass.out = torch::empty({rows, num_outputs_}, w_.options());
  const int64_t T = net->options().sequence_length;
  if (T > 0) pass.sequence = torch::empty({rows, T, num_outputs_}, w_.options());
  // One pass per distinct t, over the rows that share it.
  auto [values, inverse] = torch::_unique(t, /*sorted=*/true, /*return_inverse=*/true);
  auto v = values.accessor<double, 1>();
  for (int64_t u = 0; u < values.size(0); ++u) {
    place(v[u]);
    torch::Tensor rows_u = torch::nonzero(inverse == u).flatten();
    const torch::Tensor f = net->forward(x.index_select(0, rows_u));
    pass.out.index_copy_(0, rows_u, at_position(f, net->options().position));
    if (T > 0) pass.sequence.index_copy_(0, rows_u, f);
  }
  return pass;
}

torch::Tensor AutogradRoute::row_jacobians(const torch::Tensor& x, const torch::Tensor& t) const {
  // One row at a time, each operation too small to share: with two threads
  // every one of them woke the sleeping OpenMP worker and waited for it (a
  // futex round trip each; 29 s of system time in 126 s on the residual
  // CNN's generic route, which one thread halved).
  OpenMpThreads one_thread(1);
  const int64_t rows = x.size(0), K = num_outputs_;
  torch::Tensor out = torch::empty({rows, K, parameter_count_}, w_.options());
  Network& net = const_cast<Network&>(net_);
  const std::vector<torch::Tensor> params = net->parameters();
  auto t_a = t.accessor<double, 1>();
  for (int64_t r = 0; r < rows; ++r) {
    place(t_a[r]);
    torch::AutoGradMode grad_mode(true);
    torch::Tensor f = net->forward_at_position(x.narrow(0, r, 1));
    for (int64_t k = 0; k < K; ++k) {
      std::vector<torch::Tensor> g = torch::autograd::grad({f[0][k]}, params, {}, /*retain_graph=*/k + 1 < K);
      copy_flat(g, out[r][k]);
    }
  }
  return out;
}

std::vector<torch::Tensor> AutogradRoute::sites_at(const torch::Tensor& x, double t) const {
  PK_ASSERT(x.size(0) == 1);
  place(t);
  return const_cast<Network&>(net_)->forward_with_sites(x).second;
}

torch::Tensor AutogradRoute::coupled_row_gradients(
    const torch::Tensor& x, const torch::Tensor& c,
    const std::function<torch::Tensor(const torch::Tensor&)>& cotangents) const {
  Network& net = const_cast<Network&>(net_);
  const std::vector<torch::Tensor> params = net->parameters();
  const int64_t rows = x.size(0);
  torch::Tensor out = torch::empty({rows, parameter_count_}, w_.options());
  place(0.0);
  const BatchStatistics train_mode(net);  // as the step's forward ran; the buffers it moves are put back
  torch::AutoGradMode grad_mode(true);
  const torch::Tensor f = net->forward(x);
  const torch::Tensor u = c.defined() ? c : cotangents(f.detach());
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<torch::Tensor> g =
        torch::autograd::grad({f[r]}, params, {u[r]}, /*retain_graph=*/r + 1 < rows, false, /*allow_unused=*/true);
    for (size_t j = 0; j < g.size(); ++j) {
      if (!g[j].defined()) g[j] = torch::zeros_like(params[j]);
    }
    copy_flat(g, out[r]);
  }
  return out;
}

torch::Tensor AutogradRoute::row_gradients(const torch::Tensor& x, const torch::Tensor& c) const {
  if (net_->batch_statistics()) return coupled_row_gradients(x, c, {});
  OpenMpThreads one_thread(1);  // one row at a time: see row_jacobians
  const int64_t rows = x.size(0);
  torch::Tensor out = torch::empty({rows, parameter_count_}, w_.options());
  Network& net = const_cast<Network&>(net_);
  const std::vector<torch::Tensor> params = net->parameters();
  place(0.0);
  for (int64_t r = 0; r < rows; ++r) {
    torch::AutoGradMode grad_mode(true);
    torch::Tensor f = net->forward(x.narrow(0, r, 1));  // all positions: c [B, T, V] for a sequence model
    PK_ASSERT(f[0].sizes() == c[r].sizes());
    std::vector<torch::Tensor> g = torch::autograd::grad({(f[0] * c[r]).sum()}, params);
    copy_flat(g, out[r]);
  }
  return out;
}

TestFeatures AutogradRoute::test_features(const SegmentEvaluator& ev, const torch::Tensor& x,
                                          const QuadratureOptions& q) const {
  return module_test_features(ev, *this, x, q);
}

TrainSignals AutogradRoute::loss_signals(const SegmentEvaluator&, const torch::Tensor& x, const SegmentPass&,
                                         const torch::Tensor& u) const {
  TrainSignals t;
  t.inputs = {torch::Tensor()};
  t.signals = {row_gradients(x, u)};  // the per-sample gradients g_i [B, P]
  return t;
}

TrainSignals AutogradRoute::batch_loss_signals(const torch::Tensor& x, const torch::Tensor& y, OutputMap map,
                                               LossKind loss, const torch::Tensor& weights) const {
  PK_ASSERT(couples_batch());
  TrainSignals t;
  t.inputs = {torch::Tensor()};
  // u_i = c_i ∂ℓ_i/∂f_i at the training-mode outputs (the batch's statistics)
  t.signals = {coupled_row_gradients(x, torch::Tensor(), [&](const torch::Tensor& f) {
    return loss_signal(f, y, map, loss, weights);
  })};
  return t;
}

std::vector<TrainSignals> AutogradRoute::output_signals(const SegmentEvaluator&, const torch::Tensor& x,
                                                        const torch::Tensor& t) const {
  PK_CHECK(!couples_batch(), "the kernel K_s(x, x_i) of a module with BatchNorm in training mode is not "
                             "computed: a training point's Jacobian depends on its whole batch (its contributions "
                             "are; decompose without the kernel)");
  const torch::Tensor jac = row_jacobians(x, t);
  std::vector<TrainSignals> out;
  for (int64_t k = 0; k < num_outputs_; ++k) out.push_back({{torch::Tensor()}, {jac.select(1, k)}, {}, {}});
  return out;
}

FeatureLayout AutogradRoute::feature_layout(const SegmentEvaluator&, const torch::Tensor&) const {
  // A Module's rows are summed into a dense block as they are evaluated.
  return {(num_outputs_ + 2) * parameter_count_, false};
}

std::unique_ptr<Route> make_autograd_route(Network& net, const std::string& reason) {
  return std::make_unique<AutogradRoute>(net, reason);
}

}  // namespace pathkernel
