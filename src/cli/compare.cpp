// `pathkernel compare`: every kernel method on the same test points, beside
// the trained network: accuracy and agreement with the network's predictions.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <numeric>
#include <sstream>

#include "commands.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/infinite_width.h"
#include "pathkernel/kernel_regression.h"
#include "pathkernel/svm_refit.h"
#include "pathkernel/text.h"

namespace pathkernel::cli {

namespace {

struct Row {
  std::string method, kernel;
  double accuracy = 0, agreement = 0;
  std::string note;
};

}  // namespace

void add_compare_command(CLI::App& app, Globals& globals) {
  struct Args {
    std::string run, kernels = "epk,dpk,ntk:0,ntk,ntk-inf", out;
    double c = 1.0, bias_scale = 0.0;
    KernelPointArgs points;
    QuadratureArgs q;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "compare", "Kernel methods beside the trained network on the same test points: the exact EPK machine, SVM "
                 "refits and kernel regression on each kernel, the NNGP, and the lazy (linearised) dynamics");
  cmd->add_option("RUN", args->run, "Run directory")->required();
  cmd->add_option("--kernels", args->kernels, "Comma-separated kernels for the SVM and regression rows")
      ->capture_default_str();
  cmd->add_option("--c", args->c, "C-SVC's cost C")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--bias-scale", args->bias_scale, "ntk-inf and nngp: the bias scale beta")->capture_default_str();
  args->points.add_to(cmd);
  args->q.add_to(cmd, globals);
  cmd->add_option("--out", args->out, "Output directory (default: RUN/compare)");
  cmd->callback([args, &globals] {
    globals.apply();
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<GramSpec> kernels;
    for (const std::string& name : split(args->kernels, ',')) kernels.push_back(GramSpec::parse(name));
    PK_CHECK(!kernels.empty(), "--kernels is empty: expected e.g. epk,dpk,ntk");
    const DecompositionOptions dopts = args->q.options();
    PathReader reader(args->run);
    const Manifest& m = reader.manifest();
    const Dataset& data = reader.dataset();
    const int64_t K = m.num_classes;
    const torch::Tensor ti = args->points.train_indices(data.y_train), si = args->points.test_indices(data.y_test);
    const torch::Tensor x_train = data.x_train.index_select(0, ti).to(torch::kFloat64);
    const torch::Tensor y_train = data.y_train.index_select(0, ti);
    const torch::Tensor x_test = data.x_test.index_select(0, si).to(torch::kFloat64);
    const torch::Tensor labels = data.y_test.index_select(0, si);
    const torch::Tensor onehot = torch::zeros({ti.size(0), K}, torch::kFloat64).scatter_(1, y_train.view({-1, 1}), 1.0);
    const torch::Tensor net = reader.outputs(m.steps, x_test).argmax(1);
    auto fraction = [](const torch::Tensor& eq) { return eq.to(torch::kFloat64).mean().item<double>(); };
    std::vector<Row> rows;
    auto add = [&](const std::string& method, const std::string& kernel, const torch::Tensor& predicted,
                   const std::string& note) {
      rows.push_back({method, kernel, fraction(predicted.eq(labels)), fraction(predicted.eq(net)), note});
    };
    add("trained network", "-", net, "");

    // The exact kernel machine: all training points, every step.
    Decomposition d = decompose(reader, x_test, dopts);
    const double rel = summarize(d).max_rel_error;
    std::ostringstream note;
    note << "all " << data.x_train.size(0) << " training points; max relative error " << rel;
    add("kernel machine (exact)", "epk", d.prediction().argmax(1), note.str());

    GramOptions g;
    g.quadrature = dopts.quadrature;
    g.progress = dopts.progress;
    g.bias_scale = args->bias_scale;
    const std::string subset = std::to_string(ti.size(0)) + " training points";
    for (const GramSpec& spec : kernels) {
      g.kernel = spec;
      KernelMatrices k = kernel_matrices(reader, x_train, x_test, true, g, false);
      SvmOptions svm;
      svm.c = args->c;
      SvmRefit fit = svm_refit(k.train, y_train, k.cross, svm);
      add("SVM refit", spec.str(), fit.predicted, subset + ", " + std::to_string(fit.support_vectors) + " support vectors");
      KernelPrediction kr = kernel_regression(k.train, k.cross, onehot, {});
      add("kernel regression", spec.str(), kr.mean.argmax(1),
          subset + ", one-hot targets" + (kr.dropped ? ", " + std::to_string(kr.dropped) + " null directions dropped" : ""));
    }
    const ModelSpec model = ModelSpec::parse(m.model_spec);
    if (model.kind == "mlp" && model.activation == "relu") {
      InfiniteWidthOptions o;
      o.hidden_layers = static_cast<int64_t>(model.widths.size());
      o.bias_scale = args->bias_scale;
      const torch::Tensor nxx = infinite_width_kernels(x_train, x_train, o).nngp;
      const torch::Tensor nsx = infinite_width_kernels(x_test, x_train, o).nngp;
      add("kernel regression", "nngp", kernel_regression(nxx, nsx, onehot, {}).mean.argmax(1), subset + ", one-hot targets");
    }
    // The lazy dynamics: the network linearised at w_0, trained by gradient
    // flow on the squared loss for the run's total time Σ_s η_s.
    {
      g.kernel = GramSpec::parse("ntk:0");
      KernelMatrices k0 = kernel_matrices(reader, x_train, x_test, true, g, false);
      const double tau = std::accumulate(m.learning_rates.begin(), m.learning_rates.end(), 0.0);
      // The scalar kernel is trace / K; each output's tangent kernel is about that.
      KernelPrediction lazy = lazy_dynamics(k0.train, k0.cross, reader.outputs(0, x_train), reader.outputs(0, x_test),
                                            onehot, tau, {});
      std::ostringstream n;
      n << subset << ", squared loss on one-hot targets, time Σ η_s = " << tau;
      add("lazy dynamics", "ntk:0", lazy.mean.argmax(1), n.str());
    }

    std::ostringstream md, csv;
    md << "# Kernel methods beside the network\n\nRun `" << args->run << "` (" << m.model_spec << ", " << m.steps
       << " steps), " << si.size(0) << " class-balanced test points. Agreement: the fraction of test points where the "
       << "method's predicted class is the network's.\n\n| method | kernel | accuracy | agreement with the network | notes |\n|---|---|---|---|---|\n";
    csv << "method,kernel,accuracy,agreement,notes\n";
    for (const Row& r : rows) {
      char acc[32], agr[32];
      std::snprintf(acc, sizeof acc, "%.4f", r.accuracy);
      std::snprintf(agr, sizeof agr, "%.4f", r.agreement);
      md << "| " << r.method << " | " << r.kernel << " | " << acc << " | " << agr << " | " << r.note << " |\n";
      csv << r.method << "," << r.kernel << "," << acc << "," << agr << ",\"" << r.note << "\"\n";
    }
    md << "\nScalar kernel: trace / K of each K x K output kernel. Took "
       << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s.\n";
    const std::filesystem::path dir = args->out.empty() ? std::filesystem::path(args->run) / "compare" : std::filesystem::path(args->out);
    std::filesystem::create_directories(dir);
    write_file_atomic((dir / "compare.md").string(), md.str());
    write_file_atomic((dir / "compare.csv").string(), csv.str());
    nlohmann::ordered_json table = nlohmann::ordered_json::array();
    for (const Row& r : rows) {
      table.push_back({{"method", r.method}, {"kernel", r.kernel}, {"accuracy", r.accuracy},
                       {"agreement", r.agreement}, {"notes", r.note}});
    }
    globals.print({{"run", args->run}, {"test_points", si.size(0)}, {"rows", table}, {"out", dir.string()}},
                  md.str() + "\n" + (dir / "compare.md").string());
  });
}

}  // namespace pathkernel::cli
