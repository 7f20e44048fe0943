#include "allocator.h"

#include "pathkernel/context.h"

#ifdef PATHKERNEL_TCMALLOC
#include <gperftools/malloc_extension.h>
#include <sys/mman.h>

#include <cstdlib>
#endif

namespace pathkernel::program {

#ifdef PATHKERNEL_TCMALLOC
namespace {

/// tcmalloc's own system allocator, with every region it takes from the
/// kernel marked for transparent huge pages. Kernels set to give huge pages
/// only where asked (`madvise`, Debian's default) otherwise fault the test
/// features' large blocks in 4 KiB at a time, with as many TLB misses:
/// glibc asks for them (glibc.malloc.hugetlb, pathkernel/process_environment.h),
/// tcmalloc does not.
class HugePagesAllocator final : public SysAllocator {
 public:
  explicit HugePagesAllocator(SysAllocator* system) : system_(system) {}

  void* Alloc(size_t size, size_t* actual_size, size_t alignment) override {
    void* p = system_->Alloc(size, actual_size, alignment);
    // The region is page-aligned; a kernel without transparent huge pages
    // refuses the advice, which changes nothing.
    if (p != nullptr) (void)::madvise(p, *actual_size, MADV_HUGEPAGE);
    return p;
  }

 private:
  SysAllocator* system_;
};

/// What every thread's cache of freed small blocks (up to 256 KiB each)
/// may hold together: 8 MiB, where tcmalloc's default is 32 MiB. A block a
/// thread frees waits in its cache for that thread alone; with the steps
/// on threads (docs/math.md §12), each worker's replay frees the step's
/// weight-sized tensors into a cache of its own, which no other thread
/// reuses. A smaller cap sends a CNN's test-side temporaries through the
/// central free lists instead: at 1 MiB, 7.0 to 7.3 % of the README CNN's
/// `verify --test 10` samples were in tcmalloc against 3.9 to 4.1 % at
/// 8 MiB and 3.2 % at 32 MiB (`perf record`). Peaks (BENCHMARKS.md): the
/// full-batch row 292 to 299 MB against 301 at 32 MiB and 281 to 285 at
/// 1 MiB; the README CNN's verify 360 MB against 382 and 349.
constexpr size_t kThreadCachesBytes = size_t{8} << 20;

}  // namespace

void set_up_allocator() {
  MallocExtension* tcmalloc = MallocExtension::instance();
  tcmalloc->SetSystemAllocator(new HugePagesAllocator(tcmalloc->GetSystemAllocator()));
  // Freed memory stays for the next step's blocks of the same sizes, as
  // glibc's is kept (keep_freed_memory): handed back, it was faulted in
  // again (minor faults in the user CNN's `verify --test 1` of 30 steps:
  // 41,900 against 27,000 kept).
  tcmalloc->SetMemoryReleaseRate(0);
  // A user's own cap (tcmalloc reads it from the environment) is kept.
  if (std::getenv("TCMALLOC_MAX_TOTAL_THREAD_CACHE_BYTES") == nullptr) {
    tcmalloc->SetNumericProperty("tcmalloc.max_total_thread_cache_bytes", kThreadCachesBytes);
  }
}
#else
void set_up_allocator() { keep_freed_memory(); }
#endif

}  // namespace pathkernel::program
