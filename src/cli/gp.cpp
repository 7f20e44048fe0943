// `pathkernel gp`: Gaussian-process regression of the network's outputs on a
// path kernel, at test points or on a 2-D grid.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/gp.h"
#include "pathkernel/grid.h"
#include "pathkernel/npy.h"

namespace pathkernel::cli {

namespace {

/// The fraction of rows whose argmax agrees.
double agreement(const torch::Tensor& a, const torch::Tensor& b) {
  return a.argmax(1).eq(b.argmax(1)).to(torch::kFloat64).mean().item<double>();
}

}  // namespace

void add_gp_command(CLI::App& app, Globals& globals) {
  struct Args {
    std::string run, targets = "outputs", out;
    int64_t grid = 0, samples = 1000;
    double noise = 0.0;
    uint64_t seed = 0;
    KernelPointArgs points;
    KernelArgs k;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "gp", "Gaussian-process regression of the network's outputs on a path kernel: posterior mean, variance and "
            "the Monte-Carlo std of the class probabilities");
  cmd->add_option("RUN", args->run, "Run directory")->required();
  cmd->add_option("--targets", args->targets, "outputs: the trained network's outputs at the training points; onehot: the labels")
      ->check(CLI::IsMember({"outputs", "onehot"}))
      ->capture_default_str();
  cmd->add_option("--grid", args->grid, "Predict on an N x N grid over the inputs (2-D data) instead of test points")
      ->check(CLI::Range(2, 1000));
  cmd->add_option("--noise", args->noise, "Observation noise variance added to the train kernel's diagonal")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--samples", args->samples, "Monte-Carlo samples for the probabilities' std (0: none)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "Seed of the Monte-Carlo samples")->capture_default_str();
  args->points.add_to(cmd);
  args->k.add_to(cmd, globals);
  cmd->add_option("--out", args->out, "Output directory (default: RUN/gp/<kernel>[_grid])");
  cmd->callback([args, &globals] {
    globals.apply();
    const auto t0 = std::chrono::steady_clock::now();
    GramOptions options = args->k.options();
    PathReader reader(args->run);
    const Dataset& data = reader.held_dataset();
    const torch::Tensor ti = args->points.train_indices(data.y_train);
    const torch::Tensor x_train = reader.train_inputs(ti).to(torch::kFloat64);
    const bool on_grid = args->grid > 0;
    torch::Tensor test_idx, x_query;
    if (on_grid) {
      const int64_t features = x_train.numel() / std::max<int64_t>(1, x_train.size(0));
      PK_CHECK(features == 2, "--grid needs 2-D inputs; this run's inputs have " << features << " features");
      // The training inputs' bounding box, widened by 10% on each side.
      const torch::Tensor all = reader.train_inputs(torch::Tensor());
      x_query = grid_2d(GridBounds::around(all, 0.1, 0.0), args->grid).points.view([&] {
        std::vector<int64_t> s = all.sizes().vec();
        s[0] = args->grid * args->grid;
        return s;
      }());
    } else {
      test_idx = args->points.test_indices(data.y_test);
      x_query = reader.test_inputs(test_idx).to(torch::kFloat64);
    }
    const int64_t steps = reader.manifest().steps;
    torch::Tensor y = args->targets == "outputs"
        ? reader.outputs(steps, x_train)
        : torch::zeros({x_train.size(0), reader.manifest().num_classes}, torch::kFloat64)
              .scatter_(1, data.y_train.index_select(0, ti).view({-1, 1}), 1.0);
    // Grid points, like test points, are the integrated side of the epk.
    KernelMatrices k = kernel_matrices(reader, x_train, x_query, true, options, true);
    GpOptions gp;
    gp.noise = args->noise;
    gp.samples = args->samples;
    gp.seed = args->seed;
    GpPosterior post = gp_posterior(k.train, k.cross, k.self, y, gp);

    const std::string name = KernelArgs::file_stem(options.kernel);
    const std::filesystem::path dir = args->out.empty()
        ? std::filesystem::path(args->run) / "gp" / (name + (on_grid ? "_grid" : ""))
        : std::filesystem::path(args->out);
    std::filesystem::create_directories(dir);
    write_npy((dir / "mean.npy").string(), post.mean);
    write_npy((dir / "variance.npy").string(), post.variance);
    if (post.prob_std.defined()) write_npy((dir / "prob_std.npy").string(), post.prob_std);
    write_npy((dir / "points.npy").string(), x_query.flatten(1));
    write_npy((dir / "train_indices.npy").string(), ti);
    nlohmann::ordered_json j{{"run", args->run},
                             {"kernel", options.kernel.str()},
                             {"scalar_kernel", "trace / K of the K x K output kernel"},
                             {"targets", args->targets},
                             {"train_points", ti.size(0)},
                             {"query", on_grid ? "grid" : "test"},
                             {"query_points", x_query.size(0)},
                             {"noise", args->noise},
                             {"jitter", post.jitter},
                             {"samples", args->samples},
                             {"mean_prob_std", post.prob_std.defined() ? post.prob_std.mean().item<double>() : 0.0},
                             {"negative_variances", post.variance.lt(0).sum().item<int64_t>()}};
    std::string line;
    if (!on_grid) {
      write_npy((dir / "test_indices.npy").string(), test_idx);
      const torch::Tensor labels = data.y_test.index_select(0, test_idx);
      const torch::Tensor net = reader.outputs(steps, x_query);
      const double acc = post.mean.argmax(1).eq(labels).to(torch::kFloat64).mean().item<double>();
      const double net_acc = net.argmax(1).eq(labels).to(torch::kFloat64).mean().item<double>();
      j["gp_accuracy"] = acc;
      j["network_accuracy"] = net_acc;
      j["agreement_with_network"] = agreement(post.mean, net);
      char buf[200];
      std::snprintf(buf, sizeof buf, "  accuracy %.4f (network %.4f), agreement with the network %.4f", acc, net_acc,
                    agreement(post.mean, net));
      line = buf;
    }
    j["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    j["files"] = {{"mean.npy", "[n, K] posterior mean"},
                  {"variance.npy", "[n] posterior variance (the same for every output)"},
                  {"prob_std.npy", "[n, K] std of softmax over posterior samples"},
                  {"points.npy", "[n, d] the query inputs, flattened"},
                  {"train_indices.npy", "indices of the training points used"}};
    write_file_atomic((dir / "gp.json").string(), j.dump(2) + "\n");
    char text[1024];
    std::snprintf(text, sizeof text, "%s  gp on %s, %lld training points, %lld %s points, jitter %.3g%s", dir.string().c_str(),
                options.kernel.str().c_str(), static_cast<long long>(ti.size(0)),
                static_cast<long long>(x_query.size(0)), on_grid ? "grid" : "test", post.jitter, line.c_str());
    nlohmann::ordered_json printed = j;
    printed["out"] = dir.string();
    globals.print(printed, text);
  });
}

}  // namespace pathkernel::cli
