// fig2: the angle between the DPK test gradient J(w_s, x) and the EPK test
// gradient J̄_s(x) = ∫_0^1 J(w_s(t), x) dt, per test point and step.
#include <cmath>

#include "common.h"
#include "pathkernel/features.h"
#include "pathkernel/progress.h"

namespace pathkernel::experiments {

ExperimentResult fig2(const ExperimentOptions& options) {
  Session session("fig2", options);
  const bool quick = options.quick;
  PathReader reader(session.train(paper_gd_run("gaussians3", quick)));
  const Manifest& m = reader.manifest();
  const torch::Tensor x = reader.test_inputs(torch::Tensor());
  const int64_t n = x.size(0), N = m.steps;
  Network net64 = engine_network(m.network_options());
  SegmentEvaluator ev(net64);
  QuadratureOptions exact, dpk, riemann;
  dpk.spec = QuadratureSpec::parse("dpk");
  riemann.spec = QuadratureSpec::parse("riemann:10");
  // angles[c][s, j]: degrees between J̄_s(x_j) and rule c's test gradient.
  torch::Tensor angles = torch::zeros({2, N, n}, torch::kFloat64);
  ProgressBar bar(N, "fig2 angles", options.progress);
  reader.forward([&](const PathStep& st) {
    ev.set_segment(st.w, st.delta);
    const TestFeatures e = test_features(ev, x, exact);
    angles[0][st.step] = feature_angle(ev, e, test_features(ev, x, dpk));
    angles[1][st.step] = feature_angle(ev, e, test_features(ev, x, riemann));
    bar.update(st.step + 1);
  });
  bar.finish();
  session.save("angles_dpk_deg.npy", angles[0]);
  session.save("angles_riemann10_deg.npy", angles[1]);
  const torch::Tensor q = torch::tensor({0.1, 0.5, 0.9}, torch::kFloat64);
  const torch::Tensor steps = torch::arange(N, torch::kFloat64);
  std::vector<torch::Tensor> cols{steps};
  std::vector<std::string> header{"step"};
  const char* names[] = {"dpk", "riemann10"};
  nlohmann::ordered_json stats = nlohmann::ordered_json::object();
  for (int c = 0; c < 2; ++c) {
    torch::Tensor qs = torch::quantile(angles[c], q, 1);  // [3, N]
    for (int i = 0; i < 3; ++i) {
      cols.push_back(qs[i]);
      header.push_back(std::string(names[c]) + "_q" + std::to_string(i == 0 ? 10 : i == 1 ? 50 : 90));
    }
    const double median = angles[c].median().item<double>();
    const double max = angles[c].max().item<double>();
    const int64_t max_step = std::get<0>(angles[c].max(1)).argmax().item<int64_t>();
    stats[names[c]] = {{"median_deg", median}, {"max_deg", max}, {"step_of_max", max_step},
                       {"median_deg_first_step", angles[c][0].median().item<double>()},
                       {"median_deg_last_step", angles[c][N - 1].median().item<double>()}};
    session.line(std::string("- ") + (c == 0 ? "DPK (one node at t = 0)" : "Riemann, 10 left nodes") +
                 " vs EPK: median angle " + fmt(median) + "°, max " + fmt(max) + "° (step " +
                 std::to_string(max_step) + "); median at step 0 " + fmt(angles[c][0].median().item<double>()) +
                 "°, at the last step " + fmt(angles[c][N - 1].median().item<double>()) + "°.");
  }
  session.metrics()["test_points"] = n;
  session.metrics()["angles"] = stats;
  Figure f;
  f.png = "fig2.png";
  f.data = {{"fig2.dat", data_table(header, cols)}};
  f.script =
      "set title 'angle between the EPK test gradient and approximations, " + std::to_string(n) + " test points'\n"
      "set xlabel 'training step s'\nset ylabel 'angle to J̄_s(x) (degrees)'\nset logscale y\nset grid\n"
      "set key top right\n"
      "plot 'fig2.dat' using 1:($2>1e-12?$2:1e-12):($4>1e-12?$4:1e-12) with filledcurves fs transparent solid 0.25 "
      "lc rgb '#1f77b4' title 'DPK, 10-90%', '' using 1:3 with lines lw 2 lc rgb '#1f77b4' title 'DPK median', "
      "'' using 1:($5>1e-12?$5:1e-12):($7>1e-12?$7:1e-12) with filledcurves fs transparent solid 0.25 lc rgb "
      "'#2ca02c' title 'riemann:10, 10-90%', '' using 1:6 with lines lw 2 lc rgb '#2ca02c' title 'riemann:10 median'\n";
  session.plot(f);
  session.line("Angle: arccos of the cosine between the flattened K x P matrices J̄_s(x) (gauss, certified) and "
               "J(w_s, x) (DPK) or the 10-node Riemann average. Data: angles_*_deg.npy [steps, test points]; fig2.dat "
               "holds the 10/50/90% quantiles per step.");
  return session.finish();
}

}  // namespace pathkernel::experiments
