#!/usr/bin/python3
"""How many float32 (or float64) products OpenBLAS adds otherwise on two
threads than on one, and how many of them pathkernel's rule reproduces on one thread
(include/pathkernel/threaded_products.h: the threaded driver's k-blocks in
turn, a block the small-matrix kernels would take widened with zero columns).

Calls OpenBLAS's sgemm_ (dgemm_) directly (ctypes), on the kernels it chose
or those OPENBLAS_CORETYPE names, with its block size Q and unroll read from
its table of kernels as the engine reads them:

  scripts/blas_thread_bits.py                        # 157 shapes x 4 transposes
  scripts/blas_thread_bits.py --dtype float64
  OPENBLAS_CORETYPE=SkylakeX scripts/blas_thread_bits.py --shapes 300
"""
import argparse
import ctypes
import random

import numpy as np

LIB = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"
ob = ctypes.CDLL(LIB)
ob.openblas_get_corename.restype = ctypes.c_char_p
# per dtype: the numpy type, the C scalar, the routine's letter
TYPES = {"float32": (np.float32, ctypes.c_float, "s"), "float64": (np.float64, ctypes.c_double, "d")}


def ref(v):
    return ctypes.byref(ctypes.c_int(v))


def gemm(dtype, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc):
    _, scalar, letter = TYPES[dtype]
    P = ctypes.POINTER(scalar)
    getattr(ob, letter + "gemm_")(ctypes.c_char_p(ta), ctypes.c_char_p(tb), ref(m), ref(n), ref(k),
                                  ctypes.byref(scalar(1.0)), a.ctypes.data_as(P), ref(lda), b.ctypes.data_as(P),
                                  ref(ldb), ctypes.byref(scalar(beta)), c.ctypes.data_as(P), ref(ldc))


def block_rule(dtype, kernels):
    """Q and the unroll of the active kernels' products of `dtype`, from
    OpenBLAS's table: float32's are its 6th and 8th ints; float64's are the
    ints just before the float64 routines (dgemm's P, Q, R, unrolls M, N,
    MN, then damax_k)."""
    table = ctypes.c_void_p.in_dll(ob, "gotoblas").value
    if dtype == "float32":
        ints = list((ctypes.c_int * 10).from_address(table))
        return ints[5], ints[7]
    first = ctypes.cast(getattr(ob, "damax_k_" + kernels.upper()), ctypes.c_void_p).value
    entries = (ctypes.c_void_p * 4096).from_address(table)
    at = next(i for i in range(4096) if entries[i] == first) * 8
    ints = list((ctypes.c_int * 6).from_address(table + at - 24))
    return ints[1], ints[3]


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
    ap.add_argument("--dtype", choices=sorted(TYPES), default="float32")
    a = ap.parse_args()
    kernels = ob.openblas_get_corename().decode()
    dt, scalar, letter = TYPES[a.dtype]
    q, unroll = block_rule(a.dtype, kernels)
    permit = getattr(ob, letter + "gemm_small_matrix_permit_" + kernels.upper())
    permit.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long, ctypes.c_long, scalar, scalar]
    random.seed(1)
    shapes = [(120, 128, 400), (128, 120, 400), (84, 128, 120), (400, 128, 120), (64, 128, 1568),
              (1568, 64, 128), (16, 12544, 9)]
    shapes += [(random.randint(1, 600), random.randint(1, 600), random.randint(1, 1500)) for _ in range(a.shapes)]
    total = differ = missed = widened = 0
    for m, n, k in shapes:
        for ta in (b"N", b"T"):
            for tb in (b"N", b"T"):
                rng = np.random.default_rng(m * 7 + n * 13 + k)
                A = rng.standard_normal(m * k).astype(dt)
                B = rng.standard_normal(k * n).astype(dt)
                C0 = rng.standard_normal(m * n).astype(dt)
                lda, ldb = (m if ta == b"N" else k), (k if tb == b"N" else n)
                out = {}
                for threads in (1, 2):
                    ob.openblas_set_num_threads(threads)
                    out[threads] = C0.copy()
                    gemm(a.dtype, ta, tb, m, n, k, A, lda, B, ldb, 1.0, out[threads], m)
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
                    B2 = np.zeros((n2, k), dt)
                    B2[:n] = B.reshape(n, k)
                else:
                    B2 = np.zeros((k, n2), dt)
                    B2[:, :n] = B.reshape(k, n)
                B2 = B2.reshape(-1)
                ldb2 = k if tb == b"N" else n2
                C = np.zeros((n2, m), dt)
                C[:n] = C0.reshape(n, m)
                C = C.reshape(-1)
                beta = 1.0
                for ls, l in blocks:
                    As = A[ls * lda:] if ta == b"N" else A[ls:]
                    Bs = B2[ls:] if tb == b"N" else B2[ls * ldb2:]
                    gemm(a.dtype, ta, tb, m, n2, l, As, lda, Bs, ldb2, beta, C, m)
                C = C.reshape(n2, m)[:n].reshape(-1)
                total += 1
                differ += not np.array_equal(out[1], out[2])
                missed += not np.array_equal(C, out[2])
    print(f"OpenBLAS {kernels}, {a.dtype} (Q {q}, unroll {unroll}): {total} products, {differ} differ between one thread "
          f"and two, the rule misses {missed} ({widened} widened)")


if __name__ == "__main__":
    main()
