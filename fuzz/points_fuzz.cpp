// libFuzzer harness: the --test-index LIST parser that selects the test
// points of verify and explain. Input: byte 0 gives n_test (the size of the
// test set), byte 1 the --test count, the rest is LIST. Every index returned
// must lie in [0, n_test).
#include "commands.h"
#include "fuzz_util.h"
#include "pathkernel/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int64_t n_test = data[0];
  const int64_t count = static_cast<int8_t>(data[1]);
  const std::string list(reinterpret_cast<const char*>(data) + 2, size - 2);
  try {
    const torch::Tensor idx = pathkernel::cli::parse_test_indices(count, list, n_test);
    if (idx.scalar_type() != torch::kLong || idx.dim() != 1 || idx.numel() == 0) {
      pathkernel::fuzz::fail("parse_test_indices returned a malformed index tensor");
    }
    if (idx.min().item<int64_t>() < 0 || idx.max().item<int64_t>() >= n_test) {
      pathkernel::fuzz::fail("parse_test_indices returned an index out of range");
    }
  } catch (const pathkernel::Error& e) {
    pathkernel::fuzz::refused(e);
  }
  return 0;
}
