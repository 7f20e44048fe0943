// The generic route: a TorchScript module differentiated by autograd alone.
// Internal to the engine (autograd_route.cpp, module_features.cpp).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "pathkernel/route.h"

namespace pathkernel {

/// One parameterised layer of kind Module whose "weight" is the whole flat
/// vector [P] (no bias). Its rows are evaluated by the module itself at the
/// formed weights w_s + t dw_s, one distinct t at a time, and its per-row
/// gradients come from autograd, one row at a time.
class AutogradRoute final : public Route {
 public:
  AutogradRoute(Network& net, const std::string& reason);

  std::string name() const override { return "generic"; }
  SegmentPass forward(const torch::Tensor& x, const torch::Tensor& t, bool track) const override;
  bool needs_graph() const override { return false; }

  TestFeatures test_features(const SegmentEvaluator& ev, const torch::Tensor& x,
                             const QuadratureOptions& q) const override;
  TrainSignals loss_signals(const SegmentEvaluator& ev, const torch::Tensor& x, const SegmentPass& pass,
                            const torch::Tensor& u) const override;
  bool couples_batch() const override { return net_->batch_statistics(); }
  TrainSignals batch_loss_signals(const torch::Tensor& x, const torch::Tensor& y, OutputMap map, LossKind loss,
                                  const torch::Tensor& weights) const override;
  std::vector<TrainSignals> output_signals(const SegmentEvaluator& ev, const torch::Tensor& x,
                                           const torch::Tensor& t) const override;
  FeatureLayout feature_layout(const SegmentEvaluator& ev, const torch::Tensor& example) const override;

  /// Per-row Jacobians J(w_s + t_r dw_s, x_r), [R, K, P], by one forward
  /// pass and K backward passes per row.
  torch::Tensor row_jacobians(const torch::Tensor& x, const torch::Tensor& t) const;
  /// Per-row gradients of c_r · f(w_s, x_r) for cotangents c [R, K], [R, P],
  /// by one forward and one backward pass per row. A module with BatchNorm
  /// in training mode: rows of one batch, whose f_r come from one pass of
  /// the batch in training mode (the per-row total derivatives of
  /// c_r · f_r, through the statistics; the buffers the pass moves are put
  /// back).
  torch::Tensor row_gradients(const torch::Tensor& x, const torch::Tensor& c) const;
  /// The values of the module's kink sites (Network::forward_with_sites)
  /// for one input x [1, *input_shape] at t, one tensor per site: [1, U_j],
  /// or [1, C, H, W] for a site fused with a max-pool (site_windows). One
  /// forward pass.
  std::vector<torch::Tensor> sites_at(const torch::Tensor& x, double t) const;
  /// Per kink site, the window of the max-pool fused with it, or 0.
  const std::vector<int64_t>& site_windows() const { return net_->kink_site_windows(); }
  /// Per kink site, whether it is a leaky ReLU of slope above 0.
  const std::vector<bool>& site_leaky() const { return net_->kink_site_leaky(); }
  /// Whether the module has kink sites.
  bool has_sites() const { return net_->kink_sites() > 0; }

 private:
  void segment_changed() const override { placed_t_ = -1; }
  /// Sets the module's parameters to w_s + t dw_s.
  void place(double t) const;
  /// row_gradients for a batch coupled by its statistics: one training-mode
  /// pass of x and one backward pass per row; the cotangents c [R, K], or
  /// undefined: `cotangents` of the pass's outputs.
  torch::Tensor coupled_row_gradients(const torch::Tensor& x, const torch::Tensor& c,
                                      const std::function<torch::Tensor(const torch::Tensor&)>& cotangents) const;

  Network net_;
  mutable double placed_t_ = -1;  ///< the t whose weights net_ holds; -1: none
};

}  // namespace pathkernel
