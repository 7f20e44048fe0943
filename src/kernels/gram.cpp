// Gram matrices of the EPK, DPK and NTKs in blocks, each kernel built by name
// from the registry.
#include "pathkernel/gram.h"

#include <algorithm>
#include <optional>

#include "pathkernel/dropout.h"
#include "pathkernel/error.h"
#include "pathkernel/infinite_width.h"
#include "pathkernel/product_kernel.h"
#include "pathkernel/progress.h"
#include "pathkernel/text.h"

namespace pathkernel {

namespace {

torch::Tensor trace_of(const torch::Tensor& k) { return k.diagonal(0, -2, -1).sum(-1); }

/// The kernels of the path: Σ over the path's steps (or at one step) of
/// Jacobian products, with epk's test side integrated along each step.
class PathKernel : public Kernel {
 public:
  /// integrate: epk (the test side along each step; dpk and ntk take every
  /// side at the step's start). one_step: ntk, at `step` (−1: the last).
  PathKernel(std::string name, bool integrate, bool one_step, int64_t step)
      : name_(std::move(name)), integrate_(integrate), one_step_(one_step), step_(step) {}

  bool integrates_test_side() const override { return integrate_; }
  bool closed_form() const override { return false; }

  torch::Tensor gram(PathReader& reader, const torch::Tensor& rows_in, bool rows_test, const torch::Tensor& cols_in,
                     bool cols_test, const GramOptions& options) const override {
    const Manifest& m = reader.manifest();
    const int64_t R = rows_in.size(0), C = cols_in.size(0), K = m.num_classes;
    // The integrated side: epk's test rows. A test column with training rows
    // is the transpose of the same computation.
    if (integrate_ && cols_test && !rows_test) {
      torch::Tensor t = gram(reader, cols_in, true, rows_in, false, options);
      return options.trace ? t.t().contiguous() : t.permute({1, 0, 3, 2}).contiguous();
    }
    const bool integrate = integrate_ && rows_test;
    // Two test sides integrate their product along t, in smaller blocks: the
    // pieces of a block are the union of its points' pieces.
    const bool product = integrate && cols_test;
    const QuadratureOptions q = quadrature(reader, options, integrate);
    Network net64 = engine_network(m.network_options());
    SegmentEvaluator ev(net64, q.route);
    const torch::Tensor rows = rows_in.to(torch::kFloat64), cols = cols_in.to(torch::kFloat64);
    torch::Tensor out =
        options.trace ? torch::zeros({R, C}, torch::kFloat64) : torch::zeros({R, C, K, K}, torch::kFloat64);
    const int64_t b = product ? std::min<int64_t>(options.block, 32) : options.block;
    for_each_step(reader, options.progress, [&](const torch::Tensor& w, const torch::Tensor& dw, int64_t step) {
      ev.set_segment(w, dw);
      for (int64_t r0 = 0; r0 < R; r0 += b) {
        const int64_t nr = std::min(b, R - r0);
        TestFeatures f;
        if (!product) {
          const auto dropout = masks(m, !rows_test, step);
          f = test_features(ev, rows.narrow(0, r0, nr), q);
        }
        for (int64_t c0 = 0; c0 < C; c0 += b) {
          const int64_t nc = std::min(b, C - c0);
          const auto dropout = masks(m, !cols_test, step);
          torch::Tensor k = product ? segment_product_kernel(ev, rows.narrow(0, r0, nr), cols.narrow(0, c0, nc), q)
                                    : output_kernel(ev, f, cols.narrow(0, c0, nc));  // [nr, nc, K, K]
          out.narrow(0, r0, nr).narrow(1, c0, nc).add_(options.trace ? trace_of(k) : k);
        }
      }
    });
    return out;
  }

  torch::Tensor diagonal(PathReader& reader, const torch::Tensor& x_in, bool test,
                         const GramOptions& options) const override {
    const Manifest& m = reader.manifest();
    const int64_t n = x_in.size(0), K = m.num_classes;
    const torch::Tensor x = x_in.to(torch::kFloat64);
    const QuadratureOptions q = quadrature(reader, options, integrate_ && test);
    Network net64 = engine_network(m.network_options());
    SegmentEvaluator ev(net64, q.route);
    torch::Tensor out = torch::zeros({n, K, K}, torch::kFloat64);
    for_each_step(reader, options.progress, [&](const torch::Tensor& w, const torch::Tensor& dw, int64_t step) {
      ev.set_segment(w, dw);
      const auto dropout = masks(m, !test, step);
      for (int64_t i0 = 0; i0 < n; i0 += options.block) {
        const int64_t nb = std::min(options.block, n - i0);
        out.narrow(0, i0, nb).add_(segment_product_diagonal(ev, x.narrow(0, i0, nb), q));
      }
    });
    return options.trace ? trace_of(out) : out;
  }

 private:
  /// The run's budget per step when a side is integrated; else the left point.
  static QuadratureOptions quadrature(const PathReader& reader, const GramOptions& options, bool integrate) {
    QuadratureOptions q = options.quadrature.for_run(reader.manifest().steps);
    if (!integrate) q.spec = QuadratureSpec::parse("dpk");
    return q;
  }

  /// The EPK is the kernel of the kernel machine: its training side is the
  /// gradient training took, with the step's dropout masks (dropout.h). The
  /// DPK and the NTK, and every test side, see the network in eval mode.
  std::optional<DropoutStep> masks(const Manifest& m, bool training_side, int64_t step) const {
    if (!integrate_ || !training_side) return std::nullopt;
    return std::optional<DropoutStep>(std::in_place, m.init_seed, step);
  }

  /// Calls add_step(w_s, dw_s, s) for the steps the kernel sums over: every
  /// step, or ntk's one point S (with dw = 0).
  template <typename F>
  void for_each_step(PathReader& reader, bool progress, F add_step) const {
    const Manifest& m = reader.manifest();
    if (one_step_) {
      const int64_t s = step_ < 0 ? m.steps : step_;
      PK_CHECK(s <= m.steps, "bad kernel 'ntk:" << s << "': the run has steps 0.." << m.steps);
      add_step(reader.weights(s), torch::zeros({m.parameter_count}, torch::kFloat64), s);
      return;
    }
    ProgressBar bar(m.steps, "gram " + name_, progress);
    reader.forward([&](const PathStep& st) {
      add_step(st.w, st.delta, st.step);
      bar.update(st.step + 1);
    });
    bar.finish();
  }

  std::string name_;
  bool integrate_, one_step_;
  int64_t step_;
};

/// The infinite-width NTK of a fully-connected ReLU network of the run's
/// depth (infinite_width.h), times the K x K identity: a closed form.
class InfiniteWidthNtk : public Kernel {
 public:
  bool integrates_test_side() const override { return false; }
  bool closed_form() const override { return true; }

  torch::Tensor gram(PathReader& reader, const torch::Tensor& rows, bool, const torch::Tensor& cols, bool,
                     const GramOptions& options) const override {
    const int64_t K = reader.manifest().num_classes;
    torch::Tensor theta = infinite_width_kernels(rows, cols, network(reader, options)).ntk;
    if (options.trace) return theta * static_cast<double>(K);
    return theta.unsqueeze(2).unsqueeze(3) * torch::eye(K, torch::kFloat64);
  }

  torch::Tensor diagonal(PathReader& reader, const torch::Tensor& x_in, bool, const GramOptions& options) const override {
    const int64_t n = x_in.size(0), K = reader.manifest().num_classes;
    const torch::Tensor x = x_in.to(torch::kFloat64).flatten(1);
    // x = x': every layer's angle is 0, so Σ^{l+1} = c_σ Σ^l / 2 + β², Σ̇ = c_σ / 2 = 1.
    const InfiniteWidthOptions o = network(reader, options);
    const double b2 = o.bias_scale * o.bias_scale;
    torch::Tensor sigma = x.pow(2).sum(1) / static_cast<double>(std::max<int64_t>(1, x.size(1))) + b2;
    torch::Tensor theta = sigma.clone();
    for (int64_t l = 0; l < o.hidden_layers; ++l) {
      sigma = sigma + b2;
      theta = theta + sigma;
    }
    if (options.trace) return theta * static_cast<double>(K);
    return theta.view({n, 1, 1}) * torch::eye(K, torch::kFloat64);
  }

 private:
  /// The run's network, which must be a fully-connected ReLU network.
  static InfiniteWidthOptions network(const PathReader& reader, const GramOptions& options) {
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
};

/// The names the registry knows, for messages: "epk, dpk, ntk[:STEP], ntk-inf".
std::string known_kernels() {
  std::vector<std::string> syntax;
  for (const KernelEntry& e : kernel_registry()) syntax.push_back(e.syntax);
  return join(syntax);
}

const KernelEntry* find_entry(const std::string& name) {
  for (const KernelEntry& e : kernel_registry()) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

}  // namespace

const std::vector<KernelEntry>& kernel_registry() {
  static const std::vector<KernelEntry> registry{
      {"epk", "epk", "the exact path kernel: the test side integrated along every step",
       [](const GramSpec&) -> std::unique_ptr<Kernel> { return std::make_unique<PathKernel>("epk", true, false, -1); }},
      {"dpk", "dpk", "the discrete path kernel: every step's Jacobians at its start",
       [](const GramSpec&) -> std::unique_ptr<Kernel> { return std::make_unique<PathKernel>("dpk", false, false, -1); }},
      {"ntk", "ntk[:STEP]", "the empirical NTK at one step (default: the last)",
       [](const GramSpec& s) -> std::unique_ptr<Kernel> {
         return std::make_unique<PathKernel>("ntk", false, true, s.step);
       }},
      {"ntk-inf", "ntk-inf", "the infinite-width NTK of a fully-connected ReLU network of the run's depth",
       [](const GramSpec&) -> std::unique_ptr<Kernel> { return std::make_unique<InfiniteWidthNtk>(); }},
  };
  return registry;
}

std::unique_ptr<Kernel> make_kernel(const GramSpec& spec) {
  const KernelEntry* e = find_entry(spec.name);
  PK_CHECK(e != nullptr, "unknown kernel '" << spec.name << "': expected one of " << known_kernels());
  return e->make(spec);
}

GramSpec GramSpec::parse(const std::string& text) {
  GramSpec g;
  const size_t colon = text.find(':');
  g.name = text.substr(0, colon);
  PK_CHECK(find_entry(g.name) != nullptr, "unknown kernel '" << text << "': expected one of " << known_kernels());
  if (colon != std::string::npos) {
    PK_CHECK(g.name == "ntk", "bad kernel '" << text << "': only ntk takes a step (ntk:STEP)");
    const std::string s = text.substr(colon + 1);
    size_t used = 0;
    try {
      g.step = std::stoll(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    PK_CHECK(!s.empty() && used == s.size() && g.step >= 0,
             "bad kernel '" << text << "': the step after 'ntk:' must be a whole number >= 0");
  }
  return g;
}

std::string GramSpec::str() const { return step < 0 ? name : name + ":" + std::to_string(step); }

torch::Tensor gram(PathReader& reader, const torch::Tensor& rows, bool rows_test, const torch::Tensor& cols,
                   bool cols_test, const GramOptions& options) {
  PK_CHECK(options.block >= 1, "gram: block must be >= 1 (got " << options.block << ")");
  return make_kernel(options.kernel)->gram(reader, rows, rows_test, cols, cols_test, options);
}

torch::Tensor gram_diagonal(PathReader& reader, const torch::Tensor& x, bool test, const GramOptions& options) {
  PK_CHECK(options.block >= 1, "gram: block must be >= 1 (got " << options.block << ")");
  return make_kernel(options.kernel)->diagonal(reader, x, test, options);
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
