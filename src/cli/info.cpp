// `pathkernel info`: what a run directory holds.
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "pathkernel/blas_kernels.h"
#include "pathkernel/error.h"
#include "pathkernel/manifest.h"

namespace pathkernel::cli {

namespace {

/// "  trained   on CPU, T threads, OpenBLAS's K kernels (its replays use
/// them; this CPU runs B)": the machine a run's bits belong to, and the
/// wider kernels a run trained on narrower ones (a user's OPENBLAS_CORETYPE)
/// gives up for every replay; a float32 run's walks run their float64 work
/// on them (blas_switch.h). Empty for a run that recorded no environment.
std::string trained_line(const ReplayEnvironment& e, bool float32) {
  if (e.empty()) return "";
  std::string line = "  trained   on " + e.cpu + ", " + std::to_string(e.threads) +
                     (e.threads == 1 ? " thread" : " threads") + ", OpenBLAS's " + e.blas_kernels +
                     " kernels (its replays use them";
  const std::string wider = wider_blas_kernels(e.blas_kernels, CpuFeatures::current());
  if (!wider.empty()) line += "; this CPU runs " + wider + (float32 ? ", for the walks' float64 work" : "");
  return line + ")\n";
}

}  // namespace

void add_info_command(CLI::App& app, Globals& globals) {
  struct Args {
    std::string run;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("info", "Describe a run directory (checks it against its manifest)");
  cmd->add_option("RUN", args->run, "Run directory")->required();
  cmd->callback([args, &globals] {
    Manifest m = Manifest::load(args->run);
    validate_run(args->run, m);
    const int64_t every_step = mul_no_overflow(
        mul_no_overflow(m.steps + 1, m.parameter_count, "every-step path size"), 8, "every-step path size");
    const int64_t path = m.path_bytes();
    nlohmann::ordered_json j{{"run", args->run},
                             {"status", m.status},
                             {"steps", m.steps},
                             {"parameters", m.parameter_count},
                             {"path_bytes", path},
                             {"every_step_bytes", every_step},
                             {"compression", every_step > 0 ? static_cast<double>(every_step) / path : 0.0},
                             {"checkpoints", m.checkpoints.size()},
                             {"checkpoint_every", m.checkpoint_every},
                             {"data", m.data.spec},
                             {"num_train", m.num_train},
                             {"num_test", m.num_test},
                             {"model", m.model_spec},
                             {"output", m.output},
                             {"loss", m.loss},
                             {"recorded", m.recorded},
                             {"loss_weights", m.loss_weights.file.empty() ? nlohmann::ordered_json(nullptr)
                                                                         : nlohmann::ordered_json(m.loss_weights.file)},
                             {"bytes_per_step", m.steps > 0 ? static_cast<double>(path) / m.steps : 0.0},
                             {"dtype", m.dtype},
                             {"optimizer", m.optimizer.to_json()},
                             {"batch_size", m.batch_size},
                             {"threads", m.threads},
                             {"libtorch_version", m.libtorch_version},
                             {"environment", m.environment.empty() ? nlohmann::ordered_json(nullptr)
                                                                   : m.environment.to_json()},
                             {"pathkernel_version", m.pathkernel_version},
                             {"summary", m.summary}};
    std::string text;
    text += format_text("run %s (%s)\n", args->run.c_str(), m.status.c_str());
    if (!m.message.empty()) text += format_text("  %s\n", m.message.c_str());
    text += format_text("  data      %s: %lld train / %lld test, %lld classes\n", m.data.spec.c_str(),
                static_cast<long long>(m.num_train), static_cast<long long>(m.num_test),
                static_cast<long long>(m.num_classes));
    text += format_text("  model     %s, output %s, loss %s, %s, %lld parameters\n", m.model_spec.c_str(),
                m.output.c_str(), m.loss.c_str(), m.dtype.c_str(), static_cast<long long>(m.parameter_count));
    text += format_text("  training  %s, batch %s, %lld steps\n", m.optimizer.to_json().dump().c_str(),
                m.batch_size == 0 ? "full" : std::to_string(m.batch_size).c_str(),
                static_cast<long long>(m.steps));
    if (!m.loss_weights.file.empty()) {
      const torch::Tensor c = read_loss_weights(args->run, m);
      text += format_text("  weights   per-point loss weights (%s): min %.4g, mean %.4g, max %.4g, %lld zero\n",
                          m.loss_weights.file.c_str(), c.min().item<double>(), c.mean().item<double>(),
                          c.max().item<double>(), static_cast<long long>(c.eq(0).sum().item<int64_t>()));
    }
    if (m.recorded && static_cast<int64_t>(m.checkpoints.size()) < m.steps + 1) {
      text += format_text("  path      recorded compactly from a training loop: %zu checkpoints, the steps between "
                          "replayed with the module and LibTorch's optimizer, %.2f MB, %.0f bytes per step\n",
                          m.checkpoints.size(), path / 1e6, m.steps > 0 ? static_cast<double>(path) / m.steps : 0.0);
    } else if (m.recorded) {
      // Recorded with every_step=True: every step's weights are stored.
      text += format_text("  path      recorded from a training loop: every step's weights and optimizer state "
                          "are stored (nothing to replay), %.2f MB, %.0f bytes per step\n",
                          path / 1e6, m.steps > 0 ? static_cast<double>(path) / m.steps : 0.0);
    } else {
      text += format_text("  path      %zu checkpoints (every %lld steps), %.2f MB; every step would be %.2f MB (%.1fx)\n",
                          m.checkpoints.size(), static_cast<long long>(m.checkpoint_every), path / 1e6,
                          every_step / 1e6, path > 0 ? static_cast<double>(every_step) / path : 0.0);
    }
    text += trained_line(m.environment, m.dtype == "float32");
    if (!m.summary.empty()) text += format_text("  summary   %s\n", m.summary.dump().c_str());
    text.pop_back();  // print() ends the line
    globals.print(j, text);
  });
}

}  // namespace pathkernel::cli
