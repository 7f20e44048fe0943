// paper-4.1 (Fig. 4): the kernel machine against the network on gaussians3.
#include "common.h"
#include "pathkernel/decomposition.h"

namespace pathkernel::experiments {

namespace {
/// Columns (network, kernel) per class for scatter_script.
std::string scatter_table(const torch::Tensor& network, const torch::Tensor& kernel) {
  std::vector<std::string> header;
  std::vector<torch::Tensor> cols;
  for (int64_t k = 0; k < network.size(1); ++k) {
    header.push_back("network_" + std::to_string(k));
    header.push_back("kernel_" + std::to_string(k));
    cols.push_back(network.select(1, k));
    cols.push_back(kernel.select(1, k));
  }
  return data_table(header, cols);
}
}  // namespace

ExperimentResult paper_4_1(const ExperimentOptions& options) {
  Session session("paper-4.1", options);
  const bool quick = options.quick;
  RunOptions run;
  run.data.spec = "gaussians3";
  run.data.test_size = quick ? 12 : 100;
  if (quick) run.data.train_size = 60;
  run.model = quick ? "mlp:8" : "mlp:32";
  run.train.optimizer.name = "gd";
  run.train.optimizer.lr = 0.1;
  run.train.steps = quick ? 10 : 100;
  PathReader reader(session.train(run));
  const torch::Tensor x = reader.dataset().x_test;
  session.line("The kernel machine's prediction f(w_0, x) + Σ_i C_i(x) + R(x) + E(x) (decompose) is compared with "
               "the network's output f(w_N, x) on all " + std::to_string(x.size(0)) +
               " test points, every class. Relative error: |kernel − network| / max(1, |network|).");
  // The paper's 100-node Riemann rule beside the certified adaptive Gauss–Legendre.
  const std::vector<std::string> rules{"gauss", quick ? "riemann:10" : "riemann:100"};
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  for (const auto& rule : rules) {
    DecompositionOptions d;
    d.quadrature.spec = QuadratureSpec::parse(rule);
    d.progress = options.progress;
    Decomposition dec = decompose(reader, x, d);
    const torch::Tensor kernel = dec.prediction();
    const OutputError e = output_error(kernel, dec.fN);
    std::string tag = rule;
    for (char& c : tag) if (c == ':') c = '_';
    if (rule == rules.front()) session.save("network.npy", dec.fN);
    session.save("kernel_" + tag + ".npy", kernel);
    Figure f;
    f.png = "fig4_" + tag + ".png";
    f.data = {{"fig4_" + tag + ".dat", scatter_table(dec.fN, kernel)}};
    f.script = scatter_script("fig4_" + tag + ".dat", dec.fN.size(1),
                              "kernel machine (" + rule + ") vs network, max rel. error " + fmt(e.max_rel));
    f.width = 1500;
    f.height = 560;
    session.plot(f);
    const double completeness = dec.completeness_gap().abs().max().item<double>();
    results.push_back({{"quadrature", rule},
                       {"max_abs_error", e.max_abs},
                       {"max_rel_error", e.max_rel},
                       {"completeness_error", completeness},
                       {"certificate_max_gap", dec.certificate_max_gap},
                       {"evaluations_per_point_step",
                        static_cast<double>(dec.evaluations) / static_cast<double>(x.size(0) * dec.steps)},
                       {"seconds", dec.seconds}});
    session.line("- `" + rule + "`: max abs error " + fmt(e.max_abs) + ", max rel error " + fmt(e.max_rel) +
                 ", completeness error " + fmt(completeness) + ", " +
                 fmt(static_cast<double>(dec.evaluations) / static_cast<double>(x.size(0) * dec.steps)) +
                 " integrand evaluations per point and step, " + fmt(dec.seconds) + " s.");
  }
  session.metrics()["test_points"] = x.size(0);
  session.metrics()["results"] = results;
  session.line("Data: network.npy and kernel_<rule>.npy, [n, K] each; fig4_<rule>.dat holds the scatter columns.");
  return session.finish();
}

}  // namespace pathkernel::experiments
