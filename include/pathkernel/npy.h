// NumPy .npy files: the interchange format of recorded paths.
//
// Checkpoints, optimizer state and batch logs are .npy version 1.0 files,
// little-endian, C order, so `numpy.load` reads them without pathkernel.
// Supported element types: float64 (<f8), float32 (<f4), int64 (<i8), int32 (<i4).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <torch/torch.h>

namespace pathkernel {

/// A tensor as a .npy file, in two parts: the header, and the data of the
/// array in place (made contiguous; not copied when it already is).
struct NpyFile {
  std::string header;
  torch::Tensor array;

  /// The header, then the array's bytes: valid while this NpyFile lives.
  std::vector<std::string_view> parts() const;
  size_t size() const;
  uint32_t crc32() const;  ///< of the file's bytes, as crc32_of (files.h)
};

/// Tensor (any shape, a supported dtype) as a .npy file.
NpyFile npy_file(const torch::Tensor& tensor);

/// Serialises a tensor (any shape, a supported dtype) as .npy bytes.
std::string npy_bytes(const torch::Tensor& tensor);

/// Writes `file` to `path` atomically, from the array's own memory.
void write_npy_file(const std::string& path, const NpyFile& file);

/// Parses .npy bytes. `what` names the source in error messages.
torch::Tensor parse_npy(const std::string& bytes, const std::string& what);

/// Writes `tensor` to `path` atomically as .npy.
void write_npy(const std::string& path, const torch::Tensor& tensor);

/// Reads a .npy file. Throws Error naming the file on any format problem.
torch::Tensor read_npy(const std::string& path);

}  // namespace pathkernel
