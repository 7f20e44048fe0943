"""Recording a training loop written in PyTorch, for pathkernel's exact kernel machine.

Three lines in the loop you already have::

    from pathkernel.record import Recorder, clip_grad_norm_
    rec = Recorder("runs/mine", model, optimizer, train_x, train_y, test_x=test_x, test_y=test_y,
                   loss="cross_entropy")      # or "nll" (the model ends in log_softmax) or "mse"
    for idx in my_batches:                     # the training indices of this step
        optimizer.zero_grad()
        loss_fn(model(train_x[idx]), train_y[idx]).backward()
        clip_grad_norm_(model.parameters(), 1.0)   # optional: torch's clipping, remembered
        optimizer.step()
        rec.step(idx)                          # right after optimizer.step(), before scheduler.step()
        scheduler.step()
    rec.close()

and then ``pathkernel verify runs/mine``, ``explain``, ``gram``, ``report``.

A Python loop cannot be replayed by pathkernel, so the recorder stores the
weights of every step (``rec.bytes_per_step`` says how many bytes a step
takes), each step's batch, learning rate and clip factor, the optimizer's
kind, hyper-parameters and state, the model as TorchScript and the data as
.npy, in a run directory that every pathkernel command reads
(docs/run-directory.md).

What the loop must do for the decomposition to be exact: its loss is the
declared one, averaged over the step's batch (``F.cross_entropy``,
``F.nll_loss`` or ``F.mse_loss`` with the default ``reduction="mean"``; with
gradient accumulation, the mean over all the step's examples), with no other
term (weight decay belongs in the optimizer's ``weight_decay``);
the only change to the gradients between ``backward()`` and
``optimizer.step()`` is clipping by norm, through ``clip_grad_norm_`` above or
declared with ``rec.step(idx, clip_factor=c)``; the weights change only in
``optimizer.step()``. Anything else shows up in ``pathkernel verify`` as a
rounding term far above rounding, at the step where it happened.

Dropout: while the recorder is open, the model's ``nn.Dropout`` modules draw
pathkernel's own masks (pathkernel.dropout), which the engine draws again for
each training point; keep the model in the mode (train or eval) it had when
the recorder was created.
"""
import io
import math
import os
import re
import shutil
import types
import weakref
import zlib

import numpy as np
import torch
import torch.nn.functional as F

from . import __version__ as _pathkernel_version
from .dropout import SeededForward, graph_sites
from ._files import file_record, json_text, npy_bytes, step_name, sync_files, write_atomic

__all__ = ["Recorder", "RecorderError", "clip_grad_norm_", "SUPPORTED_OPTIMIZERS", "LOSSES"]

LOSSES = ("cross_entropy", "nll", "mse")

SUPPORTED_OPTIMIZERS = (
    "torch.optim.SGD (momentum 0: 'sgd'; momentum > 0: 'momentum', with dampening; nesterov=True: "
    "'nesterov'), torch.optim.Adam ('adam') and torch.optim.AdamW ('adamw'), with weight decay, "
    "one set of hyper-parameters for all parameters, amsgrad, maximize, capturable, differentiable "
    "and fused off")

# Steps between two rewrites of manifest.json while recording (and so the
# steps of one batch file): 50, or a tenth of the steps so far past 500, at
# most 1000, so the manifest's rewrites cost time linear in the steps.
FLUSH_EVERY = 50


class RecorderError(ValueError):
    """The recorder refuses a model, optimizer, data or step it cannot record exactly."""


# Recorders that are open, so that clip_grad_norm_ can tell them the factor.
_open_recorders = weakref.WeakSet()


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False):
    """``torch.nn.utils.clip_grad_norm_``, and tells every open Recorder whose
    model owns these parameters the factor torch multiplied the gradients by,
    so the next ``optimizer.step()`` is recorded with it. Returns what torch
    returns (the total norm before clipping)."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    params = list(parameters)
    total_norm = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type,
                                                error_if_nonfinite=error_if_nonfinite)
    if not any(p.grad is not None for p in params):
        return total_norm
    # torch 1.13 computes exactly this and multiplies every gradient by it;
    # the same operations on the same tensor give the same bits.
    clip_coef = max_norm / (total_norm + 1e-6)
    factor = float(torch.clamp(clip_coef, max=1.0))
    ids = {id(p) for p in params}
    for rec in list(_open_recorders):
        if ids & rec._param_ids:
            rec._pending_clip = factor
    return total_norm


def _fail(message):
    raise RecorderError(message)


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and ":" in line:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _torch_config_value(key):
    try:
        text = torch.__config__.show()
    except Exception:
        return ""
    for line in text.splitlines():
        if key in line:
            return line.split(key, 1)[1].strip()
    return ""


def _libtorch_version():
    """The LibTorch version as the C++ side writes it (TORCH_VERSION, e.g.
    "1.13.0"): Python's torch.__version__ may carry a suffix ("1.13.0a0",
    "1.13.1+cpu")."""
    m = re.search(r"TORCH_VERSION=(\d+\.\d+\.\d+)", _torch_config_value("Build settings:"))
    if m:
        return m.group(1)
    m = re.match(r"\d+\.\d+\.\d+", torch.__version__)
    return m.group(0) if m else torch.__version__


def _as_tensor(a, what):
    if a is None:
        return None
    if isinstance(a, torch.Tensor):
        t = a.detach()
    else:
        try:
            t = torch.from_numpy(np.ascontiguousarray(np.asarray(a)))
        except TypeError as e:
            _fail("%s: cannot read it as an array (%s)" % (what, e))
    if t.device.type != "cpu":
        t = t.cpu()
    return t.contiguous()


def _flat_indices(idx, n):
    if isinstance(idx, torch.Tensor):
        a = idx.detach().cpu().numpy()
    else:
        a = np.asarray(idx)
    if a.dtype == np.bool_:
        _fail("rec.step: the batch is a boolean mask; pass the training indices of the step "
              "(e.g. mask.nonzero().flatten())")
    if a.size == 0:
        _fail("rec.step: the batch is empty; pass the training indices the step used")
    if not np.issubdtype(a.dtype, np.integer):
        if np.issubdtype(a.dtype, np.floating) and np.all(a == np.round(a)):
            a = a.astype(np.int64)
        else:
            _fail("rec.step: the batch must be integer training indices (got dtype %s)" % a.dtype)
    a = a.astype(np.int64).reshape(-1)
    lo, hi = int(a.min()), int(a.max())
    if lo < 0 or hi >= n:
        _fail("rec.step: the batch holds index %d, outside the training set [0, %d)" % (lo if lo < 0 else hi, n))
    uniq, counts = np.unique(a, return_counts=True)
    if uniq.size != a.size:
        dup = uniq[counts > 1][:5].tolist()
        _fail("rec.step: the batch repeats training indices %s; pathkernel's loss is a mean over distinct "
              "training points, each weighted once (sample with replacement only across steps)" % dup)
    return a


_NORM_NAMES = {"BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "LazyBatchNorm1d",
               "LazyBatchNorm2d", "LazyBatchNorm3d"}
_DROPOUT_NAMES = {"Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout"}


def _kind_name(module):
    if isinstance(module, torch.jit.ScriptModule):
        return getattr(module, "original_name", type(module).__name__)
    return type(module).__name__


def _coupling_modules(model):
    """(name, module, why) of the submodules that must stay in eval mode."""
    out = []
    for name, m in model.named_modules():
        kind = _kind_name(m)
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) or kind in _NORM_NAMES:
            out.append((name or kind, m, "batch"))
        elif isinstance(m, torch.nn.modules.dropout._DropoutNd) or kind in _DROPOUT_NAMES:
            p = getattr(m, "p", 1.0)
            if p > 0 and kind != "Dropout":
                out.append((name or kind, m, "dropout"))
    return out


def _check_modes(coupling, when):
    for name, m, why in coupling:
        uses_batch_stats = m.training
        if why == "batch" and not isinstance(m, torch.jit.ScriptModule):
            uses_batch_stats = m.training or (m.running_mean is None and m.running_var is None)
        if why == "batch" and uses_batch_stats:
            _fail("%s: '%s' is a BatchNorm that normalises with the batch's own statistics (training mode, "
                  "or track_running_stats=False), which couples the examples of a batch: no training point "
                  "has a gradient of its own, so there is no per-example decomposition. Call .eval() on it "
                  "(it then uses fixed running statistics) or use LayerNorm/GroupNorm" % (when, name))
        if why == "dropout" and m.training:
            _fail("%s: '%s' is an active %s: pathkernel draws the masks of nn.Dropout and F.dropout itself, "
                  "seeded per step and example, and cannot draw this kind's (channel or alpha dropout) again, "
                  "so the steps could not be decomposed. Use nn.Dropout, or call .eval() on it (or set p=0)"
                  % (when, name, _kind_name(m)))


class _eval_mode:
    """Puts a module and its submodules in eval mode for a block, then gives
    each its own mode back."""

    def __init__(self, module):
        self._module = module

    def __enter__(self):
        self._modes = [(m, m.training) for m in self._module.modules()]
        self._module.eval()

    def __exit__(self, *exc):
        for m, mode in self._modes:
            m.training = mode
        return False


def _hyper_parameters(optimizer, group):
    """A parameter group's hyper-parameters but the learning rate (the keys of
    the optimizer's defaults; schedulers' own keys such as initial_lr or
    max_lr are not the optimizer's)."""
    return {k: group.get(k) for k in optimizer.defaults if k not in ("params", "lr")}


def _optimizer_declaration(optimizer):
    """manifest.json's optimizer entry (the fields src/train/optimizer.cpp
    writes) and the group hyper-parameters that must not change."""
    cls = type(optimizer)
    if cls not in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW):
        _fail("optimizer %s.%s is not supported; supported: %s"
              % (cls.__module__, cls.__name__, SUPPORTED_OPTIMIZERS))
    groups = optimizer.param_groups
    first = _hyper_parameters(optimizer, groups[0])
    for i, g in enumerate(groups[1:], start=1):
        other = _hyper_parameters(optimizer, g)
        if other != first or g["lr"] != groups[0]["lr"]:
            diff = sorted(k for k in set(first) | set(other) | {"lr"}
                          if (g.get(k) if k != "lr" else g["lr"]) != (groups[0].get(k) if k != "lr" else groups[0]["lr"]))
            _fail("optimizer parameter group %d has hyper-parameters (%s) that differ from group 0; pathkernel "
                  "records one set of hyper-parameters for all parameters (supported: %s)"
                  % (i, ", ".join(diff), SUPPORTED_OPTIMIZERS))
    g = groups[0]
    for flag in ("amsgrad", "maximize", "capturable", "differentiable", "fused"):
        if g.get(flag, False):
            _fail("optimizer %s with %s=True is not supported; supported: %s" % (cls.__name__, flag, SUPPORTED_OPTIMIZERS))
    lr = float(g.get("initial_lr", g["lr"]))
    if not (math.isfinite(lr) and lr > 0):
        _fail("optimizer learning rate must be > 0 (got %r)" % lr)
    wd = float(g.get("weight_decay", 0.0))
    if not (wd >= 0):
        _fail("optimizer weight_decay must be >= 0 (got %r)" % wd)
    if cls is torch.optim.SGD:
        momentum, dampening, nesterov = float(g["momentum"]), float(g["dampening"]), bool(g["nesterov"])
        if momentum == 0:
            decl = {"name": "sgd", "lr": lr, "weight_decay": wd}
        else:
            if not (0 < momentum < 1):
                _fail("SGD momentum must be in (0, 1) (got %r)" % momentum)
            if not (0 <= dampening < 1):
                _fail("SGD dampening must be in [0, 1) (got %r)" % dampening)
            decl = {"name": "nesterov" if nesterov else "momentum", "lr": lr, "momentum": momentum,
                    "dampening": dampening, "weight_decay": wd}
    else:
        beta1, beta2 = (float(b) for b in g["betas"])
        eps = float(g["eps"])
        if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
            _fail("Adam betas must be in [0, 1) (got %r)" % (g["betas"],))
        if not (eps > 0):
            _fail("Adam eps must be > 0 (got %r)" % eps)
        decl = {"name": "adam" if cls is torch.optim.Adam else "adamw", "lr": lr, "beta1": beta1,
                "beta2": beta2, "eps": eps, "weight_decay": wd}
    return decl, first


class Recorder:
    """Records a PyTorch training loop into a pathkernel run directory.

    Arguments:
      directory: the run directory to create (refused if it exists and is not
        empty, unless ``overwrite=True`` and it holds a previous run).
      model: the torch.nn.Module being trained (on the CPU, float32 or float64).
      optimizer: the torch.optim.SGD, Adam or AdamW instance that trains it,
        created over exactly the model's parameters, before its first step.
      train_x, train_y: the training set, tensors or numpy arrays; train_x is
        [n, *input_shape] (float32/float64, or integer ids, stored as int64),
        train_y holds class labels [n] in [0, K), or for loss "mse" float
        targets [n, K]. The loop's batches index these arrays.
      test_x, test_y: the test set (optional).
      loss: "cross_entropy" (the model outputs logits; F.cross_entropy),
        "nll" (the model ends in log_softmax; F.nll_loss) or "mse"
        (F.mse_loss, the mean over the batch and the K outputs).
      output: what pathkernel explains for cross_entropy: "logsoftmax" (the
        default: the log-probabilities) or "logits" (the model's outputs).
      script: the TorchScript module to save, when the model cannot be
        scripted (e.g. ``torch.jit.trace(model, example)``); it must hold the
        model's parameters (same names and shapes). By default the model is
        scripted with torch.jit.script.
      overwrite: replace an existing run directory.

    Call ``rec.step(idx)`` right after every ``optimizer.step()`` (before
    ``scheduler.step()``), and ``rec.close()`` at the end (or use ``with``).
    The recorder wraps ``optimizer.step`` (on this instance) to read the
    learning rate each step runs with at that moment, so a scheduler stepped
    before ``rec.step`` is still recorded right; two optimizer steps without a
    ``rec.step`` between them, or a ``rec.step`` without one, are refused.
    """

    def __init__(self, directory, model, optimizer, train_x, train_y, test_x=None, test_y=None,
                 loss="cross_entropy", output=None, script=None, overwrite=False):
        if loss not in LOSSES:
            _fail("loss '%s' is not supported; expected one of %s" % (loss, ", ".join(LOSSES)))
        if output is None:
            output = "logsoftmax" if loss == "cross_entropy" else "logits"
        if output not in ("logsoftmax", "logits"):
            _fail("output '%s' is not supported; expected 'logsoftmax' or 'logits'" % output)
        if loss != "cross_entropy" and output != "logits":
            _fail("output '%s' applies to loss cross_entropy only; loss '%s' explains the model's outputs as "
                  "they are (output 'logits')" % (output, loss))
        if not isinstance(model, torch.nn.Module):
            _fail("model must be a torch.nn.Module (got %s)" % type(model).__name__)
        if not isinstance(optimizer, torch.optim.Optimizer):
            _fail("optimizer must be a torch.optim.Optimizer (got %s); supported: %s"
                  % (type(optimizer).__name__, SUPPORTED_OPTIMIZERS))
        self.directory = os.fspath(directory)
        self.loss = loss
        self.output = output
        self._closed = True  # until construction succeeds

        # The model's parameters.
        named = list(model.named_parameters())
        if not named:
            _fail("the model has no parameters")
        dtypes = {p.dtype for _, p in named}
        if len(dtypes) > 1:
            _fail("the model mixes parameter dtypes (%s); pathkernel needs one dtype, float32 or float64 "
                  "(call model.double() or model.float())" % ", ".join(sorted(str(d) for d in dtypes)))
        dtype = dtypes.pop()
        if dtype not in (torch.float32, torch.float64):
            _fail("the model's parameters are %s; pathkernel records float32 or float64 models" % dtype)
        for name, p in named:
            if p.device.type != "cpu":
                _fail("parameter '%s' is on %s; record on the CPU (pathkernel's engine runs on the CPU and "
                      "decomposes the path exactly only with the same floating-point kernels)" % (name, p.device))
        self.dtype = "float64" if dtype == torch.float64 else "float32"
        self._coupling = _coupling_modules(model)
        _check_modes(self._coupling, "the model")

        # The optimizer.
        self._declaration, self._hyper = _optimizer_declaration(optimizer)
        opt_params = [p for g in optimizer.param_groups for p in g["params"]]
        model_ids = {id(p): n for n, p in named}
        opt_ids = {id(p) for p in opt_params}
        missing = [n for n, p in named if id(p) not in opt_ids]
        if missing:
            _fail("the optimizer does not train parameter(s) %s of the model; pathkernel decomposes a path "
                  "along which every parameter is trained (frozen parameters are not supported)"
                  % ", ".join("'%s'" % n for n in missing[:5]))
        extra = [p for p in opt_params if id(p) not in model_ids]
        if extra:
            _fail("the optimizer trains %d tensor(s) that are not parameters of the model; pass the model that "
                  "owns all of the optimizer's parameters" % len(extra))
        if any(v is not None for st in optimizer.state.values() for v in st.values()):
            _fail("the optimizer has already taken steps (its state is not empty); create the Recorder before "
                  "the first optimizer.step(), so the path starts at the model's initial weights")

        # The data.
        self._x = _as_tensor(train_x, "train_x")
        self._y = _as_tensor(train_y, "train_y")
        self._xt = _as_tensor(test_x, "test_x")
        self._yt = _as_tensor(test_y, "test_y")
        if (self._xt is None) != (self._yt is None):
            _fail("give both test_x and test_y, or neither")
        self._x, integer_inputs = self._check_inputs(self._x, "train_x")
        n = self._x.shape[0]
        if n < 1:
            _fail("train_x has no rows")
        if self._xt is None:
            self._xt = self._x.new_empty((0,) + tuple(self._x.shape[1:]))
        else:
            self._xt, integer_test = self._check_inputs(self._xt, "test_x")
            if tuple(self._xt.shape[1:]) != tuple(self._x.shape[1:]):
                _fail("test_x has examples of shape %s, train_x %s; expected the same"
                      % (list(self._xt.shape[1:]), list(self._x.shape[1:])))
            if integer_test != integer_inputs:
                _fail("train_x is %s and test_x %s; expected both floating point or both integer"
                      % (self._x.dtype, self._xt.dtype))
            if integer_inputs:
                self._xt = self._xt.to(torch.int64)
            elif self._xt.dtype != self._x.dtype:
                _fail("train_x is %s and test_x %s; expected the same dtype" % (self._x.dtype, self._xt.dtype))
        self.integer_inputs = integer_inputs

        # The TorchScript module.
        if script is None:
            if isinstance(model, torch.jit.ScriptModule):
                script = model
            else:
                try:
                    script = torch.jit.script(model)
                except Exception as e:  # torch raises several kinds
                    first = str(e).strip().splitlines()
                    _fail("the model cannot be scripted with torch.jit.script (%s: %s); pathkernel runs the "
                          "model as TorchScript. Make its forward scriptable, or pass "
                          "script=torch.jit.trace(model, example_inputs) if tracing captures it"
                          % (type(e).__name__, first[0] if first else ""))
        elif not isinstance(script, torch.jit.ScriptModule):
            _fail("script must be a TorchScript module (torch.jit.script or torch.jit.trace), got %s"
                  % type(script).__name__)
        snamed = list(script.named_parameters())
        if [(n_, tuple(p.shape)) for n_, p in snamed] != [(n_, tuple(p.shape)) for n_, p in named] and \
                sorted((n_, tuple(p.shape)) for n_, p in snamed) != sorted((n_, tuple(p.shape)) for n_, p in named):
            _fail("the TorchScript module's parameters %s are not the model's %s"
                  % ([n_ for n_, _ in snamed][:8], [n_ for n_, _ in named][:8]))
        by_name = dict(named)
        for n_, p in snamed:
            if p is not by_name[n_] and not torch.equal(p.detach(), by_name[n_].detach()):
                _fail("the TorchScript module's parameter '%s' holds other values than the model's: it must hold "
                      "the weights training starts from (trace or script the model itself)" % n_)
        # The flat order is the TorchScript module's, which pathkernel reads.
        self._names = [n_ for n_, _ in snamed]
        self._params = [by_name[n_] for n_ in self._names]
        self._param_ids = {id(p) for p in self._params}
        self._shapes = [tuple(p.shape) for p in self._params]
        self._numels = [p.numel() for p in self._params]
        self.parameter_count = int(sum(self._numels))

        # The model's output on a probe batch, and the labels; dropout off on
        # both sides (torch's masks are not the engine's).
        probe = self._x[: min(n, 8)]
        with torch.no_grad(), _eval_mode(model), _eval_mode(script):
            try:
                out = model(probe)
            except Exception as e:
                _fail("the model fails on train_x[:%d] (%s: %s); check train_x's shape and dtype"
                      % (probe.shape[0], type(e).__name__, str(e).strip().splitlines()[0] if str(e).strip() else ""))
            if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != probe.shape[0]:
                _fail("the model maps train_x[:%d] to %s; expected outputs of shape [%d, K]"
                      % (probe.shape[0], list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__,
                         probe.shape[0]))
            if script is not model:
                try:
                    sout = script(probe)
                except Exception as e:
                    _fail("the TorchScript module fails on train_x[:%d] (%s)" % (probe.shape[0], e))
                scale = max(1.0, float(out.abs().max()))
                if sout.shape != out.shape or float((sout - out).abs().max()) > 1e-5 * scale:
                    _fail("the TorchScript module's outputs on train_x[:%d] are not the model's (max difference "
                          "%.3g): it does not compute what is trained" % (probe.shape[0],
                          float((sout - out).abs().max()) if sout.shape == out.shape else float("nan")))
        self.num_classes = K = int(out.shape[1])
        if K < 1:
            _fail("the model has no outputs")
        if loss == "nll":
            lse = torch.logsumexp(out.to(torch.float64), dim=1)
            if float(lse.abs().max()) > (1e-9 if dtype == torch.float64 else 1e-4):
                _fail("loss 'nll' takes log-probabilities, but the model's outputs on train_x[:%d] are not "
                      "(logsumexp %.3g, expected 0): end the model in log_softmax, or use "
                      "loss='cross_entropy' for logits" % (probe.shape[0], float(lse.abs().max())))
        elif loss == "cross_entropy" and K < 2:
            _fail("loss 'cross_entropy' needs at least 2 classes; the model has %d output" % K)
        self._y = self._check_targets(self._y, self._x, "train", K)
        if self._yt is None:
            self._yt = torch.zeros((0, K), dtype=torch.float64) if loss == "mse" else torch.zeros(0, dtype=torch.int64)
        else:
            self._yt = self._check_targets(self._yt, self._xt, "test", K)
        self.num_train, self.num_test = int(n), int(self._xt.shape[0])

        # Dropout: pathkernel draws the masks (pathkernel.dropout), by site.
        sites, nested = graph_sites(script)
        if nested > 0 and model.training:
            _fail("the model's TorchScript forward has %d dropout site(s) inside a branch or a loop (a call of "
                  "F.dropout from a forward compiles to a branch on `inplace`); pathkernel draws dropout masks "
                  "itself, numbered by site, and numbers only the sites of the forward's own block in the order "
                  "they are called. Use nn.Dropout modules, or call .eval() on the model" % nested)

        # The directory.
        self._prepare_directory(overwrite)

        # Write the data, the module, w_0 and the first manifest.
        self._unsynced = []
        arrays = {"train_x": self._x, "train_y": self._y, "test_x": self._xt, "test_y": self._yt}
        data_bytes = {}
        for name, t in arrays.items():
            data_bytes[name] = npy_bytes(t.numpy())
            write_atomic(os.path.join(self.directory, "data", name + ".npy"), data_bytes[name])
        # The CRC-32 pathkernel's reader computes (training_data_crc32) on the
        # data as it loads it: the inputs converted to the run's dtype (so
        # token ids and float32 inputs of a float64 model as float64), then the
        # int64 labels or float64 targets.
        x_raw = np.ascontiguousarray(self._x.to(dtype).numpy()).tobytes()
        y_raw = np.ascontiguousarray(self._y.numpy()).tobytes()
        self._train_crc32 = zlib.crc32(y_raw, zlib.crc32(x_raw)) & 0xFFFFFFFF
        buf = io.BytesIO()
        try:
            torch.jit.save(script, buf)
        except Exception as e:
            _fail("cannot save the TorchScript module (%s)" % e)
        module_bytes = buf.getvalue()
        write_atomic(os.path.join(self.directory, "model.pt"), module_bytes)
        self._module_record = file_record("model.pt", module_bytes)
        # pathkernel's copy, to evaluate the loss at w_s and the accuracies.
        self._eval_module = torch.jit.load(io.BytesIO(module_bytes))
        self._eval_module.eval()  # metrics without dropout, as pathkernel's own training writes them
        self._eval_params = dict(self._eval_module.named_parameters())

        self.steps = 0
        self._flushed = 0
        self._w = self._flat_weights()
        self._checkpoints = [dict(step=0, **self._write_flat(step_name("checkpoints/w_", 0), self._w),
                                  optimizer_state={"step": 0, "buffers": {}})]
        self._learning_rates = []
        self._metrics = []
        self._batch_rows = []          # rows of steps >= self._flushed, not yet in a file
        self._batch_files = []
        self._batch_size = 0
        self._clip = []                # one factor per step (1.0 where none)
        self._any_clip = False
        self._clip_file = None
        self._path_bytes_after_w0 = 0
        self._optimizer = optimizer
        self._model = model
        self._status = "running"
        self._message = ""
        self._summary = None
        self._pending_clip = None
        self._step_clip = None
        self._step_lrs = []            # the lr of each optimizer.step() since the last rec.step
        self._start_matches = True     # the last optimizer.step() started from w_s
        self._write_manifest()
        self._install_step_hook(optimizer)
        self._closed = False
        # Dropout draws the engine's masks while recording (pathkernel.dropout).
        self._dropout = None
        if sites > 0:
            self._modes = [m.training for m in model.modules()]

            def mismatch(called, expected):
                _fail("step %d: the model's forward called dropout %d time(s), but its TorchScript graph holds %d "
                      "dropout site(s); pathkernel numbers the sites in graph order and draws their masks "
                      "itself, counting the calls of F.dropout. Call dropout through nn.Dropout modules "
                      "(not torch.dropout, nor a dropout imported from torch.nn.functional by name)"
                      % (self.steps, called, expected))

            self._dropout = SeededForward(model, 0, lambda: self.steps, sites, mismatch)
        _open_recorders.add(self)

    # ---------------------------------------------------------------- set-up

    def _check_inputs(self, x, what):
        if x.dim() < 2:
            _fail("%s has shape %s; expected [n, *input_shape] with at least one input dimension"
                  % (what, list(x.shape)))
        if x.dtype in (torch.float32, torch.float64):
            if x.numel() and not bool(torch.isfinite(x).all()):
                _fail("%s holds a value that is not finite (NaN or infinite)" % what)
            return x, False
        if x.dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            x = x.to(torch.int64)
            if x.numel() and float(x.abs().max()) >= 2.0 ** 53:
                _fail("%s holds integers of magnitude >= 2^53, which float64 does not hold exactly" % what)
            return x, True
        _fail("%s has dtype %s; expected float32/float64 inputs or integer codes such as token ids"
              % (what, x.dtype))

    def _check_targets(self, y, x, what, K):
        if y.dim() == 0 or y.shape[0] != x.shape[0]:
            _fail("%s_y has %s rows but %s_x has %d; expected one %s per example"
                  % (what, y.shape[0] if y.dim() >= 1 else "no", what, x.shape[0],
                     "target" if self.loss == "mse" else "label"))
        if self.loss == "mse":
            if y.dim() != 2 or y.shape[1] != K or y.dtype not in (torch.float32, torch.float64):
                _fail("loss 'mse' takes float targets of shape [n, K] = [%d, %d] (K the model's outputs; for "
                      "class labels, F.one_hot(y, K).double()); %s_y is %s of shape %s"
                      % (x.shape[0], K, what, y.dtype, list(y.shape)))
            if y.numel() and not bool(torch.isfinite(y).all()):
                _fail("%s_y holds a target that is not finite" % what)
            return y.to(torch.float64).contiguous()
        if y.dim() != 1:
            _fail("%s_y has shape %s; loss '%s' takes class labels of shape [n]%s"
                  % (what, list(y.shape), self.loss, " (use loss='mse' for targets [n, K])" if y.dim() == 2 else ""))
        if y.dtype.is_floating_point or y.dtype == torch.bool:
            _fail("%s_y has dtype %s; expected integer class labels" % (what, y.dtype))
        y = y.to(torch.int64)
        if y.numel():
            lo, hi = int(y.min()), int(y.max())
            if lo < 0 or hi >= K:
                _fail("%s_y holds labels in [%d, %d], but the model has %d outputs: expected labels in [0, %d)"
                      % (what, lo, hi, K, K))
        return y.contiguous()

    def _prepare_directory(self, overwrite):
        d = self.directory
        if os.path.exists(d):
            if not os.path.isdir(d):
                _fail("run path '%s' exists and is not a directory" % d)
            if os.listdir(d):
                if not overwrite:
                    _fail("run directory '%s' already exists and is not empty; pass overwrite=True to replace "
                          "a previous run" % d)
                if not os.path.exists(os.path.join(d, "manifest.json")):
                    _fail("run directory '%s' is not empty and holds no manifest.json, so it is not a pathkernel "
                          "run; refusing to delete it even with overwrite=True" % d)
                shutil.rmtree(d)
        for sub in ("", "checkpoints", "optimizer", "batches", "data"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)

    def _install_step_hook(self, optimizer):
        """Wraps optimizer.step (on the instance) to note the learning rate each
        step used, the clip factor pending at that moment and how many steps
        ran. Schedulers wrap it again; both keep working."""
        original = optimizer.step
        counted = getattr(original, "_with_counter", False)
        recorder = weakref.ref(self)

        def step(opt, *args, **kwargs):
            rec = recorder()
            if rec is not None and not rec._closed:
                lrs = [g["lr"] for g in opt.param_groups]
                rec._step_lrs.append(lrs)
                rec._step_clip = rec._pending_clip
                rec._pending_clip = None
                rec._start_matches = np.array_equal(rec._flat_weights(), rec._w)
            if not counted:  # what a scheduler's own wrapper counts
                opt._step_count = getattr(opt, "_step_count", 0) + 1
            return original(*args, **kwargs)

        # A scheduler created later sees a counted step and leaves it as is.
        step._with_counter = True
        optimizer.step = types.MethodType(step, optimizer)

    # ------------------------------------------------------------- recording

    def _flat_weights(self):
        with torch.no_grad():
            return torch.cat([p.detach().reshape(-1).to(torch.float64) for p in self._params]).numpy().copy()

    def _write(self, relative, data):
        """Writes a file of the path atomically; it is synced, with the others
        written since, before the next manifest lists it."""
        path = os.path.join(self.directory, relative)
        write_atomic(path, data, sync=False)
        self._unsynced.append(path)
        return file_record(relative, data)

    def _write_flat(self, relative, array):
        return self._write(relative, npy_bytes(np.asarray(array, dtype=np.float64)))

    def _flat_state(self, name):
        parts = []
        for n_, p in zip(self._names, self._params):
            st = self._optimizer.state.get(p, {})
            t = st.get(name)
            if t is None:
                _fail("the optimizer has no '%s' for parameter '%s' after the step" % (name, n_))
            parts.append(t.detach().reshape(-1).to(torch.float64))
        return torch.cat(parts).numpy()

    def _state_after_step(self, s):
        """optimizer_state of checkpoint s+1: the state the next step starts from."""
        kind = self._declaration["name"]
        if kind == "sgd":
            return {"step": 0, "buffers": {}}
        names = ["momentum_buffer"] if kind in ("momentum", "nesterov") else ["exp_avg", "exp_avg_sq"]
        step = 0
        if kind in ("adam", "adamw"):
            counts = set()
            for p in self._params:
                t = self._optimizer.state.get(p, {}).get("step")
                counts.add(int(float(t)) if t is not None else 0)
            if len(counts) != 1:
                _fail("step %d: the optimizer's parameters have different step counts %s (a parameter without "
                      "a gradient is skipped by torch's Adam); pathkernel needs every parameter updated at every "
                      "step" % (s, sorted(counts)))
            step = counts.pop()
            if step != s + 1:
                _fail("step %d: Adam's step count is %d, expected %d; call rec.step(idx) once after every "
                      "optimizer.step()" % (s, step, s + 1))
        buffers = {}
        for name in names:
            buffers[name] = self._write_flat(step_name("optimizer/%s_" % name, s + 1), self._flat_state(name))
            self._path_bytes_after_w0 += buffers[name]["bytes"]
        return {"step": step, "buffers": buffers}

    def _batch_metrics(self, w, idx):
        """The declared loss and batch accuracy at weights w on training indices idx."""
        with torch.no_grad():
            offset = 0
            for n_, numel, shape in zip(self._names, self._numels, self._shapes):
                p = self._eval_params[n_]
                p.copy_(torch.from_numpy(w[offset:offset + numel]).reshape(shape).to(p.dtype))
                offset += numel
            index = torch.from_numpy(idx)
            return self._loss_and_accuracy(self._x.index_select(0, index), self._y.index_select(0, index))

    def _loss_and_accuracy(self, x, y):
        out = self._eval_module(x)
        if self.loss == "cross_entropy":
            value = F.cross_entropy(out, y)
            correct = (out.argmax(1) == y)
        elif self.loss == "nll":
            value = F.nll_loss(out, y)
            correct = (out.argmax(1) == y)
        else:
            # Regression targets have no classes: accuracy 0, as pathkernel's
            # own training writes it (correct_predictions in loss.h).
            return float(F.mse_loss(out, y.to(out.dtype))), 0.0
        return float(value), float(correct.to(torch.float64).mean())

    def step(self, idx, clip_factor=None, loss=None, accuracy=None):
        """Records the step the optimizer just took: ``idx`` are its training
        indices (a LongTensor, array or list, no repeats). Call it right after
        ``optimizer.step()`` and before ``scheduler.step()``.

        clip_factor: the factor the gradients were multiplied by before the
          step (gradient clipping by norm); not needed when the loop clips
          with ``pathkernel.record.clip_grad_norm_``.
        loss, accuracy: the batch loss (and accuracy) at the weights before the
          step, for metrics.csv; by default the recorder computes them."""
        if self._closed:
            _fail("rec.step: the recorder is closed")
        s = self.steps
        idx = _flat_indices(idx, self.num_train)
        if len(self._step_lrs) == 0:
            _fail("rec.step (step %d): no optimizer.step() since the previous rec.step(); call rec.step(idx) "
                  "right after each optimizer.step()" % s)
        if len(self._step_lrs) > 1:
            _fail("rec.step (step %d): optimizer.step() ran %d times since the previous rec.step(); call "
                  "rec.step(idx) after every optimizer.step()" % (s, len(self._step_lrs)))
        lrs = self._step_lrs.pop()
        if any(lr != lrs[0] for lr in lrs):
            _fail("step %d: the optimizer's parameter groups used different learning rates %s; pathkernel "
                  "records one learning rate per step" % (s, lrs))
        lr = float(lrs[0])
        for i, g in enumerate(self._optimizer.param_groups):
            now = _hyper_parameters(self._optimizer, g)
            if now != self._hyper:
                changed = sorted(k for k in set(now) | set(self._hyper) if now.get(k) != self._hyper.get(k))
                _fail("step %d: the optimizer's %s changed during training (group %d: %s); pathkernel records "
                      "a per-step learning rate only (for OneCycleLR pass cycle_momentum=False)"
                      % (s, ", ".join(changed), i, ", ".join("%s=%r" % (k, now.get(k)) for k in changed)))
        _check_modes(self._coupling, "step %d" % s)
        if self._dropout is not None and [m.training for m in self._model.modules()] != self._modes:
            _fail("step %d: the model's modes (train/eval) are not those it had when the Recorder was created, "
                  "which its saved TorchScript keeps; pathkernel draws dropout where the saved module is in "
                  "training mode. Train in the mode the model had then (model.train() after evaluating)" % s)
        for n_, p in zip(self._names, self._params):
            if p.grad is None:
                _fail("step %d: parameter '%s' has no gradient, so torch's optimizer skipped it (no weight decay, "
                      "no momentum); pathkernel's update rule updates every parameter. Use every parameter in "
                      "the loss, and optimizer.zero_grad(set_to_none=False)" % (s, n_))
        if not self._start_matches:
            _fail("step %d: the weights the optimizer stepped from are not the recorded w_%d: the loop changed "
                  "them outside optimizer.step() (after the previous rec.step(), or before the first step after "
                  "the Recorder was created); pathkernel decomposes the optimizer's steps alone" % (s, s))
        helper_clip, self._step_clip = self._step_clip, None
        if clip_factor is not None:
            clip_factor = float(clip_factor)
            if not (math.isfinite(clip_factor) and clip_factor > 0):
                _fail("step %d: clip_factor must be finite and > 0 (got %r)" % (s, clip_factor))
            if helper_clip is not None and helper_clip != clip_factor:
                _fail("step %d: clip_factor=%r, but clip_grad_norm_ applied %r" % (s, clip_factor, helper_clip))
        else:
            clip_factor = helper_clip
        if loss is None or accuracy is None:
            l, a = self._batch_metrics(self._w, idx)
            loss = l if loss is None else loss
            accuracy = a if accuracy is None else accuracy
        loss = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
        accuracy = float(accuracy)

        w = self._flat_weights()
        if not np.all(np.isfinite(w)):
            self._status = "diverged"
            self._message = "the weights are not finite after step %d; the path ends at step %d" % (s, s)
            self._finish()
            _fail("step %d: the weights are not finite after the step; the run ends at step %d (status diverged)"
                  % (s, s))
        record = self._write_flat(step_name("checkpoints/w_", s + 1), w)
        self._path_bytes_after_w0 += record["bytes"]
        state = self._state_after_step(s)
        self._checkpoints.append(dict(step=s + 1, **record, optimizer_state=state))
        self._batch_rows.append(idx.astype(np.int32))
        self._batch_size = max(self._batch_size, idx.size)
        self._learning_rates.append(lr)
        self._metrics.append((s, lr, loss, accuracy))
        if clip_factor is not None:
            self._any_clip = True
        self._clip.append(1.0 if clip_factor is None else clip_factor)
        self._w = w
        self.steps = s + 1
        if self.steps - self._flushed >= min(1000, max(FLUSH_EVERY, self.steps // 10)):
            self._flush()

    # --------------------------------------------------------------- writing

    def _flush(self):
        """Writes the pending batch rows, clip factors and metrics, then the
        manifest listing them."""
        if self._batch_rows:
            width = max(r.size for r in self._batch_rows)
            rows = np.full((len(self._batch_rows), width), -1, dtype=np.int32)
            for i, r in enumerate(self._batch_rows):
                rows[i, :r.size] = r
            record = self._write(step_name("batches/b_", self._flushed), npy_bytes(rows))
            self._path_bytes_after_w0 += record["bytes"]
            self._batch_files.append(dict(first_step=self._flushed, steps=len(self._batch_rows), **record))
            self._batch_rows = []
        old_clip = self._clip_file
        if self._any_clip:
            # While running, the file is named by its step count, so the
            # manifest on disk always lists a file that matches it.
            relative = "clip_factors.npy" if self._status != "running" else \
                "clip_factors_%08d.npy" % self.steps
            self._clip_file = self._write(relative, npy_bytes(np.asarray(self._clip, dtype=np.float64)))
        self._flushed = self.steps
        self._write_metrics()
        self._write_manifest()
        if old_clip is not None and self._clip_file is not None and old_clip["file"] != self._clip_file["file"]:
            try:
                os.unlink(os.path.join(self.directory, old_clip["file"]))
            except OSError:
                pass

    def _write_metrics(self):
        lines = ["step,lr,loss,batch_accuracy\n"]
        lines += ["%d,%.17g,%.17g,%.17g\n" % row for row in self._metrics]
        self._write("metrics.csv", "".join(lines).encode())

    def _manifest(self):
        steps = self._flushed
        x_shape = list(self._x.shape[1:])
        data = {
            "spec": "npy:data",
            "train_size": -1,
            "test_size": -1,
            "seed": 0,
            "num_train": self.num_train,
            "num_test": self.num_test,
            "input_shape": x_shape,
            "num_classes": self.num_classes,
            "normalization": {"kind": "none"},
            "source": {"kind": "npy", "directory": "data", "in_run": True,
                       "files": ["train_x.npy", "train_y.npy", "test_x.npy", "test_y.npy"],
                       "inputs": "integer" if self.integer_inputs else "float"},
            "train_crc32": self._train_crc32,
        }
        if self.integer_inputs:
            data["integer_inputs"] = True
        tensors, offset = [], 0
        for n_, shape, numel in zip(self._names, self._shapes, self._numels):
            tensors.append({"name": n_, "shape": list(shape), "offset": offset, "numel": numel})
            offset += numel
        training = {
            "batch_size": int(self._batch_size),
            "batch_seed": 0,
            "schedule": "recorded",
            "threads": torch.get_num_threads(),
            "checkpoint_every": 1,
            "recorded": True,
            "loss": self.loss,
        }
        if self._any_clip and self._clip_file is not None:
            training["clip_factors"] = dict(self._clip_file)
        return {
            "format": "pathkernel-run",
            "format_version": 1,
            "pathkernel_version": _pathkernel_version,
            "libtorch_version": _libtorch_version(),
            "status": self._status,
            "message": self._message,
            "steps": steps,
            "data": data,
            "model": {"spec": "torchscript:model.pt", "output": self.output, "zero_last_layer": False,
                      "init_seed": 0, "module": dict(self._module_record)},
            "dtype": self.dtype,
            "parameters": {"count": self.parameter_count, "tensors": tensors},
            "optimizer": dict(self._declaration),
            "training": training,
            "environment": {"cpu": _cpu_model(), "cpu_capability": _torch_config_value("CPU capability usage:"),
                            "blas": "", "blas_kernels": "", "libtorch": _libtorch_version(),
                            "threads": torch.get_num_threads()},
            "learning_rates": self._learning_rates[:steps],
            "checkpoints": self._checkpoints[:steps + 1],
            "batches": list(self._batch_files),
            "metrics": "metrics.csv",
            "summary": self._summary,
        }

    def _write_manifest(self):
        sync_files(self.directory, self._unsynced)
        self._unsynced = []
        write_atomic(os.path.join(self.directory, "manifest.json"), json_text(self._manifest()).encode())

    def _accuracy(self, x, y):
        if x.shape[0] == 0:
            return None
        if self.loss == "mse":
            return 0.0  # regression targets have no classes (as pathkernel's training writes it)
        correct = 0
        with torch.no_grad():
            for start in range(0, x.shape[0], 1024):
                out = self._eval_module(x[start:start + 1024])
                correct += int((out.argmax(1) == y[start:start + 1024]).sum())
        return correct / x.shape[0]

    def _finish(self):
        # Weights of the last recorded step, for the summary.
        with torch.no_grad():
            offset = 0
            for n_, numel, shape in zip(self._names, self._numels, self._shapes):
                p = self._eval_params[n_]
                p.copy_(torch.from_numpy(self._w[offset:offset + numel]).reshape(shape).to(p.dtype))
                offset += numel
        self._summary = {"final_batch_loss": self._metrics[-1][2] if self._metrics else None,
                         "train_accuracy": self._accuracy(self._x, self._y),
                         "test_accuracy": self._accuracy(self._xt, self._yt)}
        self._flush()
        self._closed = True
        self._release_dropout()
        _open_recorders.discard(self)

    def _release_dropout(self):
        if getattr(self, "_dropout", None) is not None:
            self._dropout.remove()
            self._dropout = None

    def close(self):
        """Ends the recording: writes the last batches, the summary and the
        manifest with status complete."""
        if self._closed:
            return
        self._status = "complete"
        self._finish()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        elif not self._closed:
            # The run stays 'running' up to the last recorded step.
            self._message = "the training loop raised %s: %s" % (exc_type.__name__, exc)
            self._flush()
            self._closed = True
            self._release_dropout()
            _open_recorders.discard(self)
        return False

    @property
    def bytes_per_step(self):
        """Bytes the run's path takes per recorded step, as ``pathkernel info``
        counts them: every checkpoint (w_0 included), the optimizer buffers,
        the batch indices and the clip factors, over the steps. Before the
        first step: the bytes one step will take."""
        per_w = 8 * self.parameter_count + 128
        if self.steps == 0:
            buffers = {"sgd": 0, "momentum": 1, "nesterov": 1}.get(self._declaration["name"], 2)
            return per_w * (1 + buffers)
        pending = sum(4 * r.size for r in self._batch_rows)
        clip = self._clip_file["bytes"] if self._clip_file else 0
        return (self._checkpoints[0]["bytes"] + self._path_bytes_after_w0 + pending + clip) / self.steps

    @property
    def status(self):
        return self._status
