// Assertion failure and overflow-checked size arithmetic.
#include "pathkernel/error.h"

#include <cstdio>
#include <cstdlib>
#include <limits>

namespace pathkernel {

void assertion_failed(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "pathkernel: internal error: assertion '%s' failed at %s:%d\n", expr, file,
               line);
  std::abort();
}

int64_t mul_no_overflow(int64_t a, int64_t b, const char* what) {
  PK_CHECK(a >= 0 && b >= 0, what << ": negative size (" << a << " x " << b << ")");
  if (a != 0 && b > std::numeric_limits<int64_t>::max() / a) {
    PK_THROW(what << ": size overflows 64 bits (" << a << " x " << b << ")");
  }
  return a * b;
}

}  // namespace pathkernel
