#!/usr/bin/env python3
"""The paper's Algorithm 1 in PyTorch with functorch's vmap: the way the
existing Python tools compute the exact path kernel. The benchmark's peer.

Reads the export of pathkernel's benchmark (bench/work/peer_input):
weights.npy [N+1, P] (every step, float64), x_train.npy, y_train.npy,
x_test.npy, learning_rates.npy [N], spec.json ({"model": "mlp:H,..", "T": T}).
At every step it materialises every training point's Jacobian [M, K, P] with
vmap(jacrev), averages the test points' Jacobians over a left Riemann sum of
T nodes, contracts them, and scales by the loss derivative (NLL on
log-softmax). Writes contributions_peer.npy [n, M, K] and prints one JSON
object with the seconds the computation took (data loading excluded).
"""
import argparse
import json
import os
import platform
import time

import numpy as np
import torch
from functorch import jacrev, vmap


def mlp_layout(model, d_in, k):
    """(name, shape) of each parameter in pathkernel's flat order: fc1.weight, fc1.bias, ..."""
    kind, _, rest = model.partition(":")
    if kind != "mlp":
        raise SystemExit(f"the peer covers mlp models (got {model!r})")
    widths = [int(w) for w in rest.split(":")[0].split(",")]
    dims = [d_in] + widths + [k]
    layout = []
    for i in range(len(dims) - 1):
        layout.append((f"fc{i + 1}.weight", (dims[i + 1], dims[i])))
        layout.append((f"fc{i + 1}.bias", (dims[i + 1],)))
    return layout


def unflatten(w, layout):
    out, off = [], 0
    for _, shape in layout:
        n = int(np.prod(shape))
        out.append(w[off:off + n].reshape(shape))
        off += n
    return out


def forward(params, x):
    """ReLU MLP with log-softmax output on one input x [d]."""
    h = x
    layers = len(params) // 2
    for l in range(layers):
        h = torch.nn.functional.linear(h, params[2 * l], params[2 * l + 1])
        if l + 1 < layers:
            h = torch.relu(h)
    return torch.log_softmax(h, dim=-1)


def jacobians(params, xs):
    """Per-sample Jacobians [B, K, P] by vmap(jacrev)."""
    per_param = vmap(jacrev(forward), in_dims=(None, 0))(params, xs)
    return torch.cat([j.reshape(j.shape[0], j.shape[1], -1) for j in per_param], dim=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="the benchmark's export directory")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    d = args.dir
    spec = json.load(open(os.path.join(d, "spec.json")))
    W = torch.from_numpy(np.load(os.path.join(d, "weights.npy"))).to(dtype)
    X = torch.from_numpy(np.load(os.path.join(d, "x_train.npy"))).to(dtype)
    Y = torch.from_numpy(np.load(os.path.join(d, "y_train.npy")))
    x = torch.from_numpy(np.load(os.path.join(d, "x_test.npy"))).to(dtype)
    lr = np.load(os.path.join(d, "learning_rates.npy"))
    T = int(spec["T"])
    M, n, steps = X.shape[0], x.shape[0], W.shape[0] - 1
    K = int(Y.max()) + 1
    layout = mlp_layout(spec["model"], X.shape[1], K)

    t0 = time.perf_counter()
    C = torch.zeros(n, M, K, dtype=dtype)
    L = -torch.nn.functional.one_hot(Y, K).to(dtype)  # dℓ/df for NLL on log-softmax, [M, K]
    with torch.no_grad():
        for s in range(steps):
            w, dw = W[s], W[s + 1] - W[s]
            JX = jacobians(unflatten(w, layout), X)  # [M, K, P]
            Jx = torch.zeros(n, K, w.shape[0], dtype=dtype)
            for j in range(T):
                Jx += jacobians(unflatten(w + (j / T) * dw, layout), x) / T
            G = torch.einsum("ijp,nkp->nijk", JX, Jx)  # [n, M, K, K]
            C += (-lr[s] / M) * torch.einsum("ij,nijk->nik", L, G)
    seconds = time.perf_counter() - t0
    np.save(os.path.join(d, "contributions_peer.npy"), C.to(torch.float64).numpy())
    print(json.dumps({"seconds": seconds, "T": T, "steps": steps, "dtype": args.dtype,
                      "torch": torch.__version__, "python": platform.python_version(),
                      "threads": args.threads}))


if __name__ == "__main__":
    main()
