// `pathkernel gram`: Gram matrices of the EPK, DPK and NTKs as .npy with a JSON
// sidecar (gram_file.h owns the format).
#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "pathkernel/across_ranks.h"
#include "pathkernel/gram_file.h"

namespace pathkernel::cli {

void add_gram_command(CLI::App& app, Globals& globals) {
  struct Args {
    std::string run, rows = "test", cols = "train", outputs = "full", out;
    TestPointArgs test;
    int64_t train = 100;
    int64_t row_count = 0, col_count = 0;  ///< deprecated: the first N of the row or column set (0: unset)
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
  args->test.add_to(cmd, "of the test rows or columns (default: the first 100)");
  cmd->add_option("--train", args->train, "The first N training points, for training rows or columns")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  add_deprecated_option(cmd, "--row-count", args->row_count, "--test N or --train N")->check(CLI::PositiveNumber);
  add_deprecated_option(cmd, "--col-count", args->col_count, "--test N or --train N")->check(CLI::PositiveNumber);
  cmd->add_option("--outputs", args->outputs, "full: K x K blocks [R, C, K, K]; trace: their trace [R, C]")
      ->check(CLI::IsMember({"full", "trace"}))
      ->capture_default_str();
  args->k.add_to(cmd, globals);
  cmd->add_option("--out", args->out, "Output .npy (default: RUN/gram/<kernel>_<rows>_<cols>.npy); a .json sidecar goes beside it");
  cmd->callback([args, &globals] {
    globals.apply();
    GramOptions options = args->k.options();
    options.trace = args->outputs == "trace";
    // Under mpirun each rank computes a share of the test side (across_ranks.h).
    const Communicator& world = Communicator::world();
    std::optional<PathReader> reader_storage;
    world.agree([&] { reader_storage.emplace(args->run); });
    PathReader& reader = *reader_storage;
    const Dataset& data = reader.held_dataset();
    // Each side: its set's chosen points, or (deprecated) the first N of it.
    auto side = [&](const std::string& set, int64_t count) -> torch::Tensor {
      const int64_t available = set == "test" ? reader.test_count() : reader.train_count();
      if (count > 0) return torch::arange(std::min(count, available), torch::kLong);
      if (set == "test") return args->test.indices(data.y_test, 100);
      return torch::arange(std::min(args->train, available), torch::kLong);
    };
    torch::Tensor row_indices, col_indices;
    world.agree([&] {
      row_indices = side(args->rows, args->row_count);
      col_indices = side(args->cols, args->col_count);
    });
    const GramFile g = gram_across(world, reader, args->rows, row_indices, args->cols, col_indices, options);
    const std::string name = KernelArgs::file_stem(options.kernel);
    const std::string out = args->out.empty()
        ? (std::filesystem::path(args->run) / "gram" / (name + "_" + args->rows + "_" + args->cols + ".npy")).string()
        : args->out;
    nlohmann::ordered_json printed;
    world.agree([&] {
      if (world.root()) printed = write_gram_file(out, g.matrix, g.record);
    });
    if (!world.root()) return;
    printed["out"] = out;
    globals.print(printed, out + "  " + printed["shape"].dump());
  });
}

}  // namespace pathkernel::cli
