// A Gram matrix on disk, as `pathkernel gram` writes it: NAME.npy (float64,
// [R, C, K, K], or [R, C] for the trace) and beside it the JSON sidecar
// NAME.json that says what the matrix is:
//
//   {file, run, kernel, rows: {set, indices}, cols: {set, indices}, outputs,
//    shape, axes, dtype, steps, quadrature, seconds}
//
// `set` is "train" or "test", `indices` the list of indices into that set,
// `outputs` "full" or "trace", `axes` the names of the npy's axes (row, col,
// row_output, col_output) and `quadrature` the EPK's test-side rule ("none"
// for the other kernels). This header owns the format: writer and reader.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pathkernel/gram.h"

namespace pathkernel {

/// What a Gram matrix file holds, as its sidecar records it.
struct GramRecord {
  std::string run;                   ///< the run directory
  GramSpec kernel;
  std::string row_set = "test";      ///< "train" or "test"
  std::string col_set = "train";     ///< "train" or "test"
  std::vector<int64_t> row_indices;  ///< [R] into the row set
  std::vector<int64_t> col_indices;  ///< [C] into the column set
  bool trace = false;                ///< [R, C] traces instead of [R, C, K, K] blocks
  std::vector<int64_t> shape;        ///< the matrix's shape
  int64_t steps = 0;                 ///< N, the steps of the run the kernel sums over
  std::string quadrature = "none";   ///< epk's test-side rule, e.g. "gauss"; "none" for the others
  double seconds = 0;                ///< time taken to compute it

  /// The sidecar's JSON; `file` is the .npy's name beside it.
  nlohmann::ordered_json to_json(const std::string& file) const;
  /// Parses a sidecar; `where` names it in errors. Throws Error naming the
  /// missing or malformed field.
  static GramRecord from_json(const nlohmann::json& j, const std::string& where);
};

/// Writes `matrix` (float64, shape record.shape) as npy_path and its sidecar
/// beside it (the same name ending in .json), atomically; returns the
/// sidecar's JSON. Throws Error when the matrix's shape is not the record's.
nlohmann::ordered_json write_gram_file(const std::string& npy_path, const torch::Tensor& matrix,
                                       const GramRecord& record);

struct GramFile {
  GramRecord record;
  torch::Tensor matrix;  ///< float64, shape record.shape
};

/// The Gram matrix of `options` between points row_indices (int64 [R]) of
/// the row set and col_indices (int64 [C]) of the column set ("train" or
/// "test") of the run, with its record. Throws Error on a bad set name or an
/// index out of range.
GramFile gram_between(PathReader& reader, const std::string& row_set, const torch::Tensor& row_indices,
                      const std::string& col_set, const torch::Tensor& col_indices, const GramOptions& options);

/// Reads a sidecar and the .npy it names (relative to the sidecar's
/// directory). Throws Error naming the file when either is missing or
/// malformed, or when the matrix's shape is not the recorded one.
GramFile read_gram_file(const std::string& sidecar_path);

}  // namespace pathkernel
