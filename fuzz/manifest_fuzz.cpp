// libFuzzer harness: a run directory's manifest.json. Each input becomes the
// manifest of a copy of the small run in fuzz/run/ (checkpoints, optimizer
// state, batch logs), which is then loaded and validated against its files,
// as `PathReader` does before replaying. Whatever the manifest says, the
// reader must refuse it with a clean error or accept a consistent run: it
// must not read outside the run directory, allocate what a field claims, or
// change on a save -> load round trip.
#include <filesystem>

#include "fuzz_util.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/manifest.h"

namespace fs = std::filesystem;

namespace {

const std::string& run_dir() {
  static const std::string dir = [] {
    const fs::path out = pathkernel::fuzz::scratch_path(".run");
    fs::remove_all(out);
    fs::copy(fs::path(PATHKERNEL_SOURCE_DIR) / "fuzz" / "run", out, fs::copy_options::recursive);
    fs::remove(out / "manifest.json");
    // A target outside the run directory for the symlink checks.
    pathkernel::write_file_atomic(out.string() + ".outside.npy", "not part of the run");
    fs::create_symlink(out.string() + ".outside.npy", out / "link_out.npy");
    return out.string();
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = run_dir();
  pathkernel::fuzz::write_bytes(dir + "/manifest.json", data, size);
  try {
    const pathkernel::Manifest m = pathkernel::Manifest::load(dir);
    const pathkernel::Manifest again = pathkernel::Manifest::from_json(m.to_json());
    if (again.dump() != m.dump()) pathkernel::fuzz::fail("manifest save -> load -> save changed it");
    pathkernel::validate_run(dir, m);
    m.network_options();
  } catch (const pathkernel::Error&) {
  }
  return 0;
}
