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
std::vector<std::string> state_names(const OptimizerTraits& t) {
  if (t.momentum_family) return {"momentum_buffer"};
  if (t.adam_family) return {"exp_avg", "exp_avg_sq"};
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

/// One optimizer step as a differentiable function of the weights w [P], the
/// batch gradient g [P] (already clipped) and the state before the step
/// (empty on the first step), in LibTorch's conventions (optimizer.h): the
/// weights after the step and the state after it. `t` is Adam's step count
/// after the step.
std::pair<torch::Tensor, Buffers> update(const OptimizerOptions& o, double lr, int64_t t, const torch::Tensor& w,
                                         const torch::Tensor& g, const Buffers& before) {
  const OptimizerTraits& traits = o.traits();
  const double lambda = o.weight_decay;
  Buffers after;
  if (traits.adam_family) {
    const bool decoupled = traits.kind == OptimizerKind::AdamW;
    const torch::Tensor d = decoupled || lambda == 0 ? g : g + lambda * w;
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
  const torch::Tensor d = lambda == 0 ? g : g + lambda * w;
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
  return "";
}

Metagradient metagradient(PathReader& reader, const torch::Tensor& x_in, const MetagradientOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const Manifest& m = reader.manifest();
  const std::string why = metagradient_unsupported(m);
  PK_CHECK(why.empty(), "cannot compute the metagradient of run '" << reader.dir() << "': " << why);
  const int64_t n = x_in.size(0), M = m.num_train, K = m.num_classes;
  PK_CHECK(n >= 1, "metagradient: no test points given");
  if (options.outputs.defined()) {
    PK_CHECK(options.outputs.dim() == 1 && options.outputs.size(0) == n &&
                 options.outputs.scalar_type() == torch::kLong,
             "metagradient: the outputs differentiated must be int64 [" << n << "], one per test point (got "
                                                                         << options.outputs.sizes() << " "
                                                                         << options.outputs.scalar_type() << ")");
    PK_CHECK(options.outputs.min().item<int64_t>() >= 0 && options.outputs.max().item<int64_t>() < K,
             "metagradient: output numbers must lie in [0, " << K << ") (got " << options.outputs.min().item<int64_t>()
                                                             << " .. " << options.outputs.max().item<int64_t>() << ")");
  }
  torch::AutoGradMode gradients_needed(true);
  const torch::Tensor x = x_in.to(torch::kFloat64);
  Network net = engine_network(m.network_options());
  std::vector<torch::Tensor> params = net->parameters();
  const int64_t P = m.parameter_count;

  // The adjoints λ_N = ∂f_k(w_N, x_p)/∂w: one per test point p and output k.
  std::vector<int64_t> point, output;
  for (int64_t p = 0; p < n; ++p) {
    if (options.outputs.defined()) {
      point.push_back(p);
      output.push_back(options.outputs[p].item<int64_t>());
    } else {
      for (int64_t k = 0; k < K; ++k) {
        point.push_back(p);
        output.push_back(k);
      }
    }
  }
  const int64_t J = static_cast<int64_t>(point.size());
  Metagradient result;
  result.outputs = options.outputs;
  result.adjoints = J;
  result.steps = m.steps;
  torch::Tensor lw = torch::empty({J, P}, torch::kFloat64);  // λ of the weights
  {
    set_flat_parameters(net, reader.checkpoint(m.checkpoints.size() - 1));
    const torch::Tensor f = net->forward(x);
    result.fN = f.detach().clone();
    for (int64_t j = 0; j < J; ++j) {
      std::vector<torch::Tensor> g = torch::autograd::grad({f[point[j]][output[j]]}, params, {}, true);
      lw[j].copy_(flat_in_graph(g));
    }
  }
  const std::vector<std::string> names = state_names(m.optimizer.traits());
  std::vector<Buffers> lstate(static_cast<size_t>(J));  // λ of the optimizer state after the step (empty: 0)
  torch::Tensor values = torch::zeros({J, M}, torch::kFloat64);

  const torch::Tensor x_train = reader.dataset().x_train.to(torch::kFloat64);
  const torch::Tensor& y_train = reader.dataset().y_train;
  const OutputMap map = net->options().output;
  const LossKind loss = net->options().loss;
  ProgressBar bar(m.steps, "metagradient", options.progress);
  int64_t done = 0;

  // Step s of the path, given the optimizer state before it (empty before the first step).
  auto backward_step = [&](const PathStep& st, const Buffers& before_values) {
    const torch::Tensor idx = st.batch.defined() ? st.batch : torch::arange(M);
    const torch::Tensor run_weights = reader.loss_weights(idx);
    const torch::Tensor c = (run_weights.defined() ? run_weights.clone() : torch::ones({idx.size(0)}, torch::kFloat64))
                                .requires_grad_(true);
    {
      torch::NoGradGuard no_grad;
      set_flat_parameters(net, st.w);
    }
    Buffers before;
    for (const auto& [name, b] : before_values) before[name] = b.to(torch::kFloat64).detach().requires_grad_(true);
    const torch::Tensor batch_loss = [&] {
      const DropoutStep dropout(net->options().seed, st.step);  // the step's masks, for its loss only
      return training_loss(net->forward(x_train.index_select(0, idx)), y_train.index_select(0, idx), map, loss, c) *
             st.clip;
    }();
    const torch::Tensor w = flat_in_graph(params);
    const torch::Tensor g = flat_in_graph(torch::autograd::grad({batch_loss}, params, {}, true, true));
    auto [w_next, after] = update(m.optimizer, st.lr, st.state.step, w, g, before);
    std::vector<torch::Tensor> outputs{w_next}, inputs(params.begin(), params.end());
    for (const std::string& name : names) outputs.push_back(after.at(name));
    for (const std::string& name : names) {
      if (!before.empty()) inputs.push_back(before.at(name));
    }
    inputs.push_back(c);
    for (int64_t j = 0; j < J; ++j) {
      std::vector<torch::Tensor> grad_outputs{lw[j]};
      for (const std::string& name : names) {
        auto it = lstate[j].find(name);
        grad_outputs.push_back(it == lstate[j].end() ? torch::zeros({P}, torch::kFloat64) : it->second);
      }
      std::vector<torch::Tensor> grads =
          torch::autograd::grad(outputs, inputs, grad_outputs, /*retain_graph=*/true, false, /*allow_unused=*/true);
      std::vector<torch::Tensor> wg(grads.begin(), grads.begin() + static_cast<int64_t>(params.size()));
      for (size_t l = 0; l < wg.size(); ++l) {
        if (!wg[l].defined()) wg[l] = torch::zeros_like(params[l]);
      }
      size_t next = params.size();
      lw[j].copy_(flat_in_graph(wg));
      lstate[j].clear();
      if (!before.empty()) {
        for (const std::string& name : names) {
          const torch::Tensor& gs = grads[next++];
          lstate[j][name] = gs.defined() ? gs.detach() : torch::zeros({P}, torch::kFloat64);
        }
      }
      const torch::Tensor& gc = grads[next];
      if (gc.defined()) values[j].index_add_(0, idx, gc.detach());
    }
    result.hessian_vector_products += J;
    bar.update(++done);
  };

  // The walk meets step s before step s − 1, whose state after it is step s's
  // state before: each step is taken once the one before it arrives.
  std::optional<PathStep> pending;
  reader.reverse([&](const PathStep& st) {
    if (pending) backward_step(*pending, st.state.buffers);
    pending = st;
  });
  if (pending) backward_step(*pending, Buffers{});
  bar.finish();

  result.values = torch::full({n, M, K}, std::nan(""), torch::kFloat64);
  for (int64_t j = 0; j < J; ++j) result.values[point[j]].select(1, output[j]).copy_(values[j]);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace pathkernel
