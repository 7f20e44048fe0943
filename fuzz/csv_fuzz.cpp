// libFuzzer harness: the csv:PATH dataset (read_csv, then the per-class
// train/test split). A successful read must give finite features, labels
// >= 0 and as many rows as labels.
#include "fuzz_util.h"
#include "loaders.h"
#include "pathkernel/dataset.h"
#include "pathkernel/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = pathkernel::fuzz::scratch_path(".csv");
  pathkernel::fuzz::write_bytes(path, data, size);
  try {
    const auto [x, y] = pathkernel::read_csv(path);
    if (x.dim() != 2 || y.dim() != 1 || x.size(0) != y.size(0) || x.size(0) == 0 || x.size(1) == 0) {
      pathkernel::fuzz::fail("read_csv returned inconsistent shapes");
    }
    if (!torch::isfinite(x).all().item<bool>()) pathkernel::fuzz::fail("read_csv kept a non-finite feature");
    if (y.min().item<int64_t>() < 0) pathkernel::fuzz::fail("read_csv kept a negative label");
    const pathkernel::Dataset d = pathkernel::detail::load_csv(path, 0);
    if (d.x_train.size(0) + d.x_test.size(0) != x.size(0)) pathkernel::fuzz::fail("the split lost rows");
  } catch (const pathkernel::Error& e) {
    pathkernel::fuzz::refused(e);
  }
  return 0;
}
