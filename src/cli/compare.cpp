// `pathkernel compare`: every kernel method on the same test points, beside
// the trained network (compare_kernel_methods() in compare.h does the work;
// this binds its options and prints the table).
#include <filesystem>
#include <memory>

#include "commands.h"
#include "pathkernel/compare.h"

namespace pathkernel::cli {

void add_compare_command(CLI::App& app, Globals& globals) {
  struct Args {
    std::string run, kernels = "epk,dpk,ntk:0,ntk,ntk-inf", out;
    CompareOptions compare;
    KernelPointArgs points;
    QuadratureArgs q;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "compare", "Kernel methods beside the trained network on the same test points: the exact EPK machine, SVM "
                 "refits and kernel regression on each kernel, the NNGP, and the lazy (linearised) dynamics");
  cmd->add_option("RUN", args->run, "Run directory")->required();
  cmd->add_option("--kernels", args->kernels, "Comma-separated kernels for the SVM and regression rows")
      ->capture_default_str();
  cmd->add_option("--c", args->compare.c, "C-SVC's cost C")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--bias-scale", args->compare.bias_scale, "ntk-inf and nngp: the bias scale beta")
      ->capture_default_str();
  args->points.add_to(cmd);
  args->q.add_to(cmd, globals);
  cmd->add_option("--out", args->out, "Output directory (default: RUN/compare)");
  cmd->callback([args, &globals] {
    globals.apply();
    CompareOptions options = args->compare;
    options.kernels = CompareOptions::parse_kernel_list(args->kernels);
    options.decomposition = args->q.options();
    PathReader reader(args->run);
    const Dataset& data = reader.held_dataset();
    const Comparison c = compare_kernel_methods(reader, args->points.train_indices(data.y_train),
                                                args->points.test_indices(data.y_test), options);
    const std::string dir = args->out.empty() ? (std::filesystem::path(args->run) / "compare").string() : args->out;
    const std::string md = write_comparison(c, dir);
    globals.print({{"run", args->run}, {"test_points", c.test_points}, {"rows", c.rows_json()}, {"out", dir}},
                  c.markdown() + "\n" + md);
  });
}

}  // namespace pathkernel::cli
