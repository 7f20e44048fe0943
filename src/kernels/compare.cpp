// Kernel methods beside the trained network on the same test points, and the
// comparison's files (compare.md, compare.csv).
#include "pathkernel/compare.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <sstream>

#include "pathkernel/dataset.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/infinite_width.h"
#include "pathkernel/kernel_regression.h"
#include "pathkernel/model.h"
#include "pathkernel/svm_refit.h"
#include "pathkernel/text.h"

namespace pathkernel {

namespace {

/// The fraction of true entries of a boolean tensor.
double fraction(const torch::Tensor& eq) { return eq.to(torch::kFloat64).mean().item<double>(); }

/// Indices int64 [n] into a set of `size` points, checked.
void check_indices(const torch::Tensor& idx, int64_t size, const char* what) {
  PK_CHECK(idx.defined() && idx.dim() == 1 && idx.scalar_type() == torch::kLong && idx.size(0) >= 1,
           what << " indices must be a non-empty int64 vector");
  const int64_t lo = idx.min().item<int64_t>(), hi = idx.max().item<int64_t>();
  PK_CHECK(lo >= 0 && hi < size, what << " index " << (lo < 0 ? lo : hi) << " is out of range [0, " << size << ")");
}

/// "%.4f", as compare.md and compare.csv print scores.
std::string score(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

}  // namespace

std::vector<GramSpec> CompareOptions::parse_kernel_list(const std::string& list) {
  std::vector<GramSpec> kernels;
  for (const std::string& name : split(list, ',')) kernels.push_back(GramSpec::parse(name));
  PK_CHECK(!kernels.empty(), "the list of kernels to compare is empty: expected e.g. epk,dpk,ntk");
  return kernels;
}

void CompareOptions::check() const {
  PK_CHECK(!kernels.empty(), "the list of kernels to compare is empty: expected e.g. epk,dpk,ntk");
  PK_CHECK(std::isfinite(c) && c > 0, "the SVM's cost C must be > 0 (got " << c << ")");
  PK_CHECK(std::isfinite(bias_scale) && bias_scale >= 0, "bias scale must be finite and >= 0 (got " << bias_scale << ")");
}

Comparison compare_kernel_methods(PathReader& reader, const torch::Tensor& train_index,
                                  const torch::Tensor& test_index, const CompareOptions& options) {
  options.check();
  const auto t0 = std::chrono::steady_clock::now();
  const Manifest& m = reader.manifest();
  const Dataset& data = reader.held_dataset();  // the inputs read by rows (train_inputs, test_inputs)
  check_indices(train_index, reader.train_count(), "training");
  check_indices(test_index, reader.test_count(), "test");
  const int64_t K = m.num_classes;
  const torch::Tensor& ti = train_index;
  const torch::Tensor x_train = reader.train_inputs(ti).to(torch::kFloat64);
  const torch::Tensor y_train = data.y_train.index_select(0, ti);
  const torch::Tensor x_test = reader.test_inputs(test_index).to(torch::kFloat64);
  const torch::Tensor labels = data.y_test.index_select(0, test_index);
  const torch::Tensor onehot = torch::zeros({ti.size(0), K}, torch::kFloat64).scatter_(1, y_train.view({-1, 1}), 1.0);
  const torch::Tensor net = reader.outputs(m.steps, x_test).argmax(1);

  Comparison out;
  out.run = reader.dir();
  out.model = m.model_spec;
  out.steps = m.steps;
  out.train_points = ti.size(0);
  out.test_points = test_index.size(0);
  auto add = [&](const std::string& method, const std::string& kernel, const torch::Tensor& predicted,
                 const std::string& note) {
    out.rows.push_back({method, kernel, fraction(predicted.eq(labels)), fraction(predicted.eq(net)), note});
  };
  add("trained network", "-", net, "");

  // The exact kernel machine: all training points, every step.
  const Decomposition d = decompose(reader, x_test, options.decomposition);
  std::ostringstream note;
  note << "all " << reader.train_count() << " training points; max relative error " << summarize(d).max_rel_error;
  add("kernel machine (exact)", "epk", d.prediction().argmax(1), note.str());

  GramOptions g;
  g.quadrature = options.decomposition.quadrature;
  g.progress = options.decomposition.progress;
  g.bias_scale = options.bias_scale;
  const std::string subset = std::to_string(ti.size(0)) + " training points";
  for (const GramSpec& spec : options.kernels) {
    g.kernel = spec;
    const KernelMatrices k = kernel_matrices(reader, x_train, x_test, true, g, false);
    SvmOptions svm;
    svm.c = options.c;
    const SvmRefit fit = svm_refit(k.train, y_train, k.cross, svm);
    add("SVM refit", spec.str(), fit.predicted, subset + ", " + std::to_string(fit.support_vectors) + " support vectors");
    const KernelPrediction kr = kernel_regression(k.train, k.cross, onehot, {});
    add("kernel regression", spec.str(), kr.mean.argmax(1),
        subset + ", one-hot targets" + (kr.dropped ? ", " + std::to_string(kr.dropped) + " null directions dropped" : ""));
  }
  const ModelSpec model = ModelSpec::parse(m.model_spec);
  if (model.kind == "mlp" && model.activation == "relu") {
    InfiniteWidthOptions o;
    o.hidden_layers = static_cast<int64_t>(model.widths.size());
    o.bias_scale = options.bias_scale;
    const torch::Tensor nxx = infinite_width_kernels(x_train, x_train, o).nngp;
    const torch::Tensor nsx = infinite_width_kernels(x_test, x_train, o).nngp;
    add("kernel regression", "nngp", kernel_regression(nxx, nsx, onehot, {}).mean.argmax(1), subset + ", one-hot targets");
  }
  // The lazy dynamics: the network linearised at w_0, trained by gradient
  // flow on the squared loss for the run's total time Σ_s η_s. The scalar
  // kernel is trace / K; each output's tangent kernel is about that.
  g.kernel = GramSpec::parse("ntk:0");
  const KernelMatrices k0 = kernel_matrices(reader, x_train, x_test, true, g, false);
  const double tau = std::accumulate(m.learning_rates.begin(), m.learning_rates.end(), 0.0);
  const KernelPrediction lazy =
      lazy_dynamics(k0.train, k0.cross, reader.outputs(0, x_train), reader.outputs(0, x_test), onehot, tau, {});
  std::ostringstream lazy_note;
  lazy_note << subset << ", squared loss on one-hot targets, time Σ η_s = " << tau;
  add("lazy dynamics", "ntk:0", lazy.mean.argmax(1), lazy_note.str());
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

std::string Comparison::markdown() const {
  std::ostringstream md;
  md << "# Kernel methods beside the network\n\nRun `" << run << "` (" << model << ", " << steps << " steps), "
     << test_points << " test points. Agreement: the fraction of test points where the "
     << "method's predicted class is the network's.\n\n| method | kernel | accuracy | agreement with the network | notes |\n|---|---|---|---|---|\n";
  for (const ComparisonRow& r : rows) {
    md << "| " << r.method << " | " << r.kernel << " | " << score(r.accuracy) << " | " << score(r.agreement) << " | "
       << r.note << " |\n";
  }
  md << "\nScalar kernel: trace / K of each K x K output kernel. Took " << seconds << " s.\n";
  return md.str();
}

std::string Comparison::csv() const {
  std::ostringstream csv;
  csv << "method,kernel,accuracy,agreement,notes\n";
  for (const ComparisonRow& r : rows) {
    csv << r.method << "," << r.kernel << "," << score(r.accuracy) << "," << score(r.agreement) << ",\"" << r.note
        << "\"\n";
  }
  return csv.str();
}

nlohmann::ordered_json Comparison::rows_json() const {
  nlohmann::ordered_json table = nlohmann::ordered_json::array();
  for (const ComparisonRow& r : rows) {
    table.push_back({{"method", r.method}, {"kernel", r.kernel}, {"accuracy", r.accuracy},
                     {"agreement", r.agreement}, {"notes", r.note}});
  }
  return table;
}

std::string write_comparison(const Comparison& comparison, const std::string& dir) {
  std::filesystem::create_directories(dir);
  const std::string md = (std::filesystem::path(dir) / "compare.md").string();
  write_file_atomic(md, comparison.markdown());
  write_file_atomic((std::filesystem::path(dir) / "compare.csv").string(), comparison.csv());
  return md;
}

}  // namespace pathkernel
