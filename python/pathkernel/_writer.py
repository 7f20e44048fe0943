"""Writing a recorded run directory while the loop runs.

The layout and the guarantees of pathkernel's C++ run writer
(src/path/run_writer.cpp, include/pathkernel/run_writer.h):

    manifest.json                 the index (_manifest.Manifest), rewritten at each flush
    checkpoints/w_SSSSSSSS.npy    w_s, [P] (float64 every step; the run's dtype when compact)
    optimizer/NAME_SSSSSSSS.npy   the optimizer's buffers the step s starts from, [P], same dtype
    checkpoints/mu_SSSSSSSS.npy   BatchNorm in training mode: the module's buffers μ_s, float64 [Q]
    batches/b_SSSSSSSS.npy        int32 [steps, max batch] indices of the steps since the last flush
    clip_factors.npy              float64 [N], each step's clip factor (when the loop clipped)
    metrics.csv                   step,lr,loss,batch_accuracy
    model.pt, data/*.npy          the TorchScript module and the data (an input array with at most
                                  256 distinct values as NAME.codes.npy uint8 + NAME.values.npy)
    data/vocabulary.json          a sequence data set's tokens as text

Every file is written atomically; the path's files are synced, together,
before the manifest that lists them is written, so an interrupted loop
leaves a run that reads as valid up to its last flush.

The writer knows nothing of torch: it takes numpy arrays and bytes.
``write_checkpoint`` and ``on_step`` are separate, so a writer can store
the weights of some steps only: a compact writer (``flush_at_checkpoints``)
flushes only right after a checkpoint, so the manifest on disk always ends
at a checkpoint (steps = its step), and an interrupted or diverged loop
leaves a run that reads as valid up to its last checkpoint.
"""
import os
import shutil
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from ._errors import RecorderError
from ._files import json_text, npy_bytes, step_name, sync_files, value_codes, write_atomic
from ._manifest import MANIFEST_FILE, BatchRecord, CheckpointRecord, Environment, FileRecord, Manifest

# Steps between two rewrites of manifest.json while recording (and so the
# steps of one batch file): 50, or a tenth of the steps so far past 500, at
# most 1000, so the manifest's rewrites cost time linear in the steps.
FLUSH_EVERY = 50

MetricsRow = Tuple[int, float, float, float]  # step, lr, loss, batch accuracy


def prepare_directory(directory: str, overwrite: bool) -> None:
    """Creates the run directory and its subdirectories. Refuses a path that
    is not a directory, and a non-empty directory unless ``overwrite`` and it
    holds a previous run (never deletes what is not a pathkernel run)."""
    if os.path.exists(directory):
        if not os.path.isdir(directory):
            raise RecorderError(f"run path '{directory}' exists and is not a directory")
        if os.listdir(directory):
            if not overwrite:
                raise RecorderError(f"run directory '{directory}' already exists and is not empty; pass "
                                    f"overwrite=True to replace a previous run")
            if not os.path.exists(os.path.join(directory, MANIFEST_FILE)):
                raise RecorderError(f"run directory '{directory}' is not empty and holds no manifest.json, so it "
                                    f"is not a pathkernel run; refusing to delete it even with overwrite=True")
            shutil.rmtree(directory)
    for sub in ("", "checkpoints", "optimizer", "batches", "data"):
        os.makedirs(os.path.join(directory, sub), exist_ok=True)


def metrics_csv(rows: List[MetricsRow]) -> bytes:
    """metrics.csv's bytes (src/path/metrics_csv.cpp's columns)."""
    lines = ["step,lr,loss,batch_accuracy\n"]
    lines += [f"{step},{lr:.17g},{loss:.17g},{accuracy:.17g}\n" for step, lr, loss, accuracy in rows]
    return "".join(lines).encode()


def batch_rows(batches: List[np.ndarray]) -> np.ndarray:
    """The batches of consecutive steps as int32 [steps, max batch], rows
    padded with -1."""
    width = max(r.size for r in batches)
    rows = np.full((len(batches), width), -1, dtype=np.int32)
    for i, r in enumerate(batches):
        rows[i, :r.size] = r
    return rows


class RunWriter:
    """Writes one recorded run: ``add_data`` and ``add_module``, then
    ``start`` with the manifest and w_0, then per step ``write_checkpoint``
    and ``on_step``, and ``stop`` (or ``interrupt``) at the end.

    ``environment`` is read each time the manifest is written (the loop may
    change torch's thread count)."""

    def __init__(self, directory: str, overwrite: bool, environment: Callable[[], Environment],
                 flush_at_checkpoints: bool = False):
        prepare_directory(directory, overwrite)
        self._flush_at_checkpoints = flush_at_checkpoints
        self.directory = directory
        self._environment = environment
        self.manifest: Optional[Manifest] = None
        self.steps = 0                           # steps recorded
        self._flushed = 0                        # steps the manifest on disk lists
        self._unsynced: List[str] = []           # written, to sync before the next manifest
        self._pending_batches: List[np.ndarray] = []  # steps >= self._flushed, not yet in a file
        self._metrics: List[MetricsRow] = []
        self._clip: List[float] = []             # one factor per step (1.0 where none)
        self._any_clip = False
        self._path_bytes_after_w0 = 0

    # -------------------------------------------------------------- before

    def add_data(self, arrays: Dict[str, np.ndarray], coded: Tuple[str, ...] = ()) -> List[str]:
        """Writes data/NAME.npy for each array (synced). An array named in
        ``coded`` with at most 256 distinct values goes instead, when that is
        smaller, to the pair data/NAME.codes.npy (uint8, the array's shape)
        and data/NAME.values.npy (its distinct values, in its dtype),
        values[codes] being the array bit for bit. Returns the files
        written, relative to data/."""
        files = []
        for name, array in arrays.items():
            pair = value_codes(array) if name in coded else None
            if pair is not None and array.size * array.itemsize <= pair[0].size + pair[1].size * array.itemsize + 128:
                pair = None  # the pair would not be smaller (a small array)
            parts = [(name + ".npy", array)] if pair is None else \
                [(name + ".codes.npy", pair[0]), (name + ".values.npy", pair[1])]
            for file, part in parts:
                write_atomic(os.path.join(self.directory, "data", file), npy_bytes(part))
                files.append(file)
        return files

    def add_vocabulary(self, words: List[str]) -> None:
        """Writes data/vocabulary.json (synced): a sequence data set's tokens
        as text, one string per code (src/data/npy_dir.cpp reads it)."""
        write_atomic(os.path.join(self.directory, "data", "vocabulary.json"), json_text(words).encode())

    def add_module(self, data: bytes, relative: str = "model.pt") -> FileRecord:
        """Writes the TorchScript module's bytes (synced); returns its record."""
        write_atomic(os.path.join(self.directory, relative), data)
        return FileRecord.of(relative, data)

    def start(self, manifest: Manifest, weights: np.ndarray, module_buffers: Optional[np.ndarray] = None) -> None:
        """Writes w_0 (and μ_0) and the first manifest (status running, 0 steps)."""
        self.manifest = manifest
        self.write_checkpoint(0, weights, 0, {}, module_buffers)
        self._save_manifest()

    # ------------------------------------------------------------ each step

    def write_checkpoint(self, step: int, weights: np.ndarray, optimizer_step: int,
                         buffers: Dict[str, np.ndarray], module_buffers: Optional[np.ndarray] = None) -> None:
        """Writes w_step, the optimizer's buffers the step starts from and
        (BatchNorm in training mode) the module's buffers μ_step, float64,
        and lists them at the next flush."""
        weights_file = self._write(step_name("checkpoints/w_", step), npy_bytes(weights))
        buffer_files = {name: self._write(step_name(f"optimizer/{name}_", step), npy_bytes(b))
                        for name, b in buffers.items()}
        mu_file = None if module_buffers is None else \
            self._write(step_name("checkpoints/mu_", step), npy_bytes(module_buffers.astype(np.float64)))
        if step > 0:
            self._path_bytes_after_w0 += weights_file.bytes + sum(f.bytes for f in buffer_files.values()) + \
                (mu_file.bytes if mu_file is not None else 0)
        self.manifest.checkpoints.append(CheckpointRecord(step, weights_file, optimizer_step, buffer_files, mu_file))

    def on_step(self, step: int, batch: np.ndarray, lr: float, loss: float, accuracy: float,
                clip_factor: Optional[float]) -> None:
        """Records step ``step``: its batch (training indices), learning rate,
        metrics and clip factor (None: not clipped). Flushes when due."""
        self._pending_batches.append(batch.astype(np.int32))
        training = self.manifest.training
        training.batch_size = max(training.batch_size, int(batch.size))
        self.manifest.learning_rates.append(lr)
        self._metrics.append((step, lr, loss, accuracy))
        if clip_factor is not None:
            self._any_clip = True
        self._clip.append(1.0 if clip_factor is None else clip_factor)
        self.steps = step + 1
        if self._flush_at_checkpoints:
            return  # the recorder flushes after each checkpoint
        if self.steps - self._flushed >= min(1000, max(FLUSH_EVERY, self.steps // 10)):
            self.flush()

    # ---------------------------------------------------------------- end

    def stop(self, status: str, message: Optional[str], summary: Dict[str, Optional[float]]) -> None:
        """Writes what is pending and the manifest with its final status (and
        ``message``, why it stopped, unless None)."""
        self.manifest.status = status
        if message is not None:
            self.manifest.message = message
        self.manifest.summary = summary
        if self._flush_at_checkpoints and self.last_checkpoint_step != self.steps:
            self._save_manifest()  # the path ends at the last checkpoint (and flush)
        else:
            self.flush()

    def interrupt(self, message: str) -> None:
        """The loop raised: the run stays 'running' up to the last step (a
        compact writer's: up to the last checkpoint)."""
        self.manifest.message = message
        if self._flush_at_checkpoints:
            self._save_manifest()
        else:
            self.flush()

    @property
    def last_checkpoint_step(self) -> int:
        return self.manifest.checkpoints[-1].step

    @property
    def last_loss(self) -> Optional[float]:
        return self._metrics[-1][2] if self._metrics else None

    def path_bytes(self) -> int:
        """Bytes of the path so far: the checkpoints (w_0 included), the
        optimizer's buffers, the module's buffers μ, the batch indices
        (pending ones too) and the clip factors' file."""
        pending = sum(4 * r.size for r in self._pending_batches)
        clip = self.manifest.training.clip_factors.bytes if self.manifest.training.clip_factors else 0
        first = self.manifest.checkpoints[0]
        mu0 = first.module_buffers.bytes if first.module_buffers is not None else 0
        return first.weights.bytes + mu0 + self._path_bytes_after_w0 + pending + clip

    # ------------------------------------------------------------- writing

    def flush(self) -> None:
        """Writes the pending batch rows, clip factors and metrics, then the
        manifest listing them."""
        if self._pending_batches:
            record = self._write(step_name("batches/b_", self._flushed), npy_bytes(batch_rows(self._pending_batches)))
            self._path_bytes_after_w0 += record.bytes
            self.manifest.batches.append(BatchRecord(self._flushed, len(self._pending_batches), record))
            self._pending_batches = []
        training = self.manifest.training
        old_clip = training.clip_factors
        if self._any_clip:
            # While running, the file is named by its step count, so the
            # manifest on disk always lists a file that matches it.
            relative = "clip_factors.npy" if self.manifest.status != "running" else \
                f"clip_factors_{self.steps:08d}.npy"
            training.clip_factors = self._write(relative, npy_bytes(np.asarray(self._clip, dtype=np.float64)))
        self._flushed = self.steps
        self._write(self.manifest.metrics, metrics_csv(self._metrics))
        self._save_manifest()
        if old_clip is not None and training.clip_factors is not None and old_clip.file != training.clip_factors.file:
            try:
                os.unlink(os.path.join(self.directory, old_clip.file))
            except OSError:
                pass

    def _write(self, relative: str, data: bytes) -> FileRecord:
        """Writes a file of the run atomically; it is synced, with the others
        written since, before the next manifest lists it."""
        path = os.path.join(self.directory, relative)
        write_atomic(path, data, sync=False)
        self._unsynced.append(path)
        return FileRecord.of(relative, data)

    def _save_manifest(self) -> None:
        sync_files(self.directory, self._unsynced)
        self._unsynced = []
        environment = self._environment()
        self.manifest.environment = environment
        self.manifest.training.threads = environment.threads
        self.manifest.steps = self._flushed
        write_atomic(os.path.join(self.directory, MANIFEST_FILE), json_text(self.manifest.to_json()).encode())
