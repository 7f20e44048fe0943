// The test and training sides' arithmetic from the layer shapes (arithmetic.h).
#include "pathkernel/arithmetic.h"

#include <algorithm>

namespace pathkernel {

namespace {

/// Multiply-adds of one row through param layer l with output y [1, C, ...]:
/// the weight's entries times the output positions, for the layers that are
/// products; 0 for the others.
double multiply_adds(const ParamLayer& l, const torch::Tensor& y) {
  using Kind = LayerDesc::Kind;
  const Kind k = l.desc.kind;
  if (k != Kind::Linear && k != Kind::Conv1d && k != Kind::Conv2d) return 0;
  const int64_t positions = y.dim() <= 2 ? 1 : y[0][0].numel();
  return static_cast<double>(l.weight_numel) * static_cast<double>(positions);
}

}  // namespace

double RowArithmetic::test_side_flop(const QuadratureCounts& c, int64_t K) const {
  auto n = [](int64_t v) { return static_cast<double>(v); };
  const double cotangents = n(c.evaluations) * n(K) + n(c.moment_evaluations);
  const double whole = cotangents - n(c.short_cotangents) - n(c.unwalked_cotangents);
  return n(c.evaluations + c.moment_evaluations + c.forward_evaluations) * forward_flop + whole * cotangent_flop +
         n(c.short_cotangents) * short_cotangent_flop + n(c.pair_pieces) * pair_piece_flop +
         n(c.pair_sums) * n(K) * pair_sum_flop;
}

double RowArithmetic::training_side_flop(const Manifest& m) const {
  const int64_t rows = m.batch_size > 0 ? std::min(m.batch_size, m.num_train) : m.num_train;
  return static_cast<double>(rows) * static_cast<double>(m.steps) * training_row_flop;
}

std::optional<RowArithmetic> row_arithmetic(SegmentEvaluator& ev, const torch::Tensor& example) {
  if (ev.route() == "generic") return std::nullopt;
  int64_t p = 0;
  for (const ParamLayer& l : ev.param_layers()) {
    p = std::max(p, std::max(l.weight_offset + l.weight_numel, l.bias_offset + l.bias_numel));
  }
  const torch::Tensor w = torch::zeros({p}, torch::kFloat64);
  ev.set_segment(w, w);
  torch::NoGradGuard no_grad;
  const torch::Tensor x = example.is_floating_point() ? example.to(torch::kFloat64) : example;  // token ids stay
  const SegmentPass pass = ev.forward(x, torch::full({1}, 0.5, torch::kFloat64), false);
  RowArithmetic a;
  const std::vector<ParamLayer>& layers = ev.param_layers();
  for (size_t l = 0; l < layers.size() && l < pass.preacts.size(); ++l) {
    const double macs = multiply_adds(layers[l], pass.preacts[l]);
    const bool conv = layers[l].desc.convolution();
    a.training_row_flop += 2 * macs + 2 * macs;   // forward at W_s, the weight gradient
    if (l > 0) a.training_row_flop += 2 * macs;   // the input gradient, at W_s
    a.forward_flop += 2 * 2 * macs;               // at W_s and at dW_s
    a.cotangent_flop += 2 * macs;                 // the weight gradient
    if (l > 0) a.cotangent_flop += 2 * 2 * macs;  // the input gradient, at W_s and at dW_s
    if (l > 1) a.short_cotangent_flop += 3 * 2 * macs;  // the weight and input gradients
    if (l != 1) continue;
    // Layer 1 of a pair: a convolution's weight gradient from the sums
    // (its input A + t B: two rows), another's from each row.
    if (conv) {
      a.pair_sum_flop += 2 * 2 * macs;
    } else {
      a.short_cotangent_flop += 2 * macs;
    }
    a.pair_sum_flop += 2 * 2 * macs;    // the input gradient, at W_s and at dW_s
    a.pair_piece_flop += 2 * 2 * macs;  // forward on one row, at W_s and at dW_s
  }
  return a;
}

std::optional<RowArithmetic> row_arithmetic(PathReader& reader, const DecompositionOptions& options,
                                            const torch::Tensor& x) {
  Network net64 = engine_network(reader.manifest().network_options(options.position));
  SegmentEvaluator ev(net64, options.quadrature.route);
  return row_arithmetic(ev, x.narrow(0, 0, 1));
}

}  // namespace pathkernel
