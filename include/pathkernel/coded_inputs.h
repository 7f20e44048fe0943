// Inputs held as codes into a table of at most 256 values, decoded on
// selection.
//
// A source whose inputs are bytes (Fashion-MNIST's IDX images) maps each byte
// to one input value: its normalisation is elementwise. Holding the bytes and
// the 256 values they stand for takes an eighth of float64's memory (47 MB
// against 376 MB for Fashion-MNIST's training split), and a row decoded from
// them has the bits of the row normalised whole, since the value of a code is
// computed by the same elementwise operations as the whole split's.
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace pathkernel {

struct CodedInputs {
  torch::Tensor codes;   ///< [n, *input_shape] uint8
  torch::Tensor values;  ///< [256] in the inputs' floating dtype: the input a code stands for

  bool defined() const { return codes.defined(); }
  int64_t size() const { return codes.size(0); }

  /// Rows `index` ([k] int64, each in [0, size())) decoded: [k, *input_shape]
  /// in values' dtype.
  torch::Tensor rows(const torch::Tensor& index) const;

  /// Rows first .. first + n - 1 decoded: [n, *input_shape].
  torch::Tensor range(int64_t first, int64_t n) const;

  /// Every row decoded: [n, *input_shape].
  torch::Tensor all() const;
};

/// `codes` (uint8) with the table `values` ([256]) that decodes them.
CodedInputs coded_inputs(torch::Tensor codes, torch::Tensor values);

}  // namespace pathkernel
