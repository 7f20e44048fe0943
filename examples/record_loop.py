"""A user's own PyTorch training loop, recorded for pathkernel.

The loop is ordinary PyTorch: a ReLU network, Adam with weight decay, a
cosine schedule, gradient clipping by norm, the loop's own shuffled batches.
Three lines record it (marked below); then every pathkernel command reads the
run directory:

    PYTHONPATH=python /usr/bin/python3 examples/record_loop.py runs/loop
    build/pathkernel info runs/loop
    build/pathkernel verify runs/loop --test 10 --json
    build/pathkernel explain runs/loop --test-index 0 --out runs/loop/explain

The data is either two interleaved spirals (the default: no download) or,
with --data fashion-mnist, a subset of Debian's Fashion-MNIST.
"""
import argparse
import gzip
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from pathkernel.record import Recorder, clip_grad_norm_, set_threads


def spirals(n, seed):
    g = np.random.default_rng(seed)
    t = g.uniform(0.25, 3.0 * math.pi, n)
    label = g.integers(0, 3, n)
    angle = t + label * 2.0 * math.pi / 3.0
    x = np.stack([t * np.cos(angle), t * np.sin(angle)], 1) / 3.0 + g.normal(0, 0.05, (n, 2))
    return torch.tensor(x), torch.tensor(label, dtype=torch.long)


def fashion_mnist(n, split):
    root = "/usr/share/datasets/fashion-mnist"
    if not os.path.isdir(root):
        sys.exit("Fashion-MNIST is not installed: apt-get install dataset-fashion-mnist (make deps does)")
    prefix = "train" if split == "train" else "t10k"
    with gzip.open(os.path.join(root, prefix + "-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)[:n]
    with gzip.open(os.path.join(root, prefix + "-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)[:n]
    return torch.tensor(images / 255.0), torch.tensor(labels.astype(np.int64))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="the run directory to write")
    p.add_argument("--data", choices=["spirals", "fashion-mnist"], default="spirals")
    p.add_argument("--train", type=int, default=300, help="training points")
    p.add_argument("--test", type=int, default=100, help="test points")
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=30)
    p.add_argument("--clip", type=float, default=1.0, help="max gradient norm (0: no clipping)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--every-step", action="store_true",
                   help="store every step's weights (the format before compact recordings, which older "
                        "pathkernel binaries read) instead of checkpoints that pathkernel replays between")
    a = p.parse_args()

    torch.set_default_dtype(torch.float64)  # the exactness claim is for float64
    set_threads(1)  # torch and OpenBLAS on one thread: pathkernel replays the loop beside its own work
    torch.manual_seed(a.seed)
    if a.data == "spirals":
        train_x, train_y = spirals(a.train, a.seed)
        test_x, test_y = spirals(a.test, a.seed + 1)
    else:
        train_x, train_y = fashion_mnist(a.train, "train")
        test_x, test_y = fashion_mnist(a.test, "test")
    classes = int(train_y.max()) + 1
    model = nn.Sequential(nn.Linear(train_x.shape[1], a.hidden), nn.ReLU(),
                          nn.Linear(a.hidden, a.hidden), nn.ReLU(), nn.Linear(a.hidden, classes))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-4)
    steps = a.epochs * math.ceil(a.train / a.batch)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)

    start = time.time()
    rec = Recorder(a.out, model, optimizer, train_x, train_y, test_x=test_x, test_y=test_y,  # 1
                   loss="cross_entropy", overwrite=True, every_step=a.every_step)
    g = torch.Generator().manual_seed(a.seed)
    for epoch in range(a.epochs):
        for idx in torch.randperm(a.train, generator=g).split(a.batch):
            optimizer.zero_grad()
            F.cross_entropy(model(train_x[idx]), train_y[idx]).backward()
            if a.clip > 0:
                clip_grad_norm_(model.parameters(), a.clip)  # torch's clipping, and the factor remembered
            optimizer.step()
            rec.step(idx)                                    # 2
            scheduler.step()
    rec.close()                                              # 3
    seconds = time.time() - start
    with torch.no_grad():
        accuracy = (model(test_x).argmax(1) == test_y).double().mean().item()
    print("recorded %d steps of %d parameters to %s in %.1f s: %.0f bytes per step; test accuracy %.3f"
          % (steps, sum(q.numel() for q in model.parameters()), a.out, seconds, rec.bytes_per_step, accuracy))


if __name__ == "__main__":
    main()
