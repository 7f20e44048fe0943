// `pathkernel explain`: per-training-point attribution of test predictions
// (explain() in explanation.h does the work; this binds its options and
// prints what it wrote).
#include <cstdio>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "pathkernel/explanation.h"

namespace pathkernel::cli {

namespace {

/// The top five proponents and opponents of each explained point, as text.
void print_points(const nlohmann::ordered_json& points) {
  for (const auto& p : points) {
    std::printf("test %lld (label %lld) predicted %lld; completeness error %.2e\n",
                static_cast<long long>(p["test_index"].get<int64_t>()),
                static_cast<long long>(p["label"].get<int64_t>()),
                static_cast<long long>(p["predicted"].get<int64_t>()), p["completeness_error"].get<double>());
    for (const char* side : {"proponents", "opponents"}) {
      std::printf("  %-10s", side);
      int shown = 0;
      for (const auto& e : p[side]) {
        if (shown++ == 5) break;
        std::printf(" #%lld(label %lld) %+.3g", static_cast<long long>(e["index"].get<int64_t>()),
                    static_cast<long long>(e["label"].get<int64_t>()), e["value"].get<double>());
      }
      std::printf("\n");
    }
  }
}

}  // namespace

void add_explain_command(CLI::App& app, Globals& globals) {
  struct Args {
    std::string run, out;
    TestPointArgs points;
    std::string kernel = "auto";
    ExplainOptions explain;
    QuadratureArgs q;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "explain", "Split test predictions exactly into per-training-point contributions");
  cmd->add_option("RUN", args->run, "Run directory")->required();
  args->points.add_to(cmd, "to explain (default: test point 0)");
  cmd->add_option("--top", args->explain.top, "Proponents and opponents to list")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  args->q.add_to(cmd, globals);
  cmd->add_option("--kernel", args->kernel,
                  "Write kernel.npy, the summed kernel [n, M, K, K] of a gd or sgd run: auto (when it takes at most 2 GiB), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd->add_option("--out", args->out, "Directory for contributions.npy and explain.json (default: RUN/explain)");
  cmd->add_option("--checkpoint-seconds", args->explain.checkpoint_seconds,
                  "Save the accumulators to OUT/.progress this often; a rerun with the same arguments continues "
                  "from there")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->callback([args, &globals] {
    globals.apply();
    ExplainOptions options = args->explain;
    options.decomposition = args->q.options();
    options.kernel = parse_kernel_output(args->kernel);
    options.on_note = [](const std::string& note) {
      const bool kernel = note.rfind("kernel.npy", 0) == 0;
      std::fprintf(stderr, "pathkernel: %s%s\n", note.c_str(), kernel ? " (use --kernel on to force)" : "");
    };
    PathReader reader(args->run);
    const torch::Tensor idx = args->points.indices(reader.dataset().y_test, 1);
    const std::string out = args->out.empty() ? (std::filesystem::path(args->run) / "explain").string() : args->out;
    const Explanation e = explain(reader, idx, out, options);
    if (e.json.contains("warning")) {  // updates the run does not describe (decomposition.h, StepResiduals)
      std::fprintf(stderr, "pathkernel: warning: %s\n", e.json["warning"].get<std::string>().c_str());
    }
    if (globals.json) {
      nlohmann::ordered_json summary = e.json;
      summary["out"] = out;
      summary["images"] = e.images;
      globals.print(summary, "");
      return;
    }
    print_points(e.json["points"]);
    const torch::Tensor& c = e.decomposition.contributions;
    std::printf("wrote %s/contributions.npy [%lld, %lld, %lld]%s and %s/explain.json\n", out.c_str(),
                static_cast<long long>(c.size(0)), static_cast<long long>(c.size(1)),
                static_cast<long long>(c.size(2)), e.kernel ? ", kernel.npy" : "", out.c_str());
    if (!e.images.empty()) {
      std::printf("wrote %zu PNG grids (test image in blue; proponents green, top row; opponents red, bottom row): "
                  "%s/%s ...\n", e.images.size(), out.c_str(), e.images.front().c_str());
    }
  });
}

}  // namespace pathkernel::cli
