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

Then the test side's forward products of one test point (ROWS quadrature
rows a step, about what `verify --test 1` evaluates on that CNN), one
step's rows against STEPS steps' rows at once in one batched product (each
step its own weights): whether forming several steps' test features
together would run their products faster.
"""
import time

import torch

BATCH = 128
# (output channels, input channels x 3 x 3, output positions) of the two
# convolutions: 1 -> 16 channels on 28 x 28, 16 -> 32 channels on 14 x 14.
CONVOLUTIONS = [(16, 9, 784), (32, 144, 196)]
ROWS = 12   # a test point's quadrature rows a step (the bench's evaluations_per_step_1: 11.9)
STEPS = 8   # steps formed at once
# (rows' positions x inputs, outputs) of the test side's forward products:
# the two convolutions from their patches, and the hidden Linear layer.
TEST_PRODUCTS = [(784, 9, 16), (196, 144, 32), (1, 1568, 64)]


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
    print(f"\n{'test-side product':>24} {'one step':>10} {f'{STEPS} steps at once':>18}   (GFLOP/s)")
    for positions, q, cout in TEST_PRODUCTS:
        m = ROWS * positions
        one_a = torch.randn(m, q, dtype=torch.float64)
        one_w = torch.randn(q, cout, dtype=torch.float64)
        many_a = torch.randn(STEPS, m, q, dtype=torch.float64)
        many_w = torch.randn(STEPS, q, cout, dtype=torch.float64)
        flop = 2 * m * q * cout
        one = flop / seconds(lambda: one_a @ one_w) / 1e9
        many = STEPS * flop / seconds(lambda: torch.bmm(many_a, many_w)) / 1e9
        print(f"{f'[{m}, {q}] x [{q}, {cout}]':>24} {one:10.1f} {many:18.1f}")


if __name__ == "__main__":
    main()
