// paper-4.1 (Fig. 4): the kernel machine against the network on gaussians3.
#include "common.h"

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
  PathReader reader(session.train(paper_gd_run("gaussians3", quick)));
  const torch::Tensor x = reader.test_inputs(torch::Tensor());
  session.line("The kernel machine's prediction f(w_0, x) + Σ_i C_i(x) + R(x) + E(x) (decompose) is compared with "
               "the network's output f(w_N, x) on all " + std::to_string(x.size(0)) +
               " test points, every class. Relative error: |kernel − network| / max(1, |network|).");
  // The paper's 100-node Riemann rule beside the certified adaptive Gauss–Legendre.
  const std::vector<std::string> rules{"gauss", quick ? "riemann:10" : "riemann:100"};
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  for (const auto& rule : rules) {
    const RuleComparison c = compare_rule(session, reader, x, rule);
    const std::string& tag = c.tag;
    if (rule == rules.front()) session.save("network.npy", c.network);
    Figure f;
    f.png = "fig4_" + tag + ".png";
    f.data = {{"fig4_" + tag + ".dat", scatter_table(c.network, c.kernel)}};
    f.script = scatter_script("fig4_" + tag + ".dat", c.network.size(1),
                              "kernel machine (" + rule + ") vs network, max rel. error " + fmt(c.error.max_rel));
    f.width = 1500;
    f.height = 560;
    session.plot(f);
    results.push_back(c.json);
  }
  session.metrics()["test_points"] = x.size(0);
  session.metrics()["results"] = results;
  session.line("Data: network.npy and kernel_<rule>.npy, [n, K] each; fig4_<rule>.dat holds the scatter columns.");
  return session.finish();
}

}  // namespace pathkernel::experiments
