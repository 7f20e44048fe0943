"""manifest.json's schema: the index of a run directory, in one place.

The types mirror pathkernel's C++ ``Manifest`` (include/pathkernel/manifest.h):
the recorder builds a :class:`Manifest` and writes ``Manifest.to_json()``;
read.py checks a manifest with :func:`check_header` (the required fields),
:func:`field` and the records' ``from_json``; ``Manifest.from_json`` parses
a whole one (a recorded run's manifest -> Manifest -> the same bytes).
The standard library only.

Key order is the recorder's, as every recorded run has it; it is the C++
writer's but for ``training.recorded``, which the recorder writes before
``training.loss`` (JSON objects are unordered: both read the same).
"""
from dataclasses import dataclass, field as dataclass_field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type, Union

from ._files import RunFormatError, crc32

FORMAT = "pathkernel-run"
FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
METRICS_FILE = "metrics.csv"

JsonObject = Dict[str, Any]
JsonType = Union[Type[Any], Tuple[Type[Any], ...]]

# The fields every manifest has, beyond format and format_version, with
# their JSON types.
REQUIRED_FIELDS: Tuple[Tuple[str, JsonType], ...] = (
    ("status", str), ("steps", int), ("data", dict), ("model", dict), ("dtype", str), ("parameters", dict),
    ("optimizer", dict), ("training", dict), ("learning_rates", list), ("checkpoints", list), ("batches", list),
    ("metrics", str))


def field(obj: Any, key: str, where: str, kind: Optional[JsonType] = None) -> Any:
    """Field ``key`` of the manifest object ``obj`` (``where`` names it in
    errors), checked to be of JSON type ``kind``."""
    if not isinstance(obj, dict) or key not in obj:
        raise RunFormatError(f"manifest: {where} has no field '{key}'")
    value = obj[key]
    if kind is not None and not isinstance(value, kind):
        raise RunFormatError(f"manifest: field '{key}' of {where} has the wrong type ({value!r})")
    return value


def check_header(manifest: Any, path: str) -> None:
    """Checks that ``manifest`` (read from ``path``) is a pathkernel run's
    manifest of a supported format version with every required field."""
    if not isinstance(manifest, dict):
        raise RunFormatError(f"manifest '{path}' is not a JSON object")
    fmt = field(manifest, "format", "the manifest", str)
    if fmt != FORMAT:
        raise RunFormatError(f"manifest: format is '{fmt}', expected '{FORMAT}'")
    version = field(manifest, "format_version", "the manifest", int)
    if version != FORMAT_VERSION:
        raise RunFormatError(f"manifest: format_version {version} is not supported (expected {FORMAT_VERSION})")
    for key, kind in REQUIRED_FIELDS:
        field(manifest, key, "the manifest", kind)


@dataclass(frozen=True)
class FileRecord:
    """A file of the run, relative to the run directory, with its size and
    CRC-32 (zlib's)."""
    file: str
    bytes: int
    crc32: int

    @classmethod
    def of(cls, relative: str, data: bytes) -> "FileRecord":
        return cls(relative, len(data), crc32(data))

    def to_json(self) -> JsonObject:
        return {"file": self.file, "bytes": self.bytes, "crc32": self.crc32}

    @classmethod
    def from_json(cls, j: Any, where: str) -> "FileRecord":
        return cls(field(j, "file", where, str), field(j, "bytes", where, int), field(j, "crc32", where, int))


def _optional_file(j: JsonObject, key: str, where: str) -> Optional[FileRecord]:
    return FileRecord.from_json(field(j, key, where, dict), f"{where} {key}") if key in j else None


@dataclass(frozen=True)
class ParamInfo:
    """One parameter tensor: its values are flat[offset : offset + numel],
    row-major, of the given shape."""
    name: str
    shape: Tuple[int, ...]
    offset: int
    numel: int

    def to_json(self) -> JsonObject:
        return {"name": self.name, "shape": list(self.shape), "offset": self.offset, "numel": self.numel}

    @classmethod
    def from_json(cls, j: Any) -> "ParamInfo":
        name = field(j, "name", "a parameter tensor", str)
        where = f"parameter '{name}'"
        numel = field(j, "numel", where, int)
        offset = field(j, "offset", where, int)
        return cls(name, tuple(field(j, "shape", where, list)), offset, numel)


def parameter_layout(names: Sequence[str], shapes: Sequence[Sequence[int]]) -> List[ParamInfo]:
    """The flat layout of tensors ``names`` of ``shapes``, in that order."""
    out, offset = [], 0
    for name, shape in zip(names, shapes):
        numel = 1
        for d in shape:
            numel *= int(d)
        out.append(ParamInfo(name, tuple(int(d) for d in shape), offset, numel))
        offset += numel
    return out


@dataclass
class CheckpointRecord:
    """w_step (a flat [P] .npy: float64, or the run's dtype in a compact
    recording) and the optimizer's state the step starts from: its step count
    and buffers (each a flat [P] .npy of the same dtype; none at step 0).
    ``module_buffers``: with BatchNorm in training mode, the module's buffers
    μ at this step (running statistics and batch counters, every buffer of
    the TorchScript module in its order, flat float64 [Q]), else None."""
    step: int
    weights: FileRecord
    optimizer_step: int = 0
    optimizer_buffers: Dict[str, FileRecord] = dataclass_field(default_factory=dict)
    module_buffers: Optional[FileRecord] = None

    def to_json(self) -> JsonObject:
        out: JsonObject = {"step": self.step}
        out.update(self.weights.to_json())
        out["optimizer_state"] = {"step": self.optimizer_step,
                                  "buffers": {name: f.to_json() for name, f in self.optimizer_buffers.items()}}
        if self.module_buffers is not None:  # after optimizer_state, as the C++ writer orders it
            out["module_buffers"] = self.module_buffers.to_json()
        return out

    @staticmethod
    def step_of(j: Any) -> int:
        """The step of a checkpoint entry (read.py reads the rest lazily)."""
        return field(j, "step", "a checkpoint", int)

    @classmethod
    def from_json(cls, j: Any) -> "CheckpointRecord":
        step = cls.step_of(j)
        where = f"checkpoint {step}"
        state = field(j, "optimizer_state", where, dict)
        buffers = field(state, "buffers", f"{where} optimizer_state", dict)
        return cls(step, FileRecord.from_json(j, where), field(state, "step", f"{where} optimizer_state", int),
                   {name: FileRecord.from_json(f, f"{where} buffer {name}") for name, f in buffers.items()},
                   _optional_file(j, "module_buffers", where))


@dataclass
class BatchRecord:
    """The batch indices of steps [first_step, first_step + steps): an int32
    .npy of shape [steps, max batch], rows padded with -1."""
    first_step: int
    steps: int
    indices: FileRecord

    def to_json(self) -> JsonObject:
        out: JsonObject = {"first_step": self.first_step, "steps": self.steps}
        out.update(self.indices.to_json())
        return out

    @staticmethod
    def first_step_of(j: Any) -> int:
        return field(j, "first_step", "a batch log", int)

    @classmethod
    def from_json(cls, j: Any) -> "BatchRecord":
        first = cls.first_step_of(j)
        return cls(first, field(j, "steps", "a batch log", int), FileRecord.from_json(j, f"batch log at step {first}"))


@dataclass
class DataInfo:
    """The manifest's ``data``: the training and test sets."""
    num_train: int
    num_test: int
    input_shape: List[int]
    num_classes: int
    source: JsonObject
    train_crc32: int
    integer_inputs: bool = False
    sequence_length: int = 0  # T of a sequence data set (tokens [n, T]), 0 otherwise
    spec: str = "npy:data"
    train_size: int = -1
    test_size: int = -1
    seed: int = 0
    normalization: JsonObject = dataclass_field(default_factory=lambda: {"kind": "none"})

    def to_json(self) -> JsonObject:
        out: JsonObject = {"spec": self.spec, "train_size": self.train_size, "test_size": self.test_size,
                           "seed": self.seed, "num_train": self.num_train, "num_test": self.num_test,
                           "input_shape": list(self.input_shape), "num_classes": self.num_classes,
                           "normalization": self.normalization, "source": self.source,
                           "train_crc32": self.train_crc32}
        if self.integer_inputs:
            out["integer_inputs"] = True
        if self.sequence_length > 0:
            out["sequence_length"] = self.sequence_length
        return out

    @classmethod
    def from_json(cls, j: JsonObject) -> "DataInfo":
        def get(key: str, kind: JsonType) -> Any:
            return field(j, key, "data", kind)
        return cls(num_train=get("num_train", int), num_test=get("num_test", int),
                   input_shape=get("input_shape", list), num_classes=get("num_classes", int),
                   source=get("source", dict), train_crc32=get("train_crc32", int),
                   integer_inputs=bool(j.get("integer_inputs", False)),
                   sequence_length=int(j.get("sequence_length", 0)), spec=get("spec", str),
                   train_size=get("train_size", int), test_size=get("test_size", int), seed=get("seed", int),
                   normalization=get("normalization", dict))


@dataclass
class ModelInfo:
    """The manifest's ``model``: a TorchScript module's file in the run."""
    output: str
    module: Optional[FileRecord] = None
    spec: str = "torchscript:model.pt"
    zero_last_layer: bool = False
    init_seed: int = 0

    def to_json(self) -> JsonObject:
        out: JsonObject = {"spec": self.spec, "output": self.output, "zero_last_layer": self.zero_last_layer,
                           "init_seed": self.init_seed}
        if self.module is not None:
            out["module"] = self.module.to_json()
        return out

    @classmethod
    def from_json(cls, j: JsonObject) -> "ModelInfo":
        return cls(output=field(j, "output", "model", str), module=_optional_file(j, "module", "model"),
                   spec=field(j, "spec", "model", str), zero_last_layer=field(j, "zero_last_layer", "model", bool),
                   init_seed=field(j, "init_seed", "model", int))


@dataclass
class TrainingInfo:
    """The manifest's ``training``."""
    loss: str
    batch_size: int = 0
    batch_seed: int = 0
    schedule: str = "recorded"
    threads: int = 1
    checkpoint_every: int = 1
    recorded: bool = True
    clip_factors: Optional[FileRecord] = None
    loss_weights: Optional[FileRecord] = None  # pathkernel train --loss-weights

    def to_json(self) -> JsonObject:
        out: JsonObject = {"batch_size": self.batch_size, "batch_seed": self.batch_seed,
                           "schedule": self.schedule, "threads": self.threads,
                           "checkpoint_every": self.checkpoint_every}
        if self.recorded:
            out["recorded"] = True
        out["loss"] = self.loss
        if self.clip_factors is not None:
            out["clip_factors"] = self.clip_factors.to_json()
        if self.loss_weights is not None:
            out["loss_weights"] = self.loss_weights.to_json()
        return out

    @classmethod
    def from_json(cls, j: JsonObject) -> "TrainingInfo":
        def get(key: str, kind: JsonType) -> Any:
            return field(j, key, "training", kind)
        return cls(loss=j.get("loss", "cross_entropy"), batch_size=get("batch_size", int),
                   batch_seed=get("batch_seed", int), schedule=get("schedule", str), threads=get("threads", int),
                   checkpoint_every=get("checkpoint_every", int), recorded=bool(j.get("recorded", False)),
                   clip_factors=_optional_file(j, "clip_factors", "training"),
                   loss_weights=_optional_file(j, "loss_weights", "training"))


@dataclass
class Environment:
    """The machine the run was recorded on, as far as bit-for-bit replay
    depends on it (include/pathkernel/environment.h)."""
    cpu: str
    cpu_capability: str
    libtorch: str
    threads: int
    blas: str = ""
    blas_kernels: str = ""
    # OpenBLAS's own thread count, which torch.set_num_threads leaves alone;
    # 0: not recorded (the same as threads, as in the engine's own runs).
    blas_threads: int = 0

    def to_json(self) -> JsonObject:
        out: JsonObject = {"cpu": self.cpu, "cpu_capability": self.cpu_capability, "blas": self.blas,
                           "blas_kernels": self.blas_kernels, "libtorch": self.libtorch, "threads": self.threads}
        if self.blas_threads > 0:
            out["blas_threads"] = self.blas_threads
        return out

    @classmethod
    def from_json(cls, j: Any) -> "Environment":
        def get(key: str, kind: JsonType) -> Any:
            return field(j, key, "environment", kind)
        return cls(cpu=get("cpu", str), cpu_capability=get("cpu_capability", str), libtorch=get("libtorch", str),
                   threads=get("threads", int), blas=get("blas", str), blas_kernels=get("blas_kernels", str),
                   blas_threads=get("blas_threads", int) if "blas_threads" in j else 0)


@dataclass
class Manifest:
    """manifest.json: everything needed to read the run without pathkernel.
    ``checkpoints`` holds w_0 .. w_steps (every step, or a compact
    recording's checkpoints, whose steps between are replayed),
    ``learning_rates`` one rate per
    step, ``batches`` the batch logs covering the steps."""
    pathkernel_version: str
    libtorch_version: str
    data: DataInfo
    model: ModelInfo
    dtype: str
    parameters: List[ParamInfo]
    optimizer: JsonObject  # the optimizer's declaration (src/train/optimizer.cpp's fields)
    training: TrainingInfo
    environment: Optional[Environment]  # None in runs written before it was recorded
    status: str = "running"
    message: str = ""
    steps: int = 0
    learning_rates: List[float] = dataclass_field(default_factory=list)
    checkpoints: List[CheckpointRecord] = dataclass_field(default_factory=list)
    batches: List[BatchRecord] = dataclass_field(default_factory=list)
    metrics: str = METRICS_FILE
    summary: Optional[JsonObject] = None

    @property
    def parameter_count(self) -> int:
        return sum(p.numel for p in self.parameters)

    def to_json(self) -> JsonObject:
        steps = self.steps
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "pathkernel_version": self.pathkernel_version,
            "libtorch_version": self.libtorch_version,
            "status": self.status,
            "message": self.message,
            "steps": steps,
            "data": self.data.to_json(),
            "model": self.model.to_json(),
            "dtype": self.dtype,
            "parameters": {"count": self.parameter_count, "tensors": [p.to_json() for p in self.parameters]},
            "optimizer": dict(self.optimizer),
            "training": self.training.to_json(),
            **({"environment": self.environment.to_json()} if self.environment is not None else {}),
            "learning_rates": self.learning_rates[:steps],
            "checkpoints": [c.to_json() for c in self.checkpoints if c.step <= steps],
            "batches": [b.to_json() for b in self.batches],
            "metrics": self.metrics,
            "summary": self.summary,
        }

    @classmethod
    def from_json(cls, j: Any, path: str = MANIFEST_FILE) -> "Manifest":
        """Parses a manifest read from ``path``; raises RunFormatError naming
        the first missing or mistyped field."""
        check_header(j, path)
        parameters = [ParamInfo.from_json(t) for t in field(j["parameters"], "tensors", "parameters", list)]
        environment = Environment.from_json(j["environment"]) if "environment" in j else None
        return cls(pathkernel_version=field(j, "pathkernel_version", "the manifest", str),
                   libtorch_version=field(j, "libtorch_version", "the manifest", str),
                   data=DataInfo.from_json(j["data"]), model=ModelInfo.from_json(j["model"]), dtype=j["dtype"],
                   parameters=parameters, optimizer=j["optimizer"], training=TrainingInfo.from_json(j["training"]),
                   environment=environment, status=j["status"], message=field(j, "message", "the manifest", str),
                   steps=j["steps"], learning_rates=j["learning_rates"],
                   checkpoints=[CheckpointRecord.from_json(c) for c in j["checkpoints"]],
                   batches=[BatchRecord.from_json(b) for b in j["batches"]], metrics=j["metrics"],
                   summary=field(j, "summary", "the manifest"))
