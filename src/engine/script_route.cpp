// The structured route: a TorchScript module's graph read as parameterised
// operations with rules (script_graph.h), every row evaluated at its own t
// in one pass of the rewritten graph, its signals by autograd through it.
#include <algorithm>

#include "layered_route.h"
#include "pathkernel/error.h"
#include "pathkernel/script_graph.h"
#include "routes.h"

namespace pathkernel {

namespace {

class ScriptRoute final : public LayeredRoute {
 public:
  explicit ScriptRoute(Network& net);

  std::string name() const override { return "structured"; }
  SegmentPass forward(const torch::Tensor& x, const torch::Tensor& t, bool track) const override;
  bool needs_graph() const override { return true; }
  /// One autograd backward per cotangent through the pass's graph.
  std::vector<torch::Tensor> signals(const SegmentPass& pass, const torch::Tensor& c, bool of_logits) const override;
  const std::vector<torch::Tensor>& kink_sites(const SegmentPass& pass) const override { return pass.sites; }

  /// Whether the rewritten graph evaluates the module's own outputs: rows
  /// at t = 0.3 and 0.8 against the module at the formed weights.
  bool agrees();

 private:
  void segment_changed() const override { placed_t_ = -1; }
  /// Sets the module's parameters to w_s + t dw_s.
  void place(double t) const;

  Network net_;
  mutable double placed_t_ = -1;  ///< the t whose weights net_ holds; -1: none
};

ScriptRoute::ScriptRoute(Network& net) : LayeredRoute(net), net_(net) {
  std::vector<ParamInfo> layout = parameter_layout(net);
  for (const ScriptLayer& sl : net->script_graph()->layers()) {
    ParamLayer p;
    p.desc = sl.desc;
    for (const ParamInfo& info : layout) {
      if (info.name == sl.weight) {
        p.weight_offset = info.offset;
        p.weight_numel = info.numel;
        p.weight_shape = info.shape;
      } else if (!sl.bias.empty() && info.name == sl.bias) {
        p.bias_offset = info.offset;
        p.bias_numel = info.numel;
      }
    }
    PK_ASSERT(p.weight_numel > 0 && (sl.bias.empty() || p.bias_numel > 0));
    params_.push_back(p);
  }
  hints_.relu_after.assign(static_cast<size_t>(net->script_graph()->sites()), true);
  hints_.pool_after = net->script_graph()->site_windows();
  hints_.leaky_after = net->script_graph()->site_leaky();
  hints_.polynomial_degree = static_cast<int>(net->script_graph()->polynomial_degree());
  hints_.first_site_affine = false;
  hints_.first_input_fixed = true;
}

void ScriptRoute::place(double t) const {
  PK_ASSERT(w_.defined());
  if (t == placed_t_) return;
  set_flat_parameters(const_cast<Network&>(net_), t == 0 ? w_ : w_ + t * dw_);
  placed_t_ = t;
}

bool ScriptRoute::agrees() {
  const bool agrees = rows_agree_with_module(*this, net_);
  w_ = torch::Tensor();
  dw_ = torch::Tensor();
  placed_t_ = -1;
  return agrees;
}

SegmentPass ScriptRoute::forward(const torch::Tensor& x, const torch::Tensor& t, bool track) const {
  PK_ASSERT(w_.defined());
  PK_CHECK(t.dim() == 1 && t.size(0) == x.size(0),
           "segment rows: " << x.size(0) << " inputs but t has shape " << t.sizes());
  SegmentPass pass;
  // The rewritten graph at w_s, each row at its t.
  place(0.0);
  std::vector<torch::Tensor> dirs;
  for (size_t l = 0; l < params_.size(); ++l) {
    dirs.push_back(weight_of(dw_, l));
    if (params_[l].bias_numel) dirs.push_back(bias_of(dw_, l));
  }
  torch::AutoGradMode grad_mode(track);
  NetworkImpl::SegmentOutputs o = const_cast<Network&>(net_)->forward_segment(x, t, dirs);
  pass.out = o.out;
  pass.logits = o.logits;
  pass.inputs = std::move(o.inputs);
  pass.preacts = std::move(o.outputs);
  pass.sites = std::move(o.sites);
  if (!track) {
    for (auto& a : pass.inputs) a = a.detach();
    for (auto& y : pass.preacts) y = y.detach();
    pass.out = pass.out.detach();
    pass.logits = pass.logits.detach();
  }
  return pass;
}

std::vector<torch::Tensor> ScriptRoute::signals(const SegmentPass& pass, const torch::Tensor& c,
                                                bool of_logits) const {
  std::vector<std::vector<torch::Tensor>> per_k;
  for (int64_t k = 0; k < c.size(0); ++k) per_k.push_back(autograd_signals(pass, c[k], of_logits));
  std::vector<torch::Tensor> stacked;
  for (size_t l = 0; l < pass.preacts.size(); ++l) {
    std::vector<torch::Tensor> ks;
    for (auto& s : per_k) ks.push_back(s[l]);
    stacked.push_back(torch::stack(ks));
  }
  return stacked;
}

}  // namespace

std::unique_ptr<Route> make_script_route(Network& net) {
  auto route = std::make_unique<ScriptRoute>(net);
  if (!route->agrees()) return nullptr;
  return route;
}

}  // namespace pathkernel
