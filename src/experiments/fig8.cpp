// fig8: the straight line w(α) = w_0 + α(w_N − w_0) through the trained
// network's start and end: weight norm, training loss, accuracy, and the
// loss's slope along the line; plus the weight norm along the actual path.
#include "common.h"
#include "pathkernel/progress.h"
#include "pathkernel/segment.h"
#include "pathkernel/trainer.h"

namespace pathkernel::experiments {

ExperimentResult fig8(const ExperimentOptions& options) {
  Session session("fig8", options);
  const bool quick = options.quick;
  RunOptions run;
  run.data.spec = "mnist";
  if (quick) {
    run.data.train_size = 100;
    run.data.test_size = 50;
  }
  run.model = quick ? "cnn:2,4" : "cnn:8,16";
  run.train.optimizer.name = "sgd";
  run.train.optimizer.lr = 0.05;
  run.train.batch = quick ? 20 : 100;
  run.train.steps = quick ? 5 : 200;
  PathReader reader(session.train(run));
  const Manifest& m = reader.manifest();
  const Dataset& data = reader.decoded_dataset();
  const OutputMap map = parse_output_map(m.output);
  const torch::Tensor w0 = reader.weights(0), wN = reader.weights(m.steps);
  const torch::Tensor dir = wN - w0;
  const double dist = dir.norm().item<double>();
  // α = i/D for i = lo .. hi: [-0.2, 1.2], with 0 and 1 exactly.
  const int64_t D = 10, lo = -2, hi = 12;
  const int64_t A = hi - lo + 1;
  torch::Tensor alpha = torch::zeros({A}, torch::kFloat64), norm = torch::zeros({A}, torch::kFloat64);
  torch::Tensor loss = torch::zeros({A}, torch::kFloat64), train_acc = torch::zeros({A}, torch::kFloat64);
  torch::Tensor test_acc = torch::zeros({A}, torch::kFloat64), slope = torch::zeros({A}, torch::kFloat64);
  Network net = engine_network(m.network_options());
  ProgressBar bar(A, "fig8 line", options.progress);
  for (int64_t i = 0; i < A; ++i) {
    const double a = static_cast<double>(lo + i) / static_cast<double>(D);
    const torch::Tensor w = a == 0.0 ? w0 : a == 1.0 ? wN : w0 + a * dir;
    set_flat_parameters(net, w);
    alpha[i] = a;
    norm[i] = w.norm().item<double>();
    // Mean training loss and its derivative along the unit direction, by autograd in chunks.
    double total = 0, d = 0, correct = 0;
    const int64_t M = data.x_train.size(0);
    for (int64_t c = 0; c < M; c += 1000) {
      const int64_t nc = std::min<int64_t>(1000, M - c);
      for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
      const torch::Tensor out = net->forward(data.x_train.narrow(0, c, nc).to(torch::kFloat64));
      const torch::Tensor y = data.y_train.narrow(0, c, nc);
      correct += (out.argmax(1) == y).sum().item<double>();
      torch::Tensor l = training_loss(out, y, map) * (static_cast<double>(nc) / static_cast<double>(M));
      l.backward();
      total += l.item<double>();
      std::vector<torch::Tensor> g;
      for (auto& p : net->parameters()) g.push_back(p.grad().reshape(-1));
      d += (torch::cat(g) * dir).sum().item<double>() / dist;
    }
    loss[i] = total;
    slope[i] = d;
    train_acc[i] = correct / static_cast<double>(M);
    test_acc[i] = accuracy(net, data.x_test, data.y_test);
    bar.update(i + 1);
  }
  bar.finish();
  // The weight norm along the path actually taken.
  torch::Tensor path_norm = torch::zeros({m.steps + 1}, torch::kFloat64);
  reader.forward([&](const PathStep& st) { path_norm[st.step] = st.w.norm().item<double>(); });
  path_norm[m.steps] = wN.norm().item<double>();
  for (const auto& [file, t] : std::vector<std::pair<std::string, torch::Tensor>>{
           {"alpha.npy", alpha}, {"weight_norm.npy", norm}, {"train_loss.npy", loss},
           {"train_accuracy.npy", train_acc}, {"test_accuracy.npy", test_acc},
           {"loss_slope.npy", slope}, {"path_weight_norm.npy", path_norm}}) {
    session.save(file, t);
  }
  const int64_t i0 = -lo, i1 = D - lo;
  const double n0 = norm[i0].item<double>(), n1 = norm[i1].item<double>();
  // Monotone on [0, 1]?
  const torch::Tensor inner = norm.narrow(0, i0, i1 - i0 + 1);
  const torch::Tensor steps = inner.narrow(0, 1, inner.size(0) - 1) - inner.narrow(0, 0, inner.size(0) - 1);
  const bool line_monotone = (steps >= 0).all().item<bool>() || (steps <= 0).all().item<bool>();
  const torch::Tensor ps = path_norm.narrow(0, 1, m.steps) - path_norm.narrow(0, 0, m.steps);
  const bool path_monotone = (ps >= 0).all().item<bool>() || (ps <= 0).all().item<bool>();
  const double min_norm = inner.min().item<double>();
  session.metrics()["distance_w0_wN"] = dist;
  session.metrics()["norm_w0"] = n0;
  session.metrics()["norm_wN"] = n1;
  session.metrics()["norm_change"] = n1 / n0 - 1;
  session.metrics()["norm_min_on_line"] = min_norm;
  session.metrics()["norm_monotone_on_line"] = line_monotone;
  session.metrics()["norm_monotone_on_path"] = path_monotone;
  session.metrics()["train_loss_w0"] = loss[i0].item<double>();
  session.metrics()["train_loss_wN"] = loss[i1].item<double>();
  session.metrics()["train_accuracy_w0"] = train_acc[i0].item<double>();
  session.metrics()["train_accuracy_wN"] = train_acc[i1].item<double>();
  session.metrics()["test_accuracy_wN"] = test_acc[i1].item<double>();
  session.metrics()["alpha_of_min_loss"] = alpha[loss.argmin()].item<double>();
  session.line("Line: w(α) = w_0 + α(w_N − w_0) for α = −0.2, −0.1, …, 1.2 (α = 0 and 1 are w_0 and w_N exactly). "
               "Training loss is the mean loss over all " + std::to_string(data.x_train.size(0)) +
               " training points; slope is d loss / dα divided by |w_N − w_0|, i.e. the loss gradient along the "
               "unit direction.");
  session.line("- |w_0| = " + fmt(n0, 5) + ", |w_N| = " + fmt(n1, 5) + ": the norm changes by " +
               fmt(100 * (n1 / n0 - 1)) + "% (|w_N − w_0| = " + fmt(dist, 4) + "); minimum on [0, 1] " +
               fmt(min_norm, 5) + "; monotone along the line: " + (line_monotone ? "yes" : "no") +
               ", along the training path (" + std::to_string(m.steps + 1) + " iterates): " +
               (path_monotone ? "yes" : "no") + ".");
  session.line("- training loss " + fmt(loss[i0].item<double>(), 4) + " at w_0, " + fmt(loss[i1].item<double>(), 4) +
               " at w_N (lowest on the grid at α = " + fmt(alpha[loss.argmin()].item<double>()) +
               "); training accuracy " + fmt(train_acc[i0].item<double>()) + " → " +
               fmt(train_acc[i1].item<double>()) + ", test accuracy " + fmt(test_acc[i0].item<double>()) + " → " +
               fmt(test_acc[i1].item<double>()) + ".");
  Figure f;
  f.png = "fig8.png";
  f.data = {{"fig8.dat", data_table({"alpha", "weight_norm_rel", "train_loss", "train_accuracy", "test_accuracy",
                                      "loss_slope"},
                                     {alpha, norm / n0, loss, train_acc, test_acc, slope})}};
  f.script =
      "set title 'along w(α) = w_0 + α (w_N − w_0)'\nset xlabel 'α'\nset grid\nset key outside right\n"
      "set ylabel 'loss, accuracy, |w(α)| / |w_0|'\nset y2label 'd loss / dα / |w_N − w_0|'\nset y2tics\nset ytics nomirror\n"
      "plot 'fig8.dat' using 1:4 with linespoints lw 2 lc rgb '#1f77b4' title 'train accuracy', "
      "'' using 1:5 with lines dt 2 lc rgb '#1f77b4' title 'test accuracy', "
      "'' using 1:3 with linespoints lw 2 lc rgb '#d62728' title 'training loss', "
      "'' using 1:2 with linespoints lw 2 lc rgb '#2ca02c' title '|w| / |w_0|', "
      "'' using 1:6 axes x1y2 with lines dt 3 lw 2 lc rgb '#9467bd' title 'slope (right axis)'\n";
  f.width = 1100;
  session.plot(f);
  session.line("Data: alpha.npy, weight_norm.npy, train_loss.npy, train_accuracy.npy, test_accuracy.npy, "
               "loss_slope.npy [15]; path_weight_norm.npy [N + 1].");
  return session.finish();
}

}  // namespace pathkernel::experiments
