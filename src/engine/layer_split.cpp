// Contributions split over the parameter tensors (layer_split.h).
#include "pathkernel/layer_split.h"

#include <algorithm>

#include "feature_parts.h"
#include "pathkernel/error.h"
#include "pathkernel/layer_rules.h"
#include "pathkernel/segment.h"

namespace pathkernel {

namespace {

using Form = LayerFeatures::Form;

/// The pieces of the flat range [offset, offset + numel), which is the
/// layer's own entries from `start`: one per tensor of `layout` it meets.
void add_pieces(std::vector<TensorPiece>& out, const std::vector<ParamInfo>& layout, int64_t offset, int64_t numel,
                int64_t start) {
  int64_t covered = 0;
  for (size_t i = 0; i < layout.size(); ++i) {
    const int64_t lo = std::max(offset, layout[i].offset);
    const int64_t hi = std::min(offset + numel, layout[i].offset + layout[i].numel);
    if (lo >= hi) continue;
    out.push_back({static_cast<int64_t>(i), start + (lo - offset), lo, hi - lo});
    covered += hi - lo;
  }
  PK_CHECK(covered == numel, "parameters [" << offset << ", " << offset + numel << ") of a layer lie outside the "
                                            << "network's parameter tensors (" << covered << " of " << numel
                                            << " entries found): the layout does not describe this network");
}

/// Layer l's factored features (Summed or Rows) against training rows t,
/// split into the weight's part and the bias's, each [K, n, B]: with
/// dd = δ_{k,r}·δ_i, the weight's is Σ_r ω_r dd (a_r·a_i), the bias's Σ_r ω_r dd.
std::pair<torch::Tensor, torch::Tensor> factored_parts(const TestFeatures& f, const LayerFeatures& lf,
                                                       const TrainSignals& t, size_t l) {
  const torch::Tensor& ai = t.inputs[l];   // [B, in]
  const torch::Tensor& di = t.signals[l];  // [B, out]
  const int64_t B = ai.size(0);
  if (lf.form == Form::Summed) {  // the point's one input: no nodes to sum over
    const torch::Tensor dd = torch::matmul(lf.signals, di.t());  // [K, n, B]
    return {dd * torch::matmul(lf.inputs, ai.t()).unsqueeze(0), dd};
  }
  const torch::Tensor dd = torch::matmul(lf.signals, di.t());  // [K, R, B]
  const torch::Tensor aa = torch::matmul(lf.inputs, ai.t()).view({1, -1, B});
  return {aggregate(f, dd * aa), aggregate(f, dd)};
}

}  // namespace

std::vector<TensorPiece> layer_pieces(const ParamLayer& p, const std::vector<ParamInfo>& layout) {
  std::vector<TensorPiece> out;
  add_pieces(out, layout, p.weight_offset, p.weight_numel, 0);
  if (p.bias_numel) add_pieces(out, layout, p.bias_offset, p.bias_numel, p.weight_numel);
  return out;
}

torch::Tensor contract_by_tensor(const SegmentEvaluator& ev, const TestFeatures& f, const TrainSignals& t,
                                 const std::vector<ParamInfo>& layout) {
  const int64_t n = f.num_points, K = ev.num_outputs(), L = static_cast<int64_t>(layout.size());
  const int64_t B = t.signals.front().size(0);
  torch::Tensor total = torch::zeros({K, n, B, L}, torch::kFloat64);
  for (size_t l = 0; l < f.layers.size(); ++l) {
    const LayerFeatures& lf = f.layers[l];
    const ParamLayer& p = ev.param_layers()[l];
    const std::vector<TensorPiece> pieces = layer_pieces(p, layout);
    if (lf.form != Form::Dense) {  // a Linear layer: its weight is one tensor, its bias another
      const auto [weight, bias] = factored_parts(f, lf, t, l);
      for (const TensorPiece& piece : pieces) total.select(3, piece.tensor).add_(piece.start == 0 ? weight : bias);
      continue;
    }
    const torch::Tensor g = layer_sample_gradients(ev, t, l);  // [B, Q]
    const torch::Tensor block = dense_block(lf, n);
    for (const TensorPiece& piece : pieces) {
      total.select(3, piece.tensor)
          .add_(torch::matmul(block.narrow(2, piece.start, piece.numel), g.narrow(1, piece.start, piece.numel).t()));
    }
  }
  return total.permute({1, 2, 0, 3}).contiguous();  // [n, B, K, L]
}

torch::Tensor contract_dense_by_tensor(const SegmentEvaluator& ev, const torch::Tensor& a, const TrainSignals& t,
                                       const std::vector<ParamInfo>& layout) {
  const int64_t n = a.size(0), K = a.size(1), L = static_cast<int64_t>(layout.size());
  const int64_t B = t.signals.front().size(0);
  torch::Tensor total = torch::zeros({n, B, K, L}, torch::kFloat64);
  for (size_t l = 0; l < ev.param_layers().size(); ++l) {
    const ParamLayer& p = ev.param_layers()[l];
    const std::vector<TensorPiece> pieces = layer_pieces(p, layout);
    if (p.desc.kind != LayerDesc::Kind::Module && factored(p.desc, t.inputs[l])) {
      // δ_iᵀ W a_i for the weight, δ_iᵀ b for the bias: no per-sample gradient formed.
      const torch::Tensor& delta = t.signals[l];  // [B, out]
      const int64_t out = p.weight_shape[0], in = p.weight_shape[1];
      for (const TensorPiece& piece : pieces) {
        torch::Tensor part;
        if (piece.start == 0) {
          const torch::Tensor w = a.narrow(2, p.weight_offset, p.weight_numel).reshape({n, K, out, in});
          part = linear_rows_contraction(w, t.inputs[l].flatten(1), delta);
        } else {
          part = torch::einsum("nko,bo->nbk", {a.narrow(2, p.bias_offset, p.bias_numel), delta});
        }
        total.select(3, piece.tensor).add_(part);
      }
      continue;
    }
    const torch::Tensor g = layer_sample_gradients(ev, t, l);  // [B, Q]
    for (const TensorPiece& piece : pieces) {
      total.select(3, piece.tensor)
          .add_(torch::einsum("nkq,bq->nbk", {a.narrow(2, piece.offset, piece.numel), g.narrow(1, piece.start, piece.numel)}));
    }
  }
  return total;
}

}  // namespace pathkernel
