// The experiments' shared session: output directory, training, summary.
#include "common.h"

#include <cstdio>
#include <filesystem>

#include "pathkernel/decomposition.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/npy.h"

namespace pathkernel::experiments {

Session::Session(std::string name, const ExperimentOptions& options)
    : name_(std::move(name)), options_(options), start_(std::chrono::steady_clock::now()) {
  PK_CHECK(!options_.out.empty(), "experiment " << name_ << ": no output directory given");
  std::filesystem::create_directories(options_.out);
  metrics_["experiment"] = name_;
  metrics_["quick"] = options_.quick;
}

std::string Session::path(const std::string& file) const {
  return (std::filesystem::path(options_.out) / file).string();
}

std::string Session::train(RunOptions run) {
  run.out = path("run");
  run.force = true;
  run.train.progress = options_.progress;
  RunResult r = train_run(run);
  const Manifest& m = r.manifest;
  std::string batch = m.batch_size == 0 ? "full batch" : "batch " + std::to_string(m.batch_size);
  line("Run: `" + m.data.spec + "` (" + std::to_string(m.num_train) + " train / " + std::to_string(m.num_test) +
       " test), model `" + m.model_spec + "` (" + std::to_string(m.parameter_count) + " parameters), " +
       m.optimizer.name + " lr " + fmt(m.optimizer.lr) + ", " + batch + ", " + std::to_string(m.steps) +
       " steps, seed " + std::to_string(run.seed) + (m.zero_last_layer ? ", last layer zeroed at start" : "") +
       ". Final batch loss " + fmt(r.summary.final_loss) + ", train accuracy " + fmt(r.summary.train_accuracy) +
       ", test accuracy " + fmt(r.summary.test_accuracy) + " (training took " + fmt(r.summary.seconds) + " s).");
  metrics_["run"] = {{"data", m.data.spec},           {"num_train", m.num_train},
                     {"num_test", m.num_test},        {"model", m.model_spec},
                     {"parameters", m.parameter_count}, {"optimizer", m.optimizer.name},
                     {"lr", m.optimizer.lr},          {"batch", m.batch_size},
                     {"steps", m.steps},              {"train_accuracy", r.summary.train_accuracy},
                     {"test_accuracy", r.summary.test_accuracy}, {"train_seconds", r.summary.seconds}};
  return run.out;
}

void Session::save(const std::string& file, const torch::Tensor& t) const {
  torch::Tensor c = t.is_floating_point() ? t.to(torch::kFloat64) : t.to(torch::kInt64);
  write_npy(path(file), c.contiguous());
}

void Session::plot(Figure figure) {
  figures_.push_back(figure.png);
  figure.png = path(figure.png);
  render(figure);
}

void Session::line(const std::string& text) { lines_.push_back(text); }

double Session::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

ExperimentResult Session::finish() {
  ExperimentResult result;
  result.name = name_;
  result.out = options_.out;
  result.seconds = elapsed();
  metrics_["seconds"] = result.seconds;
  result.metrics = metrics_;
  write_file_atomic(path("metrics.json"), metrics_.dump(2) + "\n");
  std::string md = "# " + name_ + ": " + experiment_description(name_) + "\n\n";
  md += "Command: `pathkernel experiment " + name_ + (options_.quick ? " --quick" : "") + "`" +
        (options_.quick ? " (quick: reduced sizes, a smoke test only)" : "") + "\n\n";
  for (const auto& l : lines_) md += l + "\n\n";
  if (!figures_.empty()) {
    md += "Figures:\n\n";
    for (const auto& f : figures_) md += "![" + f + "](" + f + ")\n";
    md += "\n";
  }
  md += "Total time: " + fmt(result.seconds) + " s.\n";
  write_file_atomic(path("summary.md"), md);
  return result;
}

OutputError output_error(const torch::Tensor& kernel, const torch::Tensor& network) {
  PK_CHECK(kernel.sizes() == network.sizes(), "output_error: kernel outputs " << kernel.sizes()
                                                  << " and network outputs " << network.sizes() << " differ in shape");
  OutputError e;
  e.max_abs = (kernel - network).abs().max().item<double>();
  e.max_rel = relative_error(kernel, network).max().item<double>();
  return e;
}

RunOptions paper_gd_run(const std::string& data, bool quick) {
  RunOptions run;
  run.data.spec = data;
  if (data == "gaussians3") run.data.test_size = quick ? 12 : 100;
  if (quick) run.data.train_size = data == "toy2d" ? 30 : 60;
  run.model = quick ? "mlp:8" : "mlp:32";
  run.train.optimizer.name = "gd";
  run.train.optimizer.lr = 0.1;
  run.train.steps = quick ? 10 : 100;
  return run;
}

RuleComparison compare_rule(Session& session, PathReader& reader, const torch::Tensor& x, const std::string& rule) {
  DecompositionOptions d;
  d.quadrature.spec = QuadratureSpec::parse(rule);
  d.progress = session.progress();
  Decomposition dec = decompose(reader, x, d);
  RuleComparison c;
  c.rule = rule;
  c.tag = rule;
  for (char& ch : c.tag) ch = ch == ':' ? '_' : ch;
  c.network = dec.fN;
  c.kernel = dec.prediction();
  c.error = output_error(c.kernel, dec.fN);
  const double agree = (c.kernel.argmax(1) == dec.fN.argmax(1)).to(torch::kFloat64).mean().item<double>();
  const double completeness = dec.completeness_gap().abs().max().item<double>();
  const double evaluations = static_cast<double>(dec.evaluations) / static_cast<double>(x.size(0) * dec.steps);
  session.save("kernel_" + c.tag + ".npy", c.kernel);
  c.json = {{"quadrature", rule},
            {"max_abs_error", c.error.max_abs},
            {"max_rel_error", c.error.max_rel},
            {"completeness_error", completeness},
            {"predicted_class_agreement", agree},
            {"certificate_max_gap", dec.certificate_max_gap},
            {"evaluations_per_point_step", evaluations},
            {"seconds", dec.seconds}};
  session.line("- `" + rule + "`: max abs error " + fmt(c.error.max_abs) + ", max rel error " + fmt(c.error.max_rel) +
               ", completeness error " + fmt(completeness) + ", predicted class agrees on " + fmt(100 * agree) +
               "% of the test points, " + fmt(evaluations) + " integrand evaluations per point and step, " +
               fmt(dec.seconds) + " s.");
  return c;
}

std::string fmt(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

std::string scatter_script(const std::string& data, int64_t classes, const std::string& title) {
  std::string s = "set multiplot layout 1," + std::to_string(classes) + " title '" + title + "'\n" +
                  "set size ratio -1\nset grid\nset key top left\n" +
                  "set xlabel 'network output f(w_N, x)'\nset ylabel 'kernel machine output'\n";
  for (int64_t k = 0; k < classes; ++k) {
    const std::string c = std::to_string(2 * k + 1), d = std::to_string(2 * k + 2);
    s += "set title 'class " + std::to_string(k) + "'\n";
    s += "plot '" + data + "' using " + c + ":" + d + " with points pt 7 ps 0.6 title 'test points', '' using " + c +
         ":" + c + " with lines lc rgb 'gray' title 'y = x'\n";
  }
  return s + "unset multiplot\n";
}

}  // namespace pathkernel::experiments
