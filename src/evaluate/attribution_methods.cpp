// The attribution methods evaluate.h compares: the exact contribution, the
// discrete path kernel, checkpoint TracIn, final-weight gradient similarity
// and a random baseline.
#include "pathkernel/attribution_methods.h"

#include <filesystem>
#include <functional>

#include <nlohmann/json.hpp>

#include "pathkernel/context.h"
#include "pathkernel/decomposition.h"
#include "pathkernel/decomposition_checkpoint.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/metagradient.h"
#include "pathkernel/progress.h"
#include "pathkernel/segment.h"
#include "pathkernel/text.h"

namespace pathkernel {

namespace fs = std::filesystem;

namespace {

using Method = std::function<torch::Tensor(PathReader&, const torch::Tensor&, const torch::Tensor&,
                                           const AttributionOptions&)>;

/// scores[n, i] = c[n, i, output[n]] for c [n, M, K].
torch::Tensor select_output(const torch::Tensor& c, const torch::Tensor& output) {
  const int64_t n = c.size(0), M = c.size(1);
  return c.gather(2, output.view({n, 1, 1}).expand({n, M, 1})).squeeze(2).contiguous();
}

/// The decomposition's contributions for the chosen outputs, with quadrature q.
torch::Tensor decomposition_scores(PathReader& reader, const std::string& method, const torch::Tensor& x,
                                   const torch::Tensor& output, const AttributionOptions& options,
                                   const QuadratureOptions& q) {
  DecompositionOptions d;
  d.quadrature = q;
  d.train_chunk = options.train_chunk;
  d.progress = options.progress;
  if (options.progress_dir.empty()) return select_output(decompose(reader, x, d).contributions, output);
  const torch::Tensor xc = x.to(torch::kFloat64).contiguous();
  nlohmann::ordered_json arguments{
      {"manifest_crc32", reader.manifest_crc32()},
      {"method", method},
      {"inputs_crc32", crc32_update(0, xc.data_ptr(), static_cast<size_t>(xc.numel()) * 8)},
      {"quadrature", q.spec.str()},
      {"tol", q.tol},
      {"gauss_nodes", q.gauss_nodes},
      {"threads", current_threads()}};
  DirectoryCheckpoint progress((fs::path(options.progress_dir) / method).string(), arguments,
                               options.checkpoint_seconds);
  progress.resume_point();
  Decomposition result = decompose(reader, x, d, &progress);
  progress.finish();
  return select_output(result.contributions, output);
}

/// −Σ_k weight_k ∇f_{output}(w_k, x)·∇ℓ_i(w_k) over weight vectors w_k
/// (float64 [P]) with weights weight_k: [n, M].
torch::Tensor gradient_dot_scores(PathReader& reader, const std::vector<torch::Tensor>& weights,
                                  const std::vector<double>& weight_of, const torch::Tensor& x,
                                  const torch::Tensor& output, const AttributionOptions& options,
                                  const std::string& label) {
  const Manifest& m = reader.manifest();
  const NetworkOptions net_options = m.network_options();
  Network net64 = engine_network(net_options);
  SegmentEvaluator ev(net64);
  QuadratureOptions q;
  q.spec = QuadratureSpec::parse("dpk");
  const torch::Tensor x64 = x.to(torch::kFloat64);
  const torch::Tensor& y_train = reader.held_dataset().y_train;  // the inputs read by chunks (train_rows)
  const int64_t n = x.size(0), M = reader.train_count();
  torch::Tensor scores = torch::zeros({n, M}, torch::kFloat64);
  const torch::Tensor& lw = reader.loss_weights();  // each point's gradient carries its loss weight
  ProgressBar bar(static_cast<int64_t>(weights.size()), label, options.progress);
  for (size_t k = 0; k < weights.size(); ++k) {
    ev.set_segment(weights[k], torch::zeros_like(weights[k]));
    const TestFeatures f = test_features(ev, x64, q);
    for (int64_t i0 = 0; i0 < M; i0 += options.train_chunk) {
      const int64_t b = std::min(options.train_chunk, M - i0);
      const torch::Tensor rows = reader.train_rows(i0, b);
      const TrainSignals t = train_signals(ev, rows.to(torch::kFloat64),
                                           y_train.narrow(0, i0, b), net_options.output, net_options.loss,
                                           lw.defined() ? lw.narrow(0, i0, b) : lw);
      const torch::Tensor dots = select_output(contract(ev, f, t), output);  // [n, b]
      scores.narrow(1, i0, b).add_(dots, -weight_of[k]);
    }
    bar.update(static_cast<int64_t>(k + 1));
  }
  bar.finish();
  return scores;
}

torch::Tensor epk(PathReader& reader, const torch::Tensor& x, const torch::Tensor& output,
                  const AttributionOptions& options) {
  return decomposition_scores(reader, "epk", x, output, options, options.quadrature);
}

torch::Tensor dpk(PathReader& reader, const torch::Tensor& x, const torch::Tensor& output,
                  const AttributionOptions& options) {
  QuadratureOptions q = options.quadrature;
  q.spec = QuadratureSpec::parse("dpk");
  return decomposition_scores(reader, "dpk", x, output, options, q);
}

torch::Tensor tracin_cp(PathReader& reader, const torch::Tensor& x, const torch::Tensor& output,
                        const AttributionOptions& options) {
  const Manifest& m = reader.manifest();
  std::vector<torch::Tensor> weights;
  std::vector<double> weight_of;
  for (size_t k = 0; k + 1 < m.checkpoints.size(); ++k) {
    double lr_sum = 0;
    for (int64_t s = m.checkpoints[k].step; s < m.checkpoints[k + 1].step; ++s) lr_sum += m.learning_rates[s];
    weights.push_back(reader.checkpoint(k));
    weight_of.push_back(lr_sum / static_cast<double>(m.num_train));
  }
  return gradient_dot_scores(reader, weights, weight_of, x, output, options, "tracin-cp");
}

torch::Tensor grad_dot(PathReader& reader, const torch::Tensor& x, const torch::Tensor& output,
                       const AttributionOptions& options) {
  const Manifest& m = reader.manifest();
  double lr_sum = 0;
  for (double lr : m.learning_rates) lr_sum += lr;
  return gradient_dot_scores(reader, {reader.checkpoint(m.checkpoints.size() - 1)},
                             {lr_sum / static_cast<double>(m.num_train)}, x, output, options, "grad-dot");
}

/// c_i · d f(w_N, x)/d c_i: removing point i (c_i → 0) moves the output by
/// minus this, to first order, the whole run responding.
torch::Tensor metagradient_scores(PathReader& reader, const torch::Tensor& x, const torch::Tensor& output,
                                  const AttributionOptions& options) {
  MetagradientOptions o;
  o.outputs = output;
  o.progress = options.progress;
  torch::Tensor scores = select_output(metagradient(reader, x, o).values, output);
  if (reader.loss_weights().defined()) scores.mul_(reader.loss_weights().view({1, -1}));
  return scores;
}

torch::Tensor random_scores(PathReader& reader, const torch::Tensor& x, const torch::Tensor& /*output*/,
                            const AttributionOptions& options) {
  auto gen = at::detail::createCPUGenerator(options.seed);
  return torch::randn({x.size(0), reader.manifest().num_train}, gen, torch::kFloat64);
}

struct Entry {
  const char* name;
  Method method;
};

const std::vector<Entry>& registry() {
  static const std::vector<Entry> entries = {
      {"epk", epk},           {"dpk", dpk},         {"tracin-cp", tracin_cp}, {"grad-dot", grad_dot},
      {"metagradient", metagradient_scores}, {"random", random_scores}};
  return entries;
}

}  // namespace

std::vector<std::string> attribution_method_names() {
  std::vector<std::string> names;
  for (const Entry& e : registry()) names.push_back(e.name);
  return names;
}

void check_attribution_method(const std::string& name) {
  for (const Entry& e : registry()) {
    if (name == e.name) return;
  }
  PK_THROW("unknown attribution method '" << name << "': expected one of " << join(attribution_method_names()));
}

torch::Tensor attribution_scores(PathReader& reader, const std::string& method, const torch::Tensor& x,
                                 const torch::Tensor& output, const AttributionOptions& options) {
  check_attribution_method(method);
  const int64_t K = reader.manifest().num_classes;
  PK_CHECK(x.dim() >= 2 && x.size(0) >= 1, "attribution: test inputs must be [n >= 1, ...] (got " << x.sizes()
                                                                                                   << ")");
  PK_CHECK(output.dim() == 1 && output.size(0) == x.size(0) && output.scalar_type() == torch::kLong,
           "attribution: outputs must be int64 [" << x.size(0) << "], one per test input (got " << output.sizes()
                                                  << " " << output.scalar_type() << ")");
  PK_CHECK(output.min().item<int64_t>() >= 0 && output.max().item<int64_t>() < K,
           "attribution: outputs must lie in [0, " << K << ") (got " << output.min().item<int64_t>() << " .. "
                                                   << output.max().item<int64_t>() << ")");
  PK_CHECK(options.train_chunk >= 1, "attribution: train_chunk must be >= 1 (got " << options.train_chunk << ")");
  for (const Entry& e : registry()) {
    if (method == e.name) return e.method(reader, x, output, options);
  }
  PK_ASSERT(false);
  return {};
}

}  // namespace pathkernel
