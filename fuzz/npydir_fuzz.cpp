// libFuzzer harness: the npy:DIR dataset (load_npy_dir). The input is cut
// into the directory's four arrays: three little-endian uint32 lengths, then
// train_x.npy, train_y.npy and test_x.npy of those lengths, and the rest as
// test_y.npy. A successful read must give rows that agree between inputs and
// labels, inputs of one shape in both splits, finite values, and labels that
// are classes in [0, num_classes) or finite targets [n, num_classes].
// The same pieces are then read as a directory whose inputs are coded pairs:
// the first piece as train_x.codes.npy and test_x.codes.npy, the third as
// train_x.values.npy and test_x.values.npy, under the same checks: a coded
// train_x or test_x of floating values is held as its codes (x_train_coded,
// x_test_coded), and checked decoded.
#include <filesystem>

#include "fuzz_util.h"
#include "loaders.h"
#include "pathkernel/dataset.h"
#include "pathkernel/error.h"

namespace {

uint32_t take_length(const uint8_t*& data, size_t& size) {
  if (size < 4) return 0;
  const uint32_t n = data[0] | data[1] << 8 | data[2] << 16 | static_cast<uint32_t>(data[3]) << 24;
  data += 4;
  size -= 4;
  return n;
}

/// A split's inputs, whole or as codes (never both, never neither), decoded.
torch::Tensor decoded(const torch::Tensor& x, const pathkernel::CodedInputs& coded, const char* split) {
  using pathkernel::fuzz::fail;
  if (x.defined() == coded.defined()) fail((std::string(split) + " inputs neither or both whole and coded").c_str());
  if (coded.defined() && coded.values.size(0) != 256) fail("a table not of a value per code");
  return coded.defined() ? coded.all() : x;
}

void check(const pathkernel::Dataset& d) {
  using pathkernel::fuzz::fail;
  // Coded inputs (a coded pair of floating values) checked decoded.
  const torch::Tensor x_train = decoded(d.x_train, d.x_train_coded, "training");
  const torch::Tensor x_test = decoded(d.x_test, d.x_test_coded, "test");
  if (x_train.size(0) != d.y_train.size(0) || x_test.size(0) != d.y_test.size(0)) fail("rows disagree");
  if (x_train.size(0) == 0) fail("an empty training split was accepted");
  if (x_train.sizes().slice(1) != x_test.sizes().slice(1)) fail("the splits' input shapes differ");
  if (d.num_classes < 1) fail("no outputs");
  for (const torch::Tensor& x : {x_train, x_test}) {
    if (x.numel() > 0 && !torch::isfinite(x.to(torch::kFloat64)).all().item<bool>()) fail("a non-finite input");
  }
  for (const torch::Tensor& y : {d.y_train, d.y_test}) {
    if (y.dim() == 2) {  // regression targets
      if (y.scalar_type() != torch::kFloat64 || y.size(1) != d.num_classes) fail("targets of the wrong kind");
      if (y.numel() > 0 && !torch::isfinite(y).all().item<bool>()) fail("a non-finite target");
    } else {
      if (y.dim() != 1 || y.scalar_type() != torch::kLong) fail("labels of the wrong kind");
      if (y.numel() > 0 && (y.min().item<int64_t>() < 0 || y.max().item<int64_t>() >= d.num_classes)) {
        fail("a label out of range");
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = pathkernel::fuzz::scratch_path("_npydir");
  static const bool made = std::filesystem::create_directories(dir) || true;
  (void)made;
  static const std::string coded = pathkernel::fuzz::scratch_path("_npydir_coded");
  static const bool made_coded = std::filesystem::create_directories(coded) || true;
  (void)made_coded;
  const char* names[] = {"train_x.npy", "train_y.npy", "test_x.npy", "test_y.npy"};
  const char* coded_names[] = {"train_x.codes.npy", "train_y.npy", "train_x.values.npy", "test_y.npy"};
  uint32_t lengths[3];
  for (uint32_t& n : lengths) n = take_length(data, size);
  for (int i = 0; i < 4; ++i) {
    const size_t n = i < 3 ? std::min<size_t>(lengths[i], size) : size;
    pathkernel::fuzz::write_bytes(dir + "/" + names[i], data, n);
    pathkernel::fuzz::write_bytes(coded + "/" + coded_names[i], data, n);
    if (i == 0) pathkernel::fuzz::write_bytes(coded + "/test_x.codes.npy", data, n);
    if (i == 2) pathkernel::fuzz::write_bytes(coded + "/test_x.values.npy", data, n);
    data += n;
    size -= n;
  }
  for (const std::string& d : {dir, coded}) {
    try {
      check(pathkernel::detail::load_npy_dir(d, 0));
    } catch (const pathkernel::Error& e) {
      pathkernel::fuzz::refused(e);
    }
  }
  return 0;
}
