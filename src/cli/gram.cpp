// `pathkernel gram`: Gram matrices of the EPK, DPK and NTKs as .npy with a JSON sidecar.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/gram.h"
#include "pathkernel/npy.h"

namespace pathkernel::cli {

namespace {

/// The first `count` points of a set (all when count exceeds it).
torch::Tensor first_points(int64_t count, int64_t available, const std::string& option) {
  PK_CHECK(count >= 1, option << " must be >= 1 (got " << count << ")");
  return torch::arange(std::min(count, available));
}

}  // namespace

void add_gram_command(CLI::App& app, Globals& globals) {
  struct Args {
    std::string run, rows = "test", cols = "train", outputs = "full", out;
    int64_t row_count = 100, col_count = 100;
    KernelArgs k;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("gram", "Gram matrix of the EPK, DPK or NTK between test and training points");
  cmd->add_option("RUN", args->run, "Run directory")->required();
  cmd->add_option("--rows", args->rows, "Row points: train or test")
      ->check(CLI::IsMember({"train", "test"}))
      ->capture_default_str();
  cmd->add_option("--cols", args->cols, "Column points: train or test")
      ->check(CLI::IsMember({"train", "test"}))
      ->capture_default_str();
  cmd->add_option("--row-count", args->row_count, "Use the first N row points")->capture_default_str();
  cmd->add_option("--col-count", args->col_count, "Use the first N column points")->capture_default_str();
  cmd->add_option("--outputs", args->outputs, "full: K x K blocks [R, C, K, K]; trace: their trace [R, C]")
      ->check(CLI::IsMember({"full", "trace"}))
      ->capture_default_str();
  args->k.add_to(cmd, globals);
  cmd->add_option("--out", args->out, "Output .npy (default: RUN/gram/<kernel>_<rows>_<cols>.npy); a .json sidecar goes beside it");
  cmd->callback([args, &globals] {
    globals.apply();
    const auto t0 = std::chrono::steady_clock::now();
    GramOptions options = args->k.options();
    options.trace = args->outputs == "trace";
    PathReader reader(args->run);
    const Dataset& data = reader.dataset();
    const bool rows_test = args->rows == "test", cols_test = args->cols == "test";
    const torch::Tensor& row_set = rows_test ? data.x_test : data.x_train;
    const torch::Tensor& col_set = cols_test ? data.x_test : data.x_train;
    const torch::Tensor ri = first_points(args->row_count, row_set.size(0), "--row-count");
    const torch::Tensor ci = first_points(args->col_count, col_set.size(0), "--col-count");
    torch::Tensor g = gram(reader, row_set.index_select(0, ri), rows_test, col_set.index_select(0, ci), cols_test, options);

    const std::string name = KernelArgs::file_stem(options.kernel);
    const std::filesystem::path out = args->out.empty()
        ? std::filesystem::path(args->run) / "gram" / (name + "_" + args->rows + "_" + args->cols + ".npy")
        : std::filesystem::path(args->out);
    if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path());
    write_npy(out.string(), g);
    nlohmann::ordered_json axes = options.trace ? nlohmann::ordered_json{"row", "col"}
                                                : nlohmann::ordered_json{"row", "col", "row_output", "col_output"};
    nlohmann::ordered_json j{
        {"file", out.filename().string()},
        {"run", args->run},
        {"kernel", options.kernel.str()},
        {"rows", {{"set", args->rows}, {"indices", "0.." + std::to_string(ri.size(0) - 1)}}},
        {"cols", {{"set", args->cols}, {"indices", "0.." + std::to_string(ci.size(0) - 1)}}},
        {"outputs", args->outputs},
        {"shape", g.sizes().vec()},
        {"axes", axes},
        {"dtype", "float64"},
        {"steps", reader.manifest().steps},
        {"quadrature", options.kernel.kind == GramSpec::Kind::Epk ? options.quadrature.spec.str() : "none"},
        {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}};
    std::filesystem::path sidecar = out;
    sidecar.replace_extension(".json");
    write_file_atomic(sidecar.string(), j.dump(2) + "\n");
    nlohmann::ordered_json printed = j;
    printed["out"] = out.string();
    globals.print(printed, out.string() + "  " + j["shape"].dump());
  });
}

}  // namespace pathkernel::cli
