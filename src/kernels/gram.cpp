// Gram matrices of the EPK, DPK and NTKs in blocks.
#include "pathkernel/gram.h"

#include <algorithm>

#include "pathkernel/error.h"
#include "pathkernel/infinite_width.h"
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

torch::Tensor gram(PathReader& reader, const torch::Tensor& rows_in, bool rows_test, const torch::Tensor& cols_in,
                   bool cols_test, const GramOptions& options) {
  const Manifest& m = reader.manifest();
  const int64_t R = rows_in.size(0), C = cols_in.size(0), K = m.num_classes;
  const GramSpec& spec = options.kernel;
  PK_CHECK(options.block >= 1, "gram: block must be >= 1 (got " << options.block << ")");
  if (spec.kind == GramSpec::Kind::NtkInfinite) {
    const ModelSpec model = ModelSpec::parse(m.model_spec);
    PK_CHECK(model.kind == "mlp" && model.activation == "relu",
             "ntk-inf is the kernel of a fully-connected ReLU network; run '" << reader.dir() << "' has model '"
                                                                            << m.model_spec << "'");
    InfiniteWidthOptions o;
    o.hidden_layers = static_cast<int64_t>(model.widths.size());
    o.bias_scale = options.bias_scale;
    torch::Tensor theta = infinite_width_kernels(rows_in, cols_in, o).ntk;  // [R, C]
    if (options.trace) return theta * static_cast<double>(K);
    return theta.unsqueeze(2).unsqueeze(3) * torch::eye(K, torch::kFloat64);
  }
  // The integrated side: epk's test rows. A test column with training rows is
  // the transpose of the same computation.
  if (spec.kind == GramSpec::Kind::Epk && cols_test && !rows_test) {
    torch::Tensor t = gram(reader, cols_in, true, rows_in, false, options);
    return options.trace ? t.t().contiguous() : t.permute({1, 0, 3, 2}).contiguous();
  }
  PK_CHECK(!(spec.kind == GramSpec::Kind::Epk && rows_test && cols_test),
           "gram: the epk between two test sets (∫ J(t,x) J(t,x')ᵀ dt) is not built yet; use dpk or ntk there");
  const bool integrate = spec.kind == GramSpec::Kind::Epk && rows_test;
  QuadratureOptions q = options.quadrature;
  if (!integrate) q.spec = QuadratureSpec::parse("dpk");

  Network net64 = engine_network(m.network_options());
  SegmentEvaluator ev(net64);
  const torch::Tensor rows = rows_in.to(torch::kFloat64), cols = cols_in.to(torch::kFloat64);
  torch::Tensor out = options.trace ? torch::zeros({R, C}, torch::kFloat64) : torch::zeros({R, C, K, K}, torch::kFloat64);
  const int64_t b = options.block;
  auto add_step = [&](const torch::Tensor& w, const torch::Tensor& dw) {
    ev.set_segment(w, dw);
    for (int64_t r0 = 0; r0 < R; r0 += b) {
      const int64_t nr = std::min(b, R - r0);
      TestFeatures f = test_features(ev, rows.narrow(0, r0, nr), q);
      for (int64_t c0 = 0; c0 < C; c0 += b) {
        const int64_t nc = std::min(b, C - c0);
        torch::Tensor k = output_kernel(ev, f, cols.narrow(0, c0, nc));  // [nr, nc, K, K]
        if (options.trace) k = k.diagonal(0, 2, 3).sum(2);
        out.narrow(0, r0, nr).narrow(1, c0, nc).add_(k);
      }
    }
  };
  if (spec.kind == GramSpec::Kind::Ntk) {
    const int64_t s = spec.step < 0 ? m.steps : spec.step;
    PK_CHECK(s <= m.steps, "bad kernel 'ntk:" << s << "': the run has steps 0.." << m.steps);
    add_step(reader.weights(s), torch::zeros({m.parameter_count}, torch::kFloat64));
    return out;
  }
  ProgressBar bar(m.steps, "gram " + spec.str(), options.progress);
  reader.forward([&](const PathStep& st) {
    add_step(st.w, st.delta);
    bar.update(st.step + 1);
  });
  bar.finish();
  return out;
}

}  // namespace pathkernel
