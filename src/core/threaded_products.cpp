// OpenBLAS's matrix products on several threads, added as they are there,
// on one thread (threaded_products.h): its threaded level-3 driver
// (driver/level3/level3_thread.c of 0.3.21) followed step by step, calling
// OpenBLAS's own packing and kernel routines with the blocks and widths each
// of its threads would give them.
#include "pathkernel/threaded_products.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "openblas_table.h"

extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);
extern "C" void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const double* alpha, const double* a, const int* lda, const double* b, const int* ldb,
                       const double* beta, double* c, const int* ldc);

namespace pathkernel {
namespace {

template <typename T>
using Gemm = void (*)(const char*, const char*, const int*, const int*, const int*, const T*, const T*, const int*,
                      const T*, const int*, const T*, T*, const int*);

/// The precision's letter and BLAS routine (sgemm_, dgemm_: pathkernel's).
template <typename T>
struct Precision;
template <>
struct Precision<float> {
  static constexpr char letter = 's';
  static constexpr Gemm<float> ours = &sgemm_;
};
template <>
struct Precision<double> {
  static constexpr char letter = 'd';
  static constexpr Gemm<double> ours = &dgemm_;
};

/// The gemm_ after pathkernel's: OpenBLAS's.
template <typename T>
Gemm<T> openblas_gemm() {
  static const Gemm<T> f =
      reinterpret_cast<Gemm<T>>(::dlsym(RTLD_NEXT, (std::string(1, Precision<T>::letter) + "gemm_").c_str()));
  return f;
}

/// What OpenBLAS's threaded driver calls for one precision, with the active
/// kernels' block sizes (common_param.h: GEMM_P, Q, R, UNROLL_M, UNROLL_N).
template <typename T>
struct Rule {
  using Copy = int (*)(long, long, const T*, long, T*);
  using Kernel = int (*)(long, long, long, T, const T*, const T*, T*, long);
  using Beta = int (*)(long, long, long, T, T*, long, T*, long, T*, long);
  using Permit = int (*)(int, int, long, long, long, T, T);
  Copy incopy = nullptr, itcopy = nullptr, oncopy = nullptr, otcopy = nullptr;
  Kernel kernel = nullptr;
  Beta beta = nullptr;
  Permit permit = nullptr;
  long p = 0, q = 0, r = 0, unroll_m = 0, unroll_n = 0;
  std::string unavailable;  ///< why there is no rule; "" when there is
};

/// What does not change in a process: whether LibTorch's products reach
/// pathkernel's gemm_ and OpenBLAS's comes after it, and where precision
/// T's entries are in OpenBLAS's tables (every table of one library is laid
/// out alike). Found once: the lookups read OpenBLAS's symbols by address.
template <typename T>
struct Layout {
  std::string unavailable;
  size_t first = 0, kernel = 0;  ///< <l>amax_k's and <l>gemm_kernel's entries

  static const Layout& get() {
    static const Layout l = [] {
      Layout o;
      const std::string letter(1, Precision<T>::letter);
      if (openblas_gemm<T>() == nullptr) {
        o.unavailable = "no BLAS " + letter + "gemm_ after pathkernel's";
      } else if (::dlsym(RTLD_DEFAULT, (letter + "gemm_").c_str()) != reinterpret_cast<void*>(Precision<T>::ours)) {
        o.unavailable = "LibTorch's products do not reach pathkernel's " + letter + "gemm_";
      } else {
        o.first = kernel_table_offset(letter + "amax_k");
        o.kernel = kernel_table_offset(letter + "gemm_kernel");
        if (o.first == 0 || o.kernel == 0) {
          o.unavailable = "the BLAS is not an OpenBLAS whose table of kernels is laid out as 0.3.21's";
        }
      }
      return o;
    }();
    return l;
  }
};

/// The rule from a table's entries for precision T (its gemm kernel, beta,
/// four packing routines and small-matrix rule, named as 0.3.21 names
/// them) and block sizes (P, Q, R, unroll M, N).
template <typename T>
Rule<T> rule_of_entries(void* const (&entries)[7], const int (&ints)[5]) {
  Rule<T> r;
  const std::string prefix = std::string(1, Precision<T>::letter) + "gemm_";
  const char* kinds[7] = {"kernel", "beta", "", "", "", "", "small_matrix_permit"};  // "": a packing routine
  for (int i = 0; i < 7; ++i) {
    const std::string name = exported_routine(entries[i]);
    const std::string want = prefix + kinds[i];
    const bool named = name.compare(0, want.size(), want) == 0 &&
                       (kinds[i][0] != '\0' || name.find("copy") != std::string::npos);
    if (!named) {
      r.unavailable = "OpenBLAS's table of kernels has " + (name.empty() ? std::string("no routine") : name) +
                      " where 0.3.21's has " + want + (kinds[i][0] ? "" : "*copy");
      return r;
    }
  }
  r.kernel = reinterpret_cast<typename Rule<T>::Kernel>(entries[0]);
  r.beta = reinterpret_cast<typename Rule<T>::Beta>(entries[1]);
  r.incopy = reinterpret_cast<typename Rule<T>::Copy>(entries[2]);
  r.itcopy = reinterpret_cast<typename Rule<T>::Copy>(entries[3]);
  r.oncopy = reinterpret_cast<typename Rule<T>::Copy>(entries[4]);
  r.otcopy = reinterpret_cast<typename Rule<T>::Copy>(entries[5]);
  r.permit = reinterpret_cast<typename Rule<T>::Permit>(entries[6]);
  r.p = ints[0], r.q = ints[1], r.r = ints[2], r.unroll_m = ints[3], r.unroll_n = ints[4];
  if (r.p <= 0 || r.q <= 0 || r.r <= 0 || r.unroll_m <= 0 || r.unroll_m > 64 || r.unroll_n <= 0 || r.unroll_n > 64) {
    r.unavailable = "OpenBLAS's table of kernels has no " + prefix + "block sizes where 0.3.21's has them";
  }
  return r;
}

/// The active table's block sizes and routines of precision T. The table
/// (common_param.h as 0.3.21 lays it out) starts with dtb_entries, the
/// buffers' offsets and alignment, then sgemm's P, Q, R and unrolls M, N,
/// MN; dgemm's come right before its first float64 routine, damax_k. Each
/// precision's gemm kernel is followed by its beta, its four packing
/// routines (incopy, itcopy, oncopy, otcopy) and its small-matrix rule.
/// The routines are read from the entries, where OpenBLAS calls them: one
/// routine's code may serve two entries (Prescott's dgemm_incopy is its
/// dgemm_oncopy), and the table may be pathkernel's mix (blas_switch.h).
/// The entries' names are checked again only when they change (a replay
/// opens a scope a step).
template <typename T>
Rule<T> active_rule() {
  const Layout<T>& layout = Layout<T>::get();
  if (!layout.unavailable.empty()) {
    Rule<T> r;
    r.unavailable = layout.unavailable;
    return r;
  }
  const unsigned char* head = active_kernel_table();
  if (head == nullptr) {
    Rule<T> r;
    r.unavailable = "OpenBLAS calls through no table of kernels";
    return r;
  }
  void* entries[7];
  int ints[5];
  std::memcpy(entries, head + layout.kernel, sizeof entries);
  std::memcpy(ints, head + (Precision<T>::letter == 's' ? 16 : layout.first - 24), sizeof ints);
  struct Last {
    void* entries[7] = {};
    int ints[5] = {};
    Rule<T> rule;
    bool set = false;
  };
  thread_local Last last;
  if (!last.set || std::memcmp(last.entries, entries, sizeof entries) != 0 ||
      std::memcmp(last.ints, ints, sizeof ints) != 0) {
    last.rule = rule_of_entries<T>(entries, ints);
    std::memcpy(last.entries, entries, sizeof entries);
    std::memcpy(last.ints, ints, sizeof ints);
    last.set = true;
  }
  return last.rule;
}

struct ThreadState {
  int threads = 0;  ///< the count whose threaded driver is followed; <= 1: none
  Rule<float> single;
  Rule<double> twice;
  long split = 0;
  std::vector<unsigned char> scratch;  ///< the packed panels, grown as needed
};
thread_local ThreadState t_state;

template <typename T>
Rule<T>& rule_of(ThreadState& s);
template <>
Rule<float>& rule_of(ThreadState& s) { return s.single; }
template <>
Rule<double>& rule_of(ThreadState& s) { return s.twice; }

/// 1 for a transposed operand, 0 for one as it is, -1 for what OpenBLAS
/// refuses itself.
int transposed(char t) {
  switch (t) {
    case 'N': case 'n': case 'R': case 'r': return 0;
    case 'T': case 't': case 'C': case 'c': return 1;
    default: return -1;
  }
}

/// OpenBLAS's split of `size` into `parts` ranges (gemm_driver: each the
/// rest over the parts left, at least `least`); boundaries, parts + 1.
std::vector<long> ranges(long from, long size, long parts, long least) {
  std::vector<long> at{from};
  for (long i = 0; size > 0; ++i) {
    long width = (size + parts - i - 1) / (parts - i);
    width = std::max(width, least);
    size -= width;
    if (size < 0) width += size;
    at.push_back(at.back() + width);
  }
  while (static_cast<long>(at.size()) < parts + 1) at.push_back(at.back());
  return at;
}

/// One product's operands, column-major as the BLAS takes them.
template <typename T>
struct Product {
  int ta, tb;
  long m, n, k, lda, ldb, ldc;
  T alpha, beta;
  const T *a, *b;
  T* c;
  /// op(A)[row, l]: where the threaded driver's ICOPY starts.
  const T* a_at(long row, long l) const { return ta == 0 ? a + row + l * lda : a + l + row * lda; }
  /// op(B)[l, col]: where its OCOPY starts.
  const T* b_at(long l, long col) const { return tb == 0 ? b + l + col * ldb : b + col + l * ldb; }
  T* c_at(long row, long col) const { return c + row + col * ldc; }
};

/// OpenBLAS's threaded driver (level3_thread.c's CNAME, gemm_driver and
/// inner_thread, with the defaults Debian's x86-64 build has: SWITCH_RATIO
/// 2, GEMM_PREFERED_SIZE 1, DIVIDE_RATE 2) for one product, every thread's
/// work in turn on this thread. A C entry's sums depend only on the blocks
/// and widths its kernel calls got, which are each thread's; not on when
/// the threads ran them.
template <typename T>
class ThreadedDriver {
 public:
  ThreadedDriver(const Rule<T>& r, int threads, const Product<T>& x, std::vector<unsigned char>& scratch)
      : r_(r), x_(x), scratch_(scratch) {
    threads_m_ = threads;
    if (x.m < 2 * kSwitch) {
      threads_m_ = 1;
    } else {
      while (x.m < threads_m_ * kSwitch) threads_m_ /= 2;
    }
    long threads_n = 1;
    if (x.n >= kSwitch * threads_m_) {
      threads_n = (x.n + kSwitch * threads_m_ - 1) / (kSwitch * threads_m_);
      if (threads_m_ * threads_n > threads) threads_n = threads / threads_m_;
    }
    threads_ = threads_m_ * threads_n;
    range_m_ = ranges(0, x.m, threads_m_, 1);
  }

  /// False, nothing done, where the driver hands the product to its
  /// one-thread driver (one thread's worth of rows and columns).
  bool run() {
    if (threads_ <= 1) return false;
    for (long js0 = 0; js0 < x_.n; js0 += r_.r * threads_) {
      range_n_ = ranges(js0, std::min(x_.n - js0, r_.r * threads_), threads_, kSwitch);
      lay_out_buffers();
      scale_by_beta();
      if (x_.k == 0 || x_.alpha == T(0)) continue;
      for (long ls = 0, l = 0; ls < x_.k; ls += l) {
        l = x_.k - ls;
        if (l >= r_.q * 2) {
          l = r_.q;
        } else if (l > r_.q) {
          l = (l + 1) / 2;
        }
        pack_columns(ls, l);
        for (long pos = 0; pos < threads_; ++pos) add_rows_of(pos, ls, l);
      }
    }
    return true;
  }

 private:
  static constexpr long kSwitch = 2, kDivide = 2;

  /// One of a thread's kDivide buffers of packed columns of op(B).
  struct Buffer {
    long col, width;
    const T* panel;
    std::vector<std::pair<long, long>> own;  ///< its owner's kernel calls as it packs: (column, width)
  };

  /// OpenBLAS's buffers, each on a page as blas_memory_alloc gives them (a
  /// kernel may load its panels aligned): A's panel (P × Q), then each
  /// thread's kDivide panels of B, Q × its buffers' columns (rounded to the
  /// unroll) apart, as inner_thread lays them out.
  void lay_out_buffers() {
    const long page = 4096 / static_cast<long>(sizeof(T));
    auto up = [](long v, long to) { return (v + to - 1) / to * to; };
    start_.assign(threads_, 0);
    stride_.assign(threads_, 0);
    long total = up(r_.p * r_.q, page);
    for (long pos = 0; pos < threads_; ++pos) {
      stride_[pos] = r_.q * up(div_n(pos), r_.unroll_n);
      start_[pos] = total;
      total += up(kDivide * stride_[pos], page);
    }
    const size_t need = sizeof(T) * static_cast<size_t>(total + page);
    if (scratch_.size() < need) scratch_.assign(need, 0);
    sa_ = reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(scratch_.data()) + 4095) & ~uintptr_t{4095});
  }

  long div_n(long pos) const { return (range_n_[pos + 1] - range_n_[pos] + kDivide - 1) / kDivide; }

  /// C times beta: each thread its rows of its group's columns.
  void scale_by_beta() {
    if (x_.beta == T(1)) return;
    for (long pos = 0; pos < threads_; ++pos) {
      const long pn = pos / threads_m_, pm = pos - pn * threads_m_;
      const long m0 = range_m_[pm], m1 = range_m_[pm + 1];
      const long n0 = range_n_[pn * threads_m_], n1 = range_n_[(pn + 1) * threads_m_];
      if (m1 > m0 && n1 > n0) r_.beta(m1 - m0, n1 - n0, 0, x_.beta, nullptr, 0, nullptr, 0, x_.c_at(m0, n0), x_.ldc);
    }
  }

  /// Every thread's columns of op(B)'s rows [ls, ls + l), in its buffers,
  /// packed in pieces of min_jj (the panels' bytes do not depend on who
  /// packs them; its own kernel calls take those pieces).
  void pack_columns(long ls, long l) {
    buffers_.assign(threads_, {});
    for (long pos = 0; pos < threads_; ++pos) {
      const long n0 = range_n_[pos], n1 = range_n_[pos + 1], width = div_n(pos);
      for (long js = n0, side = 0; js < n1; js += width, ++side) {
        const long end = std::min(n1, js + width);
        T* const panel = sa_ + start_[pos] + side * stride_[pos];
        Buffer buf{js, end - js, panel, {}};
        for (long jjs = js, jj = 0; jjs < end; jjs += jj) {
          jj = end - jjs;
          if (jj >= 3 * r_.unroll_n) {
            jj = 3 * r_.unroll_n;
          } else if (jj > r_.unroll_n) {
            jj = r_.unroll_n;
          }
          (x_.tb == 0 ? r_.oncopy : r_.otcopy)(l, jj, x_.b_at(ls, jjs), x_.ldb, panel + l * (jjs - js));
          buf.own.emplace_back(jjs, jj);
        }
        buffers_[pos].push_back(std::move(buf));
      }
    }
  }

  /// Thread `pos`'s rows times every column, for the inner dimension's
  /// block [ls, ls + l): its first rows against its own columns piece by
  /// piece and the others' buffer by buffer, then its later rows against
  /// every buffer.
  void add_rows_of(long pos, long ls, long l) {
    const long pn = pos / threads_m_, pm = pos - pn * threads_m_;
    const long m0 = range_m_[pm], m1 = range_m_[pm + 1];
    if (m1 <= m0) return;
    auto after = [&](long cur) { return cur + 1 >= (pn + 1) * threads_m_ ? pn * threads_m_ : cur + 1; };
    long rows = m1 - m0;
    if (rows >= r_.p * 2) {
      rows = r_.p;
    } else if (rows > r_.p) {
      rows = (rows / 2 + r_.unroll_m - 1) / r_.unroll_m * r_.unroll_m;
    }
    pack_rows(m0, rows, ls, l);
    for (const Buffer& buf : buffers_[pos]) {
      for (const auto& [col, width] : buf.own) kernel(m0, rows, l, col, width, buf.panel + l * (col - buf.col));
    }
    for (long cur = after(pos); cur != pos; cur = after(cur)) {
      for (const Buffer& buf : buffers_[cur]) kernel(m0, rows, l, buf.col, buf.width, buf.panel);
    }
    for (long is = m0 + rows; is < m1; is += rows) {
      rows = m1 - is;
      if (rows >= r_.p * 2) {
        rows = r_.p;
      } else if (rows > r_.p) {
        rows = ((rows + 1) / 2 + r_.unroll_m - 1) / r_.unroll_m * r_.unroll_m;
      }
      pack_rows(is, rows, ls, l);
      long cur = pos;
      do {
        for (const Buffer& buf : buffers_[cur]) kernel(is, rows, l, buf.col, buf.width, buf.panel);
        cur = after(cur);
      } while (cur != pos);
    }
  }

  /// op(A)'s rows [row, row + rows), columns [ls, ls + l), into A's panel.
  void pack_rows(long row, long rows, long ls, long l) {
    (x_.ta == 0 ? r_.itcopy : r_.incopy)(l, rows, x_.a_at(row, ls), x_.lda, sa_);
  }

  void kernel(long row, long rows, long l, long col, long width, const T* panel) {
    r_.kernel(rows, width, l, x_.alpha, sa_, panel, x_.c_at(row, col), x_.ldc);
  }

  const Rule<T>& r_;
  const Product<T>& x_;
  std::vector<unsigned char>& scratch_;
  long threads_m_ = 1, threads_ = 1;
  std::vector<long> range_m_, range_n_, start_, stride_;
  std::vector<std::vector<Buffer>> buffers_;
  T* sa_ = nullptr;
};

/// The product as OpenBLAS at s.threads threads adds it, on this thread;
/// false, nothing done, where OpenBLAS adds it alike at any count.
template <typename T>
bool run_in_threads_order(ThreadState& s, const char* transa, const char* transb, const int* m, const int* n,
                          const int* k, const T* alpha, const T* a, const int* lda, const T* b, const int* ldb,
                          const T* beta, T* c, const int* ldc) {
  const Rule<T>& r = rule_of<T>(s);
  if (!r.unavailable.empty()) return false;
  const int ta = transposed(*transa), tb = transposed(*transb);
  if (ta < 0 || tb < 0 || *m <= 0 || *n <= 0 || *k < 0) return false;
  if (*lda < std::max(1, ta == 0 ? *m : *k) || *ldb < std::max(1, tb == 0 ? *k : *n) || *ldc < std::max(1, *m)) {
    return false;  // OpenBLAS's own error
  }
  // interface/gemm.c: its small-matrix kernels, then M·N·K <=
  // SMP_THRESHOLD_MIN × GEMM_MULTITHREAD_THRESHOLD on one thread.
  if (r.permit(ta, tb, *m, *n, *k, *alpha, *beta) != 0) return false;
  if (static_cast<double>(*m) * *n * *k <= 65536.0 * 4) return false;
  const Product<T> x{ta, tb, *m, *n, *k, *lda, *ldb, *ldc, *alpha, *beta, a, b, c};
  if (!ThreadedDriver<T>(r, s.threads, x, s.scratch).run()) return false;
  ++s.split;
  return true;
}

template <typename T>
void gemm(const char* transa, const char* transb, const int* m, const int* n, const int* k, const T* alpha,
          const T* a, const int* lda, const T* b, const int* ldb, const T* beta, T* c, const int* ldc) {
  ThreadState& s = t_state;
  if (s.threads > 1 && run_in_threads_order(s, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) {
    return;
  }
  openblas_gemm<T>()(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace

ThreadedProductsOnOneThread::ThreadedProductsOnOneThread(int threads) : previous_(t_state.threads) {
  if (threads > 1) {
    t_state.single = active_rule<float>();  // the kernels may have switched since the last scope
    t_state.twice = active_rule<double>();
    t_state.threads = threads;
  }
}

ThreadedProductsOnOneThread::~ThreadedProductsOnOneThread() { t_state.threads = previous_; }

std::string threaded_products_unavailable() {
  const std::string single = active_rule<float>().unavailable, twice = active_rule<double>().unavailable;
  std::string why = single.empty() ? "" : "float32: " + single;
  if (!twice.empty()) why += (why.empty() ? "" : "; ") + std::string("float64: ") + twice;
  return why;
}

long threaded_products_split() { return t_state.split; }

}  // namespace pathkernel

/// Every float32 and float64 matrix product LibTorch asks of the BLAS (it
/// calls sgemm_ and dgemm_; the program's definitions come first),
/// forwarded to OpenBLAS's, in its threaded driver's order inside a
/// ThreadedProductsOnOneThread.
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc) {
  pathkernel::gemm<float>(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

extern "C" void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const double* alpha, const double* a, const int* lda, const double* b, const int* ldb,
                       const double* beta, double* c, const int* ldc) {
  pathkernel::gemm<double>(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
