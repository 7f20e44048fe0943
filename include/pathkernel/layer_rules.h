// The engine's rule for each kind of parameterised layer (docs/math.md §8):
// how its output moves along a parameter direction, and its per-sample
// gradient from the layer's input a and backprop signal δ = ∂(c·f)/∂y. Each
// kind's rule is its entry of the layer table (layer_table.h); these
// functions look the entry up.
//
// Every parameterised layer is linear in its own parameters, y = op(a; W, b),
// so along a segment y(t) = op(a; W_s, b_s) + t op_dir(a; dW, db), and the
// gradient of c·f with respect to (W, b) is a function of a and δ alone:
//   Linear      δ aᵀ (summed over any leading token dimensions), δ
//   Conv        Σ_positions δ ⊗ patch (im2col, per group), Σ_positions δ
//   LayerNorm   Σ δ ⊙ â with â the normalised input, Σ δ
//   Embedding   δ added into the rows of the token ids (none for the padding row)
//   Addend      δ summed over the dimensions the parameter is broadcast along
// A Linear layer on rows [R, in] is kept factored (δ and a, never their outer
// product: docs/math.md §8); every other layer's per-sample gradients are
// small and formed, flattened weight first, then bias.
#pragma once

#include <vector>

#include <torch/torch.h>

#include "pathkernel/model.h"

namespace pathkernel {

/// op_dir(a; vw, vb): the change of layer `d`'s output at input a [R, ...]
/// for the parameter direction (vw shaped like the weight, vb like the bias,
/// undefined when the layer has none).
torch::Tensor layer_direction(const LayerDesc& d, const torch::Tensor& a, const torch::Tensor& vw,
                              const torch::Tensor& vb);

/// Whether the layer's per-sample gradients stay factored as (δ, a): a
/// Linear layer whose input is rows [R, in] (LayerRule::factored_rows).
bool factored(const LayerDesc& d, const torch::Tensor& a);

/// Per-sample gradients [K, R, Qw + Qb] (weight flattened, then bias) for
/// input a [R, ...] and signals delta [K, R, ...] (one set per cotangent k).
/// weight_shape is the weight's shape; bias_numel 0 when there is no bias.
torch::Tensor sample_gradients(const LayerDesc& d, const torch::Tensor& a, const torch::Tensor& delta,
                               const std::vector<int64_t>& weight_shape, int64_t bias_numel);

/// The same for one set of signals delta [R, ...]: [R, Qw + Qb].
torch::Tensor sample_gradients_one(const LayerDesc& d, const torch::Tensor& a, const torch::Tensor& delta,
                                   const std::vector<int64_t>& weight_shape, int64_t bias_numel);

/// The same from a convolution's input patches u [R, C_in·kernel, L]
/// (conv_patches of its input) instead of the input: [R, Qw + Qb].
torch::Tensor sample_gradients_of_patches(const LayerDesc& d, const torch::Tensor& u, const torch::Tensor& delta,
                                          const std::vector<int64_t>& weight_shape, int64_t bias_numel);

/// Whether the layer is a convolution, contracted through its patches.
bool has_patches(const LayerDesc& d);

/// A convolution only: the patches of input a [R, C_in, ...] for
/// weight_shape [C_out, C_in/groups, kernel...]: [R, C_in·kernel, L]
/// (im2col; Conv2d: [R, C_in, H, W] and [C_out, C_in/groups, kh, kw]).
torch::Tensor conv_patches(const LayerDesc& d, const torch::Tensor& a, const std::vector<int64_t>& weight_shape);

}  // namespace pathkernel
