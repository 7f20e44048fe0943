// fig5: kernel values and the GP's standard deviation on a toy2d grid.
#include "common.h"
#include "pathkernel/gp.h"
#include "pathkernel/gram.h"
#include "pathkernel/grid.h"

namespace pathkernel::experiments {

ExperimentResult fig5(const ExperimentOptions& options) {
  Session session("fig5", options);
  const bool quick = options.quick;
  PathReader reader(session.train(paper_gd_run("toy2d", quick)));
  const Manifest& m = reader.manifest();
  const Dataset& data = reader.decoded_dataset();
  const torch::Tensor X = data.x_train;
  const int64_t M = X.size(0);
  // A G x G grid over [−2.5, 8.5]², around the class means (1,4), (4,1), (5,5).
  const int64_t G = quick ? 6 : 30;
  const double lo = -2.5, hi = 8.5;
  GridBounds bounds;
  bounds.lo[0] = bounds.lo[1] = lo;
  bounds.hi[0] = bounds.hi[1] = hi;
  const torch::Tensor grid = grid_2d(bounds, G).points;  // [G², 2]
  GramOptions g;
  g.kernel = GramSpec::parse("epk");
  g.trace = true;
  g.progress = options.progress;
  const double t0 = session.elapsed();
  // The scalar kernel trace / K: train x train, grid x train, and each grid point with itself.
  const KernelMatrices k = kernel_matrices(reader, X, grid, true, g, true);
  const torch::Tensor &k_cross = k.cross, &k_train = k.train, &k_test = k.self;
  const double kernel_seconds = session.elapsed() - t0;
  // GP regression to the network's outputs (log-probabilities) at the training points.
  const torch::Tensor y = reader.outputs(m.steps, X);
  GpOptions gpo;
  gpo.samples = quick ? 100 : 1000;
  const GpPosterior gp = gp_posterior(k_train, k_cross, k_test, y, gpo);
  const torch::Tensor value = k_cross.mean(1);          // [n]: mean kernel value against the training points
  const torch::Tensor std_map = gp.prob_std.mean(1);    // [n]: the class probabilities' std, averaged over classes
  const torch::Tensor f_grid = reader.outputs(m.steps, grid);
  const double agree = (gp.mean.argmax(1) == f_grid.argmax(1)).to(torch::kFloat64).mean().item<double>();
  session.save("grid.npy", grid);
  session.save("kernel_cross.npy", k_cross);
  session.save("kernel_train.npy", k_train);
  session.save("kernel_test.npy", k_test);
  session.save("gp_mean.npy", gp.mean);
  session.save("gp_variance.npy", gp.variance);
  session.save("gp_prob_std.npy", gp.prob_std);
  session.save("network_grid.npy", f_grid);
  // Near vs far from the data: distance of each grid point to its nearest training point.
  const torch::Tensor dist = std::get<0>(torch::cdist(grid, X).min(1));
  auto mean_where = [](const torch::Tensor& v, const torch::Tensor& mask) {
    return mask.any().item<bool>() ? v.index({mask}).mean().item<double>() : std::nan("");
  };
  const torch::Tensor near = dist < 0.5, far = dist > 2.0;
  auto corr = [](const torch::Tensor& a, const torch::Tensor& b) {
    const torch::Tensor ac = a - a.mean(), bc = b - b.mean();
    return ((ac * bc).sum() / (ac.norm() * bc.norm())).item<double>();
  };
  nlohmann::ordered_json& mt = session.metrics();
  mt["grid"] = {{"points_per_axis", G}, {"low", lo}, {"high", hi}};
  mt["gp_jitter"] = gp.jitter;
  mt["gp_argmax_agrees_with_network"] = agree;
  mt["kernel_value_near"] = mean_where(value, near);
  mt["kernel_value_far"] = mean_where(value, far);
  mt["prob_std_near"] = mean_where(std_map, near);
  mt["prob_std_far"] = mean_where(std_map, far);
  mt["corr_distance_kernel_value"] = corr(dist, value);
  mt["corr_distance_prob_std"] = corr(dist, std_map);
  mt["kernel_seconds"] = kernel_seconds;
  session.line("Grid: " + std::to_string(G) + " x " + std::to_string(G) + " points over [" + fmt(lo) + ", " + fmt(hi) +
               "]². Kernel: the EPK's mean output kernel, Σ_k K(x, x')[k, k] / K, with the test side integrated (gauss); "
               "train–train Σ_s J(w_s, x_i) J(w_s, x_j)ᵀ; the grid points' own values from the test–test EPK "
               "∫ J(w_s(t), x) J(w_s(t), x)ᵀ dt. Kernels took " + fmt(kernel_seconds) + " s.");
  session.line("Left map (kernel value): the mean over the " + std::to_string(M) +
               " training points of that kernel between the grid point and the training point. Right map: GP "
               "regression of the network's log-probabilities at the training points with that kernel (jitter " +
               fmt(gp.jitter) + "), " + std::to_string(gpo.samples) +
               " posterior samples pushed through softmax; the standard deviation of the class probabilities, "
               "averaged over classes.");
  session.line("- near the data (nearest training point < 0.5 away): mean kernel value " +
               fmt(mean_where(value, near)) + ", mean probability std " + fmt(mean_where(std_map, near)) +
               "; far (> 2 away): kernel value " + fmt(mean_where(value, far)) + ", probability std " +
               fmt(mean_where(std_map, far)) + ".");
  session.line("- correlation with the distance to the nearest training point: kernel value " +
               fmt(corr(dist, value)) + ", probability std " + fmt(corr(dist, std_map)) +
               "; the GP mean's class agrees with the network's on " + fmt(100 * agree) + "% of the grid.");
  Figure f;
  f.png = "fig5.png";
  f.data = {{"fig5.dat", data_table({"x", "y", "kernel_value", "prob_std", "gp_variance", "self_kernel"},
                                    {grid.select(1, 0), grid.select(1, 1), value, std_map, gp.variance, k_test})},
            {"fig5_train.dat", data_table({"x", "y", "label"}, {X.select(1, 0), X.select(1, 1), data.y_train})}};
  f.width = 1500;
  f.height = 650;
  f.script =
      "set multiplot layout 1,2\nset size ratio -1\nset xrange [" + fmt(lo) + ":" + fmt(hi) + "]\nset yrange [" +
      fmt(lo) + ":" + fmt(hi) + "]\nset palette defined (0 '#440154', 0.5 '#21918c', 1 '#fde725')\n"
      "set title 'mean EPK value against the training points'\n"
      "plot 'fig5.dat' using 1:2:3 with image notitle, 'fig5_train.dat' using 1:2 with points pt 7 ps 0.3 "
      "lc rgb 'white' notitle\n"
      "set title 'GP on the EPK: std of the class probabilities'\n"
      "plot 'fig5.dat' using 1:2:4 with image notitle, 'fig5_train.dat' using 1:2 with points pt 7 ps 0.3 "
      "lc rgb 'white' notitle\nunset multiplot\n";
  session.plot(f);
  session.line("Data: grid.npy [n, 2]; kernel_cross.npy [n, M], kernel_train.npy [M, M], kernel_test.npy [n] (trace / K "
               "of the EPK); gp_mean.npy [n, K], gp_variance.npy [n], gp_prob_std.npy [n, K]; network_grid.npy [n, K].");
  return session.finish();
}

}  // namespace pathkernel::experiments
