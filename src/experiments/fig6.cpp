// fig6: the kernel value of every training point for test points at the
// class means (toy2d), per output class.
#include <cmath>

#include "common.h"
#include "pathkernel/gram.h"

namespace pathkernel::experiments {

ExperimentResult fig6(const ExperimentOptions& options) {
  Session session("fig6", options);
  const bool quick = options.quick;
  PathReader reader(session.train(paper_gd_run("toy2d", quick)));
  const Manifest& m = reader.manifest();
  const Dataset& data = reader.decoded_dataset();
  const int64_t M = data.x_train.size(0), K = m.num_classes;
  // The generating means of toy2d (dataset.h).
  const torch::Tensor means = torch::tensor({1.0, 4.0, 4.0, 1.0, 5.0, 5.0}, torch::kFloat64).reshape({3, 2});
  GramOptions g;
  g.kernel = GramSpec::parse("epk");
  g.progress = options.progress;
  const torch::Tensor kernel = gram(reader, means, true, data.x_train, false, g);  // [3, M, K, K]
  // value[j, i, k] = K(x_j, x_i)[k, y_i]: the weight training point i's own
  // class column carries into output k (Thm. 3.7).
  const torch::Tensor yi = data.y_train.view({1, M, 1, 1}).expand({3, M, K, 1});
  const torch::Tensor value = kernel.gather(3, yi).squeeze(3);  // [3, M, K]
  session.save("kernel.npy", kernel);
  session.save("kernel_values.npy", value);
  session.save("test_points.npy", means);
  // The kernel machine at the means: f(w_0) + (η/M) Σ_i K(x, x_i)[:, y_i].
  const torch::Tensor f0 = reader.outputs(0, means), fN = reader.outputs(m.steps, means);
  const torch::Tensor machine = f0 + (m.optimizer.lr / static_cast<double>(M)) * value.sum(1);
  const OutputError e = output_error(machine, fN);
  session.save("network.npy", fN);
  session.save("kernel_machine.npy", machine);
  session.line("Test points: the class means (1,4), (4,1), (5,5). Kernel: the EPK K(x, x_i) = Σ_s J̄_s(x) J(w_s, x_i)ᵀ "
               "(gauss quadrature), K x K per pair; the value plotted for output k is K(x, x_i)[k, y_i], the weight "
               "with which training point i enters output k (the network's log-softmax output, Thm. 3.7).");
  session.line("Kernel machine at the means, f(w_0, x) + (η/M) Σ_i K(x, x_i)[:, y_i], vs the network: max abs error " +
               fmt(e.max_abs) + ", max rel error " + fmt(e.max_rel) + ".");
  // Is the kernel value a function of distance? Pearson correlation of the
  // predicted-class value with the Euclidean distance to the test point.
  nlohmann::ordered_json points = nlohmann::ordered_json::array();
  const torch::Tensor predicted = fN.argmax(1);
  // Each training point's margin at w_N: f_{y_i} − max_{k ≠ y_i} f_k.
  const torch::Tensor f_train = reader.outputs(m.steps, data.x_train);
  const torch::Tensor own = f_train.gather(1, data.y_train.view({M, 1})).squeeze(1);
  const torch::Tensor others = f_train.scatter(1, data.y_train.view({M, 1}), -INFINITY).amax(1);
  const torch::Tensor margin = own - others;
  session.save("train_margin.npy", margin);
  for (int64_t j = 0; j < 3; ++j) {
    const int64_t k = predicted[j].item<int64_t>();
    const torch::Tensor v = value[j].select(1, k);
    const torch::Tensor d = (data.x_train - means[j]).norm(2, 1);
    const torch::Tensor vc = v - v.mean(), dc = d - d.mean();
    const double corr = ((vc * dc).sum() / (vc.norm() * dc.norm())).item<double>();
    // Within the predicted class: are points with a small margin (near the
    // decision boundary) weighted more?
    const torch::Tensor in_class = data.y_train == k;
    const torch::Tensor va = v.index({in_class}), ma = margin.index({in_class});
    const torch::Tensor vac = va - va.mean(), mac = ma - ma.mean();
    const double corr_margin = ((vac * mac).sum() / (vac.norm() * mac.norm())).item<double>();
    std::vector<double> class_mean;
    for (int64_t c = 0; c < K; ++c) class_mean.push_back(v.index({data.y_train == c}).mean().item<double>());
    const int64_t top = v.abs().argmax().item<int64_t>();
    points.push_back({{"test_point", {means[j][0].item<double>(), means[j][1].item<double>()}},
                      {"predicted", k},
                      {"corr_value_distance", corr},
                      {"corr_value_margin_in_class", corr_margin},
                      {"class_mean_value", class_mean},
                      {"largest_index", top},
                      {"largest_label", data.y_train[top].item<int64_t>()},
                      {"largest_value", v[top].item<double>()},
                      {"largest_distance", d[top].item<double>()}});
    std::string cm;
    for (int64_t c = 0; c < K; ++c) cm += (c ? ", " : "") + fmt(class_mean[c]);
    session.line("- mean " + std::to_string(j) + " (predicted class " + std::to_string(k) +
                 "): correlation of the predicted-class kernel value with distance " + fmt(corr) +
                 "; within class " + std::to_string(k) + ", correlation with the training point's margin " +
                 fmt(corr_margin) + "; mean value per training class (" + cm + "); largest |value| at training point " +
                 std::to_string(top) + " (class " + std::to_string(data.y_train[top].item<int64_t>()) + ", value " +
                 fmt(v[top].item<double>()) + ", distance " + fmt(d[top].item<double>()) + ").");
  }
  session.metrics()["kernel_machine_max_abs_error"] = e.max_abs;
  session.metrics()["kernel_machine_max_rel_error"] = e.max_rel;
  session.metrics()["points"] = points;
  std::vector<std::string> header{"index", "label"};
  std::vector<torch::Tensor> cols{torch::arange(M), data.y_train};
  for (int64_t j = 0; j < 3; ++j) {
    for (int64_t k = 0; k < K; ++k) {
      header.push_back("x" + std::to_string(j) + "_out" + std::to_string(k));
      cols.push_back(value[j].select(1, k));
    }
  }
  Figure f;
  f.png = "fig6.png";
  f.data = {{"fig6.dat", data_table(header, cols)}};
  f.width = 1500;
  f.height = 1200;
  std::string s = "set multiplot layout 3,3 title 'EPK value K(x, x_i)[k, y_i] per training point i, test points at "
                  "the class means'\nset grid\nset key top left opaque font ',8'\nset xlabel 'training index i'\n";
  const char* colours[] = {"#1f77b4", "#ff7f0e", "#2ca02c"};
  for (int64_t j = 0; j < 3; ++j) {
    for (int64_t k = 0; k < K; ++k) {
      const std::string col = std::to_string(3 + j * K + k);
      s += "set title 'x = (" + fmt(means[j][0].item<double>()) + "," + fmt(means[j][1].item<double>()) +
           "), output " + std::to_string(k) + "'\nplot ";
      for (int64_t c = 0; c < K; ++c) {
        s += std::string(c ? ", " : "") + "'fig6.dat' using 1:($2==" + std::to_string(c) + "?$" + col +
             ":1/0) with points pt 7 ps 0.4 lc rgb '" + colours[c % 3] + "' title 'class " + std::to_string(c) + "'";
      }
      s += "\n";
    }
  }
  f.script = s + "unset multiplot\n";
  session.plot(f);
  session.line("Data: kernel.npy [3, M, K, K], kernel_values.npy [3, M, K] (value[j, i, k] = K(x_j, x_i)[k, y_i]), "
               "network.npy and kernel_machine.npy [3, K]; train_margin.npy [M] (f_{y_i} − max_{k≠y_i} f_k at w_N).");
  return session.finish();
}

}  // namespace pathkernel::experiments
