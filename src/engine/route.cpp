// The route interface's shared parts, and the factory that picks a route.
#include "pathkernel/route.h"

#include <algorithm>

#include "feature_parts.h"
#include "pathkernel/dropout.h"
#include "pathkernel/error.h"
#include "pathkernel/features.h"
#include "pathkernel/script_graph.h"
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

std::vector<torch::Tensor> Route::signals_above_first(const SegmentPass& pass, const torch::Tensor& c,
                                                      bool of_logits) const {
  std::vector<torch::Tensor> sig = signals(pass, c, of_logits);
  if (!sig.empty()) sig[0] = torch::Tensor();
  return sig;
}

std::vector<torch::Tensor> Route::signals_from_above_first(const SegmentPass& pass, size_t layer,
                                                           const torch::Tensor& g) const {
  std::vector<torch::Tensor> sig = signals_from(pass, layer, g);
  if (!sig.empty()) sig[0] = torch::Tensor();
  return sig;
}

std::vector<torch::Tensor> Route::signals_from(const SegmentPass&, size_t layer, const torch::Tensor&) const {
  PK_CHECK(false, "the " << name() << " route cannot walk back from param layer " << layer
                         << ": only routes whose layers are walked by hand (own, chain) can");
  return {};
}

torch::Tensor Route::first_signals_of_pair(const SegmentPass&, const torch::Tensor&, const torch::Tensor&) const {
  PK_CHECK(false, "the " << name() << " route cannot walk back a pair of cotangents: only routes whose layers are "
                         << "walked by hand (own, chain) can");
  return {};
}

torch::Tensor Route::first_dot_of_pair(const SegmentPass& pass, const torch::Tensor& rows,
                                       const torch::Tensor& /*selection*/, const torch::Tensor& g,
                                       const torch::Tensor& g_dw) const {
  const SegmentPass r = rows_of(pass, rows);
  return (first_signals_of_pair(r, g, g_dw) * r.directions[0].unsqueeze(0)).flatten(2).sum(2);
}

torch::Tensor Route::first_signals_of_pairs_summed(const SegmentPass& pass, const torch::Tensor& rows,
                                                   const torch::Tensor& /*selection*/, const torch::Tensor& g,
                                                   const torch::Tensor& g_dw, const torch::Tensor& group,
                                                   int64_t groups, const PairSums& /*g_sums*/) const {
  return sum_by_group(first_signals_of_pair(rows_of(pass, rows), g, g_dw), group, groups);
}

torch::Tensor rows_of_points(const torch::Tensor& x, const torch::Tensor& point) {
  if (x.size(0) != 1) return x.index_select(0, point);
  std::vector<int64_t> rows = x.sizes().vec();
  rows[0] = point.size(0);
  return x.expand(rows);
}

SegmentPass rows_of(const SegmentPass& pass, const torch::Tensor& index) {
  auto take = [&](const torch::Tensor& v) { return v.defined() ? v.index_select(0, index) : v; };
  auto take_all = [&](const std::vector<torch::Tensor>& vs) {
    std::vector<torch::Tensor> out;
    for (const torch::Tensor& v : vs) out.push_back(take(v));
    return out;
  };
  SegmentPass rows;
  rows.out = take(pass.out);
  rows.logits = take(pass.logits);
  rows.sequence = take(pass.sequence);
  rows.inputs = take_all(pass.inputs);
  rows.preacts = take_all(pass.preacts);
  rows.directions = take_all(pass.directions);
  rows.sites = take_all(pass.sites);
  rows.t = take(pass.t);
  rows.layer_inputs = take_all(pass.layer_inputs);
  rows.argmax = take_all(pass.argmax);
  rows.dropout = take_all(pass.dropout);
  rows.patches = take_all(pass.patches);
  return rows;
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

bool rows_agree_with_module(Route& route, Network& net) {
  // Two rows of a fixed pattern (integer codes 0 and 1 for token ids) at
  // t = 0.3 and 0.8 along a direction that moves every parameter; again
  // inside a training step, where a module's dropout draws its masks.
  const NetworkOptions& o = net->options();
  std::vector<int64_t> shape{2};
  shape.insert(shape.end(), o.input_shape.begin(), o.input_shape.end());
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  const torch::Tensor ramp = torch::arange(numel, torch::kFloat64);
  const torch::Tensor x = (o.integer_inputs ? torch::remainder(ramp, 2) : 0.5 + 0.5 * torch::sin(ramp)).view(shape);
  const torch::Tensor w = flatten_parameters(net).to(torch::kFloat64);
  const torch::Tensor dw =
      0.05 * torch::cos(torch::arange(route.parameter_count(), torch::kFloat64) + 1) * (1 + w.abs());
  const torch::Tensor t = torch::tensor({0.3, 0.8}, torch::kFloat64);
  auto agree = [&] {
    torch::NoGradGuard guard;
    // A route that runs the module's graph reads the module's own
    // parameters as w: set again, since the rows below move them.
    set_flat_parameters(net, w);
    route.set_segment(w, dw);
    const torch::Tensor got = route.forward(x, t, false).out;
    std::vector<torch::Tensor> want;
    for (int64_t r = 0; r < 2; ++r) {
      set_flat_parameters(net, w + t[r].item<double>() * dw);
      want.push_back(net->forward(x.narrow(0, r, 1)));
    }
    const torch::Tensor ref = torch::cat(want);
    const double scale = std::max(1.0, ref.abs().max().item<double>());
    return got.sizes() == ref.sizes() && (got - ref).abs().max().item<double>() <= 1e-9 * scale;
  };
  bool agrees = false;
  try {
    agrees = agree();
    if (agrees) {
      const DropoutStep training(/*seed=*/7, /*step=*/3);
      agrees = agree();
    }
  } catch (const c10::Error&) {  // e.g. a flattening view whose width is not the rest of the shape
    agrees = false;
  } catch (const Error&) {
    agrees = false;
  }
  set_flat_parameters(net, w);
  return agrees;
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
    std::string not_chain;
    if (std::unique_ptr<Route> chain = make_chain_route(net, not_chain)) return chain;
    if (std::unique_ptr<Route> structured = make_script_route(net)) {
      structured->set_reason("its rewritten graph is run, not its layers walked as a chain (slower): " + not_chain);
      return structured;
    }
    reason = "its graph, rewritten to evaluate rows at their own points of a segment, does not reproduce "
             "the module's outputs (an operation with parameters does not keep the examples on its first "
             "dimension)";
  }
  if (choice == ModuleRoute::Auto && reason.empty()) reason = net->script_graph_refusal();
  return make_autograd_route(net, reason);
}

}  // namespace pathkernel
