// The experiment registry: names, descriptions and dispatch.
#include <functional>

#include "common.h"
#include "pathkernel/error.h"
#include "pathkernel/text.h"

namespace pathkernel {

namespace {
struct Entry {
  const char* name;
  const char* description;
  std::function<ExperimentResult(const ExperimentOptions&)> run;
};

const std::vector<Entry>& registry() {
  static const std::vector<Entry> entries{
      {"paper-4.1", "kernel machine (EPK) vs network, gaussians3, one-hidden-layer ReLU MLP, full-batch GD (paper Fig. 4)",
       experiments::paper_4_1},
      {"fig2", "angle between the DPK and EPK test gradients along training (paper Fig. 2)", experiments::fig2},
      {"fig5", "toy2d kernel-value map and GP standard-deviation map on a grid (paper Fig. 5)", experiments::fig5},
      {"fig6", "per-training-point kernel values for test points at the class means (paper Fig. 6)",
       experiments::fig6},
      {"fig7", "MNIST CNN: kernel machine vs network with T = 1 (DPK), 10, 200 Riemann nodes and gauss (paper Fig. 7)",
       experiments::fig7},
      {"fig8", "weight norm, training loss and accuracy along the straight line from w_0 to w_N (paper Fig. 8)",
       experiments::fig8},
  };
  return entries;
}

const Entry& find(const std::string& name) {
  for (const auto& e : registry()) {
    if (name == e.name) return e;
  }
  PK_THROW("unknown experiment '" << name << "': expected one of " << join(experiment_names()));
}
}  // namespace

std::vector<std::string> experiment_names() {
  std::vector<std::string> names;
  for (const auto& e : registry()) names.push_back(e.name);
  return names;
}

std::string experiment_description(const std::string& name) { return find(name).description; }

ExperimentResult run_experiment(const std::string& name, const ExperimentOptions& options) {
  return find(name).run(options);
}

}  // namespace pathkernel
