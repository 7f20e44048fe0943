// Gram matrices of the EPK, DPK and NTKs in blocks.
#include "pathkernel/gram.h"

#include <algorithm>

#include "pathkernel/error.h"
#include "pathkernel/infinite_width.h"
#include "pathkernel/product_kernel.h"
#include "pathkernel/progress.h"

namespace pathkernel {

GramSpec GramSpec::parse(const std::string& text) {
  GramSpec g;
  if (text == "epk") {
    g.kind = Kind::Epk;
  } else if (text == "dpk") {
    g.kind = Kind::Dpk;
  } else if (text == "ntk-inf") {
    g.kind = Kind::NtkInfinite;
  } else if (text == "ntk" || text.rfind("ntk:", 0) == 0) {
    g.kind = Kind::Ntk;
    if (text.size() > 4) {
      const std::string s = text.substr(4);
      size_t used = 0;
      try {
        g.step = std::stoll(s, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      PK_CHECK(!s.empty() && used == s.size() && g.step >= 0,
               "bad kernel '" << text << "': the step after 'ntk:' must be a whole number >= 0");
    }
  } else {
    PK_THROW("unknown kernel '" << text << "': expected epk, dpk, ntk, ntk:STEP or ntk-inf");
  }
  return g;
}

std::string GramSpec::str() const {
  switch (kind) {
    case Kind::Epk: return "epk";
    case Kind::Dpk: return "dpk";
    case Kind::NtkInfinite: return "ntk-inf";
    case Kind::Ntk: return step < 0 ? "ntk" : "ntk:" + std::to_string(step);
  }
  return "";
}

namespace {

/// ntk-inf needs a fully-connected ReLU network; returns its options.
InfiniteWidthOptions infinite_width_options(const PathReader& reader, const GramOptions& options) {
  const Manifest& m = reader.manifest();
  const ModelSpec model = ModelSpec::parse(m.model_spec);
  PK_CHECK(model.kind == "mlp" && model.activation == "relu",
           "ntk-inf is the kernel of a fully-connected ReLU network; run '" << reader.dir() << "' has model '"
                                                                          << m.model_spec << "'");
  InfiniteWidthOptions o;
  o.hidden_layers = static_cast<int64_t>(model.widths.size());
  o.bias_scale = options.bias_scale;
  return o;
}

/// The step of an ntk[:S] spec, checked against the run.
int64_t ntk_step(const GramSpec& spec, const Manifest& m) {
  const int64_t s = spec.step < 0 ? m.steps : spec.step;
  PK_CHECK(s <= m.steps, "bad kernel 'ntk:" << s << "': the run has steps 0.." << m.steps);
  return s;
}

/// Calls add_step(w_s, dw_s) for the steps the kernel sums over: every step,
/// or ntk's one point (with dw = 0).
template <typename F>
void for_each_step(PathReader& reader, const GramSpec& spec, bool progress, F add_step) {
  const Manifest& m = reader.manifest();
  if (spec.kind == GramSpec::Kind::Ntk) {
    add_step(reader.weights(ntk_step(spec, m)), torch::zeros({m.parameter_count}, torch::kFloat64));
    return;
  }
  ProgressBar bar(m.steps, "gram " + spec.str(), progress);
  reader.forward([&](const PathStep& st) {
    add_step(st.w, st.delta);
    bar.update(st.step + 1);
  });
  bar.finish();
}

torch::Tensor trace_of(const torch::Tensor& k) { return k.diagonal(0, -2, -1).sum(-1); }

}  // namespace

torch::Tensor gram(PathReader& reader, const torch::Tensor& rows_in, bool rows_test, const torch::Tensor& cols_in,
                   bool cols_test, const GramOptions& options) {
  const Manifest& m = reader.manifest();
  const int64_t R = rows_in.size(0), C = cols_in.size(0), K = m.num_classes;
  const GramSpec& spec = options.kernel;
  PK_CHECK(options.block >= 1, "gram: block must be >= 1 (got " << options.block << ")");
  if (spec.kind == GramSpec::Kind::NtkInfinite) {
    torch::Tensor theta = infinite_width_kernels(rows_in, cols_in, infinite_width_options(reader, options)).ntk;
    if (options.trace) return theta * static_cast<double>(K);
    return theta.unsqueeze(2).unsqueeze(3) * torch::eye(K, torch::kFloat64);
  }
  // The integrated side: epk's test rows. A test column with training rows is
  // the transpose of the same computation.
  if (spec.kind == GramSpec::Kind::Epk && cols_test && !rows_test) {
    torch::Tensor t = gram(reader, cols_in, true, rows_in, false, options);
    return options.trace ? t.t().contiguous() : t.permute({1, 0, 3, 2}).contiguous();
  }
  const bool integrate = spec.kind == GramSpec::Kind::Epk && rows_test;
  // Two test sides integrate their product along t, in smaller blocks: the
  // pieces of a block are the union of its points' pieces.
  const bool product = integrate && cols_test;
  QuadratureOptions q = options.quadrature.for_run(reader.manifest().steps);  // the run's budget per step
  if (!integrate) q.spec = QuadratureSpec::parse("dpk");

  Network net64 = engine_network(m.network_options());
  SegmentEvaluator ev(net64, q.route);
  const torch::Tensor rows = rows_in.to(torch::kFloat64), cols = cols_in.to(torch::kFloat64);
  torch::Tensor out = options.trace ? torch::zeros({R, C}, torch::kFloat64) : torch::zeros({R, C, K, K}, torch::kFloat64);
  const int64_t b = product ? std::min<int64_t>(options.block, 32) : options.block;
  for_each_step(reader, spec, options.progress, [&](const torch::Tensor& w, const torch::Tensor& dw) {
    ev.set_segment(w, dw);
    for (int64_t r0 = 0; r0 < R; r0 += b) {
      const int64_t nr = std::min(b, R - r0);
      TestFeatures f;
      if (!product) f = test_features(ev, rows.narrow(0, r0, nr), q);
      for (int64_t c0 = 0; c0 < C; c0 += b) {
        const int64_t nc = std::min(b, C - c0);
        torch::Tensor k = product ? segment_product_kernel(ev, rows.narrow(0, r0, nr), cols.narrow(0, c0, nc), q)
                                  : output_kernel(ev, f, cols.narrow(0, c0, nc));  // [nr, nc, K, K]
        out.narrow(0, r0, nr).narrow(1, c0, nc).add_(options.trace ? trace_of(k) : k);
      }
    }
  });
  return out;
}

torch::Tensor gram_diagonal(PathReader& reader, const torch::Tensor& x_in, bool test, const GramOptions& options) {
  const Manifest& m = reader.manifest();
  const int64_t n = x_in.size(0), K = m.num_classes;
  const GramSpec& spec = options.kernel;
  PK_CHECK(options.block >= 1, "gram: block must be >= 1 (got " << options.block << ")");
  const torch::Tensor x = x_in.to(torch::kFloat64);
  if (spec.kind == GramSpec::Kind::NtkInfinite) {
    // x = x': every layer's angle is 0, so Σ^{l+1} = c_σ Σ^l / 2 + β², Σ̇ = c_σ / 2 = 1.
    const InfiniteWidthOptions o = infinite_width_options(reader, options);
    const double b2 = o.bias_scale * o.bias_scale;
    torch::Tensor sigma = x.flatten(1).pow(2).sum(1) / static_cast<double>(std::max<int64_t>(1, x.flatten(1).size(1))) + b2;
    torch::Tensor theta = sigma.clone();
    for (int64_t l = 0; l < o.hidden_layers; ++l) {
      sigma = sigma + b2;
      theta = theta + sigma;
    }
    if (options.trace) return theta * static_cast<double>(K);
    return theta.view({n, 1, 1}) * torch::eye(K, torch::kFloat64);
  }
  const bool integrate = spec.kind == GramSpec::Kind::Epk && test;
  QuadratureOptions q = options.quadrature.for_run(reader.manifest().steps);  // the run's budget per step
  if (!integrate) q.spec = QuadratureSpec::parse("dpk");
  Network net64 = engine_network(m.network_options());
  SegmentEvaluator ev(net64, q.route);
  torch::Tensor out = torch::zeros({n, K, K}, torch::kFloat64);
  for_each_step(reader, spec, options.progress, [&](const torch::Tensor& w, const torch::Tensor& dw) {
    ev.set_segment(w, dw);
    for (int64_t i0 = 0; i0 < n; i0 += options.block) {
      const int64_t nb = std::min(options.block, n - i0);
      out.narrow(0, i0, nb).add_(segment_product_diagonal(ev, x.narrow(0, i0, nb), q));
    }
  });
  return options.trace ? trace_of(out) : out;
}

KernelMatrices kernel_matrices(PathReader& reader, const torch::Tensor& x_train, const torch::Tensor& x_query,
                               bool query_test, GramOptions options, bool self) {
  options.trace = true;
  const double K = static_cast<double>(reader.manifest().num_classes);
  KernelMatrices k;
  k.train = gram(reader, x_train, false, x_train, false, options) / K;
  k.cross = gram(reader, x_query, query_test, x_train, false, options) / K;
  if (self) k.self = gram_diagonal(reader, x_query, query_test, options) / K;
  return k;
}

}  // namespace pathkernel
