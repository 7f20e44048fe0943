#!/usr/bin/env python3
"""GFLOP/s of the user CNN's per-sample convolution gradients, by how they
are called: the measurement behind BENCHMARKS.md's section on the user
CNN's one point (the training side's speed is its products' shapes).

Run with Debian's python3-torch (the LibTorch and OpenBLAS pathkernel calls):

    /usr/bin/python3 scripts/product_shapes.py

For each convolution of the user CNN (batch 128, float64, one thread), the
per-sample weight gradients sum_l delta[o, l] patch[q, l] as torch.bmm, as
the five-index einsum the engine's layer table calls, and, for scale, the
same arithmetic as one product of a shape OpenBLAS runs at its best.
"""
import time

import torch

BATCH = 128
# (output channels, input channels x 3 x 3, output positions) of the two
# convolutions: 1 -> 16 channels on 28 x 28, 16 -> 32 channels on 14 x 14.
CONVOLUTIONS = [(16, 9, 784), (32, 144, 196)]


def seconds(fn, runs=30):
    fn()
    start = time.perf_counter()
    for _ in range(runs):
        fn()
    return (time.perf_counter() - start) / runs


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"{'convolution':>14} {'call':>36} {'ms':>8} {'GFLOP/s':>8}")
    for cout, q, positions in CONVOLUTIONS:
        delta = torch.randn(1, BATCH, 1, cout, positions, dtype=torch.float64)
        patches = torch.randn(BATCH, 1, q, positions, dtype=torch.float64)
        flop = 2 * BATCH * cout * q * positions
        d3, p3 = delta.view(BATCH, cout, positions), patches.view(BATCH, q, positions)
        calls = [
            ("bmm [B, C, L] x [B, L, Q]", lambda: torch.bmm(d3, p3.transpose(1, 2))),
            ("einsum krgcl,rgql->krgcq", lambda: torch.einsum("krgcl,rgql->krgcq", delta, patches)),
            ("one [B*C, L] x [L, Q] (for scale)", lambda: d3.reshape(-1, positions) @ p3[0].t()),
        ]
        for name, fn in calls:
            s = seconds(fn)
            print(f"{cout:>5} x {q:>3} x {positions:>3} {name:>36} {s * 1e3:8.3f} {flop / s / 1e9:8.1f}")


if __name__ == "__main__":
    main()
