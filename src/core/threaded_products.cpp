// OpenBLAS's float32 products on several threads, added as they are there,
// on one thread (threaded_products.h).
#include "pathkernel/threaded_products.h"

#include <dlfcn.h>

#include <cctype>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "pathkernel/blas_switch.h"
#include "openblas_table.h"

extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);

namespace pathkernel {
namespace {

using Sgemm = void (*)(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                       const int*, const float*, const int*, const float*, float*, const int*);
/// OpenBLAS's sgemm_small_matrix_permit_<KERNELS>: whether its small-matrix
/// kernels take a product (transa, transb 0 or 1), at any thread count.
using Permit = int (*)(int, int, long, long, long, float, float);

/// The sgemm_ after pathkernel's: OpenBLAS's.
Sgemm openblas_sgemm() {
  static const Sgemm f = reinterpret_cast<Sgemm>(::dlsym(RTLD_NEXT, "sgemm_"));
  return f;
}

/// How OpenBLAS's active kernels cut a float32 product's inner dimension.
struct Rule {
  int q = 0;         ///< the block size Q
  int unroll_m = 0;  ///< the one-thread driver's rounding of a half
  Permit permit = nullptr;
  std::string unavailable;  ///< why there is no rule; "" when there is
};

std::string upper(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return s;
}

/// The active kernels' rule, read from OpenBLAS's table of kernels
/// (common_param.h, as Debian's 0.3.21 builds it: dtb_entries, the buffers'
/// offsets and alignment, then sgemm's P, Q, R and unrolls M, N, MN, an
/// int, and from byte 48 the float32 routines, samax_k first).
Rule active_rule() {
  Rule r;
  if (openblas_sgemm() == nullptr) {
    r.unavailable = "no BLAS sgemm_ after pathkernel's";
    return r;
  }
  if (reinterpret_cast<const void*>(::dlsym(RTLD_DEFAULT, "sgemm_")) != reinterpret_cast<const void*>(&sgemm_)) {
    r.unavailable = "LibTorch's float32 products do not reach pathkernel's sgemm_";
    return r;
  }
  const std::string kernels = active_blas_kernels();
  const unsigned char* head = active_kernel_table();
  if (kernels.empty() || head == nullptr) {
    r.unavailable = "the BLAS is not an OpenBLAS that switches its kernels";
    return r;
  }
  const std::string suffix = "_" + upper(kernels);
  const void* first = nullptr;
  std::memcpy(&first, head + 48, sizeof first);
  if (exported_routine(first) != "samax_k" + suffix) {
    r.unavailable = "OpenBLAS's table of kernels is not laid out as 0.3.21's";
    return r;
  }
  int ints[10];
  std::memcpy(ints, head, sizeof ints);
  r.q = ints[5];
  r.unroll_m = ints[7];
  r.permit = reinterpret_cast<Permit>(::dlsym(RTLD_DEFAULT, ("sgemm_small_matrix_permit" + suffix).c_str()));
  if (r.q <= 0 || r.unroll_m <= 0 || r.unroll_m > 64 || r.permit == nullptr) {
    r.unavailable = "OpenBLAS's " + kernels + " kernels have no block size or small-matrix rule here";
  }
  return r;
}

struct ThreadState {
  int threads = 0;  ///< the count whose threaded driver is followed; <= 1: none
  Rule rule;
  long split = 0;
};
thread_local ThreadState t_state;

/// The blocks [start, length] OpenBLAS cuts an inner dimension k into: its
/// one-thread driver's (driver/level3/level3.c: a remainder r with Q < r <
/// 2Q is halved, rounded up to a multiple of `unroll`) or, unroll 0, its
/// threaded driver's (level3_thread.c: ⌈r/2⌉).
std::vector<std::pair<int, int>> k_blocks(int k, int q, int unroll) {
  std::vector<std::pair<int, int>> out;
  for (int ls = 0; ls < k;) {
    const int r = k - ls;
    int l = r;
    if (r >= 2 * q) {
      l = q;
    } else if (r > q) {
      l = unroll > 0 ? (r / 2 + unroll - 1) / unroll * unroll : (r + 1) / 2;
    }
    out.emplace_back(ls, l);
    ls += l;
  }
  return out;
}

/// 1 for a transposed operand, 0 for one as it is, -1 for what OpenBLAS
/// refuses itself.
int transposed(char t) {
  switch (t) {
    case 'N': case 'n': case 'R': case 'r': return 0;
    case 'T': case 't': case 'C': case 'c': return 1;
    default: return -1;
  }
}

/// The columns a copy of the product needs so that none of `blocks` takes
/// OpenBLAS's small-matrix kernels (n itself where none would); 0 where no
/// width below 2^20 columns does.
int unsmall_columns(const Rule& r, int ta, int tb, int m, int n, const std::vector<std::pair<int, int>>& blocks,
                    float alpha, float beta) {
  const float one = 1.0F;
  for (long n2 = n; n2 < (1L << 20); n2 *= 2) {
    bool small = false;
    for (size_t i = 0; i < blocks.size() && !small; ++i) {
      small = r.permit(ta, tb, m, n2, blocks[i].second, alpha, i == 0 ? beta : one) != 0;
    }
    if (!small) return static_cast<int>(n2);
  }
  return 0;
}

/// The product's k-blocks in turn, each added to the last (OpenBLAS's
/// threaded driver's sums, in its order).
void run_blocks(const std::vector<std::pair<int, int>>& blocks, const char* transa, const char* transb, int ta,
                int tb, const int* m, const int* n, const float* alpha, const float* a, const int* lda,
                const float* b, const int* ldb, const float* beta, float* c, const int* ldc) {
  const float one = 1.0F;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const int ls = blocks[i].first, l = blocks[i].second;
    // Column-major: op(A) is m × k, columns of A or rows of Aᵀ; op(B) k × n.
    const float* a_l = ta == 0 ? a + static_cast<long>(ls) * *lda : a + ls;
    const float* b_l = tb == 0 ? b + ls : b + static_cast<long>(ls) * *ldb;
    openblas_sgemm()(transa, transb, m, n, &l, alpha, a_l, lda, b_l, ldb, i == 0 ? beta : &one, c, ldc);
  }
}

/// run_blocks on a copy of op(B) and C widened to n2 columns, the ones past
/// n zero, then C's first n columns copied back: a block OpenBLAS's
/// small-matrix kernels would take is not small that wide, and on these
/// kernels a column's sums do not depend on the other columns.
void run_blocks_widened(const std::vector<std::pair<int, int>>& blocks, int n2, const char* transa,
                        const char* transb, int ta, int tb, const int* m, const int* n, const int* k,
                        const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                        const float* beta, float* c, const int* ldc) {
  const long M = *m, N = *n, K = *k, N2 = n2;
  std::vector<float> b2(static_cast<size_t>(K * N2), 0.0F), c2(static_cast<size_t>(M * N2), 0.0F);
  const int ldb2 = tb == 0 ? *k : n2, ldc2 = *m;
  for (long j = 0; j < N; ++j) {
    if (tb == 0) {  // B is k × n: column j
      std::memcpy(&b2[j * K], b + j * *ldb, sizeof(float) * K);
    } else {  // B is n × k: row j
      for (long p = 0; p < K; ++p) b2[j + p * N2] = b[j + p * *ldb];
    }
    std::memcpy(&c2[j * M], c + j * *ldc, sizeof(float) * M);
  }
  run_blocks(blocks, transa, transb, ta, tb, m, &n2, alpha, a, lda, b2.data(), &ldb2, beta, c2.data(), &ldc2);
  for (long j = 0; j < N; ++j) std::memcpy(c + j * *ldc, &c2[j * M], sizeof(float) * M);
}

/// The product as OpenBLAS's threaded driver at s.threads threads adds it,
/// in k-blocks on this thread; false, nothing done, where OpenBLAS runs it
/// alike at any count.
bool run_in_blocks(ThreadState& s, const char* transa, const char* transb, const int* m, const int* n,
                   const int* k, const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                   const float* beta, float* c, const int* ldc) {
  const Rule& r = s.rule;
  const int ta = transposed(*transa), tb = transposed(*transb);
  if (ta < 0 || tb < 0 || *m <= 0 || *n <= 0 || *k <= r.q) return false;
  // interface/gemm.c: M·N·K <= SMP_THRESHOLD_MIN × GEMM_MULTITHREAD_THRESHOLD
  // runs on one thread at any count, and so do the small-matrix kernels.
  if (static_cast<double>(*m) * *n * *k <= 65536.0 * 4) return false;
  if (r.permit(ta, tb, *m, *n, *k, *alpha, *beta) != 0) return false;
  const std::vector<std::pair<int, int>> blocks = k_blocks(*k, r.q, 0);
  if (blocks == k_blocks(*k, r.q, r.unroll_m)) return false;
  const int n2 = unsmall_columns(r, ta, tb, *m, *n, blocks, *alpha, *beta);
  if (n2 == 0) return false;
  if (n2 == *n) {
    run_blocks(blocks, transa, transb, ta, tb, m, n, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    run_blocks_widened(blocks, n2, transa, transb, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  ++s.split;
  return true;
}

}  // namespace

ThreadedProductsOnOneThread::ThreadedProductsOnOneThread(int threads) : previous_(t_state.threads) {
  if (threads > 1) {
    t_state.rule = active_rule();  // the kernels may have switched since the last scope
    t_state.threads = threads;
  }
}

ThreadedProductsOnOneThread::~ThreadedProductsOnOneThread() { t_state.threads = previous_; }

std::string threaded_products_unavailable() { return active_rule().unavailable; }

long threaded_products_split() { return t_state.split; }

}  // namespace pathkernel

/// Every float32 matrix product LibTorch asks of the BLAS (it calls sgemm_;
/// the program's definition comes first), forwarded to OpenBLAS's, in the
/// threaded driver's k-blocks inside a ThreadedProductsOnOneThread.
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc) {
  pathkernel::ThreadState& s = pathkernel::t_state;
  if (s.threads > 1 && s.rule.unavailable.empty() &&
      pathkernel::run_in_blocks(s, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) {
    return;
  }
  pathkernel::openblas_sgemm()(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
