// Streaming the path to decompose the final outputs per training point.
#include "pathkernel/decomposition.h"

#include <chrono>
#include <cstdio>

#include "pathkernel/error.h"
#include "pathkernel/progress.h"

namespace pathkernel {

torch::Tensor Decomposition::prediction() const {
  return f0 + contributions.sum(1) + regularization + rounding;
}

torch::Tensor Decomposition::completeness_gap() const {
  return fN - f0 - contributions.sum(1) - regularization;
}

namespace {

/// The full-batch mean-loss gradient G_s at w as training computed it: [P].
torch::Tensor mean_gradient(Network& net, const torch::Tensor& w, const torch::Tensor& x, const torch::Tensor& y) {
  set_flat_parameters(net, w.to(net->parameters()[0].scalar_type()));
  for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
  training_loss(net->forward(x), y, net->options().output).backward();
  std::vector<torch::Tensor> grads;
  for (auto& p : net->parameters()) grads.push_back(p.grad().reshape({-1}).to(torch::kFloat64));
  return torch::cat(grads);
}

torch::Tensor outputs_at(Network& net, const torch::Tensor& w, const torch::Tensor& x) {
  torch::NoGradGuard guard;
  set_flat_parameters(net, w.to(net->parameters()[0].scalar_type()));
  return net->forward(x.to(net->parameters()[0].scalar_type())).to(torch::kFloat64);
}

}  // namespace

Decomposition decompose(PathReader& reader, const torch::Tensor& x_in, const DecompositionOptions& options) {
  const Manifest& m = reader.manifest();
  PK_CHECK(m.optimizer.name == "gd" || m.optimizer.name == "sgd",
           "the exact decomposition supports optimizers gd and sgd; run '" << reader.dir() << "' used '"
                                                                             << m.optimizer.name << "'");
  auto t0 = std::chrono::steady_clock::now();
  const torch::Tensor x = x_in.to(torch::kFloat64);
  const torch::Tensor& x_train = reader.dataset().x_train;
  const torch::Tensor& y_train = reader.dataset().y_train;
  const torch::Tensor x_train64 = x_train.to(torch::kFloat64);
  const int64_t n = x.size(0), M = x_train.size(0), K = m.num_classes;
  const double lambda = m.optimizer.weight_decay;
  // A network of our own: the reader's is busy replaying the path.
  Network net = build_network(m.network_options());
  const OutputMap map = net->options().output;
  // The engine works in float64 whatever the training dtype: the recorded
  // path is float64-exact.
  Network net64 = build_network(m.network_options());
  net64->to(torch::kFloat64);
  SegmentEvaluator ev(net64);

  Decomposition d;
  d.steps = m.steps;
  d.f0 = outputs_at(net, reader.checkpoint(0), x);
  d.fN = outputs_at(net, reader.checkpoint(m.checkpoints.size() - 1), x);
  d.contributions = torch::zeros({n, M, K}, torch::kFloat64);
  d.regularization = torch::zeros({n, K}, torch::kFloat64);
  d.rounding = torch::zeros({n, K}, torch::kFloat64);
  if (options.kernel) d.kernel = torch::zeros({n, M, K, K}, torch::kFloat64);

  const int64_t rows_per_point =
      options.quadrature.spec.kind == QuadratureSpec::Kind::Riemann ? options.quadrature.spec.nodes
      : options.quadrature.spec.kind == QuadratureSpec::Kind::Dpk  ? 1
                                                                   : 8 * options.quadrature.gauss_nodes;
  ev.set_segment(reader.checkpoint(0), torch::zeros({m.parameter_count}, torch::kFloat64));
  const int64_t per_row = feature_doubles_per_row(ev, x.narrow(0, 0, std::min<int64_t>(n, 1)));
  const int64_t chunk = std::clamp<int64_t>(options.memory_doubles / std::max<int64_t>(1, per_row * rows_per_point), 1, n);

  ProgressBar bar(m.steps, "decompose", options.progress);
  reader.forward([&](const PathStep& st) {
    ev.set_segment(st.w, st.delta);
    const torch::Tensor idx = st.batch.defined() ? st.batch : torch::arange(M);
    const int64_t b = idx.size(0);
    const torch::Tensor xb = x_train64.index_select(0, idx), yb = y_train.index_select(0, idx);
    // Regularisation and rounding directions of this step.
    torch::Tensor g = mean_gradient(net, st.w, x_train.index_select(0, idx), yb);
    torch::Tensor rho = -st.lr * lambda * st.w;
    torch::Tensor e = st.delta + st.lr * (g + lambda * st.w);
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
      const int64_t nc = std::min(chunk, n - c0);
      TestFeatures f = test_features(ev, x.narrow(0, c0, nc), options.quadrature);
      d.evaluations += f.evaluations;
      d.forward_evaluations += f.forward_evaluations;
      d.kinks += f.kinks;
      d.certificate_max_gap = std::max(d.certificate_max_gap, f.certificate_gap);
      if (lambda != 0) d.regularization.narrow(0, c0, nc).add_(apply_features(ev, f, rho));
      d.rounding.narrow(0, c0, nc).add_(apply_features(ev, f, e));
      for (int64_t r0 = 0; r0 < b; r0 += options.train_chunk) {
        const int64_t nr = std::min(options.train_chunk, b - r0);
        TrainSignals ts = train_signals(ev, xb.narrow(0, r0, nr), yb.narrow(0, r0, nr), map);
        torch::Tensor part = contract(ev, f, ts) * (-st.lr / static_cast<double>(b));  // [nc, nr, K]
        d.contributions.narrow(0, c0, nc).index_add_(1, idx.narrow(0, r0, nr), part);
        if (options.kernel) {
          std::vector<TrainSignals> per_output = train_output_signals(ev, xb.narrow(0, r0, nr));
          torch::Tensor ks = torch::stack(
              [&] {
                std::vector<torch::Tensor> parts;
                for (const TrainSignals& t : per_output) parts.push_back(contract(ev, f, t));  // [nc, nr, K]
                return parts;
              }(),
              3);  // [nc, nr, K, K]
          d.kernel.narrow(0, c0, nc).index_add_(1, idx.narrow(0, r0, nr), ks);
        }
      }
    }
    char status[96];
    std::snprintf(status, sizeof status, "certificate gap %.1e, %.1f evaluations/step", d.certificate_max_gap,
                  static_cast<double>(d.evaluations) / static_cast<double>(n * (st.step + 1)));
    bar.update(st.step + 1, status);
  });
  bar.finish();
  d.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return d;
}

}  // namespace pathkernel
