// Switching OpenBLAS's kernels inside one process (blas_switch.h).
#include "pathkernel/blas_switch.h"

#include <dlfcn.h>
#include <link.h>
#include <strings.h>

#include <cctype>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "pathkernel/blas_kernels.h"
#include "openblas_table.h"

namespace pathkernel {

namespace {

using VoidFn = void (*)();
using NameFn = char* (*)();

/// OpenBLAS's DYNAMIC_ARCH entry points: choose kernels from
/// OPENBLAS_CORETYPE (it returns at once while some are chosen), forget the
/// choice, and the name of the kernels chosen, all null unless all exist;
/// and the pointer to the table of kernels OpenBLAS calls through
/// (`gotoblas`, null when not exported).
struct DynamicArch {
  VoidFn init = nullptr, quit = nullptr;
  NameFn corename = nullptr;
  const void** table = nullptr;

  static const DynamicArch& get() {
    static const DynamicArch d = [] {
      DynamicArch a;
      a.init = reinterpret_cast<VoidFn>(::dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
      a.quit = reinterpret_cast<VoidFn>(::dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
      a.corename = reinterpret_cast<NameFn>(::dlsym(RTLD_DEFAULT, "gotoblas_corename"));
      a.table = reinterpret_cast<const void**>(::dlsym(RTLD_DEFAULT, "gotoblas"));
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

/// What OpenBLAS's mixed table mixes (mix_blas_kernels).
struct Mix {
  bool on = false;      ///< OpenBLAS calls through MixedKernels::table
  std::string run;      ///< the kernels of every routine but the float64 ones
  std::string float64;  ///< the kernels of the float64 routines
};

/// OpenBLAS's mixed table of kernels and what it mixes, which any thread
/// may read (active_blas_kernels) while one mixes or switches: read and
/// written whole, under its own lock, never held while waiting.
/// The table is never freed: OpenBLAS's threads read it while they run.
struct MixedKernels {
  alignas(64) unsigned char table[16384];

  static MixedKernels& get() {
    static MixedKernels m;
    return m;
  }
  Mix state() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return mix_;
  }
  void set(Mix mix) {
    const std::lock_guard<std::mutex> lock(mutex_);
    mix_ = std::move(mix);
  }

 private:
  std::mutex mutex_;
  Mix mix_;
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
  MixedKernels::get().set(Mix{});
}

/// A table of kernels OpenBLAS exports (gotoblas_HASWELL): where it is,
/// its size and the suffix of its kernels' names ("_HASWELL").
struct KernelTable {
  const unsigned char* at = nullptr;
  size_t size = 0;
  std::string suffix;

  static KernelTable of(const void* table) {
    KernelTable t;
    Dl_info info{};
    void* entry = nullptr;  // the symbol's ElfW(Sym)
    if (table == nullptr || ::dladdr1(table, &info, &entry, RTLD_DL_SYMENT) == 0 || info.dli_sname == nullptr ||
        info.dli_saddr != table || entry == nullptr) {
      return t;
    }
    const auto* symbol = static_cast<const ElfW(Sym)*>(entry);
    const std::string name = info.dli_sname;
    const std::string prefix = "gotoblas_";
    if (name.compare(0, prefix.size(), prefix) != 0 || name.size() == prefix.size()) return t;
    t.at = static_cast<const unsigned char*>(table);
    t.size = symbol->st_size;
    t.suffix = "_" + name.substr(prefix.size());
    return t;
  }

  /// The routine the entry at `offset` points to, without the table's
  /// suffix; "" when it points to no exported routine of this table's.
  std::string routine_at(size_t offset) const {
    const void* p = nullptr;
    std::memcpy(&p, at + offset, sizeof p);
    const std::string name = exported_routine(p);
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      return "";
    }
    return name.substr(0, name.size() - suffix.size());
  }
};

/// Whether an OpenBLAS routine's name is a float64 one's (ddot_k, idamax_k).
bool is_float64_routine(const std::string& name) {
  return !name.empty() && (name[0] == 'd' || name.compare(0, 2, "id") == 0);
}

/// The head of a table of kernels: OpenBLAS's packing buffers' layout,
/// which every precision's routines share (common_param.h).
struct BufferLayout {
  int dtb_entries, offset_a, offset_b, align;  ///< `align` a mask, 2^k - 1

  /// Where dgemm's packed panel of B starts in OpenBLAS's buffer, for
  /// dgemm's block sizes P and Q (interface/gemm.c).
  int64_t panel_b(int p, int q) const {
    const int64_t panel_a = int64_t{p} * q * static_cast<int64_t>(sizeof(double));
    return offset_a + ((panel_a + align) & ~int64_t{align}) + offset_b;
  }
};

/// `run` with the float64 entries of `wide` into `out`: false, `out` left
/// as it may be, unless both tables are laid out alike as OpenBLAS's
/// common_param.h has them. Its float64 block starts with six ints (dgemm's
/// block sizes P, Q, R and unroll M, N, MN) after the last float32 routine,
/// then the routines from damax_k on, each named by the kernel it points to
/// (damax_k_HASWELL); the block ends where an entry of either table names a
/// routine of another precision. dsdot_k takes float32 vectors and stays
/// the run's.
///
/// The mix keeps the run's buffer layout, so that every float32 routine runs
/// exactly as alone. The wide kernels need their buffers aligned as alone at
/// least; where the run's layout starts dgemm's panel of B later than the
/// wide kernels' (Prescott's does), dgemm's column block R is cut so that the
/// panel still fits the buffer, as OpenBLAS sizes R. R splits the columns of
/// a product, not its sums: the bits stay the wide kernels'.
bool mix_tables(const KernelTable& run, const KernelTable& wide, unsigned char* out, size_t capacity) {
  constexpr size_t kSlot = sizeof(void*), kSizes = 6 * sizeof(int);
  if (run.at == nullptr || wide.at == nullptr || run.size != wide.size || run.size > capacity) return false;
  BufferLayout run_layout{}, wide_layout{};
  std::memcpy(&run_layout, run.at, sizeof run_layout);
  std::memcpy(&wide_layout, wide.at, sizeof wide_layout);
  if (run_layout.align < wide_layout.align || run_layout.offset_a % 64 != 0 || run_layout.offset_b % 64 != 0) {
    return false;
  }
  size_t start = 0;
  for (size_t o = kSizes + kSlot; o + kSlot <= run.size && start == 0; o += kSlot) {
    if (run.routine_at(o) == "damax_k" && wide.routine_at(o) == "damax_k") start = o;
  }
  if (start == 0) return false;
  const size_t sizes = start - kSizes;
  const std::string last_float32 = run.routine_at(sizes - kSlot);
  if (last_float32.empty() || last_float32[0] != 's' || wide.routine_at(sizes - kSlot) != last_float32) return false;
  int block[6];  // the wide kernels' P, Q, R and unrolls
  std::memcpy(block, wide.at + sizes, kSizes);
  for (int i = 0; i < 6; ++i) {
    if (block[i] <= 0 || (i >= 3 && block[i] > 64)) return false;
  }
  const int64_t later = run_layout.panel_b(block[0], block[1]) - wide_layout.panel_b(block[0], block[1]);
  if (later > 0) {
    const int64_t column = int64_t{block[1]} * static_cast<int64_t>(sizeof(double));
    block[2] -= static_cast<int>(((later + column - 1) / column + 15) / 16 * 16);
    if (block[2] <= 0) return false;
  }
  std::memcpy(out, run.at, run.size);
  std::memcpy(out + sizes, block, kSizes);
  std::set<std::string> gemm = {"dgemm_kernel", "dgemm_beta", "dgemm_incopy", "dgemm_itcopy", "dgemm_oncopy",
                                "dgemm_otcopy"};
  for (size_t o = start; o + kSlot <= run.size; o += kSlot) {
    // An entry may name another routine of the same code (Prescott's dgemm_incopy is its dgemm_oncopy).
    const std::string name = wide.routine_at(o), run_name = run.routine_at(o);
    if (!is_float64_routine(name) || !is_float64_routine(run_name)) break;
    gemm.erase(name);
    if (name != "dsdot_k" && run_name != "dsdot_k") std::memcpy(out + o, wide.at + o, kSlot);
  }
  return gemm.empty();  // the wide kernels' block held dgemm's kernel, its beta and its four copy routines
}

}  // namespace

std::string exported_routine(const void* p) {
  Dl_info info{};
  if (p == nullptr || ::dladdr(p, &info) == 0 || info.dli_sname == nullptr || info.dli_saddr != p) return "";
  return info.dli_sname;
}

std::string blas_library_file() {
  void* gemm = ::dlsym(RTLD_NEXT, "dgemm_");
  if (gemm == nullptr) gemm = ::dlsym(RTLD_DEFAULT, "dgemm_");
  Dl_info info{};
  if (gemm == nullptr || ::dladdr(gemm, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

size_t kernel_table_offset(const std::string& routine) {
  const DynamicArch& d = DynamicArch::get();
  std::string kernels = active_blas_kernels();
  if (!d.available() || kernels.empty()) return 0;
  for (char& ch : kernels) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  // The exported table of the active kernels: the active one may be
  // pathkernel's mix, laid out alike.
  const KernelTable t = KernelTable::of(::dlsym(RTLD_DEFAULT, ("gotoblas_" + kernels).c_str()));
  for (size_t o = 0; t.at != nullptr && o + sizeof(void*) <= t.size; o += sizeof(void*)) {
    if (t.routine_at(o) == routine) return o;
  }
  return 0;
}

const unsigned char* active_kernel_table() {
  const DynamicArch& d = DynamicArch::get();
  if (!d.available() || d.table == nullptr) return nullptr;
  return static_cast<const unsigned char*>(*d.table);
}

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
  const Mix mix = MixedKernels::get().state();
  if (mix.on) return mix.run;
  const char* name = d.corename();
  return name == nullptr ? "" : name;
}

bool switch_blas_kernels(const std::string& name) {
  const DynamicArch& d = DynamicArch::get();
  if (!d.available() || name.empty()) return false;
  const std::string before = active_blas_kernels();
  if (::strcasecmp(before.c_str(), name.c_str()) == 0 && !MixedKernels::get().state().on) return true;
  load_kernels(d, name);
  if (::strcasecmp(active_blas_kernels().c_str(), name.c_str()) == 0) return true;
  // OpenBLAS did not know the name (it then falls back to its oldest kernels): back to the ones before.
  load_kernels(d, before);
  return false;
}

bool mix_blas_kernels(const std::string& float64_kernels) {
  const DynamicArch& d = DynamicArch::get();
  MixedKernels& m = MixedKernels::get();
  if (!d.available() || d.table == nullptr || float64_kernels.empty()) return false;
  const Mix now = m.state();
  if (now.on && ::strcasecmp(now.float64.c_str(), float64_kernels.c_str()) == 0) return true;
  const std::string run = active_blas_kernels();
  if (run.empty()) return false;
  if (!now.on && ::strcasecmp(run.c_str(), float64_kernels.c_str()) == 0) return true;
  // OpenBLAS sets a table's block sizes as it chooses it: both chosen once.
  if (!switch_blas_kernels(float64_kernels)) return false;
  const std::string float64 = active_blas_kernels();
  const KernelTable wide = KernelTable::of(*d.table);
  if (!switch_blas_kernels(run)) return false;
  const KernelTable narrow = KernelTable::of(*d.table);
  if (!mix_tables(narrow, wide, m.table, sizeof m.table)) return false;
  HeldKernels& h = HeldKernels::get();
  std::unique_lock<std::mutex> lock(h.mutex);
  h.changed.wait(lock, [&] { return h.held == 0; });
  *d.table = m.table;
  m.set(Mix{true, run, float64});
  return true;
}

void unmix_blas_kernels() {
  const Mix mix = MixedKernels::get().state();
  if (mix.on) switch_blas_kernels(mix.run);
}

std::string mixed_float64_kernels() {
  const Mix mix = MixedKernels::get().state();
  return mix.on ? mix.float64 : "";
}

void blas_kernels_for_replay(bool float32_replay) {
  if (!float32_replay) return unmix_blas_kernels();
  const std::string wider = wider_blas_kernels(active_blas_kernels(), CpuFeatures::current());
  if (!wider.empty()) mix_blas_kernels(wider);
}

bool blas_kernels_chosen_by_pathkernel() { return std::getenv(kBlasKernelsChosenVariable) != nullptr; }

std::string engine_blas_kernels() {
  if (!blas_kernels_chosen_by_pathkernel() || MixedKernels::get().state().on) return "";
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
