// `pathkernel gram`: Gram matrices of the EPK, DPK and NTKs as .npy with a JSON
// sidecar (gram_file.h owns the format).
#include <algorithm>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "pathkernel/error.h"
#include "pathkernel/gram_file.h"

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
    GramOptions options = args->k.options();
    options.trace = args->outputs == "trace";
    PathReader reader(args->run);
    const Dataset& data = reader.dataset();
    const int64_t n_rows = args->rows == "test" ? data.x_test.size(0) : data.x_train.size(0);
    const int64_t n_cols = args->cols == "test" ? data.x_test.size(0) : data.x_train.size(0);
    const GramFile g = gram_between(reader, args->rows, first_points(args->row_count, n_rows, "--row-count"), args->cols,
                                    first_points(args->col_count, n_cols, "--col-count"), options);
    const std::string name = KernelArgs::file_stem(options.kernel);
    const std::string out = args->out.empty()
        ? (std::filesystem::path(args->run) / "gram" / (name + "_" + args->rows + "_" + args->cols + ".npy")).string()
        : args->out;
    nlohmann::ordered_json printed = write_gram_file(out, g.matrix, g.record);
    printed["out"] = out;
    globals.print(printed, out + "  " + printed["shape"].dump());
  });
}

}  // namespace pathkernel::cli
