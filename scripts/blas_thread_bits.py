#!/usr/bin/python3
"""How many float32 products OpenBLAS adds otherwise on two threads than on
one, and how many of them pathkernel's rule reproduces on one thread
(include/pathkernel/threaded_products.h: the threaded driver's k-blocks in
turn, a block the small-matrix kernels would take widened with zero columns).

Calls OpenBLAS's sgemm_ directly (ctypes), on the kernels it chose or those
OPENBLAS_CORETYPE names, with its block size Q and unroll read from its table
of kernels as the engine reads them:

  scripts/blas_thread_bits.py                        # 157 shapes x 4 transposes
  OPENBLAS_CORETYPE=SkylakeX scripts/blas_thread_bits.py --shapes 300
"""
import argparse
import ctypes
import random

import numpy as np

LIB = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"
ob = ctypes.CDLL(LIB)
ob.openblas_get_corename.restype = ctypes.c_char_p
F = ctypes.POINTER(ctypes.c_float)


def ref(v):
    return ctypes.byref(ctypes.c_int(v))


def sgemm(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc):
    ob.sgemm_(ctypes.c_char_p(ta), ctypes.c_char_p(tb), ref(m), ref(n), ref(k), ctypes.byref(ctypes.c_float(1.0)),
              a.ctypes.data_as(F), ref(lda), b.ctypes.data_as(F), ref(ldb), ctypes.byref(ctypes.c_float(beta)),
              c.ctypes.data_as(F), ref(ldc))


def k_blocks(k, q, unroll):
    """OpenBLAS's cut of k: one thread's (unroll > 0) or the threaded driver's."""
    out, ls = [], 0
    while ls < k:
        r = k - ls
        l = q if r >= 2 * q else ((((r // 2) + unroll - 1) // unroll * unroll if unroll else (r + 1) // 2)
                                  if r > q else r)
        out.append((ls, l))
        ls += l
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", type=int, default=150, help="random shapes besides the fixed ones")
    a = ap.parse_args()
    kernels = ob.openblas_get_corename().decode()
    table = ctypes.c_void_p.in_dll(ob, "gotoblas").value
    ints = list((ctypes.c_int * 10).from_address(table))
    q, unroll = ints[5], ints[7]
    permit = getattr(ob, "sgemm_small_matrix_permit_" + kernels.upper())
    permit.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_float,
                       ctypes.c_float]
    random.seed(1)
    shapes = [(120, 128, 400), (128, 120, 400), (84, 128, 120), (400, 128, 120), (64, 128, 1568),
              (1568, 64, 128), (16, 12544, 9)]
    shapes += [(random.randint(1, 600), random.randint(1, 600), random.randint(1, 1500)) for _ in range(a.shapes)]
    total = differ = missed = widened = 0
    for m, n, k in shapes:
        for ta in (b"N", b"T"):
            for tb in (b"N", b"T"):
                rng = np.random.default_rng(m * 7 + n * 13 + k)
                A = rng.standard_normal(m * k).astype(np.float32)
                B = rng.standard_normal(k * n).astype(np.float32)
                C0 = rng.standard_normal(m * n).astype(np.float32)
                lda, ldb = (m if ta == b"N" else k), (k if tb == b"N" else n)
                out = {}
                for threads in (1, 2):
                    ob.openblas_set_num_threads(threads)
                    out[threads] = C0.copy()
                    sgemm(ta, tb, m, n, k, A, lda, B, ldb, 1.0, out[threads], m)
                ob.openblas_set_num_threads(1)
                blocks = k_blocks(k, q, 0)
                t, u = int(ta == b"T"), int(tb == b"T")
                if (m * n * k <= 65536 * 4 or permit(t, u, m, n, k, 1.0, 1.0)
                        or blocks == k_blocks(k, q, unroll)):
                    blocks = [(0, k)]
                n2 = n
                while any(permit(t, u, m, n2, l, 1.0, 1.0) for _, l in blocks) and len(blocks) > 1:
                    n2 *= 2
                widened += n2 != n
                # op(B) and C widened to n2 columns, zero past n
                if tb == b"N":
                    B2 = np.zeros((n2, k), np.float32)
                    B2[:n] = B.reshape(n, k)
                else:
                    B2 = np.zeros((k, n2), np.float32)
                    B2[:, :n] = B.reshape(k, n)
                B2 = B2.reshape(-1)
                ldb2 = k if tb == b"N" else n2
                C = np.zeros((n2, m), np.float32)
                C[:n] = C0.reshape(n, m)
                C = C.reshape(-1)
                beta = 1.0
                for ls, l in blocks:
                    As = A[ls * lda:] if ta == b"N" else A[ls:]
                    Bs = B2[ls:] if tb == b"N" else B2[ls * ldb2:]
                    sgemm(ta, tb, m, n2, l, As, lda, Bs, ldb2, beta, C, m)
                C = C.reshape(n2, m)[:n].reshape(-1)
                total += 1
                differ += not np.array_equal(out[1], out[2])
                missed += not np.array_equal(C, out[2])
    print(f"OpenBLAS {kernels} (Q {q}, unroll {unroll}): {total} products, {differ} differ between one thread "
          f"and two, the rule misses {missed} ({widened} widened)")


if __name__ == "__main__":
    main()
