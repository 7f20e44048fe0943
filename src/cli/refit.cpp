// `pathkernel refit`: the kernel weights learned again by an SVM on a path
// kernel (libsvm, precomputed kernel), its accuracy beside the network's.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "pathkernel/files.h"
#include "pathkernel/svm_refit.h"

namespace pathkernel::cli {

void add_refit_command(CLI::App& app, Globals& globals) {
  struct Args {
    std::string run, out;
    double c = 1.0;
    KernelPointArgs points;
    KernelArgs k;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "refit", "Re-learn the kernel weights with an SVM on a path kernel; report its accuracy beside the network's");
  cmd->add_option("RUN", args->run, "Run directory")->required();
  cmd->add_option("--c", args->c, "C-SVC's cost C")->check(CLI::PositiveNumber)->capture_default_str();
  args->points.add_to(cmd);
  args->k.add_to(cmd, globals);
  cmd->add_option("--out", args->out, "Output JSON (default: RUN/refit/<kernel>.json)");
  cmd->callback([args, &globals] {
    globals.apply();
    const auto t0 = std::chrono::steady_clock::now();
    GramOptions options = args->k.options();
    PathReader reader(args->run);
    const Dataset& data = reader.held_dataset();  // the inputs read by rows (train_inputs, test_inputs)
    const torch::Tensor ti = args->points.train_indices(data.y_train), si = args->points.test_indices(data.y_test);
    const torch::Tensor x_test = reader.test_inputs(si), labels = data.y_test.index_select(0, si);
    KernelMatrices k = kernel_matrices(reader, reader.train_inputs(ti), x_test, true, options, false);
    SvmOptions svm;
    svm.c = args->c;
    SvmRefit fit = svm_refit(k.train, data.y_train.index_select(0, ti), k.cross, svm);
    const torch::Tensor net = reader.outputs(reader.manifest().steps, x_test).argmax(1);
    auto fraction = [](const torch::Tensor& eq) { return eq.to(torch::kFloat64).mean().item<double>(); };
    const double acc = fraction(fit.predicted.eq(labels)), net_acc = fraction(net.eq(labels));
    const double agree = fraction(fit.predicted.eq(net));

    const std::string name = KernelArgs::file_stem(options.kernel);
    const std::filesystem::path out =
        args->out.empty() ? std::filesystem::path(args->run) / "refit" / (name + ".json") : std::filesystem::path(args->out);
    if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path());
    nlohmann::ordered_json j{{"run", args->run},
                             {"kernel", options.kernel.str()},
                             {"scalar_kernel", "trace / K of the K x K output kernel"},
                             {"c", args->c},
                             {"train_points", ti.size(0)},
                             {"test_points", si.size(0)},
                             {"svm_accuracy", acc},
                             {"network_accuracy", net_acc},
                             {"agreement_with_network", agree},
                             {"support_vectors", fit.support_vectors},
                             {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}};
    write_file_atomic(out.string(), j.dump(2) + "\n");
    char text[1024];
    std::snprintf(text, sizeof text, "svm on %s (%lld training points, C = %g): accuracy %.4f, network %.4f on the same %lld test points; "
                "agreement with the network %.4f; %lld support vectors\n%s",
                options.kernel.str().c_str(), static_cast<long long>(ti.size(0)), args->c, acc, net_acc,
                static_cast<long long>(si.size(0)), agree, static_cast<long long>(fit.support_vectors),
                out.string().c_str());
    nlohmann::ordered_json printed = j;
    printed["out"] = out.string();
    globals.print(printed, text);
  });
}

}  // namespace pathkernel::cli
