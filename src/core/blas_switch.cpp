// Switching OpenBLAS's kernels inside one process (blas_switch.h).
#include "pathkernel/blas_switch.h"

#include <dlfcn.h>
#include <strings.h>

#include <condition_variable>
#include <cstdlib>
#include <mutex>

#include "pathkernel/blas_kernels.h"

namespace pathkernel {

namespace {

using VoidFn = void (*)();
using NameFn = char* (*)();

/// OpenBLAS's DYNAMIC_ARCH entry points: choose kernels from
/// OPENBLAS_CORETYPE (it returns at once while some are chosen), forget the
/// choice, and the name of the kernels chosen. All null unless all exist.
struct DynamicArch {
  VoidFn init = nullptr, quit = nullptr;
  NameFn corename = nullptr;

  static const DynamicArch& get() {
    static const DynamicArch d = [] {
      DynamicArch a;
      a.init = reinterpret_cast<VoidFn>(::dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
      a.quit = reinterpret_cast<VoidFn>(::dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
      a.corename = reinterpret_cast<NameFn>(::dlsym(RTLD_DEFAULT, "gotoblas_corename"));
      if (a.init == nullptr || a.quit == nullptr || a.corename == nullptr) a = DynamicArch();
      return a;
    }();
    return d;
  }
  bool available() const { return init != nullptr; }
};

/// OPENBLAS_CORETYPE set to `value` for a scope ("" unset), as it was after.
class CoretypeVariable {
 public:
  explicit CoretypeVariable(const std::string& value) {
    const char* old = std::getenv(kName);
    had_ = old != nullptr;
    if (had_) old_ = old;
    set(value);
  }
  ~CoretypeVariable() { set(had_ ? old_ : std::string()); }
  CoretypeVariable(const CoretypeVariable&) = delete;
  CoretypeVariable& operator=(const CoretypeVariable&) = delete;

 private:
  static void set(const std::string& value) {
    if (value.empty()) ::unsetenv(kName);
    else ::setenv(kName, value.c_str(), 1);
  }
  static constexpr const char* kName = "OPENBLAS_CORETYPE";
  bool had_ = false;
  std::string old_;
};

/// The BlasKernelsHeld alive, whether a BlasAlone scope is open, and what
/// a switch, a BlasAlone and a new holder wait on.
struct HeldKernels {
  std::mutex mutex;
  std::condition_variable changed;
  int held = 0;
  bool alone = false;

  static HeldKernels& get() {
    static HeldKernels h;
    return h;
  }
};

/// Has OpenBLAS choose its kernels again, from OPENBLAS_CORETYPE = `name`,
/// once no work holds the kernels it runs on (BlasKernelsHeld).
void load_kernels(const DynamicArch& d, const std::string& name) {
  HeldKernels& h = HeldKernels::get();
  std::unique_lock<std::mutex> lock(h.mutex);
  h.changed.wait(lock, [&] { return h.held == 0; });
  CoretypeVariable variable(name);
  d.quit();
  d.init();
}

}  // namespace

BlasKernelsHeld::BlasKernelsHeld() {
  HeldKernels& h = HeldKernels::get();
  std::unique_lock<std::mutex> lock(h.mutex);
  h.changed.wait(lock, [&] { return !h.alone; });
  ++h.held;
}

BlasKernelsHeld::~BlasKernelsHeld() {
  HeldKernels& h = HeldKernels::get();
  {
    const std::lock_guard<std::mutex> lock(h.mutex);
    --h.held;
  }
  h.changed.notify_all();
}

BlasAlone::BlasAlone() {
  HeldKernels& h = HeldKernels::get();
  std::unique_lock<std::mutex> lock(h.mutex);
  h.changed.wait(lock, [&] { return h.held == 0 && !h.alone; });
  h.alone = true;
}

BlasAlone::~BlasAlone() {
  HeldKernels& h = HeldKernels::get();
  {
    const std::lock_guard<std::mutex> lock(h.mutex);
    h.alone = false;
  }
  h.changed.notify_all();
}

int blas_kernels_held() {
  HeldKernels& h = HeldKernels::get();
  const std::lock_guard<std::mutex> lock(h.mutex);
  return h.held;
}

std::string active_blas_kernels() {
  const DynamicArch& d = DynamicArch::get();
  if (!d.available()) return "";
  const char* name = d.corename();
  return name == nullptr ? "" : name;
}

bool switch_blas_kernels(const std::string& name) {
  const DynamicArch& d = DynamicArch::get();
  if (!d.available() || name.empty()) return false;
  const std::string before = active_blas_kernels();
  if (::strcasecmp(before.c_str(), name.c_str()) == 0) return true;
  load_kernels(d, name);
  if (::strcasecmp(active_blas_kernels().c_str(), name.c_str()) == 0) return true;
  // OpenBLAS did not know the name (it then falls back to its oldest kernels): back to the ones before.
  load_kernels(d, before);
  return false;
}

bool blas_kernels_chosen_by_pathkernel() { return std::getenv(kBlasKernelsChosenVariable) != nullptr; }

std::string engine_blas_kernels() {
  if (!blas_kernels_chosen_by_pathkernel()) return "";
  return wider_blas_kernels(active_blas_kernels(), CpuFeatures::current());
}

EngineBlasKernels::EngineBlasKernels() {
  const std::string best = engine_blas_kernels();
  if (best.empty()) return;
  const std::string now = active_blas_kernels();
  if (switch_blas_kernels(best)) previous_ = now;
}

EngineBlasKernels::~EngineBlasKernels() {
  if (!previous_.empty()) switch_blas_kernels(previous_);
}

}  // namespace pathkernel
