// The metagradient through the recorded path (metagradient.h).
#include "pathkernel/metagradient.h"

#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

#include "pathkernel/dropout.h"
#include "pathkernel/error.h"
#include "pathkernel/loss.h"
#include "pathkernel/progress.h"
#include "pathkernel/segment.h"

namespace pathkernel {

namespace {

using Buffers = std::map<std::string, torch::Tensor>;

/// The optimizer state a step carries to the next, by name (optimizer.h).
std::vector<std::string> state_names(const OptimizerOptions& o) {
  const OptimizerTraits& t = o.traits();
  if (t.momentum_family) return {"momentum_buffer"};
  if (t.adam_family) return {"exp_avg", "exp_avg_sq"};
  if (t.kind == OptimizerKind::RMSprop) {
    std::vector<std::string> names{"square_avg"};
    if (o.centered) names.push_back("grad_avg");
    if (o.momentum != 0) names.push_back("momentum_buffer");
    return names;
  }
  if (t.kind == OptimizerKind::Adagrad) return {"sum"};
  return {};
}

/// √v with the derivative 0 where v = 0. There the gradient coordinate was 0
/// at every step so far, and the update m/(√v + ε) depends on it through m
/// alone to first order (m = O(δ), √v·m = O(δ²)); the plain √ would give
/// 0·∞ = NaN.
torch::Tensor safe_sqrt(const torch::Tensor& v) {
  const torch::Tensor positive = v > 0;
  return torch::where(positive, torch::sqrt(torch::where(positive, v, torch::ones_like(v))), torch::zeros_like(v));
}

/// RMSprop's step as a differentiable function, in LibTorch's conventions:
/// v = α v + (1 − α) d², the update −η d / (√v + ε), centered −η d / (√(v −
/// m²) + ε) with m = α m + (1 − α) d; with momentum μ, b = μ b + d / (√v + ε)
/// (b = 0 before the first step) and the update −η b.
std::pair<torch::Tensor, Buffers> rmsprop_update(const OptimizerOptions& o, double lr, const torch::Tensor& w,
                                                 const torch::Tensor& d, const Buffers& before) {
  Buffers after;
  torch::Tensor v = (1 - o.alpha) * d * d;
  if (!before.empty()) v = v + o.alpha * before.at("square_avg");
  after["square_avg"] = v;
  torch::Tensor spread = v;
  if (o.centered) {
    torch::Tensor m = (1 - o.alpha) * d;
    if (!before.empty()) m = m + o.alpha * before.at("grad_avg");
    after["grad_avg"] = m;
    spread = v - m * m;
  }
  const torch::Tensor scaled = d / (safe_sqrt(spread) + o.eps);
  if (o.momentum == 0) return {w - lr * scaled, after};
  const torch::Tensor b = before.empty() ? scaled : o.momentum * before.at("momentum_buffer") + scaled;
  after["momentum_buffer"] = b;
  return {w - lr * b, after};
}

/// Adagrad's step as a differentiable function, in LibTorch's conventions:
/// Σ = Σ + d² (from initial_accumulator_value), the update −η_t d / (√Σ + ε)
/// with η_t = η / (1 + (t − 1) lr_decay).
std::pair<torch::Tensor, Buffers> adagrad_update(const OptimizerOptions& o, double lr, int64_t t,
                                                 const torch::Tensor& w, const torch::Tensor& d,
                                                 const Buffers& before) {
  Buffers after;
  const torch::Tensor sum0 = before.empty() ? torch::full_like(d, o.initial_accumulator_value) : before.at("sum");
  const torch::Tensor sum = sum0 + d * d;
  after["sum"] = sum;
  const double clr = lr / (1 + static_cast<double>(t - 1) * o.lr_decay);
  return {w - clr * d / (safe_sqrt(sum) + o.eps), after};
}

/// One optimizer step as a differentiable function of the weights w [P], the
/// batch gradient g [P] (already clipped) and the state before the step
/// (empty on the first step), in LibTorch's conventions (optimizer.h): the
/// weights after the step and the state after it. `t` is the optimizer's
/// step count after the step (adam, adamw, adagrad).
std::pair<torch::Tensor, Buffers> update(const OptimizerOptions& given, double lr, int64_t t, const torch::Tensor& w,
                                         const torch::Tensor& g, const Buffers& before) {
  const OptimizerOptions o = given.resolved();
  const OptimizerTraits& traits = o.traits();
  const double lambda = o.weight_decay;
  // The gradient the optimizer sees: the decay coupled into it, but AdamW's.
  const bool decoupled = traits.kind == OptimizerKind::AdamW;
  const torch::Tensor d = decoupled || lambda == 0 ? g : g + lambda * w;
  Buffers after;
  if (traits.kind == OptimizerKind::RMSprop) return rmsprop_update(o, lr, w, d, before);
  if (traits.kind == OptimizerKind::Adagrad) return adagrad_update(o, lr, t, w, d, before);
  if (traits.adam_family) {
    const torch::Tensor w0 = decoupled && lambda != 0 ? w * (1 - lr * lambda) : w;
    torch::Tensor m = (1 - o.beta1) * d, v = (1 - o.beta2) * d * d;
    if (!before.empty()) {
      m = m + o.beta1 * before.at("exp_avg");
      v = v + o.beta2 * before.at("exp_avg_sq");
    }
    const double bc1 = 1 - std::pow(o.beta1, static_cast<double>(t));
    const double bc2 = 1 - std::pow(o.beta2, static_cast<double>(t));
    const torch::Tensor denom = safe_sqrt(v) / std::sqrt(bc2) + o.eps;
    after["exp_avg"] = m;
    after["exp_avg_sq"] = v;
    return {w0 - (lr / bc1) * m / denom, after};
  }
  if (!traits.momentum_family) return {w - lr * d, after};
  const bool nesterov = traits.kind == OptimizerKind::Nesterov;
  // LibTorch's first step starts the buffer at d itself, without dampening.
  const torch::Tensor b =
      before.empty() ? d : o.momentum * before.at("momentum_buffer") + (nesterov ? 1.0 : 1.0 - o.dampening) * d;
  after["momentum_buffer"] = b;
  return {w - lr * (nesterov ? d + o.momentum * b : b), after};
}

/// The flat parameters of net, in the graph (not a copy).
torch::Tensor flat_in_graph(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> parts;
  for (const torch::Tensor& p : params) parts.push_back(p.reshape({-1}));
  return torch::cat(parts);
}

}  // namespace

std::string metagradient_unsupported(const Manifest& m) {
  if (m.recorded && !m.clip_factors.file.empty()) {
    return "run was recorded from a training loop that clipped gradients: a clip factor depends on the gradient's "
           "norm and the clipping threshold, which the run does not record, so the path's response to a loss "
           "weight is not known (record without clipping to use the metagradient)";
  }
  if (!m.checkpoints.empty() && !m.checkpoints.front().optimizer_buffers.empty()) {
    return "the run starts from an optimizer state (its first checkpoint holds optimizer buffers), whose own "
           "dependence on the training points is not recorded";
  }
  if (m.stores_module_buffers()) {
    return "its model has BatchNorm in training mode, whose running statistics also depend on the training "
           "points; the metagradient does not yet follow them (decompose, verify and explain do)";
  }
  return "";
}

namespace {

/// Checks the outputs differentiated (MetagradientOptions::outputs) for n
/// test points and K outputs.
void check_outputs(const torch::Tensor& outputs, int64_t n, int64_t K) {
  PK_CHECK(n >= 1, "metagradient: no test points given");
  if (!outputs.defined()) return;
  PK_CHECK(outputs.dim() == 1 && outputs.size(0) == n && outputs.scalar_type() == torch::kLong,
           "metagradient: the outputs differentiated must be int64 [" << n << "], one per test point (got "
                                                                       << outputs.sizes() << " "
                                                                       << outputs.scalar_type() << ")");
  PK_CHECK(outputs.min().item<int64_t>() >= 0 && outputs.max().item<int64_t>() < K,
           "metagradient: output numbers must lie in [0, " << K << ") (got " << outputs.min().item<int64_t>()
                                                           << " .. " << outputs.max().item<int64_t>() << ")");
}

/// What the adjoints differentiate: adjoint j is output output[j] at test
/// point point[j], one per point (outputs given) or K per point.
struct AdjointTargets {
  std::vector<int64_t> point, output;

  AdjointTargets(const torch::Tensor& outputs, int64_t n, int64_t K) {
    for (int64_t p = 0; p < n; ++p) {
      if (outputs.defined()) {
        point.push_back(p);
        output.push_back(outputs[p].item<int64_t>());
      } else {
        for (int64_t k = 0; k < K; ++k) {
          point.push_back(p);
          output.push_back(k);
        }
      }
    }
  }
  int64_t count() const { return static_cast<int64_t>(point.size()); }
};

/// One step of the path as a graph: the weights and the optimizer state
/// after the step (`outputs`) as functions of the weights, the state before
/// it (when there is one) and the batch's loss weights c (`inputs`).
struct StepGraph {
  torch::Tensor idx;  ///< int64 [b]: the batch's training points
  bool state_before = false;
  std::vector<torch::Tensor> outputs, inputs;
};

/// The adjoints carried back along the path, each step pulled back through
/// the step's graph: λ of the weights [J, P], λ of the optimizer state after
/// the step, and the loss weights' gradients so far [J, M].
class AdjointWalk {
 public:
  AdjointWalk(PathReader& reader, const torch::Tensor& x, AdjointTargets targets, torch::Tensor& fN)
      : reader_(reader),
        m_(reader.manifest()),
        net_(engine_network(m_.network_options())),
        params_(net_->parameters()),
        P_(m_.parameter_count),
        targets_(std::move(targets)),
        J_(targets_.count()),
        lw_(final_adjoints(x, fN)),
        names_(state_names(m_.optimizer)),
        lstate_(static_cast<size_t>(J_)),
        values_(torch::zeros({J_, m_.num_train}, torch::kFloat64)),
        y_train_(reader.held_dataset().y_train),
        map_(net_->options().output),
        loss_(net_->options().loss) {}

  /// Step st of the path, given the optimizer state before it (empty before
  /// the first step): every adjoint pulled back through it.
  void step(const PathStep& st, const Buffers& before_values) {
    const StepGraph graph = step_graph(st, before_values);
    for (int64_t j = 0; j < J_; ++j) pull_back(j, graph);
  }

  /// [n, M, K]: the loss weights' gradients by test point and output (NaN where not differentiated).
  torch::Tensor values(int64_t n, int64_t K) const {
    torch::Tensor out = torch::full({n, m_.num_train, K}, std::nan(""), torch::kFloat64);
    for (int64_t j = 0; j < J_; ++j) out[targets_.point[j]].select(1, targets_.output[j]).copy_(values_[j]);
    return out;
  }

 private:
  /// The adjoints λ_N = ∂f_k(w_N, x_p)/∂w, [J, P]; fN becomes f(w_N, x).
  torch::Tensor final_adjoints(const torch::Tensor& x, torch::Tensor& fN) {
    torch::Tensor lw = torch::empty({J_, P_}, torch::kFloat64);  // λ of the weights
    set_flat_parameters(net_, reader_.checkpoint(m_.checkpoints.size() - 1));
    const torch::Tensor f = net_->forward(x);
    fN = f.detach().clone();
    for (int64_t j = 0; j < J_; ++j) {
      std::vector<torch::Tensor> g =
          torch::autograd::grad({f[targets_.point[j]][targets_.output[j]]}, params_, {}, true);
      lw[j].copy_(flat_in_graph(g));
    }
    return lw;
  }

  /// The inputs of `batch` (every one for an undefined batch) in float64:
  /// a batch's rows decoded as read, the whole set converted once.
  torch::Tensor batch_inputs(const torch::Tensor& batch) {
    if (batch.defined()) return reader_.train_inputs(batch).to(torch::kFloat64);
    if (!whole_inputs_.defined()) whole_inputs_ = reader_.train_inputs(batch).to(torch::kFloat64);
    return whole_inputs_;
  }

  StepGraph step_graph(const PathStep& st, const Buffers& before_values) {
    StepGraph graph;
    graph.idx = st.batch.defined() ? st.batch : torch::arange(m_.num_train);
    const torch::Tensor run_weights = reader_.loss_weights(graph.idx);
    const torch::Tensor c =
        (run_weights.defined() ? run_weights.clone() : torch::ones({graph.idx.size(0)}, torch::kFloat64))
            .requires_grad_(true);
    {
      torch::NoGradGuard no_grad;
      set_flat_parameters(net_, st.w);
    }
    Buffers before;
    for (const auto& [name, b] : before_values) before[name] = b.to(torch::kFloat64).detach().requires_grad_(true);
    const torch::Tensor batch_loss = [&] {
      const DropoutStep dropout(net_->options().seed, st.step);  // the step's masks, for its loss only
      return training_loss(net_->forward(batch_inputs(st.batch)), y_train_.index_select(0, graph.idx),
                           map_, loss_, c) *
             st.clip;
    }();
    const torch::Tensor w = flat_in_graph(params_);
    const torch::Tensor g = flat_in_graph(torch::autograd::grad({batch_loss}, params_, {}, true, true));
    auto [w_next, after] = update(m_.optimizer, st.lr, st.state.step, w, g, before);
    graph.outputs = {w_next};
    graph.inputs.assign(params_.begin(), params_.end());
    for (const std::string& name : names_) graph.outputs.push_back(after.at(name));
    for (const std::string& name : names_) {
      if (!before.empty()) graph.inputs.push_back(before.at(name));
    }
    graph.inputs.push_back(c);
    graph.state_before = !before.empty();
    return graph;
  }

  /// Adjoint j pulled back through the step: λ of the weights and state
  /// before it, and the loss weights' gradient added to its values.
  void pull_back(int64_t j, const StepGraph& graph) {
    std::vector<torch::Tensor> grad_outputs{lw_[j]};
    for (const std::string& name : names_) {
      auto it = lstate_[j].find(name);
      grad_outputs.push_back(it == lstate_[j].end() ? torch::zeros({P_}, torch::kFloat64) : it->second);
    }
    std::vector<torch::Tensor> grads = torch::autograd::grad(graph.outputs, graph.inputs, grad_outputs,
                                                             /*retain_graph=*/true, false, /*allow_unused=*/true);
    std::vector<torch::Tensor> wg(grads.begin(), grads.begin() + static_cast<int64_t>(params_.size()));
    for (size_t l = 0; l < wg.size(); ++l) {
      if (!wg[l].defined()) wg[l] = torch::zeros_like(params_[l]);
    }
    size_t next = params_.size();
    lw_[j].copy_(flat_in_graph(wg));
    lstate_[j].clear();
    if (graph.state_before) {
      for (const std::string& name : names_) {
        const torch::Tensor& gs = grads[next++];
        lstate_[j][name] = gs.defined() ? gs.detach() : torch::zeros({P_}, torch::kFloat64);
      }
    }
    const torch::Tensor& gc = grads[next];
    if (gc.defined()) values_[j].index_add_(0, graph.idx, gc.detach());
  }

  PathReader& reader_;
  const Manifest& m_;
  Network net_;
  std::vector<torch::Tensor> params_;
  const int64_t P_;
  const AdjointTargets targets_;
  const int64_t J_;
  torch::Tensor lw_;                   ///< [J, P]: λ of the weights
  const std::vector<std::string> names_;
  std::vector<Buffers> lstate_;        ///< per adjoint: λ of the optimizer state after the step (empty: 0)
  torch::Tensor values_;               ///< [J, M]
  torch::Tensor whole_inputs_;         ///< every training input in float64, for a full batch (batch_inputs)
  const torch::Tensor& y_train_;
  const OutputMap map_;
  const LossKind loss_;
};

}  // namespace

Metagradient metagradient(PathReader& reader, const torch::Tensor& x_in, const MetagradientOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const Manifest& m = reader.manifest();
  const std::string why = metagradient_unsupported(m);
  PK_CHECK(why.empty(), "cannot compute the metagradient of run '" << reader.dir() << "': " << why);
  const int64_t n = x_in.size(0), K = m.num_classes;
  check_outputs(options.outputs, n, K);
  torch::AutoGradMode gradients_needed(true);
  const torch::Tensor x = x_in.to(torch::kFloat64);
  Metagradient result;
  AdjointTargets targets(options.outputs, n, K);
  result.outputs = options.outputs;
  result.adjoints = targets.count();
  result.steps = m.steps;
  AdjointWalk walk(reader, x, std::move(targets), result.fN);
  ProgressBar bar(m.steps, "metagradient", options.progress);
  int64_t done = 0;
  const auto take_step = [&](const PathStep& st, const Buffers& before) {
    walk.step(st, before);
    result.hessian_vector_products += result.adjoints;
    bar.update(++done);
  };

  // The walk meets step s before step s − 1, whose state after it is step s's
  // state before: each step is taken once the one before it arrives.
  std::optional<PathStep> pending;
  reader.reverse([&](const PathStep& st) {
    if (pending) take_step(*pending, st.state.buffers);
    pending = st;
  });
  if (pending) take_step(*pending, Buffers{});
  bar.finish();

  result.values = walk.values(n, K);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace pathkernel
