"""Dropout masks as pathkernel's engine draws them, for loops recorded from Python.

The engine cannot draw torch's random masks again, so it draws its own
(src/model/dropout.cpp): the mask of dropout site ``site`` (the dropout calls
of the model's TorchScript forward graph, numbered in graph order) at step
``s`` of a run seeded ``seed`` keeps element ``e`` of example ``r`` when

    u(seed, s, site, hash of r's input row in float32, e) >= p,

with ``u`` a 53-bit uniform from splitmix64, and scales it by 1 / (1 - p). A
training point's mask at a step is then the same in its batch and alone,
which the per-example decomposition needs.

While a Recorder is open on a model with dropout, the model's forward passes
draw these masks: ``F.dropout`` (which ``nn.Dropout`` calls) is replaced by
``seeded_dropout`` inside them, the sites numbered in call order. That is the
graph's order when every site is in the forward's own block, as those of
``nn.Dropout`` modules are; the recorder refuses a model in training mode with
a site inside a branch or a loop (where ``F.dropout`` called from a forward
compiles to), and checks that each forward calls dropout as many times as the
graph holds sites. Outside a recorded model's forward, ``F.dropout`` is
torch's own.
"""
import threading

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["dropout_mask", "graph_sites", "SeededForward"]

_U64 = np.uint64


def _mix(z):
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = z + _U64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
        return z ^ (z >> _U64(31))


def row_hashes(x):
    """A hash of each row of the network's input x [n, ...] from its values in
    float32 (-0 taken as +0): uint64 [n]."""
    v = np.ascontiguousarray(x.detach().reshape(x.shape[0], -1).to(torch.float32).numpy())
    v = np.where(v == 0, np.float32(0), v).astype(np.float32)
    bits = v.view(np.uint32).astype(np.uint64)
    h = _mix(np.full(v.shape[0], v.shape[1], dtype=np.uint64))
    for c in range(v.shape[1]):
        h = _mix(h ^ bits[:, c])
    return h


def dropout_mask(seed, step, site, x, per_row, p, hashes=None):
    """The engine's mask of site ``site`` at step ``step`` for the rows of the
    network's input x: float64 [n, per_row], 1 / (1 - p) where kept, else 0.
    ``hashes``: row_hashes(x), when the caller has them already."""
    base = _mix(_mix(_mix(np.array([seed], dtype=np.uint64)) ^ _U64(step)) ^ _U64(site))
    keys = _mix(base ^ (row_hashes(x) if hashes is None else hashes))
    with np.errstate(over="ignore"):
        z = _mix(keys[:, None] + np.arange(per_row, dtype=np.uint64)[None, :])
    u = (z >> _U64(11)).astype(np.float64) * 2.0 ** -53
    return np.where(u >= p, 1.0 / (1.0 - p), 0.0)


def graph_sites(script):
    """The dropout sites of a TorchScript module's inlined forward graph
    (aten::dropout and aten::dropout_) as the engine numbers them: those of
    the graph's own block first, in order, then those inside branches and
    loops. Returns (sites, nested): all of them, and those inside a branch or
    a loop, whose numbers need not follow the order of the calls (a call of
    F.dropout from a forward compiles to a branch on `inplace` holding two)."""
    graph = script.inlined_graph  # a new graph at each access: held while its nodes are read
    sites = nested = 0
    todo = [(list(graph.nodes()), False)]
    while todo:
        nodes, inside = todo.pop()
        for n in nodes:
            if n.kind() in ("aten::dropout", "aten::dropout_"):
                sites += 1
                nested += inside
            todo.extend((list(b.nodes()), True) for b in n.blocks())
    return sites, nested


_state = threading.local()
_torch_dropout = F.dropout
_installs = 0
_lock = threading.Lock()


def seeded_dropout(input, p=0.5, training=True, inplace=False):
    """F.dropout inside a recorded model's forward: the engine's masks."""
    forward = getattr(_state, "forward", None)
    if forward is None:
        return _torch_dropout(input, p, training, inplace)
    site = forward.sites
    forward.sites += 1
    if not 0 <= p <= 1:
        raise ValueError("dropout probability %r is outside [0, 1]" % p)
    if not training or p == 0:
        return input
    x = forward.x
    if input.dim() < 1 or input.shape[0] != x.shape[0]:
        raise ValueError("dropout site %d: its input has shape %s but the network's input has %d rows; pathkernel "
                         "draws each example's mask from its own input row, so the first dimension of a dropped "
                         "tensor must be the batch" % (site, list(input.shape), x.shape[0]))
    if p == 1:
        return input.mul_(0) if inplace else input * 0
    per_row = input.numel() // max(input.shape[0], 1)
    if forward.hashes is None:  # once per forward, for all its sites
        forward.hashes = row_hashes(x)
    mask = torch.from_numpy(dropout_mask(forward.seed, forward.step(), site, x, per_row, p, forward.hashes))
    mask = mask.view(input.shape).to(input.dtype)
    return input.mul_(mask) if inplace else input * mask


class SeededForward:
    """Makes `model`'s forward passes draw the engine's dropout masks of
    step ``step()`` (a callable: the step being trained) and seed ``seed``,
    and checks after each that it called dropout ``sites`` times (the
    graph's count). ``remove()`` undoes it."""

    def __init__(self, model, seed, step, sites, on_mismatch):
        global _installs
        self.seed, self.step, self.expected, self._on_mismatch = seed, step, sites, on_mismatch
        self.x, self.hashes, self.sites = None, None, 0
        self._hooks = [model.register_forward_pre_hook(self._pre), model.register_forward_hook(self._post)]
        with _lock:
            if _installs == 0:
                F.dropout = seeded_dropout
            _installs += 1

    def _pre(self, module, args):
        self.x, self.hashes, self.sites = args[0], None, 0
        _state.forward = self

    def _post(self, module, args, output):
        _state.forward = None
        if self.sites != self.expected:
            self._on_mismatch(self.sites, self.expected)

    def remove(self):
        global _installs
        if not self._hooks:
            return
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if getattr(_state, "forward", None) is self:
            _state.forward = None
        with _lock:
            _installs -= 1
            if _installs == 0:
                F.dropout = _torch_dropout
