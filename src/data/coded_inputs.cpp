// Inputs held as codes (coded_inputs.h).
#include "pathkernel/coded_inputs.h"

#include "pathkernel/error.h"

namespace pathkernel {

namespace {

/// out[i] = values[codes[i]] over every element of contiguous `codes`.
torch::Tensor decode(const torch::Tensor& codes, const torch::Tensor& values) {
  const torch::Tensor c = codes.contiguous();
  torch::Tensor out = torch::empty(c.sizes(), values.options());
  AT_DISPATCH_FLOATING_TYPES(values.scalar_type(), "decode", [&] {
    const scalar_t* table = values.data_ptr<scalar_t>();
    const uint8_t* in = c.data_ptr<uint8_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    for (int64_t i = 0, n = c.numel(); i < n; ++i) o[i] = table[in[i]];
  });
  return out;
}

}  // namespace

CodedInputs coded_inputs(torch::Tensor codes, torch::Tensor values) {
  PK_CHECK(codes.scalar_type() == torch::kUInt8 && codes.dim() >= 1,
           "coded inputs: codes of dtype " << codes.scalar_type() << " and shape " << codes.sizes()
                                           << ", expected uint8 of shape [n, *input_shape]");
  PK_CHECK(values.is_floating_point() && values.dim() == 1 && values.size(0) == 256,
           "coded inputs: a table of dtype " << values.scalar_type() << " and shape " << values.sizes()
                                             << ", expected 256 floating values, one per code");
  return CodedInputs{codes.contiguous(), values.contiguous()};
}

torch::Tensor CodedInputs::rows(const torch::Tensor& index) const {
  return decode(codes.index_select(0, index), values);
}

torch::Tensor CodedInputs::range(int64_t first, int64_t n) const { return decode(codes.narrow(0, first, n), values); }

torch::Tensor CodedInputs::all() const { return decode(codes, values); }

}  // namespace pathkernel
