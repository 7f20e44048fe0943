// Options shared by the commands that decompose a run.
#include <algorithm>
#include <cstdarg>
#include <cstdio>

#include "commands.h"
#include "pathkernel/dataset.h"
#include "pathkernel/error.h"
#include "pathkernel/sequence.h"

namespace pathkernel::cli {

void Globals::print(const nlohmann::ordered_json& j, const std::string& text) const {
  if (json) {
    std::printf("%s\n", j.dump().c_str());
  } else if (!text.empty()) {
    std::printf("%s\n", text.c_str());
  }
}

void QuadratureArgs::add_to(CLI::App* cmd, const Globals& g) {
  globals = &g;
  cmd->add_option("--quadrature", quadrature, "gauss (certified), riemann:T, or dpk")->capture_default_str();
  cmd->add_option("--tol", tol,
                  "Certificate budget of the whole run, relative to max(1,|f|): it bounds the kernel machine's "
                  "error (each of the N steps gets tol/N)")
      ->capture_default_str();
  cmd->add_option("--gauss-nodes", gauss_nodes, "Gauss-Legendre nodes per piece (gauss)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--pieces", pieces,
                  "gauss: exact (a network of Linear/Conv2d layers with ReLU, max- or average pooling and residual "
                  "sums takes at most the nodes that integrate each piece between kinks exactly, L weight layers: "
                  "ceil(L/2) for logits; for log-softmax, those and floor(L/2) more (L+1 in all for even L) "
                  "that walk back the softmax factor's one cotangent) or adaptive (ceil(n*sqrt(h)) nodes on a piece of "
                  "length h, for every network)")
      ->check(CLI::IsMember({"exact", "adaptive"}))
      ->capture_default_str();
  cmd->add_option("--kinks", kinks,
                  "gauss: how a kink is located once detected: bracket (false position to a 4-ulp bracket) or fit "
                  "(the root of the unit's pre-activation polynomial on its piece, then one bracket as wide as the "
                  "unit's rounding noise: fewer forward passes)")
      ->check(CLI::IsMember({"bracket", "fit"}))
      ->capture_default_str();
  cmd->add_option("--last-site", last_site,
                  "gauss, exact pieces: local (where the logits are a Linear layer fed by the site of the layer "
                  "before through its ReLU, max-pool and flatten alone, that site's switches inside a piece enter "
                  "through scalar integrals: pieces end at the earlier sites' kinks only, L-1 nodes a piece), "
                  "hidden (where the logits' Linear layer is fed by a hidden Linear layer through its ReLU alone, "
                  "and that layer by the site below as above, that site held through the hidden layer: pieces end at "
                  "the earlier sites' kinks and the hidden layer's, found on the pieces' interpolants, L-2 nodes a "
                  "piece), pieces (every kink ends a piece) or auto (local where it takes no more nodes a piece: "
                  "L = 3; else hidden where it does: L = 4, 5)")
      ->check(CLI::IsMember({"auto", "local", "hidden", "pieces"}))
      ->capture_default_str();
  cmd->add_option("--point-block", point_block,
                  "Test points computed together (0: automatic, 32 for a network of Linear layers on flat inputs, "
                  "4 for others); under mpirun the ranks split them in whole blocks, and the outputs are those of "
                  "one process with the same value")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--memory", memory,
                  "Memory for the test points' features and accumulators, per process (per rank under mpirun), "
                  "e.g. 512MiB or 4GiB: fewer test points are computed together when --point-block of them would "
                  "not fit, at least one; optimizers with a buffer (adam, momentum) replay the path once per set of "
                  "test points whose accumulators fit")
      ->transform(CLI::AsSizeValue(true))
      ->default_str("2GiB");
  cmd->add_option("--route", route,
                  "TorchScript models: auto (the structured route where every parameter's operation has a rule, "
                  "else autograd) or generic (autograd alone)")
      ->check(CLI::IsMember({"auto", "generic"}))
      ->capture_default_str();
  cmd->add_option("--replay", replay,
                  "ahead (the path replayed on one thread of its own while the steps before are decomposed, where "
                  "that changes no bit: a run trained on one thread, one that stores every step, or one that one "
                  "thread reproduces, checkpoint by checkpoint) or in-turn")
      ->check(CLI::IsMember({"ahead", "in-turn"}))
      ->capture_default_str();
  cmd->add_option("--training-side", training_side,
                  "Optimizers with a buffer (adam, momentum): ahead (each step's training side, the batch's "
                  "signals and gradient, formed on a thread of its own while the step after it is decomposed; "
                  "with two threads or more) or in-turn; the same values either way")
      ->check(CLI::IsMember({"ahead", "in-turn"}))
      ->capture_default_str();
}

DecompositionOptions QuadratureArgs::options() const {
  DecompositionOptions options;
  options.quadrature.spec = QuadratureSpec::parse(quadrature);
  PK_CHECK(tol > 0 && tol < 1, "--tol must be in (0, 1) (got " << tol << ")");
  options.quadrature.run_tol = tol;
  options.quadrature.gauss_nodes = gauss_nodes;
  options.quadrature.exact_pieces = pieces == "exact";
  options.quadrature.fit_kinks = kinks == "fit";
  options.quadrature.last_site = last_site == "local"    ? QuadratureOptions::LastSite::Local
                                 : last_site == "hidden" ? QuadratureOptions::LastSite::Hidden
                                 : last_site == "pieces" ? QuadratureOptions::LastSite::Pieces
                                                         : QuadratureOptions::LastSite::Auto;
  options.quadrature.route = route == "generic" ? ModuleRoute::Generic : ModuleRoute::Auto;
  options.point_block = point_block;
  options.replay_ahead = replay == "ahead";
  options.training_ahead = training_side == "ahead";
  PK_CHECK(memory >= 64 * 1024 && memory <= (uint64_t{1} << 50),
           "--memory must be between 64KiB and 1PiB (got " << memory << " bytes)");
  options.memory_doubles = static_cast<int64_t>(memory / sizeof(double));
  options.progress = globals == nullptr || !globals->quiet;
  return options;
}

void PositionArgs::add_to(CLI::App* cmd) {
  cmd->add_option("--position", position,
                  "Sequence data: the position whose outputs (the V logits or log-probabilities of the next "
                  "token) are decomposed, 0 .. T-1 (-1: the last)")
      ->capture_default_str();
}

int64_t PositionArgs::checked(const Manifest& m) const {
  if (position == -1 && m.sequence_length == 0) return -1;
  resolve_position(position, m.sequence_length, "--position");
  return position;
}

std::string format_text(const char* format, ...) {
  va_list args, copy;
  va_start(args, format);
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  std::string text(static_cast<size_t>(std::max(n, 0)) + 1, '\0');
  std::vsnprintf(text.data(), text.size(), format, args);
  va_end(args);
  text.pop_back();
  return text;
}

CLI::Option* add_deprecated_option(CLI::App* cmd, const std::string& old_name, int64_t& target,
                                   const std::string& replacement) {
  return cmd->add_option(old_name, target, "Deprecated: use " + replacement)
      ->group("Deprecated")
      ->each([old_name, replacement](const std::string&) {
        std::fprintf(stderr, "pathkernel: %s is deprecated; use %s\n", old_name.c_str(), replacement.c_str());
      });
}

void TestPointArgs::add_to(CLI::App* cmd, const std::string& what) {
  options_ = {
      cmd->add_option("--test", selection.count, "The first N test points " + what)->check(CLI::PositiveNumber),
      cmd->add_option("--test-balanced", selection.balanced, "A class-balanced subset of N test points " + what)
          ->check(CLI::PositiveNumber),
      cmd->add_option("--test-index", selection.indices,
                      "Comma-separated test indices and inclusive ranges " + what + ", e.g. 0-7,12,20-23"),
      cmd->add_option("--test-file", selection.file,
                      "A file of test indices and ranges " + what + " (separated by commas, spaces or newlines)")};
  for (size_t i = 0; i < options_.size(); ++i) {
    for (size_t j = i + 1; j < options_.size(); ++j) options_[i]->excludes(options_[j]);
  }
  cmd->add_option("--subset-seed", selection.seed, "Seed of the class-balanced subsets")->capture_default_str();
}

void InputArgs::add_to(CLI::App* cmd, const std::string& what) {
  CLI::Option* in = cmd->add_option("--inputs", inputs,
                                    "A .npy file of inputs " + what + " instead of test points: [n, *input_shape], "
                                    "float (integer token ids for a model on integer codes)");
  for (const char* name : {"--test", "--test-balanced", "--test-index", "--test-file"}) in->excludes(name);
  cmd->add_option("--labels", labels, "A .npy file of the inputs' labels: int class labels [n] (mse: targets [n, K])")
      ->needs(in);
}

void TestPointArgs::add_deprecated_balanced(CLI::App* cmd, const std::string& old_name) {
  CLI::Option* old = add_deprecated_option(cmd, old_name, selection.balanced, "--test-balanced N");
  old->check(CLI::PositiveNumber);
  for (CLI::Option* o : options_) old->excludes(o);
}

void KernelArgs::add_to(CLI::App* cmd, const Globals& g) {
  std::string kernels = "The kernel:";
  for (const KernelEntry& e : kernel_registry()) kernels += " " + e.syntax + " (" + e.meaning + ");";
  kernels.pop_back();
  cmd->add_option("--kernel", kernel, kernels)->capture_default_str();
  cmd->add_option("--bias-scale", bias_scale, "ntk-inf: the bias scale beta")->capture_default_str();
  q.add_to(cmd, g);
}

GramOptions KernelArgs::options() const {
  GramOptions options;
  options.kernel = GramSpec::parse(kernel);
  const DecompositionOptions d = q.options();
  options.quadrature = d.quadrature;
  options.progress = d.progress;
  options.bias_scale = bias_scale;
  return options;
}

std::string KernelArgs::file_stem(const GramSpec& spec) {
  std::string name = spec.str();
  for (char& c : name) c = c == ':' ? '_' : c;
  return name;
}

void KernelPointArgs::add_to(CLI::App* cmd) {
  cmd->add_option("--train-count", train_count, "Training points the kernel methods use (class-balanced subset)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  test.add_to(cmd, "to predict (default: a class-balanced subset of 100)");
  test.add_deprecated_balanced(cmd, "--test-count");
}

torch::Tensor KernelPointArgs::train_indices(const torch::Tensor& y_train) const {
  return balanced_subset(y_train, std::min(train_count, y_train.size(0)), test.selection.seed);
}

}  // namespace pathkernel::cli
