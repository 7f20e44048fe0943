// The rules of the parameterised layer kinds.
#include "pathkernel/layer_rules.h"

#include "pathkernel/error.h"

namespace pathkernel {

namespace {

using Kind = LayerDesc::Kind;

/// A Conv2d layer's stride, padding and dilation per spatial dimension.
struct ConvGeometry {
  std::vector<int64_t> stride{1, 1}, padding, dilation{1, 1};
};

ConvGeometry geometry(const LayerDesc& d) {
  ConvGeometry g;
  g.padding = d.padding2.empty() ? std::vector<int64_t>{d.padding, d.padding} : d.padding2;
  if (!d.stride.empty()) g.stride = d.stride;
  if (!d.dilation.empty()) g.dilation = d.dilation;
  if (g.stride.size() == 1) g.stride.push_back(g.stride[0]);
  if (g.padding.size() == 1) g.padding.push_back(g.padding[0]);
  if (g.dilation.size() == 1) g.dilation.push_back(g.dilation[0]);
  return g;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

}  // namespace

torch::Tensor conv_patches(const LayerDesc& d, const torch::Tensor& a, const std::vector<int64_t>& weight_shape) {
  namespace F = torch::nn::functional;
  const ConvGeometry g = geometry(d);
  return F::unfold(a, F::UnfoldFuncOptions({weight_shape[2], weight_shape[3]})
                          .padding(g.padding)
                          .stride(g.stride)
                          .dilation(g.dilation));
}

torch::Tensor layer_direction(const LayerDesc& d, const torch::Tensor& a, const torch::Tensor& vw,
                              const torch::Tensor& vb) {
  switch (d.kind) {
    case Kind::Linear: return torch::linear(a, vw, vb);
    case Kind::Conv2d: {
      const ConvGeometry g = geometry(d);
      return torch::conv2d(a, vw, vb, g.stride, g.padding, g.dilation, d.groups);
    }
    case Kind::LayerNorm: {
      torch::Tensor y = torch::layer_norm(a, d.norm_shape, {}, {}, d.eps) * vw;
      return vb.defined() ? y + vb : y;
    }
    case Kind::Embedding: return torch::embedding(vw, a.to(torch::kLong), d.padding_index);
    case Kind::Addend: return vw;  // broadcast along the rows by the caller
    default: break;
  }
  PK_ASSERT(false && "layer_direction: not a parameterised layer with a rule");
  return {};
}

bool factored(const LayerDesc& d, const torch::Tensor& a) { return d.kind == Kind::Linear && a.dim() == 2; }

torch::Tensor sample_gradients(const LayerDesc& d, const torch::Tensor& a, const torch::Tensor& delta,
                               const std::vector<int64_t>& weight_shape, int64_t bias_numel) {
  const int64_t K = delta.size(0), R = delta.size(1);
  torch::Tensor gw, gb;
  switch (d.kind) {
    case Kind::Linear: {
      const int64_t out = weight_shape[0], in = weight_shape[1];
      const torch::Tensor A = a.reshape({R, -1, in});              // [R, T, in]
      const torch::Tensor D = delta.reshape({K, R, -1, out});      // [K, R, T, out]
      gw = torch::einsum("krto,rti->kroi", {D, A}).reshape({K, R, out * in});
      if (bias_numel) gb = D.sum(2);
      break;
    }
    case Kind::Conv2d: {
      const int64_t groups = d.groups, cout = weight_shape[0];
      const torch::Tensor u = conv_patches(d, a, weight_shape);     // [R, Cin·kh·kw, L]
      const int64_t q = u.size(1) / groups, L = u.size(2);
      const torch::Tensor D = delta.reshape({K, R, groups, cout / groups, L});
      gw = torch::einsum("krgcl,rgql->krgcq", {D, u.view({R, groups, q, L})}).reshape({K, R, -1});
      if (bias_numel) gb = D.sum(4).reshape({K, R, cout});
      break;
    }
    case Kind::LayerNorm: {
      const int64_t s = numel_of(d.norm_shape);
      const torch::Tensor xhat = torch::layer_norm(a, d.norm_shape, {}, {}, d.eps).reshape({R, -1, s});
      const torch::Tensor D = delta.reshape({K, R, -1, s});
      gw = torch::einsum("krms,rms->krs", {D, xhat});
      if (bias_numel) gb = D.sum(2);
      break;
    }
    case Kind::Embedding: {
      const int64_t vocab = weight_shape[0], dim = weight_shape[1];
      const torch::Tensor ids = a.to(torch::kLong).reshape({1, R, -1, 1});         // [1, R, T, 1]
      const torch::Tensor D = delta.reshape({K, R, -1, dim});                      // [K, R, T, dim]
      torch::Tensor g = torch::zeros({K, R, vocab, dim}, delta.options());
      g.scatter_add_(2, ids.expand_as(D), D);
      if (d.padding_index >= 0) g.select(2, d.padding_index).zero_();
      gw = g.reshape({K, R, vocab * dim});
      break;
    }
    case Kind::Addend: {
      std::vector<int64_t> target{K, R};
      for (int64_t i = 2 + static_cast<int64_t>(weight_shape.size()); i < delta.dim(); ++i) target.push_back(1);
      target.insert(target.end(), weight_shape.begin(), weight_shape.end());
      gw = delta.sum_to_size(target).reshape({K, R, -1});
      break;
    }
    default: PK_ASSERT(false && "sample_gradients: not a parameterised layer with a rule");
  }
  return gb.defined() ? torch::cat({gw, gb}, 2) : gw;
}

torch::Tensor sample_gradients_one(const LayerDesc& d, const torch::Tensor& a, const torch::Tensor& delta,
                                   const std::vector<int64_t>& weight_shape, int64_t bias_numel) {
  return sample_gradients(d, a, delta.unsqueeze(0), weight_shape, bias_numel).squeeze(0);
}

}  // namespace pathkernel
