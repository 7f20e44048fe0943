#!/usr/bin/python3
"""How a user's CNN is written decides how fast pathkernel walks it.

Records the same small user CNN (two 3x3 convolutions of 16 and 32 channels,
ReLU, 2x2 max-pools, a 64-unit layer, 10 logits; Adam (--optimizer sgd:
plain SGD), batch 128, float32, Fashion-MNIST's first --train images)
written several ways (and once traced instead of scripted), with variants
of its layers (no padding; stride-2 convolutions instead of pools; average
pools; leaky ReLUs; a third convolution; a second hidden layer; and
LeNet-5 with ReLUs), each in its
own loop with pathkernel.record, then runs
`pathkernel verify RUN --test 1 --json`
on each and prints one line per spelling: the route, whether the module was
walked as a chain (verify's `route_reason` is empty) or its rewritten graph
run (the reason names the operation that breaks the chain), the seconds, the
ratio to the first spelling's, and max_rel_error.

  scripts/user_cnn_spellings.py                      # every spelling, 30 steps
  scripts/user_cnn_spellings.py --only view_rest log_softmax --steps 10
  scripts/user_cnn_spellings.py --only flatten --optimizer sgd   # plain SGD: the forward walk
  scripts/user_cnn_spellings.py --only two_hidden --epoch --keep DIR   # one epoch, against its loop
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "scripts"))
from measure_compact_recording import fashion_mnist, sampler  # noqa: E402
from pathkernel.record import Recorder, set_threads  # noqa: E402


class Base(nn.Module):
    """The CNN with flatten(1) and logits: the reference spelling."""

    def __init__(self, bias: bool = True, padding: "int | str" = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=padding, bias=bias)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=padding, bias=bias)
        self.fc1 = nn.Linear(32 * 7 * 7, 64)
        self.out = nn.Linear(64, 10)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(torch.relu(self.conv1(x)), 2)
        return F.max_pool2d(torch.relu(self.conv2(x)), 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.fc1(self.features(x).flatten(1))))


class Sequential(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(32 * 7 * 7, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class ViewRest(Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.fc1(self.features(x).view(-1, 32 * 7 * 7))))


class ReshapeShape(Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.features(x)
        return self.out(torch.relu(self.fc1(h.reshape(h.shape[0], -1))))


class LogSoftmax(Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.out(torch.relu(self.fc1(self.features(x).flatten(1)))), dim=1)


class NoBias(Base):
    def __init__(self) -> None:
        super().__init__(bias=False)


class SamePadding(Base):
    """padding='same' for padding=1: the same numbers."""

    def __init__(self) -> None:
        super().__init__(padding="same")


class NoPadding(Base):
    """Convolutions without padding: 28 -> 26 -> 13 -> 11 -> 5 (pools drop the odd row)."""

    def __init__(self) -> None:
        super().__init__(padding=0)
        self.fc1 = nn.Linear(32 * 5 * 5, 64)


class Stride2(Base):
    """Convolutions of stride 2 (padding 1) instead of max-pools: 28 -> 14 -> 7."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=1)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv2(torch.relu(self.conv1(x))))


class Dropout(Base):
    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.25)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.fc1(self.drop(self.features(x).flatten(1)))))


class AvgPool(Base):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.avg_pool2d(torch.relu(self.conv1(x)), 2)
        x = F.avg_pool2d(torch.relu(self.conv2(x)), 2)
        return self.out(torch.relu(self.fc1(x.flatten(1))))


class LeakyReLU(Base):
    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.leaky_relu(self.conv1(x)), 2)
        return F.max_pool2d(F.leaky_relu(self.conv2(x)), 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.leaky_relu(self.fc1(self.features(x).flatten(1))))


class ThreeConv(Base):
    """A third convolution (32 channels) and its pool: 28 -> 14 -> 7 -> 3, fc1 of 32 x 3 x 3."""

    def __init__(self) -> None:
        super().__init__()
        self.conv3 = nn.Conv2d(32, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 3 * 3, 64)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = F.max_pool2d(torch.relu(self.conv2(x)), 2)
        return F.max_pool2d(torch.relu(self.conv3(x)), 2)


class TwoHidden(Base):
    """A second hidden layer (64 -> 32 units) before the logits."""

    def __init__(self) -> None:
        super().__init__()
        self.fc2 = nn.Linear(64, 32)
        self.out = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(self.features(x).flatten(1)))
        return self.out(torch.relu(self.fc2(h)))


class LeNet(nn.Module):
    """LeNet-5 with ReLUs and max-pools: 5 x 5 convolutions of 6 and 16 channels
    (28 -> 28 -> 14 -> 10 -> 5), then 400 -> 120 -> 84 -> 10; 61,706 parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.out = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = F.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        return self.out(torch.relu(self.fc2(x)))


# name: (module, loss); in the order printed.
SPELLINGS = {
    "flatten": (Base, "cross_entropy"),
    "sequential": (Sequential, "cross_entropy"),
    "view_rest": (ViewRest, "cross_entropy"),
    "reshape_shape": (ReshapeShape, "cross_entropy"),
    "log_softmax": (LogSoftmax, "nll"),
    "no_bias": (NoBias, "cross_entropy"),
    "same_padding": (SamePadding, "cross_entropy"),
    "traced": (Base, "cross_entropy"),  # recorded as torch.jit.trace(model, two images)
    "no_padding": (NoPadding, "cross_entropy"),
    "stride2": (Stride2, "cross_entropy"),
    "dropout": (Dropout, "cross_entropy"),
    "avg_pool": (AvgPool, "cross_entropy"),
    "leaky_relu": (LeakyReLU, "cross_entropy"),
    "three_conv": (ThreeConv, "cross_entropy"),
    "two_hidden": (TwoHidden, "cross_entropy"),
    "lenet": (LeNet, "cross_entropy"),
}


def record(name: str, run: str, x: torch.Tensor, y: torch.Tensor, xt: torch.Tensor, yt: torch.Tensor,
           steps: int, optimizer: str = "adam", recorded: bool = True) -> float:
    """Trains spelling `name` for `steps` steps, recorded into `run` (or, not
    `recorded`, the plain loop alone); returns the loop's seconds."""
    cls, loss = SPELLINGS[name]
    torch.manual_seed(0)
    model = cls()
    opt = {"sgd": lambda p: torch.optim.SGD(p, lr=0.05),
           "adam": lambda p: torch.optim.Adam(p, lr=1e-3),
           "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-3),
           "adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-2)}[optimizer](model.parameters())
    loss_fn = F.nll_loss if loss == "nll" else F.cross_entropy
    script = torch.jit.trace(model, x[:2]) if name == "traced" else None
    rec = (Recorder(run, model, opt, x, y, test_x=xt, test_y=yt, loss=loss, overwrite=True, script=script)
           if recorded else None)
    start = time.perf_counter()
    for idx in sampler(x.shape[0], 128, steps):
        opt.zero_grad()
        loss_fn(model(x[idx]), y[idx]).backward()
        opt.step()
        if rec is not None:
            rec.step(idx)
    seconds = time.perf_counter() - start
    if rec is not None:
        rec.close()
    return seconds


def verify(binary: str, run: str) -> dict:
    start = time.perf_counter()
    p = subprocess.run([binary, "--quiet", "--threads", "2", "verify", run, "--test", "1", "--json"],
                       capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if p.returncode != 0:
        return {"error": p.stderr.strip()[-500:], "seconds": seconds}
    j = json.loads(p.stdout)
    return {"route": j["route"], "reason": j.get("route_reason", ""), "max_rel_error": j["max_rel_error"],
            "seconds": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=list(SPELLINGS), choices=list(SPELLINGS))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--train", type=int, default=4000, help="training images (the first ones)")
    ap.add_argument("--optimizer", choices=["adam", "sgd", "rmsprop", "adagrad"], default="adam",
                    help="Adam (lr 1e-3; pathkernel's reverse walk), plain SGD (lr 0.05; its forward walk), RMSprop (lr 1e-3) or Adagrad (lr 1e-2), both walked in reverse")
    ap.add_argument("--bin", default=os.environ.get("PATHKERNEL_BIN") or os.path.join(REPO, "build", "pathkernel"))
    ap.add_argument("--json", default="", help="also write the lines to this file")
    ap.add_argument("--keep", default="", help="record the runs into this directory and keep them")
    ap.add_argument("--epoch", action="store_true",
                    help="one epoch of all 60,000 images (468 steps), each loop at its own thread counts and "
                         "also timed twice alone, without the recorder: prints verify's ratio to the faster")
    a = ap.parse_args()
    if a.epoch:
        a.steps, a.train = 468, 60000
    else:
        set_threads(1)  # torch's and OpenBLAS's: the replay runs ahead, bit for bit
    x, y, xt, yt = fashion_mnist()
    x, y = x[:a.train].contiguous(), y[:a.train].contiguous()
    lines, first = [], None
    with tempfile.TemporaryDirectory(prefix="pk-spellings-") as tmp:
        tmp = a.keep or tmp
        for name in a.only:
            run = os.path.join(tmp, name)
            loop = (min(record(name, run, x, y, xt, yt, a.steps, a.optimizer, recorded=False) for _ in range(2))
                    if a.epoch else 0.0)
            record(name, run, x, y, xt, yt, a.steps, a.optimizer)
            v = verify(a.bin, run)
            v["spelling"] = name
            if a.epoch and "error" not in v:
                v["loop_seconds"] = loop
                v["over_loop"] = v["seconds"] / loop
                print(f"{name:14s} the loop alone {loop:.2f} s; verify {v['seconds']:.1f} s, "
                      f"{v['over_loop']:.2f} x the loop", flush=True)
            if "error" not in v:
                first = first or v["seconds"]
                v["chain"] = v["route"] == "structured" and not v["reason"]
                v["over_first"] = v["seconds"] / first
                print(f"{name:14s} {v['route']:10s} chain={str(v['chain']):5s} {v['seconds']:7.1f} s "
                      f"{v['over_first']:5.2f}x  max_rel_error {v['max_rel_error']:.2e}  {v['reason']}", flush=True)
            else:
                print(f"{name:14s} error: {v['error']}", flush=True)
            lines.append(v)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(lines, f, indent=2)


if __name__ == "__main__":
    main()
