// libFuzzer harness: the test-point selection of verify and explain
// (TestPointSelection). Input: byte 0 gives n_test (the size of the test
// set), byte 1 the count, byte 2 whether the rest is an index list (even) or
// the text of an index file (odd). Every index returned must lie in
// [0, n_test).
#include "fuzz_util.h"
#include "pathkernel/error.h"
#include "pathkernel/test_points.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const int64_t n_test = data[0];
  const int64_t count = static_cast<int8_t>(data[1]);
  const bool file = data[2] % 2 == 1;
  const std::string list(reinterpret_cast<const char*>(data) + 3, size - 3);
  try {
    pathkernel::TestPointSelection selection;
    if (list.empty()) selection.count = count;
    const torch::Tensor idx = file ? pathkernel::parse_test_index_list(list, n_test, "file", true)
                                   : (selection.indices = list, selection.resolve(n_test, 1));
    if (idx.scalar_type() != torch::kLong || idx.dim() != 1 || idx.numel() == 0) {
      pathkernel::fuzz::fail("test-point selection returned a malformed index tensor");
    }
    if (idx.min().item<int64_t>() < 0 || idx.max().item<int64_t>() >= n_test) {
      pathkernel::fuzz::fail("test-point selection returned an index out of range");
    }
  } catch (const pathkernel::Error& e) {
    pathkernel::fuzz::refused(e);
  }
  return 0;
}
