// `pathkernel explain`: per-training-point attribution of test predictions.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "pathkernel/context.h"
#include "pathkernel/decomposition.h"
#include "pathkernel/decomposition_checkpoint.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/image.h"
#include "pathkernel/npy.h"

namespace pathkernel::cli {

namespace {
/// The k training points with the largest (or smallest) contributions c [M].
nlohmann::ordered_json extremes(const torch::Tensor& c, const torch::Tensor& labels, int64_t k, bool largest) {
  auto [values, index] = c.topk(std::min<int64_t>(k, c.size(0)), 0, largest);
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (int64_t j = 0; j < index.size(0); ++j) {
    int64_t i = index[j].item<int64_t>();
    out.push_back({{"index", i}, {"label", labels[i].item<int64_t>()}, {"value", values[j].item<double>()}});
  }
  return out;
}
}  // namespace

void add_explain_command(CLI::App& app, Globals& globals) {
  struct Args {
    std::string run, out;
    TestPointArgs points;
    std::string kernel = "auto";
    int64_t top = 10;
    double checkpoint_seconds = 60;
    QuadratureArgs q;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "explain", "Split test predictions exactly into per-training-point contributions");
  cmd->add_option("RUN", args->run, "Run directory")->required();
  args->points.add_to(cmd, "to explain (default: test point 0)");
  cmd->add_option("--top", args->top, "Proponents and opponents to list")->check(CLI::Range(1, 100000))->capture_default_str();
  args->q.add_to(cmd, globals);
  cmd->add_option("--kernel", args->kernel,
                  "Write kernel.npy, the summed kernel [n, M, K, K] of a gd or sgd run: auto (when it takes at most 2 GiB), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd->add_option("--out", args->out, "Directory for contributions.npy and explain.json (default: RUN/explain)");
  cmd->add_option("--checkpoint-seconds", args->checkpoint_seconds,
                  "Save the accumulators to OUT/.progress this often; a rerun with the same arguments continues "
                  "from there")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->callback([args, &globals] {
    globals.apply();
    DecompositionOptions options = args->q.options();
    PathReader reader(args->run);
    const torch::Tensor& x_test = reader.dataset().x_test;
    torch::Tensor idx = args->points.indices(x_test.size(0), 1);
    const Manifest& m = reader.manifest();
    const double kernel_bytes = 8.0 * static_cast<double>(idx.size(0)) * static_cast<double>(m.num_train) *
                                static_cast<double>(m.num_classes * m.num_classes);
    // The summed kernel is the ensemble form of gd and sgd runs.
    const bool kernel_form = m.optimizer.name == "gd" || m.optimizer.name == "sgd";
    options.kernel = args->kernel == "on" || (args->kernel == "auto" && kernel_form && kernel_bytes <= 2.0 * (1 << 30));
    if (args->kernel == "auto" && kernel_form && !options.kernel) {
      std::fprintf(stderr, "pathkernel: kernel.npy would take %.1f GiB; not written (use --kernel on to force)\n",
                   kernel_bytes / (1 << 30));
    }
    const std::string out = args->out.empty() ? (std::filesystem::path(args->run) / "explain").string() : args->out;
    // Everything the accumulators depend on: a saved state made otherwise is not reused.
    nlohmann::ordered_json arguments{
        {"manifest_crc32", crc32_of(read_file((std::filesystem::path(args->run) / "manifest.json").string()))},
        {"test_indices", std::vector<int64_t>(idx.data_ptr<int64_t>(), idx.data_ptr<int64_t>() + idx.numel())},
        {"quadrature", options.quadrature.spec.str()},
        {"tol", options.quadrature.tol},
        {"gauss_nodes", options.quadrature.gauss_nodes},
        {"kernel", options.kernel},
        {"threads", current_threads()}};
    DirectoryCheckpoint progress((std::filesystem::path(out) / ".progress").string(), arguments,
                                 args->checkpoint_seconds);
    progress.resume_point();
    if (!progress.message().empty()) std::fprintf(stderr, "pathkernel: %s\n", progress.message().c_str());
    Decomposition d = decompose(reader, x_test.index_select(0, idx), options, &progress);
    std::filesystem::create_directories(out);
    write_npy((std::filesystem::path(out) / "contributions.npy").string(), d.contributions);
    if (options.kernel) write_npy((std::filesystem::path(out) / "kernel.npy").string(), d.kernel);
    // Thm. 3.7: a single kernel machine, C_i(x) = (η/|B|) kernel[x, i, :, y_i],
    // when u_i = −e_{y_i} (log-softmax + NLL) and η/|B_s| is the same at every step.
    const bool even_batches = m.batch_size == 0 || m.num_train % m.batch_size == 0;
    const bool single = m.output == "logsoftmax" && m.schedule == "constant" && even_batches;
    const double batch = static_cast<double>(m.batch_size == 0 ? m.num_train : m.batch_size);
    const torch::Tensor& y_train = reader.dataset().y_train;
    const torch::Tensor gap = d.completeness_gap();
    nlohmann::ordered_json points = nlohmann::ordered_json::array();
    for (int64_t n = 0; n < idx.size(0); ++n) {
      const int64_t predicted = d.fN[n].argmax().item<int64_t>();
      torch::Tensor c = d.contributions[n].select(1, predicted);  // [M]
      torch::Tensor completeness = gap[n].abs().max();
      auto vec = [](const torch::Tensor& t) {
        std::vector<double> v(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
        return v;
      };
      points.push_back({{"test_index", idx[n].item<int64_t>()},
                        {"label", reader.dataset().y_test[idx[n]].item<int64_t>()},
                        {"predicted", predicted},
                        {"f_final", vec(d.fN[n].contiguous())},
                        {"f_initial", vec(d.f0[n].contiguous())},
                        {"contributions_sum", vec(d.contributions[n].sum(0).contiguous())},
                        {"regularization", vec(d.regularization[n].contiguous())},
                        {"rounding", vec(d.rounding[n].contiguous())},
                        {"completeness_error", completeness.item<double>()},
                        {"proponents", extremes(c, y_train, args->top, true)},
                        {"opponents", extremes(c, y_train, args->top, false)}});
    }
    nlohmann::ordered_json j{{"run", args->run},
                             {"quadrature", options.quadrature.spec.str()},
                             {"steps", d.steps},
                             {"certificate_max_gap", d.certificate_max_gap},
                             {"contributions", {{"file", "contributions.npy"},
                                                {"shape", {idx.size(0), d.contributions.size(1), d.contributions.size(2)}}}},
                             {"kernel", options.kernel ? nlohmann::ordered_json{
                                  {"file", "kernel.npy"},
                                  {"shape", {idx.size(0), d.contributions.size(1), m.num_classes, m.num_classes}},
                                  {"single_kernel", single},
                                  {"weight", single ? nlohmann::ordered_json(m.optimizer.lr / batch)
                                                    : nlohmann::ordered_json(nullptr)}}
                                                       : nlohmann::ordered_json(nullptr)},
                             {"points", points}};
    write_file_atomic((std::filesystem::path(out) / "explain.json").string(), j.dump(2) + "\n");
    progress.finish();
    // Image data: the test image (blue) beside its top proponents (green, top
    // row) and opponents (red, bottom row).
    std::vector<std::string> pngs;
    if (m.input_shape.size() == 3) {
      const torch::Tensor& x_train = reader.dataset().x_train;
      for (int64_t n = 0; n < idx.size(0); ++n) {
        std::vector<std::vector<GridTile>> rows(2);
        rows[0].push_back({x_test[idx[n].item<int64_t>()], Rgb{40, 90, 220}});
        rows[1].push_back({torch::Tensor(), std::nullopt});
        const char* sides[] = {"proponents", "opponents"};
        const Rgb colours[] = {Rgb{30, 160, 60}, Rgb{210, 40, 40}};
        for (int side = 0; side < 2; ++side) {
          int shown = 0;
          for (const auto& e : points[n][sides[side]]) {
            if (shown++ == 8) break;
            rows[side].push_back({x_train[e["index"].get<int64_t>()], colours[side]});
          }
        }
        const std::string name = "explain_" + std::to_string(idx[n].item<int64_t>()) + ".png";
        write_png_grid((std::filesystem::path(out) / name).string(), rows);
        pngs.push_back(name);
      }
    }
    if (globals.json) {
      nlohmann::ordered_json summary = j;
      summary["out"] = out;
      summary["images"] = pngs;
      globals.print(summary, "");
      return;
    }
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
    std::printf("wrote %s/contributions.npy [%lld, %lld, %lld]%s and %s/explain.json\n", out.c_str(),
                static_cast<long long>(idx.size(0)), static_cast<long long>(d.contributions.size(1)),
                static_cast<long long>(d.contributions.size(2)), options.kernel ? ", kernel.npy" : "", out.c_str());
    if (!pngs.empty()) {
      std::printf("wrote %zu PNG grids (test image in blue; proponents green, top row; opponents red, bottom row): "
                  "%s/%s ...\n", pngs.size(), out.c_str(), pngs.front().c_str());
    }
  });
}

}  // namespace pathkernel::cli
