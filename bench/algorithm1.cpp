// The paper's Algorithm 1, written directly: per-sample Jacobians by
// autograd, a left Riemann sum for the test side.
#include "algorithm1.h"

#include <chrono>

#include "pathkernel/error.h"
#include "pathkernel/segment.h"

namespace pathkernel::bench {

namespace {

/// J(w, x) for one input x [1, ...] as a [K, P] matrix, one backprop per output.
torch::Tensor jacobian(Network& net, const torch::Tensor& x) {
  std::vector<torch::Tensor> params = net->parameters();
  torch::Tensor f = net->forward(x);
  const int64_t K = f.size(1);
  std::vector<torch::Tensor> rows;
  for (int64_t k = 0; k < K; ++k) {
    auto grads = torch::autograd::grad({f[0][k]}, params, {}, /*retain_graph=*/k + 1 < K);
    std::vector<torch::Tensor> flat;
    for (auto& g : grads) flat.push_back(g.reshape({-1}));
    rows.push_back(torch::cat(flat));
  }
  return torch::stack(rows);
}

}  // namespace

Algorithm1Result algorithm1(PathReader& reader, const torch::Tensor& x_in, int T) {
  const Manifest& m = reader.manifest();
  PK_CHECK(!m.optimizer.traits().has_buffer,
           "Algorithm 1 covers gd and sgd runs (got '" << m.optimizer.name << "')");
  PK_CHECK(T >= 1, "Algorithm 1 needs T >= 1 Riemann nodes (got " << T << ")");
  auto t0 = std::chrono::steady_clock::now();
  Network net = engine_network(m.network_options());
  const OutputMap map = net->options().output;
  const torch::Tensor x = x_in.to(torch::kFloat64);
  const torch::Tensor x_train = reader.decoded_dataset().x_train.to(torch::kFloat64);
  const torch::Tensor& y_train = reader.decoded_dataset().y_train;
  const int64_t n = x.size(0), M = x_train.size(0), K = m.num_classes;

  Algorithm1Result r;
  {
    torch::NoGradGuard guard;
    set_flat_parameters(net, reader.checkpoint(0));
    r.f0 = net->forward(x);
  }
  r.contributions = torch::zeros({n, M, K}, torch::kFloat64);
  reader.forward([&](const PathStep& st) {
    const torch::Tensor idx = st.batch.defined() ? st.batch : torch::arange(M);
    const int64_t B = idx.size(0);
    // J^X: every batch point's Jacobian at w_s(0), [B, K, P], each written
    // into its row as it is formed (a list of them, stacked, held the
    // batch's Jacobians twice).
    set_flat_parameters(net, st.w);
    torch::Tensor JX = torch::empty({B, K, st.w.size(0)}, torch::kFloat64);
    for (int64_t i = 0; i < B; ++i) JX[i].copy_(jacobian(net, x_train[idx[i].item<int64_t>()].unsqueeze(0)));
    // L' = ∂ℓ/∂f at w_s(0): NLL on log-probabilities, cross entropy on logits.
    torch::Tensor fX;
    {
      torch::NoGradGuard guard;
      fX = net->forward(x_train.index_select(0, idx));
    }
    torch::Tensor onehot = torch::zeros_like(fX).scatter_(1, y_train.index_select(0, idx).view({-1, 1}), 1.0);
    torch::Tensor L = map == OutputMap::LogSoftmax ? -onehot : torch::softmax(fX, 1) - onehot;  // [B, K]
    // J^x: each test point's Jacobian averaged over t = 0, 1/T, .., (T-1)/T.
    for (int64_t p = 0; p < n; ++p) {
      torch::Tensor Jx = torch::zeros({K, st.w.size(0)}, torch::kFloat64);
      for (int j = 0; j < T; ++j) {
        set_flat_parameters(net, st.w + (static_cast<double>(j) / T) * st.delta);
        Jx += jacobian(net, x[p].unsqueeze(0)) / static_cast<double>(T);
      }
      // G_ijk = Σ_w J^X_ijw J^x_kw; P_ik = Σ_j L'_ij G_ijk.
      torch::Tensor G = torch::matmul(JX, Jx.t());                  // [B, K, K]
      torch::Tensor Pik = torch::einsum("ij,ijk->ik", {L, G});     // [B, K]
      r.contributions[p].index_add_(0, idx, Pik * (-st.lr / static_cast<double>(B)));
    }
  });
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace pathkernel::bench
