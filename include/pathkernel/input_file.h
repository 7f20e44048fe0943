// Inputs from a file (verify and explain --inputs): any inputs of a run's
// input shape, decomposed like its test points, with optional labels.
//
//   X.npy   [n, *input_shape]: float64 or float32 for a model on real-valued
//           inputs; int64 or int32 codes (e.g. token ids) for a model whose
//           data are integer codes (an embedding first), |x| < 2^53
//   Y.npy   int64 or int32 class labels [n] in [0, K), or for a regression
//           run (loss mse) float targets [n, K]
//
// Every check names the file, the value found and what was expected. Sizes
// are checked against the file's length before anything is allocated
// (npy.h).
#pragma once

#include <cstdint>
#include <string>

#include <torch/torch.h>

#include "pathkernel/dataset.h"

namespace pathkernel {

/// Reads inputs for a model trained on `data`: X.npy of shape
/// [n, *data.input_shape] with n >= 1, floating or integer as data's inputs
/// are, every value finite, returned in the dtype of data.x_test (a value it
/// does not hold exactly is an error). Throws Error otherwise.
torch::Tensor read_inputs(const std::string& path, const Dataset& data);

/// Reads labels of n inputs for `data`: class labels int64 [n] in
/// [0, data.num_classes), or for regression data (float y_train [M, K])
/// float64 targets [n, K], finite. Throws Error otherwise.
torch::Tensor read_input_labels(const std::string& path, const Dataset& data, int64_t n);

}  // namespace pathkernel
