// `pathkernel report`: one self-contained HTML page of a run and its explanations.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "commands.h"
#include "pathkernel/error.h"
#include "pathkernel/report.h"

namespace pathkernel::cli {

void add_report_command(CLI::App& app, Globals& globals) {
  struct Args {
    std::string run, explain, metagradient, evaluate, out;
    ReportOptions report;
    QuadratureArgs q;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "report", "Write one self-contained HTML report of a run and its explanations (opens offline)");
  cmd->add_option("RUN", args->run, "Run directory")->required();
  cmd->add_option("--explain", args->explain,
                  "Explain output to show (explain.json, contributions.npy; default: RUN/explain if it exists)");
  cmd->add_option("--metagradient", args->metagradient,
                  "Metagradient output (explain --method metagradient) to show beside the exact contributions "
                  "(default: RUN/metagradient if it exists)");
  cmd->add_option("--evaluate", args->evaluate,
                  "Evaluate output (pathkernel evaluate's --out) whose table and leave-one-out scatter to show "
                  "(default: RUN/evaluate if it exists)");
  cmd->add_option("--evaluate-tests", args->report.evaluate_tests,
                  "Test points whose leave-one-out scatter is drawn (evaluate's first)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("--evaluate-points", args->report.evaluate_points,
                  "Removed points drawn per test point (evenly spaced in the actual change)")
      ->check(CLI::Range(2, 100000))
      ->capture_default_str();
  cmd->add_option("--out", args->out, "The HTML file (default: RUN/report.html)");
  cmd->add_option("--test", args->report.test_points,
                  "Test points of the kernel-vs-network plots (the explained ones first)")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  auto* tracked = cmd->add_option("--tracked", args->report.tracked,
                                  "Proponents and opponents shown per side, with their per-step curves")
                      ->check(CLI::Range(1, 100))
                      ->capture_default_str();
  add_deprecated_option(cmd, "--top", args->report.tracked, "--tracked N")->check(CLI::Range(1, 100))->excludes(tracked);
  cmd->add_option("--gram-points", args->report.gram_points, "Training points in the Gram heatmap (0: none)")
      ->check(CLI::Range(0, 2000))
      ->capture_default_str();
  cmd->add_option("--grid", args->report.grid, "2-D data: points per axis of the kernel and GP maps (0: none)")
      ->check(CLI::Range(0, 200))
      ->capture_default_str();
  args->q.add_to(cmd, globals);
  cmd->callback([args, &globals] {
    globals.apply();
    const auto t0 = std::chrono::steady_clock::now();
    PK_CHECK(std::filesystem::is_directory(args->run),
             "run directory '" << args->run << "' does not exist: expected the --out of 'pathkernel train'");
    ReportOptions options = args->report;
    const DecompositionOptions d = args->q.options();
    options.quadrature = d.quadrature;
    options.progress = d.progress;
    if (args->explain.empty()) {
      const std::filesystem::path def = std::filesystem::path(args->run) / "explain";
      if (std::filesystem::exists(def / "explain.json")) {
        options.explain_dir = def.string();
      } else {
        std::fprintf(stderr, "pathkernel: no explain output in %s; the report shows no explained test points "
                             "(run 'pathkernel explain %s' first, or pass --explain DIR)\n",
                     def.string().c_str(), args->run.c_str());
      }
    } else {
      PK_CHECK(std::filesystem::is_directory(args->explain),
               "--explain '" << args->explain << "' does not exist: run 'pathkernel explain " << args->run << " --out "
                             << args->explain << "' first, or leave out --explain");
      options.explain_dir = args->explain;
    }
    if (args->metagradient.empty()) {
      const std::filesystem::path def = std::filesystem::path(args->run) / "metagradient";
      if (std::filesystem::exists(def / "explain.json")) options.metagradient_dir = def.string();
    } else {
      PK_CHECK(std::filesystem::is_directory(args->metagradient),
               "--metagradient '" << args->metagradient << "' does not exist: run 'pathkernel explain " << args->run
                                  << " --method metagradient --out " << args->metagradient
                                  << "' first, or leave out --metagradient");
      options.metagradient_dir = args->metagradient;
    }
    if (args->evaluate.empty()) {
      const std::filesystem::path def = std::filesystem::path(args->run) / "evaluate";
      if (std::filesystem::exists(def / "evaluate.json")) options.evaluate_dir = def.string();
    } else {
      PK_CHECK(std::filesystem::is_directory(args->evaluate),
               "--evaluate '" << args->evaluate << "' does not exist: run 'pathkernel evaluate " << args->run
                              << " --out " << args->evaluate << "' first, or leave out --evaluate");
      options.evaluate_dir = args->evaluate;
    }
    const std::string out =
        args->out.empty() ? (std::filesystem::path(args->run) / "report.html").string() : args->out;
    PathReader reader(args->run);
    const size_t bytes = write_report(reader, options, out);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    char text[512];
    std::snprintf(text, sizeof text, "wrote %s (%.1f MB, %.0f s; self-contained, open it in a browser)", out.c_str(),
                  static_cast<double>(bytes) / 1e6, seconds);
    globals.print({{"run", args->run}, {"out", out}, {"bytes", bytes}, {"seconds", seconds}}, text);
  });
}

}  // namespace pathkernel::cli
