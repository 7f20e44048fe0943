#!/usr/bin/env python3
"""Whether a float64 training step's bits depend on the thread counts, and
whether a product split into row or column blocks keeps the bits of the
whole: the measurements behind BENCHMARKS.md's "What limits each missed
goal" (a replay runs ahead on one thread only where one thread gives the
run's bits).

Run with Debian's python3-torch (the LibTorch and OpenBLAS pathkernel calls):

    /usr/bin/python3 scripts/thread_bits.py

It prints, for the README CNN's shape of step (cnn:8,16 on 28 x 28 inputs,
a batch of 100), which tensors keep their bits when OpenMP and OpenBLAS run
on two threads instead of one, then how many block splits of products of
the CNNs' and MLPs' shapes give other bits than the whole product.
"""
import ctypes
import ctypes.util

import torch


def openblas():
    for name in ("openblas", "blas"):
        path = ctypes.util.find_library(name)
        if path is None:
            continue
        lib = ctypes.CDLL(path)
        if hasattr(lib, "openblas_set_num_threads"):
            return lib
    raise SystemExit("OpenBLAS not found: install libopenblas0-pthread")


BLAS = openblas()


def set_threads(openmp, blas):
    torch.set_num_threads(openmp)
    BLAS.openblas_set_num_threads(blas)


def cnn_step():
    """One step of the README CNN's shape: outputs and every gradient."""
    g = torch.Generator().manual_seed(1)
    d = torch.float64
    x = torch.randn(100, 1, 28, 28, dtype=d, generator=g)
    params = [torch.randn(*s, dtype=d, generator=g).requires_grad_()
              for s in [(8, 1, 3, 3), (8,), (16, 8, 3, 3), (16,), (10, 16 * 7 * 7), (10,)]]
    w1, b1, w2, b2, wl, bl = params
    y = torch.randint(0, 10, (100,), generator=g)
    h = torch.max_pool2d(torch.relu(torch.conv2d(x, w1, b1, padding=1)), 2)
    h = torch.max_pool2d(torch.relu(torch.conv2d(h, w2, b2, padding=1)), 2)
    out = torch.nn.functional.linear(h.flatten(1), wl, bl)
    torch.nn.functional.cross_entropy(out, y).backward()
    names = ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "out.weight", "out.bias"]
    return {"logits": out.detach(), **{n: p.grad for n, p in zip(names, params)}}


def thread_counts():
    set_threads(1, 1)
    one = cnn_step()
    print("A CNN step's tensors against one thread of each (True: the same bits):")
    print(f"  {'tensor':14s} {'OpenMP 2, OpenBLAS 2':>21s} {'OpenMP 2, OpenBLAS 1':>21s} {'OpenMP 1, OpenBLAS 2':>21s}")
    runs = {}
    for counts in [(2, 2), (2, 1), (1, 2)]:
        set_threads(*counts)
        runs[counts] = cnn_step()
    for name in one:
        cells = [str(torch.equal(one[name], runs[c][name])) for c in [(2, 2), (2, 1), (1, 2)]]
        print(f"  {name:14s} {cells[0]:>21s} {cells[1]:>21s} {cells[2]:>21s}")


def splits():
    set_threads(1, 1)
    g = torch.Generator().manual_seed(1)
    shapes = [(3000, 256, 100), (3000, 3, 256), (256, 100, 3000), (3, 256, 3000), (100, 10, 784),
              (100, 784, 10), (128, 64, 1568), (64, 1568, 128), (1568, 64, 128), (100, 256, 3000),
              (257, 33, 999), (13, 7, 5)]
    tried = differ = 0
    for m, n, k in shapes:
        a = torch.randn(m, k, dtype=torch.float64, generator=g)
        b = torch.randn(k, n, dtype=torch.float64, generator=g)
        whole = a @ b
        for cut in sorted({1, m // 2, m // 3, (m // 2) // 8 * 8, m - 1}):
            if 0 < cut < m:
                tried += 1
                same = torch.equal(whole[:cut], a[:cut] @ b) and torch.equal(whole[cut:], a[cut:] @ b)
                differ += not same
        for cut in sorted({1, n // 2, n - 1}):
            if 0 < cut < n:
                tried += 1
                same = torch.equal(whole[:, :cut], a @ b[:, :cut]) and torch.equal(whole[:, cut:], a @ b[:, cut:])
                differ += not same
    print(f"Products split in two blocks on one thread: {differ} of {tried} cuts give other bits than the whole")


if __name__ == "__main__":
    thread_counts()
    splits()
