// The test–test EPK of one segment: Gauss–Legendre on the features' pieces.
#include "pathkernel/product_kernel.h"

#include <algorithm>
#include <cmath>

#include "pathkernel/error.h"
#include "pathkernel/integrator.h"

namespace pathkernel {

namespace {

/// Nodes for the product on a piece of length h: twice the features' count
/// (adaptive_nodes).
int product_nodes(const QuadratureOptions& q, double h) { return 2 * static_cast<int>(adaptive_nodes(q, h)); }

/// Appends the product rule on the pieces between sorted `breaks` to t and w.
void piece_rule(const std::vector<double>& breaks, const QuadratureOptions& q, std::vector<double>& t,
                std::vector<double>& w) {
  for (size_t i = 0; i + 1 < breaks.size(); ++i) {
    const QuadratureRule r = gauss_legendre(product_nodes(q, breaks[i + 1] - breaks[i]), breaks[i], breaks[i + 1]);
    t.insert(t.end(), r.nodes.begin(), r.nodes.end());
    w.insert(w.end(), r.weights.begin(), r.weights.end());
  }
}

/// Rows [start, start + count) of every output's signals.
std::vector<TrainSignals> narrow_rows(const std::vector<TrainSignals>& s, int64_t start, int64_t count) {
  std::vector<TrainSignals> out(s.size());
  for (size_t k = 0; k < s.size(); ++k) {
    // A Module's inputs are undefined (its signals are whole gradients).
    for (const torch::Tensor& a : s[k].inputs) out[k].inputs.push_back(a.defined() ? a.narrow(0, start, count) : a);
    for (const torch::Tensor& d : s[k].signals) out[k].signals.push_back(d.narrow(0, start, count));
  }
  return out;
}

}  // namespace

torch::Tensor segment_product_kernel(const SegmentEvaluator& ev, const torch::Tensor& x, const torch::Tensor& y,
                                     const QuadratureOptions& q) {
  PK_CHECK(x.dim() >= 2 && x.sizes().slice(1) == y.sizes().slice(1),
           "segment_product_kernel: x " << x.sizes() << " and y " << y.sizes() << " must be batches of the same input shape");
  const int64_t n = x.size(0), m = y.size(0), K = ev.num_outputs();
  std::vector<double> t, w;
  if (q.spec.kind == QuadratureSpec::Kind::Gauss) {
    std::vector<double> all;
    for (const torch::Tensor& z : {x, y}) {
      for (const std::vector<double>& b : test_features(ev, z, q).breaks) all.insert(all.end(), b.begin(), b.end());
    }
    piece_rule(breakpoints(all, kMinPiece), q, t, w);
  } else {
    QuadratureRule r = fixed_rule(q.spec);
    t = r.nodes;
    w = r.weights;
  }
  const torch::Tensor z = torch::cat({x, y}, 0);
  const int64_t nz = n + m, nodes = static_cast<int64_t>(t.size());
  const int64_t per_pass = std::max<int64_t>(1, q.max_rows / nz);
  torch::Tensor out = torch::zeros({n, m, K, K}, x.options());
  for (int64_t j0 = 0; j0 < nodes; j0 += per_pass) {
    const int64_t nj = std::min(per_pass, nodes - j0);
    // Rows node-major: node j's n + m points are rows j·nz .. (j+1)·nz − 1.
    std::vector<int64_t> reps(static_cast<size_t>(z.dim()), 1);
    reps[0] = nj;
    const torch::Tensor rows = z.repeat(reps);
    torch::Tensor tr = torch::tensor(std::vector<double>(t.begin() + j0, t.begin() + j0 + nj), x.options())
                           .repeat_interleave(nz);
    const std::vector<TrainSignals> sig = train_output_signals(ev, rows, tr);
    for (int64_t j = 0; j < nj; ++j) {
      out.add_(tangent_kernel(ev, narrow_rows(sig, j * nz, n), narrow_rows(sig, j * nz + n, m)),
               w[static_cast<size_t>(j0 + j)]);
    }
  }
  return out;
}

torch::Tensor segment_product_diagonal(const SegmentEvaluator& ev, const torch::Tensor& x,
                                       const QuadratureOptions& q) {
  const int64_t n = x.size(0), K = ev.num_outputs();
  std::vector<int64_t> point;
  std::vector<double> t, w;
  if (q.spec.kind == QuadratureSpec::Kind::Gauss) {
    const std::vector<std::vector<double>> breaks = test_features(ev, x, q).breaks;
    for (int64_t i = 0; i < n; ++i) {
      const size_t before = t.size();
      piece_rule(breaks[static_cast<size_t>(i)], q, t, w);
      point.insert(point.end(), t.size() - before, i);
    }
  } else {
    const QuadratureRule r = fixed_rule(q.spec);
    for (int64_t i = 0; i < n; ++i) {
      t.insert(t.end(), r.nodes.begin(), r.nodes.end());
      w.insert(w.end(), r.weights.begin(), r.weights.end());
      point.insert(point.end(), r.nodes.size(), i);
    }
  }
  torch::Tensor out = torch::zeros({n, K, K}, x.options());
  const int64_t rows = static_cast<int64_t>(t.size()), per_pass = std::max<int64_t>(1, q.max_rows);
  for (int64_t r0 = 0; r0 < rows; r0 += per_pass) {
    const int64_t nr = std::min(per_pass, rows - r0);
    torch::Tensor p = torch::tensor(std::vector<int64_t>(point.begin() + r0, point.begin() + r0 + nr), torch::kLong);
    torch::Tensor tr = torch::tensor(std::vector<double>(t.begin() + r0, t.begin() + r0 + nr), x.options());
    torch::Tensor wr = torch::tensor(std::vector<double>(w.begin() + r0, w.begin() + r0 + nr), x.options());
    torch::Tensor k = tangent_kernel_rows(ev, train_output_signals(ev, x.index_select(0, p), tr));  // [nr, K, K]
    out.index_add_(0, p, k * wr.view({-1, 1, 1}));
  }
  return out;
}

}  // namespace pathkernel
