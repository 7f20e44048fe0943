// `pathkernel check-path`: replay a whole path and compare every checkpoint bit for bit.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "pathkernel/path.h"

namespace pathkernel::cli {

void add_check_path_command(CLI::App& app, Globals& globals) {
  struct Args {
    std::string run;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "check-path", "Replay every step from the checkpoints and compare them bit for bit");
  cmd->add_option("RUN", args->run, "Run directory")->required();
  cmd->callback([args, &globals] {
    globals.apply();
    auto t0 = std::chrono::steady_clock::now();
    PathReader reader(args->run);
    ReplayReport r = reader.check(!globals.quiet);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const nlohmann::ordered_json j{{"run", args->run},
                                   {"steps", reader.steps()},
                                   {"recorded", r.recorded},
                                   {"steps_replayed", r.steps_replayed},
                                   {"checkpoints_compared", r.checkpoints_compared},
                                   {"mismatches", r.mismatches},
                                   {"first_mismatch_step", r.first_mismatch_step},
                                   {"max_abs_diff", r.max_abs_diff},
                                   {"bitwise_equal", r.bitwise_equal},
                                   {"environment_differences", r.environment_differences},
                                   {"seconds", seconds}};
    const std::string text =
        r.recorded && r.steps_replayed > 0
            ? format_text("recorded compactly from a training loop: replayed %lld steps with the module and LibTorch's "
                          "optimizer; %lld of %lld checkpoints reproduced, max |diff| %.3g%s (%.1f s). Drift is not "
                          "an error for a recorded loop: 'pathkernel verify' carries it into E and reports it as "
                          "replay_drift.",
                          static_cast<long long>(r.steps_replayed),
                          static_cast<long long>(r.checkpoints_compared - r.mismatches),
                          static_cast<long long>(r.checkpoints_compared), r.max_abs_diff,
                          r.first_mismatch_step >= 0
                              ? (", first differing at step " + std::to_string(r.first_mismatch_step)).c_str()
                              : "",
                          seconds)
        : r.recorded ? format_text("recorded from a training loop: every one of the %lld steps is stored, so there is "
                                 "nothing to replay; every file matches its size and CRC-32 (%.1f s). 'pathkernel "
                                 "verify' checks that the steps are what the declared loss and optimizer give.",
                                 static_cast<long long>(reader.steps()), seconds)
        : r.bitwise_equal
            ? format_text("replayed %lld steps; all %lld checkpoints reproduced bit for bit (%.1f s)",
                          static_cast<long long>(r.steps_replayed), static_cast<long long>(r.checkpoints_compared),
                          seconds)
            : format_text("replayed %lld steps; %lld of %lld checkpoints differ, first at step %lld, max |diff| %.3g\n",
                          static_cast<long long>(r.steps_replayed), static_cast<long long>(r.mismatches),
                          static_cast<long long>(r.checkpoints_compared),
                          static_cast<long long>(r.first_mismatch_step), r.max_abs_diff) +
                  replay_mismatch_reason(reader.manifest(), r.environment_differences);
    globals.print(j, text);
    if (!r.bitwise_equal && !r.recorded) globals.exit_status = 1;
  });
}

}  // namespace pathkernel::cli
