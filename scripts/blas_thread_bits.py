#!/usr/bin/python3
"""How many products OpenBLAS adds otherwise on two threads than on one, and
how many of them pathkernel's rule reproduces on one thread
(include/pathkernel/threaded_products.h: OpenBLAS 0.3.21's threaded level-3
driver, driver/level3/level3_thread.c, followed step by step on one thread,
calling OpenBLAS's own packing, beta and kernel routines with the blocks and
widths each thread would give them).

An independent check of the engine's C++: the same driver written again
here, calling OpenBLAS's routines (ctypes) on the kernels it chose or those
OPENBLAS_CORETYPE names, with their block sizes read from its table of
kernels:

  scripts/blas_thread_bits.py                        # float32, 160 shapes x 4 transposes
  scripts/blas_thread_bits.py --dtype float64
  OPENBLAS_CORETYPE=Haswell scripts/blas_thread_bits.py --shapes 300
  scripts/blas_thread_bits.py --threads 8           # OpenBLAS runs more threads than cores
"""
import argparse
import ctypes
import random

import numpy as np

LIB = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"
ob = ctypes.CDLL(LIB)
ob.openblas_get_corename.restype = ctypes.c_char_p
KERNELS = ob.openblas_get_corename().decode()
L, P = ctypes.c_long, ctypes.c_void_p
# per dtype: the numpy type, the C scalar, the routines' letter
TYPES = {"float32": (np.float32, ctypes.c_float, "s"), "float64": (np.float64, ctypes.c_double, "d")}


def block_sizes(dtype):
    """GEMM_P, Q, R, UNROLL_M, UNROLL_N of the active kernels: float32's are
    the table's ints from byte 16; float64's the ints just before its first
    float64 routine (damax_k)."""
    table = ctypes.c_void_p.in_dll(ob, "gotoblas").value
    if dtype == "float32":
        return list((ctypes.c_int * 5).from_address(table + 16))
    first = ctypes.cast(getattr(ob, "damax_k_" + KERNELS.upper()), ctypes.c_void_p).value
    entries = (ctypes.c_void_p * 4096).from_address(table)
    at = next(i for i in range(4096) if entries[i] == first) * 8
    return list((ctypes.c_int * 5).from_address(table + at - 24))


def routines(dtype):
    """The active table's gemm routines of `dtype`, read from its entries
    (common_param.h: kernel, beta, incopy, itcopy, oncopy, otcopy, then the
    small-matrix rule), where OpenBLAS calls them: one routine's code may
    serve two entries (Prescott's dgemm_incopy is its dgemm_oncopy)."""
    _, scalar, letter = TYPES[dtype]
    table = ctypes.c_void_p.in_dll(ob, "gotoblas").value
    kernel = ctypes.cast(getattr(ob, f"{letter}gemm_kernel_{KERNELS.upper()}"), ctypes.c_void_p).value
    entries = (ctypes.c_void_p * 4096).from_address(table)
    at = next(i for i in range(4096) if entries[i] == kernel)
    kinds = {"kernel": [L, L, L, scalar, P, P, P, L], "beta": [L, L, L, scalar, P, L, P, L, P, L],
             "incopy": [L, L, P, L, P], "itcopy": [L, L, P, L, P], "oncopy": [L, L, P, L, P],
             "otcopy": [L, L, P, L, P], "small_matrix_permit": [ctypes.c_int, ctypes.c_int, L, L, L, scalar, scalar]}
    return {name: ctypes.CFUNCTYPE(ctypes.c_int, *args)(entries[at + i]) for i, (name, args) in enumerate(kinds.items())}


def aligned(count, dt):
    """A zeroed array of `count` elements starting on a page, as OpenBLAS's buffers do."""
    raw = np.zeros(count * np.dtype(dt).itemsize + 4096, np.uint8)
    skip = (-raw.ctypes.data) % 4096
    return raw[skip:skip + count * np.dtype(dt).itemsize].view(dt)


def ranges(start, size, parts, least):
    """gemm_driver's split of `size` into `parts`: each the rest over the parts left, at least `least`."""
    at, i = [start], 0
    while size > 0:
        width = max((size + parts - i - 1) // (parts - i), least)
        size -= width
        if size < 0:
            width += size
        at.append(at[-1] + width)
        i += 1
    return at + [at[-1]] * (parts + 1 - len(at))


def threaded(dtype, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, threads=2):
    """C (column-major, ldc = m) as OpenBLAS's threaded driver adds it at
    `threads` threads, every thread's share in turn; False where that driver
    hands the product to its one-thread driver."""
    dt = TYPES[dtype][0]
    item = np.dtype(dt).itemsize
    p, q, r, um, un = block_sizes(dtype)
    f = routines(dtype)
    switch, divide = 2, 2  # SWITCH_RATIO, DIVIDE_RATE as Debian's build has them
    tm = 1 if m < 2 * switch else threads
    while tm > 1 and m < tm * switch:
        tm //= 2
    tn = 1
    if n >= switch * tm:
        tn = (n + switch * tm - 1) // (switch * tm)
        if tm * tn > threads:
            tn = threads // tm
    nth = tm * tn
    if nth <= 1:
        return False
    a0, b0, c0 = A.ctypes.data, B.ctypes.data, C.ctypes.data
    sa = aligned(p * q, dt)
    range_m = ranges(0, m, tm, 1)

    def a_at(row, l):
        return a0 + ((row + l * lda) if ta == 0 else (l + row * lda)) * item

    def b_at(l, col):
        return b0 + ((l + col * ldb) if tb == 0 else (col + l * ldb)) * item

    def c_at(row, col):
        return c0 + (row + col * m) * item

    def rows_first(rows):
        return p if rows >= 2 * p else ((rows // 2 + um - 1) // um * um if rows > p else rows)

    def rows_next(rows):
        return p if rows >= 2 * p else (((rows + 1) // 2 + um - 1) // um * um if rows > p else rows)

    for js0 in range(0, n, r * nth):
        range_n = ranges(js0, min(n - js0, r * nth), nth, switch)
        for pos in range(nth):
            pn, pm = divmod(pos, tm)
            m0, m1, n0, n1 = range_m[pm], range_m[pm + 1], range_n[pn * tm], range_n[(pn + 1) * tm]
            if beta != 1.0 and m1 > m0 and n1 > n0:
                f["beta"](m1 - m0, n1 - n0, 0, beta, None, 0, None, 0, c_at(m0, n0), m)
        ls, keep = 0, []
        while ls < k and alpha != 0.0:
            l = q if k - ls >= 2 * q else ((k - ls + 1) // 2 if k - ls > q else k - ls)
            buffers = []  # per thread: (first column, width, panel's address, its owner's kernel calls)
            for pos in range(nth):
                n0, n1 = range_n[pos], range_n[pos + 1]
                div_n = (n1 - n0 + divide - 1) // divide
                stride = q * ((div_n + un - 1) // un * un)  # inner_thread's buffer[i] - buffer[i - 1]
                area = aligned(divide * stride, dt)  # the thread's own sb, on a page
                keep.append(area)
                mine = []
                for side, js in enumerate(range(n0, n1, max(div_n, 1))):  # none where n1 == n0
                    end = min(n1, js + div_n)
                    panel = area.ctypes.data + side * stride * item
                    calls, jjs = [], js
                    while jjs < end:
                        jj = end - jjs
                        jj = 3 * un if jj >= 3 * un else (un if jj > un else jj)
                        at = panel + l * (jjs - js) * item
                        f["oncopy" if tb == 0 else "otcopy"](l, jj, b_at(ls, jjs), ldb, at)
                        calls.append((jjs, jj, at))
                        jjs += jj
                    mine.append((js, end - js, panel, calls))
                buffers.append(mine)
            for pos in range(nth):
                pn, pm = divmod(pos, tm)
                m0, m1 = range_m[pm], range_m[pm + 1]
                if m1 <= m0:
                    continue
                order = [pn * tm + (pos - pn * tm + i) % tm for i in range(tm)]  # itself, then the others
                rows = rows_first(m1 - m0)
                f["itcopy" if ta == 0 else "incopy"](l, rows, a_at(m0, ls), lda, sa.ctypes.data)
                for js, width, panel, calls in buffers[pos]:
                    for col, jj, at in calls:
                        f["kernel"](rows, jj, l, alpha, sa.ctypes.data, at, c_at(m0, col), m)
                for cur in order[1:]:
                    for js, width, panel, _ in buffers[cur]:
                        f["kernel"](rows, width, l, alpha, sa.ctypes.data, panel, c_at(m0, js), m)
                i = m0 + rows
                while i < m1:
                    rows = rows_next(m1 - i)
                    f["itcopy" if ta == 0 else "incopy"](l, rows, a_at(i, ls), lda, sa.ctypes.data)
                    for cur in order:
                        for js, width, panel, _ in buffers[cur]:
                            f["kernel"](rows, width, l, alpha, sa.ctypes.data, panel, c_at(i, js), m)
                    i += rows
            ls += l
    return True


def gemm(dtype, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C):
    _, scalar, letter = TYPES[dtype]
    ptr = ctypes.POINTER(scalar)

    def ref(v):
        return ctypes.byref(ctypes.c_int(v))

    getattr(ob, letter + "gemm_")(ctypes.c_char_p(b"NT"[ta:ta + 1]), ctypes.c_char_p(b"NT"[tb:tb + 1]), ref(m),
                                  ref(n), ref(k), ctypes.byref(scalar(alpha)), A.ctypes.data_as(ptr), ref(lda),
                                  B.ctypes.data_as(ptr), ref(ldb), ctypes.byref(scalar(beta)), C.ctypes.data_as(ptr),
                                  ref(m))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", type=int, default=150, help="random shapes besides the fixed ones")
    ap.add_argument("--dtype", choices=sorted(TYPES), default="float32")
    ap.add_argument("--threads", type=int, default=2, help="OpenBLAS's count to reproduce on one thread")
    a = ap.parse_args()
    dt = TYPES[a.dtype][0]
    permit = routines(a.dtype)["small_matrix_permit"]
    random.seed(1)
    shapes = [(120, 128, 400), (128, 120, 400), (84, 128, 120), (400, 128, 120), (64, 128, 1568),
              (1568, 64, 128), (16, 12544, 9), (200, 200, 300), (3, 500, 700), (2, 900, 300)]
    shapes += [(random.randint(1, 600), random.randint(1, 600), random.randint(1, 1500)) for _ in range(a.shapes)]
    total = differ = missed = 0
    for m, n, k in shapes:
        for ta in (0, 1):
            for tb in (0, 1):
                rng = np.random.default_rng(m * 7 + n * 13 + k)
                A = rng.standard_normal(m * k).astype(dt)
                B = rng.standard_normal(k * n).astype(dt)
                C0 = rng.standard_normal(m * n).astype(dt)
                lda, ldb = (m if ta == 0 else k), (k if tb == 0 else n)
                out = {}
                for threads in (1, a.threads):
                    ob.openblas_set_num_threads(threads)
                    out[threads] = C0.copy()
                    gemm(a.dtype, ta, tb, m, n, k, 1.0, A, lda, B, ldb, 1.0, out[threads])
                ob.openblas_set_num_threads(1)
                C = C0.copy()
                # interface/gemm.c: the small-matrix kernels, and small products, at any count
                if (permit(ta, tb, m, n, k, 1.0, 1.0) or m * n * k <= 65536 * 4
                        or not threaded(a.dtype, ta, tb, m, n, k, 1.0, A, lda, B, ldb, 1.0, C, a.threads)):
                    C = out[1]
                total += 1
                differ += not np.array_equal(out[1], out[a.threads])
                missed += not np.array_equal(C, out[a.threads])
    print(f"OpenBLAS {KERNELS}, {a.dtype}: {total} products, {differ} differ between one thread and {a.threads}, "
          f"the rule misses {missed}")


if __name__ == "__main__":
    main()
