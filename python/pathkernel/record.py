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

The recorder stores a compact run: checkpoints of the weights and the
optimizer's state every ~√N steps (pathkernel._schedule says which steps;
``expected_steps`` sets the spacing to ⌈√expected_steps⌉), in the model's
dtype, and each step's batch, learning rate and clip factor; the engine
replays the steps between checkpoints with the saved TorchScript module and
LibTorch's optimizer. ``every_step=True`` stores every step's weights and
state in float64 instead (nothing replayed). Either way the run holds the
optimizer's kind and hyper-parameters, the model as TorchScript and the
data as .npy (an input array of at most 256 distinct values, such as images
of 8-bit pixels, as uint8 codes and the table of its values), in a run directory that every pathkernel command reads
(docs/run-directory.md); ``rec.bytes_per_step`` says how many bytes a step
takes.

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

BatchNorm in training mode (with running statistics): every checkpoint also
stores the module's buffers μ (checkpoints/mu_*.npy, as pathkernel's own runs
do; docs/math.md §15); each step must be one training-mode forward of its
whole batch. Sequence models (outputs [n, T, V], loss
``F.cross_entropy(logits.flatten(0, 1), y.flatten())`` over tokens [n, T])
are stored as a sequence data set; ``pathkernel verify --position t``.
"""
import io
import os
import types
import warnings
import weakref
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from . import __version__ as _pathkernel_version
from ._checks import (COUNTING_OPTIMIZERS, LOSSES, SUPPORTED_OPTIMIZERS, RecordSpec, batch_counts,
                      check_batch_counts, check_gradients, check_hyper_parameters, check_modes, check_record,
                      check_vocabulary, clip_factor_of_step, flat_indices, optimizer_step_count, step_learning_rate)
from ._environment import environment, libtorch_version, set_threads
from ._errors import RecorderError
from ._manifest import DataInfo, FileRecord, Manifest, ModelInfo, TrainingInfo, parameter_layout
from ._metrics import Metrics, outputs_loss_and_accuracy
from ._schedule import CheckpointSchedule
from ._writer import RunWriter
from .dropout import SeededForward

__all__ = ["Recorder", "RecorderError", "ThreadsWarning", "clip_grad_norm_", "set_threads", "SUPPORTED_OPTIMIZERS",
           "LOSSES"]

# Recorders that are open, so that clip_grad_norm_ can tell them the factor.
_open_recorders: "weakref.WeakSet[Recorder]" = weakref.WeakSet()


def clip_grad_norm_(parameters: Any, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> torch.Tensor:
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


class ThreadsWarning(UserWarning):
    """A compact recording of a loop on several threads of a BLAS whose
    threaded products the engine does not follow on one thread: pathkernel
    may have to replay its steps in turn with its own work, not beside it.
    ``warnings.simplefilter("ignore", ThreadsWarning)`` silences it."""


def _threads_followed(blas: str) -> bool:
    """Whether the engine adds this OpenBLAS's threaded products alike on one
    thread (include/pathkernel/threaded_products.h follows 0.3.21's threaded
    driver, calling the routines of a DYNAMIC_ARCH build's table)."""
    return blas.startswith("OpenBLAS 0.3.21 ") and " DYNAMIC_ARCH " in f" {blas} "


def _warn_threads(torch_threads: int, blas_threads: int, blas: str, blas_kernels: str,
                  dtype: str = "float32") -> None:
    """Warns (ThreadsWarning) when a compact run's loop runs on threads the
    engine's replay may not reproduce beside its own work: it replays the
    steps between checkpoints bit for bit, beside its work where its own
    thread can, else in turn. torch's operations on several threads split
    by the thread's OpenMP team, which the replay's thread takes at the
    loop's size; OpenBLAS's products on several threads add in another order
    than on one, which the engine follows on one thread for Debian's
    OpenBLAS 0.3.21 (any kernels, float32 and float64:
    scripts/blas_thread_bits.py), not for another. Measured on a 2-core AMD
    EPYC (docs/own-model.md): LeNet-5 trained one epoch at torch 1, OpenBLAS
    2 threads, `verify --test 1` took 16.4 s with its replay in turn, before
    the engine followed OpenBLAS's threads."""
    if blas_threads <= 1 or _threads_followed(blas):
        return
    warnings.warn(
        f"pathkernel.record: this {dtype} loop runs on {torch_threads} torch thread(s) and {blas_threads} OpenBLAS "
        f"thread(s) ({blas_kernels or 'no OpenBLAS'} kernels); pathkernel replays its steps beside its own work "
        "only where one thread reproduces them bit for bit (sums split over threads often add in another "
        "order), else in turn, which can make verify a quarter slower. Call pathkernel.record.set_threads(1) "
        "before the loop to replay it beside, or silence this with "
        "warnings.simplefilter('ignore', pathkernel.record.ThreadsWarning).", ThreadsWarning, stacklevel=3)


def _module_bytes(script: torch.jit.ScriptModule) -> bytes:
    buf = io.BytesIO()
    try:
        torch.jit.save(script, buf)
    except Exception as e:
        raise RecorderError(f"cannot save the TorchScript module ({e})") from e
    return buf.getvalue()


def _manifest(spec: RecordSpec, module: FileRecord, schedule: CheckpointSchedule, data_files: List[str]) -> Manifest:
    """The run's manifest before its first step; ``data_files``: the files in
    data/."""
    d = spec.data
    source = {"kind": "npy", "directory": "data", "in_run": True, "files": data_files,
              "inputs": "integer" if d.integer_inputs else "float"}
    data = DataInfo(num_train=d.num_train, num_test=d.num_test, input_shape=list(d.x.shape[1:]),
                    num_classes=d.num_classes, source=source, train_crc32=d.train_crc32,
                    integer_inputs=d.integer_inputs, sequence_length=d.sequence_length)
    return Manifest(pathkernel_version=_pathkernel_version, libtorch_version=libtorch_version(), data=data,
                    model=ModelInfo(output=spec.output, module=module), dtype=spec.dtype_name,
                    parameters=parameter_layout(spec.names, spec.shapes),
                    optimizer=dict(spec.optimizer.declaration),
                    training=TrainingInfo(loss=spec.loss, checkpoint_every=schedule.interval),
                    environment=environment())


class Recorder:
    """Records a PyTorch training loop into a pathkernel run directory.

    Arguments:
      directory: the run directory to create (refused if it exists and is not
        empty, unless ``overwrite=True`` and it holds a previous run).
      model: the torch.nn.Module being trained (on the CPU, float32 or float64).
      optimizer: the torch.optim.SGD, Adam, AdamW, RMSprop or Adagrad instance that trains it,
        created over exactly the model's parameters, before its first step.
      train_x, train_y: the training set, tensors or numpy arrays; train_x is
        [n, *input_shape] (float32/float64, or integer ids, stored as int64),
        train_y holds class labels [n] in [0, K), or for loss "mse" float
        targets [n, K], or for a sequence model (outputs [n, T, V], loss
        ``F.cross_entropy(logits.flatten(0, 1), y.flatten())``, the mean over
        tokens) integer tokens [n, T] in [0, V). The loop's batches index
        these arrays.
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
      every_step: store every step's weights and optimizer state in float64
        (nothing is replayed; about 8 (1 + buffers) P bytes a step). By
        default the run is compact: checkpoints in the model's dtype on the
        schedule of pathkernel._schedule, the steps between replayed.
      expected_steps: about how many steps the loop will take; the
        checkpoints are then every ⌈√expected_steps⌉ steps. Without it their
        spacing grows like √step (about 2√N checkpoints after N steps).
      vocabulary: a sequence model's tokens as text, a list of V strings
        (data/vocabulary.json; explain shows each sequence's text with it).
        By default a sequence model with integer inputs gets "<0>" .. "<V-1>".
      summary_accuracy: compute the summary's train and test accuracy at
        close, a forward pass over both sets. Off by default: the summary's
        accuracies are then null, and the recorder costs the loop little
        (that pass is as long as a third of an epoch on a large training
        set; docs/measurements.md); pass True to have them in the run.

    Call ``rec.step(idx)`` right after every ``optimizer.step()`` (before
    ``scheduler.step()``), and ``rec.close()`` at the end (or use ``with``).
    The recorder wraps ``optimizer.step`` (on this instance) to read the
    learning rate each step runs with at that moment, so a scheduler stepped
    before ``rec.step`` is still recorded right; two optimizer steps without a
    ``rec.step`` between them, or a ``rec.step`` without one, are refused.

    The checks are in pathkernel._checks (their RecordSpec is what is
    recorded), the files in pathkernel._writer, the manifest's schema in
    pathkernel._manifest.
    """

    def __init__(self, directory: "str | os.PathLike[str]", model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, train_x: Any, train_y: Any, test_x: Any = None,
                 test_y: Any = None, loss: str = "cross_entropy", output: Optional[str] = None,
                 script: Optional[torch.jit.ScriptModule] = None, overwrite: bool = False,
                 every_step: bool = False, expected_steps: Optional[int] = None, summary_accuracy: bool = False,
                 vocabulary: Optional[List[str]] = None):
        self.directory = os.fspath(directory)
        self._closed = True  # until construction succeeds
        self._schedule = CheckpointSchedule.choose(every_step, expected_steps)
        self._summary_accuracy = summary_accuracy
        spec = check_record(model, optimizer, train_x, train_y, test_x, test_y, loss, output, script)
        # Every step in float64 (the uncompressed format), else the model's dtype.
        self._store_dtype = torch.float64 if self._schedule.every_step else spec.params[0].dtype
        self._spec = spec
        self.loss, self.output, self.dtype = spec.loss, spec.output, spec.dtype_name
        self.integer_inputs = spec.data.integer_inputs
        self.num_classes, self.num_train, self.num_test = spec.data.num_classes, spec.data.num_train, spec.data.num_test
        self.parameter_count = spec.parameter_count
        self._model, self._optimizer = model, optimizer
        self._param_ids = {id(p) for p in spec.params}

        self._writer = RunWriter(self.directory, overwrite, environment,
                                 flush_at_checkpoints=not self._schedule.every_step)
        d = spec.data
        data_files = self._writer.add_data({"train_x": d.x.numpy(), "train_y": d.y.numpy(),
                                            "test_x": d.test_x.numpy(), "test_y": d.test_y.numpy()},
                                           coded=("train_x", "test_x"))
        words = check_vocabulary(vocabulary, d)
        if words is not None:
            self._writer.add_vocabulary(words)
        module_bytes = _module_bytes(spec.script)
        module = self._writer.add_module(module_bytes)
        manifest = _manifest(spec, module, self._schedule, data_files)
        self._metrics = Metrics(module_bytes, manifest.parameters, spec.loss)
        self.steps = 0
        self._w = self._flat_weights()
        self._mu = self._flat_module_buffers()
        self._counts = batch_counts(spec.coupling)
        self._writer.start(manifest, self._stored(self._w), self._mu)
        if not self._schedule.every_step:  # every step stored: nothing is replayed
            e = manifest.environment
            _warn_threads(e.threads, e.blas_threads, e.blas, e.blas_kernels, spec.dtype_name)
        self._next_checkpoint = self._schedule.next_after(0)

        self._pending_clip: Optional[float] = None  # set by clip_grad_norm_ before optimizer.step()
        self._step_clip: Optional[float] = None     # the factor the last optimizer.step() ran with
        self._step_lrs: List[List[float]] = []      # the lr of each optimizer.step() since the last rec.step
        self._start_matches = True                  # the last optimizer.step() started from w_s
        self._install_step_hook(optimizer)
        self._closed = False
        self._install_dropout(model, spec.dropout_sites)
        self._install_output_hook(model, spec.dropout_sites)
        _open_recorders.add(self)

    # ---------------------------------------------------------------- set-up

    def _install_step_hook(self, optimizer: torch.optim.Optimizer) -> None:
        """Wraps optimizer.step (on the instance) to note the learning rate each
        step used, the clip factor pending at that moment and how many steps
        ran. Schedulers wrap it again; both keep working."""
        original = optimizer.step
        counted = getattr(original, "_with_counter", False)
        recorder = weakref.ref(self)

        def step(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
            rec = recorder()
            if rec is not None and not rec._closed:
                rec._step_lrs.append([g["lr"] for g in opt.param_groups])
                rec._step_clip = rec._pending_clip
                rec._pending_clip = None
                rec._start_matches = np.array_equal(rec._flat_weights(), rec._w)
            if not counted:  # what a scheduler's own wrapper counts
                opt._step_count = getattr(opt, "_step_count", 0) + 1
            return original(*args, **kwargs)

        # A scheduler created later sees a counted step and leaves it as is.
        step._with_counter = True
        optimizer.step = types.MethodType(step, optimizer)

    def _install_output_hook(self, model: torch.nn.Module, sites: int) -> None:
        """Keeps the outputs of the loop's last forward with gradients on, so
        metrics.csv's batch loss and accuracy need no forward of their own.
        Without dropout, that forward at w_s on the step's batch is the
        batch's loss (BatchNorm in training mode: with the batch's own
        statistics, as the step used them)."""
        self._outputs: Optional[torch.Tensor] = None
        self._output_hook = None
        if sites > 0 or isinstance(model, torch.jit.ScriptModule):
            # The loop's forward drew dropout masks (or takes no hooks): the saved module computes the metrics.
            return

        def keep(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            if torch.is_grad_enabled() and isinstance(output, torch.Tensor):
                self._outputs = output.detach()
        self._output_hook = model.register_forward_hook(keep)

    def _batch_metrics(self, idx: np.ndarray) -> Tuple[float, float]:
        """The batch loss and accuracy at w_s: from the loop's own forward
        when it was on this batch, else by the saved module."""
        out, self._outputs = self._outputs, None
        y = self._spec.data.y
        if out is not None and out.dim() >= 1 and out.shape[0] == idx.size:
            return outputs_loss_and_accuracy(out, y.index_select(0, torch.from_numpy(idx)), self.loss)
        return self._metrics.batch(self._w, self._spec.data.x, y, idx)

    def _install_dropout(self, model: torch.nn.Module, sites: int) -> None:
        """While the recorder is open, the model's dropout draws the engine's
        masks (pathkernel.dropout)."""
        self._dropout = None
        if sites > 0:
            self._modes = [m.training for m in model.modules()]
            self._dropout = SeededForward(model, 0, lambda: self.steps, sites, self._dropout_mismatch)

    def _dropout_mismatch(self, called: int, expected: int) -> None:
        raise RecorderError(
            f"step {self.steps}: the model's forward called dropout {called} time(s), but its TorchScript graph "
            f"holds {expected} dropout site(s); pathkernel numbers the sites in graph order and draws their masks "
            f"itself, counting the calls of F.dropout. Call dropout through nn.Dropout modules (not torch.dropout, "
            f"nor a dropout imported from torch.nn.functional by name)")

    # ------------------------------------------------------------- recording

    def _flat_weights(self) -> np.ndarray:
        with torch.no_grad():
            return torch.cat([p.detach().reshape(-1).to(torch.float64) for p in self._spec.params]).numpy().copy()

    def _flat_module_buffers(self) -> Optional[np.ndarray]:
        """With BatchNorm in training mode, the module's buffers μ (every
        buffer of the saved TorchScript module, in its order, as the engine
        flattens them) as float64, read from the model; else None."""
        if not self._spec.batch_statistics:
            return None
        own = dict(self._model.named_buffers())
        with torch.no_grad():
            parts = [own.get(name, b).detach().reshape(-1).to(torch.float64)
                     for name, b in self._spec.script.named_buffers()]
        return torch.cat(parts).numpy().copy()

    def _stored(self, w: np.ndarray) -> np.ndarray:
        """Flat float64 weights as the run stores them (a float32 model's
        convert back exactly)."""
        return w if self._store_dtype == torch.float64 else w.astype(np.float32)

    def _flat_state(self, name: str) -> np.ndarray:
        parts = []
        for n, p in zip(self._spec.names, self._spec.params):
            t = self._optimizer.state.get(p, {}).get(name)
            if t is None:
                raise RecorderError(f"the optimizer has no '{name}' for parameter '{n}' after the step")
            parts.append(t.detach().reshape(-1).to(self._store_dtype))
        return torch.cat(parts).numpy().copy()

    def _state_after_step(self, s: int) -> Tuple[int, Dict[str, np.ndarray]]:
        """The optimizer's step count and buffers checkpoint s+1 starts from."""
        optimizer = self._spec.optimizer
        step = optimizer_step_count(self._optimizer, self._spec.params, s) if optimizer.kind in COUNTING_OPTIMIZERS \
            else 0
        return step, {name: self._flat_state(name) for name in optimizer.buffer_names}

    def _check_step(self, s: int, clip_factor: Optional[float]) -> Tuple[float, Optional[float]]:
        """The step's learning rate and clip factor, once the loop is checked
        to have taken one optimizer step pathkernel can decompose."""
        lr = step_learning_rate(self._step_lrs, s)
        check_hyper_parameters(self._optimizer, self._spec.optimizer.hyper, s)
        check_modes(self._spec.coupling, f"step {s}", self._spec.modes)
        self._counts = check_batch_counts(self._spec.coupling, self._counts, s)
        if self._dropout is not None and [m.training for m in self._model.modules()] != self._modes:
            raise RecorderError(
                f"step {s}: the model's modes (train/eval) are not those it had when the Recorder was created, "
                f"which its saved TorchScript keeps; pathkernel draws dropout where the saved module is in training "
                f"mode. Train in the mode the model had then (model.train() after evaluating)")
        check_gradients(self._spec.names, self._spec.params, s)
        if not self._start_matches:
            raise RecorderError(
                f"step {s}: the weights the optimizer stepped from are not the recorded w_{s}: the loop changed them "
                f"outside optimizer.step() (after the previous rec.step(), or before the first step after the "
                f"Recorder was created); pathkernel decomposes the optimizer's steps alone")
        helper_clip, self._step_clip = self._step_clip, None
        return lr, clip_factor_of_step(clip_factor, helper_clip, s)

    def step(self, idx: Any, clip_factor: Optional[float] = None, loss: Any = None,
             accuracy: Optional[float] = None) -> None:
        """Records the step the optimizer just took: ``idx`` are its training
        indices (a LongTensor, array or list, no repeats). Call it right after
        ``optimizer.step()`` and before ``scheduler.step()``.

        clip_factor: the factor the gradients were multiplied by before the
          step (gradient clipping by norm); not needed when the loop clips
          with ``pathkernel.record.clip_grad_norm_``.
        loss, accuracy: the batch loss (and accuracy) at the weights before the
          step, for metrics.csv; by default the recorder computes them."""
        if self._closed:
            raise RecorderError("rec.step: the recorder is closed")
        s = self.steps
        idx = flat_indices(idx, self.num_train)
        lr, clip_factor = self._check_step(s, clip_factor)
        if loss is None or accuracy is None:
            batch_loss, batch_accuracy = self._batch_metrics(idx)
            loss = batch_loss if loss is None else loss
            accuracy = batch_accuracy if accuracy is None else accuracy
        loss = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
        accuracy = float(accuracy)

        w = self._flat_weights()
        if not np.all(np.isfinite(w)):
            end = self._writer.last_checkpoint_step
            self._finish("diverged", f"the weights are not finite after step {s}; the path ends at step {end}")
            raise RecorderError(f"step {s}: the weights are not finite after the step; the run ends at step {end} "
                                f"(status diverged)")
        mu = self._flat_module_buffers()
        checkpoint = s + 1 == self._next_checkpoint
        if checkpoint:
            self._write_checkpoint(s + 1, w, mu)
        self._writer.on_step(s, idx, lr, loss, accuracy, clip_factor)
        if checkpoint and not self._schedule.every_step:
            self._writer.flush()
        self._w, self._mu = w, mu
        self.steps = s + 1

    def _write_checkpoint(self, step: int, w: np.ndarray, mu: Optional[np.ndarray]) -> None:
        """Writes w_step, the optimizer's state after step - 1 and the
        module's buffers μ_step (BatchNorm in training mode)."""
        optimizer_step, buffers = self._state_after_step(step - 1)
        self._writer.write_checkpoint(step, self._stored(w), optimizer_step, buffers, mu)
        self._next_checkpoint = self._schedule.next_after(step)

    # ------------------------------------------------------------------ end

    def _finish(self, status: str, message: Optional[str] = None) -> None:
        self._metrics.load(self._w, self._mu)  # the weights (and running statistics) of the last recorded step
        d = self._spec.data
        summary: Dict[str, Optional[float]] = {"final_batch_loss": self._writer.last_loss, "train_accuracy": None,
                                               "test_accuracy": None}
        if self._summary_accuracy:
            summary["train_accuracy"] = self._metrics.accuracy(d.x, d.y)
            summary["test_accuracy"] = self._metrics.accuracy(d.test_x, d.test_y)
        self._writer.stop(status, message, summary)
        self._close_hooks()

    def _close_hooks(self) -> None:
        self._closed = True
        if getattr(self, "_output_hook", None) is not None:
            self._output_hook.remove()
            self._output_hook = None
        if getattr(self, "_dropout", None) is not None:
            self._dropout.remove()
            self._dropout = None
        _open_recorders.discard(self)

    def close(self) -> None:
        """Ends the recording: writes the last batches, the summary and the
        manifest with status complete."""
        if self._closed:
            return
        if self._writer.last_checkpoint_step != self.steps:
            self._write_checkpoint(self.steps, self._w, self._mu)  # the path ends at a checkpoint
        self._finish("complete")

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if exc_type is None:
            self.close()
        elif not self._closed:
            # The run stays 'running' up to the last recorded step.
            self._writer.interrupt(f"the training loop raised {exc_type.__name__}: {exc}")
            self._close_hooks()
        return False

    @property
    def bytes_per_step(self) -> float:
        """Bytes the run's path takes per recorded step, as ``pathkernel info``
        counts them: every checkpoint (w_0 included), the optimizer buffers,
        BatchNorm's running statistics, the batch indices and the clip
        factors, over the steps. Before the
        first step: the bytes one step will take."""
        if self.steps == 0:
            per_w = torch.finfo(self._store_dtype).bits // 8 * self.parameter_count + 128
            per_mu = 8 * self._mu.size + 128 if self._mu is not None else 0
            return per_w * (1 + len(self._spec.optimizer.buffer_names)) + per_mu
        return self._writer.path_bytes() / self.steps

    @property
    def status(self) -> str:
        return self._writer.manifest.status
