// Arrays of a data directory stored as .npy, plain or coded.
//
// A coded array (at most 256 distinct values, such as inputs derived from
// 8-bit images) is the pair NAME.codes.npy, uint8 ('|u1') of the array's
// shape, and NAME.values.npy, the 1-D table of its values in the array's
// dtype (float64, float32, int64 or int32); the array is values[codes], bit
// for bit. pathkernel.record stores a recorded run's inputs so; npy:DIR
// datasets may hold either form. uint8 is read only as codes: the other
// readers of .npy (pathkernel/npy.h) refuse it; npy_bytes writes it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace pathkernel {

/// The most values a coded array's table holds (one per uint8 code).
constexpr int64_t kMaxCodedValues = 256;

/// Parses .npy bytes holding uint8 codes ('|u1'); refuses any other dtype.
torch::Tensor parse_npy_codes(const std::string& bytes, const std::string& what);

/// values[codes]: `codes` uint8 of any shape (at least one dimension),
/// `values` a 1-D table of at most kMaxCodedValues entries; every code must
/// be below the table's size (checked before the result is allocated).
torch::Tensor decode_values(const torch::Tensor& codes, const torch::Tensor& values, const std::string& what);

/// The files array `name` of directory `dir` is stored in: {name.npy}, or the
/// pair {name.codes.npy, name.values.npy}. Throws when neither is there, when
/// one of the pair is missing, or when both forms are.
std::vector<std::string> npy_array_files(const std::string& dir, const std::string& name);

/// Reads array `name` of directory `dir` from either form (npy_array_files).
torch::Tensor read_npy_array(const std::string& dir, const std::string& name);

/// A coded array as stored: its codes and its table, not decoded.
struct CodedArray {
  torch::Tensor codes;   ///< uint8, the array's shape; each below values.size(0)
  torch::Tensor values;  ///< 1-D, at most kMaxCodedValues
};

/// Array `name` of directory `dir`, stored as the coded pair, read without
/// decoding it: its codes are checked against its table (as read_npy_array
/// checks them). Throws where `name` is not stored as the pair.
CodedArray read_npy_coded(const std::string& dir, const std::string& name);

}  // namespace pathkernel
