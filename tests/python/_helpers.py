"""Shared pieces of the Python tests: the CLI, tiny models and data, a loop."""
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from pathkernel.record import Recorder, clip_grad_norm_  # noqa: E402,F401
from pathkernel._environment import _openblas_library  # noqa: E402


@contextlib.contextmanager
def thread_counts_kept():
    """torch's and OpenBLAS's thread counts (the process's) put back as they
    were when the block ends, however it ends."""
    lib = _openblas_library()
    torch_threads = torch.get_num_threads()
    blas_threads = lib.openblas_get_num_threads() if lib is not None else 0
    try:
        yield
    finally:
        torch.set_num_threads(torch_threads)
        if lib is not None:
            lib.openblas_set_num_threads(blas_threads)


def binary():
    """The pathkernel CLI: $PATHKERNEL_BIN (set by CTest), else build/pathkernel."""
    path = os.environ.get("PATHKERNEL_BIN") or os.path.join(ROOT, "build", "pathkernel")
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def need_binary(test):
    if binary() is None:
        test.skipTest("the pathkernel CLI is not built (set PATHKERNEL_BIN)")


def cli(args, cwd=None, timeout=300):
    """Runs the CLI; returns (returncode, stdout, stderr)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    p = subprocess.run([binary()] + list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def cli_json(test, args, cwd=None):
    """Runs the CLI with --json and returns its JSON object; fails the test
    (with the CLI's message) when it exits non-zero."""
    rc, out, err = cli(["--quiet", "--json"] + list(args), cwd=cwd)
    if rc != 0:
        test.fail("pathkernel %s exited %d:\n%s\n%s" % (" ".join(args), rc, out, err[-3000:]))
    start = out.find("{")
    return json.loads(out[start:])


def project_version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        m = re.search(r"project\(pathkernel VERSION ([0-9.]+)", f.read())
    return m.group(1)


class TempDirTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="pk-py-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self._dtype = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        self.addCleanup(torch.set_default_dtype, self._dtype)

    def path(self, *parts):
        return os.path.join(self.tmp, *parts)


def blobs(n=40, d=4, k=3, seed=0, dtype=torch.float64):
    """n points in k Gaussian blobs in d dimensions, labels in [0, k)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % k
    centres = torch.randn(k, d, generator=g, dtype=dtype) * 2
    x = centres[y] + torch.randn(n, d, generator=g, dtype=dtype)
    return x, y


class MLP(nn.Module):
    def __init__(self, d=4, h=8, k=3, log_softmax=False):
        super().__init__()
        self.fc1 = nn.Linear(d, h)
        self.out = nn.Linear(h, k)
        self.log_softmax = log_softmax

    def forward(self, x):
        z = self.out(torch.tanh(self.fc1(x)))
        if self.log_softmax:
            return F.log_softmax(z, dim=1)
        return z


def mlp(seed=0, **kw):
    torch.manual_seed(seed)
    return MLP(**kw).double()


def batches(n, b, steps, seed=1):
    """The loop's own sampler: a fresh permutation per epoch, batches of b."""
    g = torch.Generator().manual_seed(seed)
    out = []
    while len(out) < steps:
        perm = torch.randperm(n, generator=g)
        out += [perm[i:i + b] for i in range(0, n - b + 1, b)]
    return out[:steps]


def record_cross_entropy(run, model, opt, x, y, batch, steps, test=4):
    """The plainest recorded loop: cross-entropy on the loop's own batches,
    the first `test` training points as the test set."""
    with Recorder(run, model, opt, x, y, test_x=x[:test], test_y=y[:test]) as rec:
        for idx in batches(x.shape[0], batch, steps):
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
            rec.step(idx)
    return rec


def loss_fn(kind):
    return {"cross_entropy": F.cross_entropy, "nll": F.nll_loss, "mse": F.mse_loss}[kind]
