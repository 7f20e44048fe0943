// `pathkernel verify`: check the exact kernel machine against the network on test points.
#include <algorithm>
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "pathkernel/decomposition.h"
#include "pathkernel/error.h"

namespace pathkernel::cli {

void add_verify_command(CLI::App& app, Globals& globals) {
  struct Args {
    std::string run, test_index;
    QuadratureArgs q;
    int64_t test = 100;
    double fail_above = -1;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("verify", "Check the exact kernel machine against the network on test points");
  cmd->add_option("RUN", args->run, "Run directory")->required();
  auto* n = cmd->add_option("--test", args->test, "Use the first N test points")->capture_default_str();
  cmd->add_option("--test-index", args->test_index, "Comma-separated test indices, e.g. 0,5,17")->excludes(n);
  args->q.add_to(cmd);
  cmd->add_option("--fail-above", args->fail_above, "Exit non-zero if max_rel_error exceeds this");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args, &globals] {
    globals.apply();
    DecompositionOptions options = args->q.options();
    PathReader reader(args->run);
    torch::Tensor idx = parse_test_indices(args->test, args->test_index, reader.dataset().x_test.size(0));
    Decomposition d = decompose(reader, reader.dataset().x_test.index_select(0, idx), options);
    torch::Tensor err = (d.prediction() - d.fN).abs();
    torch::Tensor scale = d.fN.abs().clamp_min(1.0);
    torch::Tensor completeness = d.completeness_gap().abs();
    const int64_t n_test = idx.size(0);
    nlohmann::ordered_json j{
        {"run", args->run},
        {"test_points", n_test},
        {"steps", d.steps},
        {"quadrature", options.quadrature.spec.str()},
        {"tol", options.quadrature.tol},
        {"max_abs_error", err.max().item<double>()},
        {"max_rel_error", (err / scale).max().item<double>()},
        {"completeness_error", completeness.max().item<double>()},
        {"max_abs_rounding", d.rounding.abs().max().item<double>()},
        {"max_abs_regularization", d.regularization.abs().max().item<double>()},
        {"certificate_max_gap", d.certificate_max_gap},
        {"mean_evaluations_per_step",
         static_cast<double>(d.evaluations) / static_cast<double>(std::max<int64_t>(1, n_test * d.steps))},
        {"mean_forward_evaluations_per_step",
         static_cast<double>(d.forward_evaluations) / static_cast<double>(std::max<int64_t>(1, n_test * d.steps))},
        {"mean_kinks_per_step",
         static_cast<double>(d.kinks) / static_cast<double>(std::max<int64_t>(1, n_test * d.steps))},
        {"seconds", d.seconds}};
    // A float32 run is decomposed against the float64 network at its
    // (exactly representable) float32 weights; its own float32 outputs differ
    // from that by float32 rounding, shown here beside the error.
    j["dtype"] = reader.manifest().dtype;
    j["max_abs_run_dtype_difference"] = (d.fN_run - d.fN).abs().max().item<double>();
    if (args->json) {
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("kernel machine vs network on %lld test points, %lld steps, quadrature %s:\n",
                  static_cast<long long>(n_test), static_cast<long long>(d.steps),
                  options.quadrature.spec.str().c_str());
      for (auto& [key, value] : j.items()) {
        if (key != "run") std::printf("  %-26s %s\n", key.c_str(), value.dump().c_str());
      }
    }
    if (args->fail_above >= 0 && j["max_rel_error"].get<double>() > args->fail_above) globals.exit_status = 1;
  });
}

}  // namespace pathkernel::cli
