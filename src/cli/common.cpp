// Options shared by the commands that decompose a run.
#include <algorithm>
#include <cstdio>

#include "commands.h"
#include "pathkernel/dataset.h"
#include "pathkernel/error.h"

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
  cmd->add_option("--tol", tol, "Certificate tolerance per step, relative to max(1,|f|)")->capture_default_str();
  cmd->add_option("--gauss-nodes", gauss_nodes, "Gauss-Legendre nodes per piece (gauss)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
}

DecompositionOptions QuadratureArgs::options() const {
  DecompositionOptions options;
  options.quadrature.spec = QuadratureSpec::parse(quadrature);
  PK_CHECK(tol > 0 && tol < 1, "--tol must be in (0, 1) (got " << tol << ")");
  options.quadrature.tol = tol;
  options.quadrature.gauss_nodes = gauss_nodes;
  options.progress = globals == nullptr || !globals->quiet;
  return options;
}

void TestPointArgs::add_to(CLI::App* cmd, const std::string& what) {
  auto* n = cmd->add_option("--test", selection.count, "The first N test points " + what)->check(CLI::PositiveNumber);
  auto* list = cmd->add_option("--test-index", selection.indices, "Comma-separated test indices " + what + ", e.g. 0,5,17");
  auto* file = cmd->add_option("--test-file", selection.file,
                               "A file of test indices " + what + " (separated by commas, spaces or newlines)");
  n->excludes(list)->excludes(file);
  list->excludes(file);
}

void KernelArgs::add_to(CLI::App* cmd, const Globals& g) {
  cmd->add_option("--kernel", kernel, "epk, dpk, ntk (at the end), ntk:STEP or ntk-inf")->capture_default_str();
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
  cmd->add_option("--test-count", test_count, "Test points to predict (class-balanced subset)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--subset-seed", seed, "Seed of the class-balanced subsets")->capture_default_str();
}

torch::Tensor KernelPointArgs::train_indices(const torch::Tensor& y_train) const {
  return balanced_subset(y_train, std::min(train_count, y_train.size(0)), seed);
}

torch::Tensor KernelPointArgs::test_indices(const torch::Tensor& y_test) const {
  return balanced_subset(y_test, std::min(test_count, y_test.size(0)), seed);
}

}  // namespace pathkernel::cli
