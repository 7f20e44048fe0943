// libFuzzer harness: parse_npy, the reader of checkpoints, optimizer state and
// batch logs. Anything but a clean pathkernel::Error or a faithful read is a
// finding: a successful read must give the input's data bytes and survive a
// write -> read round trip unchanged. The same bytes are then read as a coded
// array's uint8 codes (parse_npy_codes) and decoded against a table of 200
// values: refused (a code out of range, another dtype) or exactly
// table[codes].
#include <cstring>

#include "fuzz_util.h"
#include "pathkernel/error.h"
#include "pathkernel/npy.h"
#include "pathkernel/npy_array.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const torch::Tensor t = pathkernel::parse_npy(bytes, "fuzz.npy");
    const size_t n = static_cast<size_t>(t.numel()) * t.element_size();
    if (n > bytes.size()) pathkernel::fuzz::fail("tensor larger than the file");
    if (n > 0 && std::memcmp(t.data_ptr(), bytes.data() + bytes.size() - n, n) != 0) {
      pathkernel::fuzz::fail("data bytes differ from the file's");
    }
    const torch::Tensor u = pathkernel::parse_npy(pathkernel::npy_bytes(t), "round trip");
    if (u.scalar_type() != t.scalar_type() || u.sizes() != t.sizes() ||
        (n > 0 && std::memcmp(u.data_ptr(), t.data_ptr(), n) != 0)) {
      pathkernel::fuzz::fail("write -> read round trip changed the tensor");
    }
  } catch (const pathkernel::Error& e) {
    pathkernel::fuzz::refused(e);
  }
  try {
    static const torch::Tensor table = torch::arange(200, torch::kFloat64) * 0.5;
    const torch::Tensor codes = pathkernel::parse_npy_codes(bytes, "fuzz.codes.npy");
    if (codes.scalar_type() != torch::kUInt8) pathkernel::fuzz::fail("codes that are not uint8");
    const torch::Tensor x = pathkernel::decode_values(codes, table, "fuzz.codes.npy");
    if (x.sizes() != codes.sizes() || x.scalar_type() != torch::kFloat64) pathkernel::fuzz::fail("decoded shape");
    if (x.numel() > 0 && (codes.max().item<int64_t>() >= 200 || !torch::equal(x, codes.to(torch::kFloat64) * 0.5))) {
      pathkernel::fuzz::fail("decoded values are not table[codes]");
    }
  } catch (const pathkernel::Error& e) {
    pathkernel::fuzz::refused(e);
  }
  return 0;
}
