// What a run's network is read as and what its training descends, by name:
// the output map (the function f the decomposition is exact for) and the
// loss kind. The model (model.h) needs the output map, the trainer and the
// engine both; the losses themselves are computed in loss.h.
//
// Output maps:
//   logsoftmax  f = log_softmax(z) of the model's raw output z (default)
//   logits      f = z
// Losses (loss.h): cross_entropy, nll (needs logits), mse (needs logits).
#pragma once

#include <string>
#include <vector>

namespace pathkernel {

enum class OutputMap { LogSoftmax, Logits };
/// Parses "logsoftmax" or "logits"; throws Error listing them otherwise.
OutputMap parse_output_map(const std::string& name);
std::string output_map_name(OutputMap map);

enum class LossKind { CrossEntropy, Nll, Mse };

/// Parses "cross_entropy" (or "cross-entropy"), "nll" or "mse"; throws Error
/// listing the valid names.
LossKind parse_loss_kind(const std::string& name);
/// The name manifests record: "cross_entropy", "nll" or "mse".
std::string loss_name(LossKind loss);
/// The names parse_loss_kind accepts, as manifests write them.
std::vector<std::string> loss_names();

/// Throws Error when `loss` cannot be trained on the output map `map` (nll
/// and mse need the logits map: on log_softmax(z) they would not be the loss
/// the user asked for).
void check_loss_output(LossKind loss, OutputMap map);

}  // namespace pathkernel
