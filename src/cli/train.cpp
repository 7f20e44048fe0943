// `pathkernel train`: train a model and record its path in a run directory.
#include <cstdio>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "pathkernel/context.h"
#include "pathkernel/dataset.h"
#include "pathkernel/error.h"
#include "pathkernel/manifest.h"
#include "pathkernel/optimizer.h"
#include "pathkernel/run.h"
#include "pathkernel/text.h"

namespace pathkernel::cli {

namespace {
struct TrainArgs {
  RunOptions run;
  std::string dtype = "float64";
  std::string output = "logsoftmax";
  std::string loss = "cross-entropy";
  std::string resume;  ///< run directory to continue; every other option comes from its manifest
};

/// The options --resume may be combined with: the rest are the manifest's.
bool allowed_with_resume(const std::string& name) {
  return name == "--resume" || name == "--json" || name == "--quiet" || name == "--help";
}

/// Checks options that only make sense together, in one place.
void check_conflicts(CLI::App& cmd, const TrainArgs& a) {
  if (!a.resume.empty()) {
    for (const CLI::Option* o : cmd.get_options()) {
      const std::string name = o->get_name();
      PK_CHECK(o->count() == 0 || allowed_with_resume(name),
               name << " cannot be combined with --resume: a resumed run takes every option from its "
                    << "manifest.json (give only --resume RUN, and --json or --quiet)");
    }
    return;
  }
  PK_CHECK(cmd.count("--data") == 1, "--data is required (or --resume RUN to continue an interrupted run)");
  PK_CHECK(cmd.count("--out") == 1, "--out is required (or --resume RUN to continue an interrupted run)");
  const std::string& opt = a.run.train.optimizer.name;
  const OptimizerTraits& kind = a.run.train.optimizer.traits();
  PK_CHECK(cmd.count("--lr") == 0 || a.run.train.optimizer.lr != 0, "--lr must be > 0 (got 0)");
  PK_CHECK(cmd.count("--momentum") == 0 || kind.momentum_family || kind.kind == OptimizerKind::RMSprop,
           "--momentum applies to --optimizer momentum, nesterov or rmsprop (got --optimizer " << opt << ")");
  PK_CHECK(cmd.count("--momentum") == 0 || !kind.momentum_family || a.run.train.optimizer.momentum != 0,
           "--momentum must be in (0, 1) for --optimizer " << opt << " (got 0; without momentum, use --optimizer sgd)");
  PK_CHECK(cmd.count("--dampening") == 0 || kind.momentum_family,
           "--dampening applies to --optimizer momentum or nesterov (got --optimizer " << opt << ")");
  for (const char* flag : {"--beta1", "--beta2"}) {
    PK_CHECK(cmd.count(flag) == 0 || kind.adam_family,
             flag << " applies to --optimizer adam or adamw (got --optimizer " << opt << ")");
  }
  PK_CHECK(cmd.count("--eps") == 0 || kind.default_eps != 0,
           "--eps applies to --optimizer adam, adamw, rmsprop or adagrad (got --optimizer " << opt << ")");
  PK_CHECK(cmd.count("--eps") == 0 || a.run.train.optimizer.eps > 0,
           "--eps must be > 0 (got " << a.run.train.optimizer.eps << ")");
  for (const char* flag : {"--alpha", "--centered"}) {
    PK_CHECK(cmd.count(flag) == 0 || kind.kind == OptimizerKind::RMSprop,
             flag << " applies to --optimizer rmsprop (got --optimizer " << opt << ")");
  }
  for (const char* flag : {"--lr-decay", "--initial-accumulator-value"}) {
    PK_CHECK(cmd.count(flag) == 0 || kind.kind == OptimizerKind::Adagrad,
             flag << " applies to --optimizer adagrad (got --optimizer " << opt << ")");
  }
  PK_CHECK(!(cmd.count("--steps") && cmd.count("--epochs")), "give --steps or --epochs, not both");
  PK_CHECK(a.run.force || !std::filesystem::is_directory(a.run.out) || std::filesystem::is_empty(a.run.out),
           "run directory '" << a.run.out << "' already exists; use --force to overwrite it");
}

/// A resumed run keeps its thread count; --threads may only repeat it.
void check_resume_threads(const std::string& run_dir, int threads) {
  if (threads == 0 || !std::filesystem::exists(std::filesystem::path(run_dir) / "manifest.json")) return;
  const int trained = Manifest::load(run_dir).threads;
  PK_CHECK(threads == trained, "--threads " << threads << " conflicts with --resume: run '" << run_dir
                                            << "' was trained with " << trained
                                            << " threads, and a resumed run uses the same count (drop --threads)");
}
}  // namespace

void add_train_command(CLI::App& app, Globals& globals) {
  auto args = std::make_shared<TrainArgs>();
  RunOptions& r = args->run;
  CLI::App* cmd = app.add_subcommand("train", "Train a model and record its path in a run directory");
  cmd->add_option("--data", r.data.spec, "Dataset: " + join(dataset_names()) + " (required unless --resume)");
  cmd->add_option("--train-size", r.data.train_size, "Class-balanced training subset size (default: all)");
  cmd->add_option("--test-size", r.data.test_size, "Class-balanced test subset size (default: all)");
  cmd->add_option("--data-seed", r.data.seed, "Seed of synthetic data and subsets")->capture_default_str();
  cmd->add_option("--model", r.model, "Model spec: mlp:H1[,H2...][:relu|tanh|gelu], cnn:C1[,C2...], torchscript:PATH (a PyTorch module "
                  "saved as TorchScript) or layers:L1,L2,... (e.g. layers:conv(8,3,padding=1),relu,"
                  "res(conv(8,3,padding=1),relu),avgpool(2); docs/own-model.md lists the layers)")
      ->capture_default_str();
  cmd->add_option("--output", args->output,
                  "Output map, the function explained: logsoftmax (log-probabilities) or logits (the model's own "
                  "outputs; needed by --loss nll and mse)")
      ->check(CLI::IsMember({"logsoftmax", "logits"}))
      ->capture_default_str();
  cmd->add_option("--loss", args->loss,
                  "Loss: cross-entropy; nll (a TorchScript module whose output is already log-probabilities); "
                  "mse (float targets [n, K] from npy:DIR, or one-hot class labels)")
      ->check(CLI::IsMember({"cross-entropy", "cross_entropy", "nll", "mse"}))
      ->capture_default_str();
  cmd->add_option("--loss-weights", r.loss_weights_file,
                  "A .npy of per-training-point loss weights (float, one per training point as used, >= 0): the "
                  "batch loss is the mean of weight x loss; copied into the run (default: all 1)");
  cmd->add_flag("--zero-last-layer", r.zero_last_layer,
                "Start the last layer at zero, so the kernel machine's bias is constant");
  cmd->add_option("--dtype", args->dtype, "float64 or float32")
      ->check(CLI::IsMember({"float64", "float32"}))
      ->capture_default_str();
  cmd->add_option("--optimizer", r.train.optimizer.name, "Optimizer: " + join(optimizer_names()))
      ->capture_default_str();
  cmd->add_option("--lr", r.train.optimizer.lr,
                  "Learning rate (default: 0.1; 0.001 for adam and adamw; 0.01 for rmsprop and adagrad)");
  cmd->add_option("--schedule", r.train.schedule, "Learning-rate schedule: constant, step[:EVERY[:GAMMA]], cosine, linear, warmup[:STEPS]")
      ->capture_default_str();
  auto* steps = cmd->add_option("--steps", r.train.steps, "Number of optimisation steps")->check(CLI::PositiveNumber);
  cmd->add_option("--epochs", r.train.epochs, "Number of epochs (default: 1 when --steps is not given)")
      ->check(CLI::PositiveNumber)
      ->excludes(steps);
  cmd->add_option("--batch", r.train.batch, "Minibatch size; 0 = full batch (default: 100; full for gd)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--momentum", r.train.optimizer.momentum,
                  "Momentum of momentum and nesterov (default: 0.9) or rmsprop (default: none)");
  cmd->add_option("--dampening", r.train.optimizer.dampening, "Dampening (momentum)")->capture_default_str();
  cmd->add_option("--weight-decay", r.train.optimizer.weight_decay,
                  "L2 weight decay (decoupled for adamw)")
      ->capture_default_str();
  cmd->add_option("--beta1", r.train.optimizer.beta1, "Adam beta1")->capture_default_str();
  cmd->add_option("--beta2", r.train.optimizer.beta2, "Adam beta2")->capture_default_str();
  cmd->add_option("--eps", r.train.optimizer.eps,
                  "Epsilon of adam, adamw, rmsprop and adagrad (default: 1e-8; 1e-10 for adagrad, as in PyTorch)");
  cmd->add_option("--alpha", r.train.optimizer.alpha, "RMSprop's smoothing constant")->capture_default_str();
  cmd->add_flag("--centered", r.train.optimizer.centered, "Centered RMSprop (divides by the gradients' deviation)");
  cmd->add_option("--lr-decay", r.train.optimizer.lr_decay, "Adagrad's learning-rate decay")->capture_default_str();
  cmd->add_option("--initial-accumulator-value", r.train.optimizer.initial_accumulator_value,
                  "Adagrad's sum of squares before the first step")
      ->capture_default_str();
  cmd->add_option("--seed", r.seed, "Seed of initialisation and batch order")->capture_default_str();
  cmd->add_option("--checkpoint-every", r.checkpoint_every,
                  "Store a full checkpoint every k steps (default: about sqrt(steps))")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--out", r.out, "Run directory to create (required unless --resume)");
  cmd->add_option("--resume", args->resume,
                  "Continue the interrupted run RUN from its last complete checkpoint, with the options "
                  "its manifest records; the finished run equals an uninterrupted one byte for byte");
  cmd->add_flag("--force", r.force, "Overwrite an existing run directory");

  cmd->callback([cmd, args, &globals] {
    check_conflicts(*cmd, *args);
    RunOptions& r = args->run;
    RunResult res;
    if (!args->resume.empty()) {
      r.out = args->resume;
      check_resume_threads(args->resume, globals.threads);
      res = resume_run(args->resume, !globals.quiet, globals.threads);
    } else {
      globals.apply();
      r.data.dtype = parse_dtype(args->dtype);
      r.output = parse_output_map(args->output);
      r.loss = parse_loss_kind(args->loss);
      r.train.seed = r.seed;
      r.train.progress = !globals.quiet;
      res = train_run(r);
    }
    const std::string& opt = res.manifest.optimizer.name;
    const Manifest& m = res.manifest;
    for (const std::string& w : res.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
    const bool has_test = m.num_test > 0;
    nlohmann::ordered_json j{{"run", r.out},
                             {"steps", m.steps},
                             {"parameters", m.parameter_count},
                             {"final_batch_loss", res.summary.final_loss},
                             {"train_accuracy", res.summary.train_accuracy},
                             {"test_accuracy", has_test ? nlohmann::ordered_json(res.summary.test_accuracy)
                                                        : nlohmann::ordered_json(nullptr)},
                             {"seconds", res.summary.seconds}};
    if (res.resumed_from >= 0) j["resumed_from_step"] = res.resumed_from;
    std::string text;
    if (res.resumed_from >= 0) {
      text += format_text("resumed %s from its checkpoint at step %lld\n", r.out.c_str(), static_cast<long long>(res.resumed_from));
    }
    text += format_text("trained %s on %s (%lld train / %lld test points) with %s, %lld steps in %.1f s\n", m.model_spec.c_str(),
        m.data.spec.c_str(), static_cast<long long>(m.num_train), static_cast<long long>(m.num_test), opt.c_str(),
        static_cast<long long>(m.steps), res.summary.seconds);
    if (has_test) {
      text += format_text("  final batch loss %.4f, train accuracy %.4f, test accuracy %.4f\n", res.summary.final_loss,
          res.summary.train_accuracy, res.summary.test_accuracy);
    } else {
      text += format_text("  final batch loss %.4f, train accuracy %.4f; no test points (the data's test split is empty)\n",
          res.summary.final_loss, res.summary.train_accuracy);
    }
    text += format_text("  %lld parameters, %zu checkpoints, path data %.2f MB\n", static_cast<long long>(m.parameter_count),
        m.checkpoints.size(), m.path_bytes() / 1e6);
    text += format_text("  run directory: %s", r.out.c_str());
    globals.print(j, text);
  });
}

}  // namespace pathkernel::cli
