// NumPy .npy files: the interchange format of recorded paths.
//
// Checkpoints, optimizer state and batch logs are .npy version 1.0 files,
// little-endian, C order, so `numpy.load` reads them without pathkernel.
// Supported element types: float64 (<f8), float32 (<f4), int64 (<i8), int32 (<i4).
#pragma once

#include <string>

#include <torch/torch.h>

namespace pathkernel {

/// Serialises a tensor (any shape, a supported dtype) as .npy bytes.
std::string npy_bytes(const torch::Tensor& tensor);

/// Parses .npy bytes. `what` names the source in error messages.
torch::Tensor parse_npy(const std::string& bytes, const std::string& what);

/// Writes `tensor` to `path` atomically as .npy.
void write_npy(const std::string& path, const torch::Tensor& tensor);

/// Reads a .npy file. Throws Error naming the file on any format problem.
torch::Tensor read_npy(const std::string& path);

}  // namespace pathkernel
