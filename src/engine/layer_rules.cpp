// The rules of the parameterised layer kinds, looked up in the layer table.
#include "pathkernel/layer_rules.h"

#include "pathkernel/error.h"
#include "pathkernel/layer_table.h"

namespace pathkernel {

torch::Tensor conv_patches(const LayerDesc& d, const torch::Tensor& a, const std::vector<int64_t>& weight_shape) {
  const LayerRule& rule = layer_rule(d.kind);
  PK_ASSERT(rule.patches && "conv_patches: not a convolution");
  return rule.patches(d, a, weight_shape);
}

bool has_patches(const LayerDesc& d) { return layer_rule(d.kind).patches != nullptr; }

torch::Tensor layer_direction(const LayerDesc& d, const torch::Tensor& a, const torch::Tensor& vw,
                              const torch::Tensor& vb) {
  const LayerRule& rule = layer_rule(d.kind);
  PK_ASSERT(rule.direction && "layer_direction: not a parameterised layer with a rule");
  return rule.direction(d, a, vw, vb);
}

bool factored(const LayerDesc& d, const torch::Tensor& a) { return layer_rule(d.kind).factored_rows && a.dim() == 2; }

namespace {

/// Weight, then bias: [K, R, Qw + Qb].
torch::Tensor joined(const GradientFactors& g) { return g.bias.defined() ? torch::cat({g.weight, g.bias}, 2) : g.weight; }

}  // namespace

torch::Tensor sample_gradients(const LayerDesc& d, const torch::Tensor& a, const torch::Tensor& delta,
                               const std::vector<int64_t>& weight_shape, int64_t bias_numel) {
  const LayerRule& rule = layer_rule(d.kind);
  PK_ASSERT(rule.gradients && "sample_gradients: not a parameterised layer with a rule");
  return joined(rule.gradients(d, a, delta, weight_shape, bias_numel));
}

torch::Tensor sample_gradients_of_patches(const LayerDesc& d, const torch::Tensor& u, const torch::Tensor& delta,
                                          const std::vector<int64_t>& weight_shape, int64_t bias_numel) {
  const LayerRule& rule = layer_rule(d.kind);
  PK_ASSERT(rule.gradients_of_patches && "sample_gradients_of_patches: not a convolution");
  return joined(rule.gradients_of_patches(d, u, delta.unsqueeze(0), weight_shape, bias_numel)).squeeze(0);
}

torch::Tensor sample_gradients_one(const LayerDesc& d, const torch::Tensor& a, const torch::Tensor& delta,
                                   const std::vector<int64_t>& weight_shape, int64_t bias_numel) {
  return sample_gradients(d, a, delta.unsqueeze(0), weight_shape, bias_numel).squeeze(0);
}

}  // namespace pathkernel
