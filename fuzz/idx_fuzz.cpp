// libFuzzer harness: read_idx, the IDX (MNIST-family) reader, on plain and
// gzip-compressed bytes. A successful read must hold exactly the elements
// its header declares.
#include "fuzz_util.h"
#include "pathkernel/dataset.h"
#include "pathkernel/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = pathkernel::fuzz::scratch_path(".idx");
  pathkernel::fuzz::write_bytes(path, data, size);
  try {
    const torch::Tensor t = pathkernel::read_idx(path);
    if (t.scalar_type() != torch::kUInt8 || t.dim() < 1 || t.dim() > 4) {
      pathkernel::fuzz::fail("read_idx returned a tensor its format cannot hold");
    }
    const bool gzip = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
    if (!gzip && static_cast<size_t>(t.numel()) + 4 + 4 * t.dim() != size) {
      pathkernel::fuzz::fail("read_idx accepted a plain file whose size does not match its header");
    }
  } catch (const pathkernel::Error& e) {
    pathkernel::fuzz::refused(e);
  }
  return 0;
}
