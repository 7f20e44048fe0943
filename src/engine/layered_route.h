// The routes whose layers give their signals (own networks, the structured
// TorchScript route): their test features, training signals and feature
// layout are the layered ones (features.cpp). Internal to the engine.
#pragma once

#include "feature_parts.h"
#include "pathkernel/route.h"

namespace pathkernel {

class LayeredRoute : public Route {
 public:
  TestFeatures test_features(const SegmentEvaluator& ev, const torch::Tensor& x,
                             const QuadratureOptions& q) const override {
    return layered_features_in_groups(ev, x, q);
  }
  TrainSignals loss_signals(const SegmentEvaluator& ev, const torch::Tensor&, const SegmentPass& pass,
                            const torch::Tensor& u) const override {
    return layered_loss_signals(ev, pass, u);
  }
  std::vector<TrainSignals> output_signals(const SegmentEvaluator& ev, const torch::Tensor& x,
                                           const torch::Tensor& t) const override {
    return layered_output_signals(ev, x, t);
  }
  FeatureLayout feature_layout(const SegmentEvaluator& ev, const torch::Tensor& example) const override {
    return layered_feature_layout(ev, example);
  }

 protected:
  using Route::Route;
};

}  // namespace pathkernel
