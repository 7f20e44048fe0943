// How pathkernel's programs' memory allocator keeps and hands out memory:
// the command-line program and the benchmark suite, whose rows measure the
// library's time and peak memory under the allocator users run.
#pragma once

namespace pathkernel::program {

/// Sets up the allocator once, at start-up, before any test point is
/// computed. Built with tcmalloc (PATHKERNEL_TCMALLOC, the default): the
/// memory tcmalloc takes from the kernel is asked for in transparent huge
/// pages, what is freed is kept for reuse, and the threads' caches of freed
/// small blocks hold 8 MiB together (unless TCMALLOC_MAX_TOTAL_THREAD_CACHE_BYTES
/// sets otherwise). Otherwise glibc's malloc keeps freed memory
/// (pathkernel::keep_freed_memory).
///
/// Why tcmalloc: with several threads, glibc gives each thread an arena of
/// its own of at most 64 MiB, and a CNN's test-feature temporaries (tens to
/// hundreds of MiB) were taken from and given back to the kernel on every
/// step: 14 s of system time in `verify --test 8` of the user CNN's first
/// 30 steps, against 2.8 s with tcmalloc, which keeps them in one heap for
/// every thread (docs/measurements.md).
void set_up_allocator();

}  // namespace pathkernel::program
