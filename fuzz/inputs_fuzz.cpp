// libFuzzer harness: inputs and labels given in a file (read_inputs,
// read_input_labels; verify and explain --inputs, --labels). The first byte
// chooses the run's data (bit 0: integer codes; bit 1: regression targets
// [n, 3]), then a little-endian uint32 length, X.npy of that length, and the
// rest as Y.npy. A successful read must give inputs [n >= 1, 2, 3] in the
// run's dtype, finite, and labels of n rows: classes in [0, 3) or finite
// targets [n, 3].
#include "fuzz_util.h"
#include "pathkernel/dataset.h"
#include "pathkernel/error.h"
#include "pathkernel/input_file.h"

namespace {

pathkernel::Dataset dataset(uint8_t kind) {
  pathkernel::Dataset d;
  d.input_shape = {2, 3};
  d.num_classes = 3;
  d.integer_inputs = kind & 1;
  d.x_test = torch::zeros({1, 2, 3}, torch::kFloat64);
  d.y_train = kind & 2 ? torch::zeros({1, 3}, torch::kFloat64) : torch::zeros({1}, torch::kLong);
  return d;
}

void check_inputs(const torch::Tensor& x) {
  using pathkernel::fuzz::fail;
  if (x.dim() != 3 || x.size(0) < 1 || x.size(1) != 2 || x.size(2) != 3) fail("inputs of the wrong shape");
  if (x.scalar_type() != torch::kFloat64) fail("inputs not in the run's dtype");
  if (!torch::isfinite(x).all().item<bool>()) fail("a non-finite input");
}

void check_labels(const torch::Tensor& y, int64_t n, bool regression) {
  using pathkernel::fuzz::fail;
  if (regression) {
    if (y.dim() != 2 || y.size(0) != n || y.size(1) != 3 || y.scalar_type() != torch::kFloat64) fail("bad targets");
    if (!torch::isfinite(y).all().item<bool>()) fail("a non-finite target");
    return;
  }
  if (y.dim() != 1 || y.size(0) != n || y.scalar_type() != torch::kLong) fail("labels of the wrong kind");
  if (y.min().item<int64_t>() < 0 || y.max().item<int64_t>() >= 3) fail("a label out of range");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string x_path = pathkernel::fuzz::scratch_path("_x.npy");
  static const std::string y_path = pathkernel::fuzz::scratch_path("_y.npy");
  if (size < 5) return 0;
  const pathkernel::Dataset d = dataset(data[0]);
  const size_t n = std::min<size_t>(data[1] | data[2] << 8 | data[3] << 16 | static_cast<size_t>(data[4]) << 24,
                                    size - 5);
  pathkernel::fuzz::write_bytes(x_path, data + 5, n);
  pathkernel::fuzz::write_bytes(y_path, data + 5 + n, size - 5 - n);
  try {
    const torch::Tensor x = pathkernel::read_inputs(x_path, d);
    check_inputs(x);
    check_labels(pathkernel::read_input_labels(y_path, d, x.size(0)), x.size(0), d.y_train.dim() == 2);
  } catch (const pathkernel::Error& e) {
    pathkernel::fuzz::refused(e);
  }
  return 0;
}
