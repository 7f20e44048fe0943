// Output maps and loss kinds by name (objective.h).
#include "pathkernel/objective.h"

#include "pathkernel/error.h"

namespace pathkernel {

OutputMap parse_output_map(const std::string& name) {
  if (name == "logsoftmax") return OutputMap::LogSoftmax;
  if (name == "logits") return OutputMap::Logits;
  PK_THROW("unknown output map '" << name << "': expected one of logsoftmax, logits");
}

std::string output_map_name(OutputMap map) { return map == OutputMap::LogSoftmax ? "logsoftmax" : "logits"; }

LossKind parse_loss_kind(const std::string& name) {
  if (name == "cross_entropy" || name == "cross-entropy") return LossKind::CrossEntropy;
  if (name == "nll") return LossKind::Nll;
  if (name == "mse") return LossKind::Mse;
  PK_THROW("unknown loss '" << name << "': expected one of cross_entropy (or cross-entropy), nll, mse");
}

std::string loss_name(LossKind loss) {
  switch (loss) {
    case LossKind::CrossEntropy: return "cross_entropy";
    case LossKind::Nll: return "nll";
    case LossKind::Mse: return "mse";
  }
  return "?";
}

std::vector<std::string> loss_names() { return {"cross_entropy", "nll", "mse"}; }

void check_loss_output(LossKind loss, OutputMap map) {
  PK_CHECK(loss == LossKind::CrossEntropy || map == OutputMap::Logits,
           "the loss '" << loss_name(loss) << "' needs the output map 'logits', got '" << output_map_name(map)
                        << "': " << (loss == LossKind::Nll ? "nll is for a model whose own output is already "
                                                             "log-probabilities (a module ending in log_softmax)"
                                                           : "mse compares the model's own outputs with the targets")
                        << ", so pathkernel must not apply log_softmax on top");
}

}  // namespace pathkernel
