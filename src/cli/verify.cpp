// `pathkernel verify`: check the exact kernel machine against the network on test points.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "pathkernel/decomposition.h"
#include "pathkernel/error.h"

namespace pathkernel::cli {

torch::Tensor parse_test_indices(int64_t count, const std::string& list, int64_t n_test) {
  std::vector<int64_t> idx;
  if (!list.empty()) {
    std::stringstream ss(list);
    std::string item;
    while (std::getline(ss, item, ',')) {
      int64_t i = -1;
      try {
        size_t used = 0;
        i = std::stoll(item, &used);
        PK_CHECK(used == item.size(), "");
      } catch (const std::exception&) {
        PK_THROW("--test-index: '" << item << "' is not an integer (expected e.g. 0,5,17)");
      }
      PK_CHECK(i >= 0 && i < n_test, "--test-index " << i << " is out of range [0, " << n_test << ")");
      idx.push_back(i);
    }
  } else {
    PK_CHECK(count >= 1, "--test must be >= 1 (got " << count << ")");
    for (int64_t i = 0; i < std::min(count, n_test); ++i) idx.push_back(i);
  }
  PK_CHECK(!idx.empty(), "no test points selected");
  return torch::tensor(idx, torch::kLong);
}

void add_verify_command(CLI::App& app, Globals& globals) {
  struct Args {
    std::string run, test_index, quadrature = "gauss";
    int64_t test = 100;
    double tol = 1e-14;
    int gauss_nodes = 8;
    double fail_above = -1;
    bool json = false, quiet = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("verify", "Check the exact kernel machine against the network on test points");
  cmd->add_option("RUN", args->run, "Run directory")->required();
  auto* n = cmd->add_option("--test", args->test, "Use the first N test points")->capture_default_str();
  cmd->add_option("--test-index", args->test_index, "Comma-separated test indices, e.g. 0,5,17")->excludes(n);
  cmd->add_option("--quadrature", args->quadrature, "gauss (certified), riemann:T, or dpk")->capture_default_str();
  cmd->add_option("--tol", args->tol, "Certificate tolerance per step, relative to max(1,|f|)")->capture_default_str();
  cmd->add_option("--gauss-nodes", args->gauss_nodes, "Gauss-Legendre nodes per piece (gauss)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--fail-above", args->fail_above, "Exit non-zero if max_rel_error exceeds this");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->add_flag("--quiet", args->quiet, "No progress bar");
  cmd->callback([args, &globals] {
    globals.apply();
    DecompositionOptions options;
    options.quadrature.spec = QuadratureSpec::parse(args->quadrature);
    PK_CHECK(args->tol > 0 && args->tol < 1, "--tol must be in (0, 1) (got " << args->tol << ")");
    options.quadrature.tol = args->tol;
    options.quadrature.gauss_nodes = args->gauss_nodes;
    options.progress = !args->quiet;
    PathReader reader(args->run);
    torch::Tensor idx = parse_test_indices(args->test, args->test_index, reader.dataset().x_test.size(0));
    Decomposition d = decompose(reader, reader.dataset().x_test.index_select(0, idx), options);
    torch::Tensor err = (d.prediction() - d.fN).abs();
    torch::Tensor scale = d.fN.abs().clamp_min(1.0);
    torch::Tensor completeness = (d.fN - d.f0 - d.contributions.sum(1) - d.regularization).abs();
    const int64_t n_test = idx.size(0);
    nlohmann::ordered_json j{
        {"run", args->run},
        {"test_points", n_test},
        {"steps", d.steps},
        {"quadrature", options.quadrature.spec.str()},
        {"tol", args->tol},
        {"max_abs_error", err.max().item<double>()},
        {"max_rel_error", (err / scale).max().item<double>()},
        {"completeness_error", completeness.max().item<double>()},
        {"max_abs_rounding", d.rounding.abs().max().item<double>()},
        {"max_abs_regularization", d.regularization.abs().max().item<double>()},
        {"certificate_max_gap", d.certificate_max_gap},
        {"mean_evaluations_per_step",
         static_cast<double>(d.evaluations) / static_cast<double>(std::max<int64_t>(1, n_test * d.steps))},
        {"seconds", d.seconds}};
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
