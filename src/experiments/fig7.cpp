// fig7: MNIST CNN, the kernel machine against the network as the test side's
// integral is approximated with T = 1 (the DPK), 10 and 200 Riemann nodes,
// and with the certified adaptive Gauss–Legendre rule.
#include "common.h"

namespace pathkernel::experiments {

ExperimentResult fig7(const ExperimentOptions& options) {
  Session session("fig7", options);
  const bool quick = options.quick;
  RunOptions run;
  run.data.spec = "mnist";
  // Full-batch GD as in the paper, on a class-balanced subset so that four
  // decompositions fit in about ten minutes on two cores.
  run.data.train_size = quick ? 40 : 500;
  run.data.test_size = quick ? 4 : 5;
  run.model = quick ? "cnn:2,4" : "cnn:8,16";
  run.train.optimizer.name = "gd";
  run.train.optimizer.lr = 0.1;
  run.train.steps = quick ? 3 : 20;
  PathReader reader(session.train(run));
  const torch::Tensor x = reader.test_inputs(torch::Tensor());
  const std::vector<std::string> rules{"dpk", "riemann:10", quick ? "riemann:20" : "riemann:200", "gauss"};
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  std::vector<std::string> header;
  std::vector<torch::Tensor> cols;
  torch::Tensor network;
  for (const auto& rule : rules) {
    const RuleComparison c = compare_rule(session, reader, x, rule);
    network = c.network;
    header.push_back("network_" + c.tag);
    header.push_back("kernel_" + c.tag);
    cols.push_back(c.network.reshape(-1));
    cols.push_back(c.kernel.reshape(-1));
    results.push_back(c.json);
  }
  session.save("network.npy", network);
  session.metrics()["test_points"] = x.size(0);
  session.metrics()["results"] = results;
  Figure f;
  f.png = "fig7.png";
  f.data = {{"fig7.dat", data_table(header, cols)}};
  f.width = 1600;
  f.height = 480;
  std::string s = "set multiplot layout 1," + std::to_string(rules.size()) +
                  " title 'MNIST CNN: kernel machine vs network, every output of every test point'\n"
                  "set size ratio -1\nset grid\nset key top left\nset xlabel 'network output'\n"
                  "set ylabel 'kernel machine output'\n";
  for (size_t r = 0; r < rules.size(); ++r) {
    const std::string a = std::to_string(2 * r + 1), b = std::to_string(2 * r + 2);
    s += "set title '" + rules[r] + ": max abs error " + fmt(results[r]["max_abs_error"].get<double>()) + "'\n";
    s += "plot 'fig7.dat' using " + a + ":" + b + " with points pt 7 ps 0.6 notitle, '' using " + a + ":" + a +
         " with lines lc rgb 'gray' title 'y = x'\n";
  }
  f.script = s + "unset multiplot\n";
  session.plot(f);
  session.line("Settings chosen for cost: the paper's full-batch GD on a " + std::to_string(reader.manifest().num_train) +
               "-image class-balanced subset, " + std::to_string(reader.manifest().steps) + " steps and " +
               std::to_string(x.size(0)) + " test points, so the four decompositions (the 200-node rule costs 200 "
               "network evaluations per point and step) finish in minutes on two cores. Data: network.npy and "
               "kernel_<rule>.npy [n, K]; fig7.dat holds the scatter columns.");
  return session.finish();
}

}  // namespace pathkernel::experiments
