#!/usr/bin/python3
"""A user's CNN loop on Fashion-MNIST, recorded compactly: the run's size, the
recorder's cost on the loop, and `pathkernel verify`.

The loop: two 3x3 convolutions (16 and 32 channels, padding 1), each with
ReLU and a 2x2 max-pool, a 64-unit hidden layer, 10 logits (105,866
parameters); Adam (lr 1e-3), batches of 128 from its own sampler, float32,
cross-entropy. One epoch is 468 steps. Data: Debian's dataset-fashion-mnist
(/usr/share/datasets/fashion-mnist).

Printed (and written as JSON with --json FILE):
  seconds_plain      the loop without the recorder
  seconds_recorded   the same loop (same initial weights, same batches) with it
  overhead           seconds_recorded / seconds_plain (goal <= 1.3), of the minima
  overheads          each repeat's recorded / plain (a plain and a recorded loop back to back)
  overhead_median    their median (the figure to quote on a shared, noisy machine)
  run_bytes          the whole run directory (goal <= 140 MB)
  path_bytes         checkpoints, optimizer state, batches, clip factors
  data_bytes         data/*.npy (the training and test sets, inside the run; inputs of 8-bit
                     pixels as uint8 codes and their 256 values)
  every_step_bytes   what every_step=True would store for the path (float64 w and buffers per step)
  verify             `pathkernel verify RUN --test N` (max_rel_error, replay_drift, seconds)

  scripts/measure_compact_recording.py --steps 468 --verify-test 10 --run /tmp/pk-cnn
  scripts/measure_compact_recording.py --steps 60 --verify-test 10     # quicker
  scripts/measure_compact_recording.py --steps 30 --run R --json F --threads 1   # the bench's user_cnn row
"""
import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, Iterator, List, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))
from pathkernel.record import Recorder, set_threads  # noqa: E402
from pathkernel._environment import _openblas_library as openblas_library  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"


def idx_file(name: str) -> np.ndarray:
    with gzip.open(os.path.join(DATA, name), "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def fashion_mnist() -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    def images(name: str) -> torch.Tensor:
        return torch.from_numpy(idx_file(name).astype(np.float32) / 255.0).unsqueeze(1)

    def labels(name: str) -> torch.Tensor:
        return torch.from_numpy(idx_file(name).astype(np.int64))

    return (images("train-images-idx3-ubyte.gz"), labels("train-labels-idx1-ubyte.gz"),
            images("t10k-images-idx3-ubyte.gz"), labels("t10k-labels-idx1-ubyte.gz"))


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 7 * 7, 64)
        self.out = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = F.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.out(torch.relu(self.fc1(x.flatten(1))))


def sampler(n: int, batch: int, steps: int) -> Iterator[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    s = 0
    while True:
        perm = torch.randperm(n, generator=g)
        for i in range(0, n - batch + 1, batch):
            if s == steps:
                return
            yield perm[i:i + batch]
            s += 1


def loop(x: torch.Tensor, y: torch.Tensor, xt: torch.Tensor, yt: torch.Tensor, steps: int,
         run: str = "", **recorder: object) -> float:
    """Seconds the loop takes (recorder construction and close included)."""
    torch.manual_seed(0)
    model = CNN()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    start = time.perf_counter()
    rec = Recorder(run, model, opt, x, y, test_x=xt, test_y=yt, overwrite=True, **recorder) if run else None
    for idx in sampler(x.shape[0], 128, steps):
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
        if rec is not None:
            rec.step(idx)
    if rec is not None:
        rec.close()
    return time.perf_counter() - start


def directory_bytes(run: str, under: str = "") -> int:
    total = 0
    for root, _, files in os.walk(os.path.join(run, under)):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def verify(run: str, test: int) -> Dict[str, object]:
    binary = os.environ.get("PATHKERNEL_BIN") or os.path.join(REPO, "build", "pathkernel")
    start = time.perf_counter()
    p = subprocess.run([binary, "--quiet", "--json", "verify", run, "--test", str(test)], capture_output=True,
                       text=True)
    if p.returncode != 0:
        return {"error": p.stderr[-2000:]}
    j = json.loads(p.stdout[p.stdout.find("{"):])
    drift = j.get("replay_drift", {})
    return {"max_rel_error": j["max_rel_error"], "max_abs_rounding": j["max_abs_rounding"],
            "updates_explained": j["updates_explained"], "replay_drift_max": drift.get("max_abs_diff"),
            "replay_drift_at": drift.get("at_checkpoint_step"), "bit_for_bit": drift.get("bit_for_bit"),
            "checkpoints": drift.get("checkpoints"), "seconds": time.perf_counter() - start}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=468)
    ap.add_argument("--run", default="", help="run directory (default: a temporary one, deleted)")
    ap.add_argument("--expected-steps", action="store_true", help="pass expected_steps=--steps to the Recorder")
    ap.add_argument("--summary-accuracy", action="store_true",
                    help="Recorder(summary_accuracy=True): the summary's accuracy pass over the data at close")
    ap.add_argument("--no-summary-accuracy", action="store_true",
                    help="Recorder(summary_accuracy=False), the default, passed explicitly")
    ap.add_argument("--repeats", type=int, default=2, help="timings: the minimum over this many loops each")
    ap.add_argument("--verify-test", type=int, default=0, help="run verify on this many test points (0: skip)")
    ap.add_argument("--json", default="", help="also write the figures to this file")
    ap.add_argument("--threads", type=int, default=0,
                    help="the loop's threads, torch's and OpenBLAS's (default: torch's own and OpenBLAS's own)")
    ap.add_argument("--blas-threads", type=int, default=0,
                    help="OpenBLAS's threads of the loop where they differ from --threads (as torch.set_num_threads "
                         "alone leaves them)")
    a = ap.parse_args()
    if a.threads > 0:
        set_threads(a.threads)
    if a.blas_threads > 0:
        openblas_library().openblas_set_num_threads(a.blas_threads)
    x, y, xt, yt = fashion_mnist()
    tmp = tempfile.mkdtemp(prefix="pk-cnn-")
    run = a.run or os.path.join(tmp, "run")
    kw = {"expected_steps": a.steps} if a.expected_steps else {}
    if a.summary_accuracy or a.no_summary_accuracy:
        kw["summary_accuracy"] = a.summary_accuracy
    plain, recorded = [], []
    for _ in range(a.repeats):  # alternate, so a change in the machine's load hits both
        plain.append(loop(x, y, xt, yt, a.steps))
        recorded.append(loop(x, y, xt, yt, a.steps, run, **kw))
    params = sum(p.numel() for p in CNN().parameters())
    out: Dict[str, object] = {
        "steps": a.steps, "parameters": params, "recorder_options": {k: v for k, v in kw.items()}, "threads": torch.get_num_threads(),
        "seconds_plain": min(plain), "seconds_recorded": min(recorded), "overhead": min(recorded) / min(plain),
        "overheads": [r / p for p, r in zip(plain, recorded)],
        "overhead_median": float(np.median([r / p for p, r in zip(plain, recorded)])),
        "run_bytes": directory_bytes(run), "data_bytes": directory_bytes(run, "data"),
        "path_bytes": sum(directory_bytes(run, d) for d in ("checkpoints", "optimizer", "batches")),
        "every_step_bytes": (a.steps + 1) * 3 * 8 * params,
        "checkpoints": len(os.listdir(os.path.join(run, "checkpoints")))}
    if a.verify_test > 0:
        out["verify"] = verify(run, a.verify_test)
    print(json.dumps(out, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    if not a.run:
        shutil.rmtree(tmp, True)


if __name__ == "__main__":
    main()
