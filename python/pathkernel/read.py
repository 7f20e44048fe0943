"""Reading pathkernel's run and explain directories into numpy arrays and dicts.

numpy and the standard library only: no torch, no compiled pathkernel code.
Every file a manifest lists is checked against its recorded size and CRC-32
when it is read; a mismatch raises RunFormatError naming the file.

    import pathkernel
    run = pathkernel.read_run("runs/mine")
    run.manifest["optimizer"], run.steps, run.learning_rates
    w0 = run.weights(0)                     # float64 [P], flat
    layers = run.weights(run.steps, by_name=True)   # {"fc1.weight": [..], ...}
    run.batches[3]                          # training indices of step 3
    run.metrics["loss"]

    ex = pathkernel.read_explain("runs/mine/explain")
    ex.contributions                        # float64 [n_test, M, K]
    ex.proponents[0][:5]                    # [{"index", "label", "value"}, ...]
"""
import json
import os

import numpy as np

from ._files import RunFormatError, parse_npy, read_array, read_listed
from ._manifest import MANIFEST_FILE, BatchRecord, CheckpointRecord, ParamInfo, check_header, field

__all__ = ["Run", "Explanation", "read_run", "read_explain"]


def _load_json(path, what):
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        raise RunFormatError("cannot read %s '%s': %s" % (what, path, e.strerror)) from e
    try:
        return json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise RunFormatError("%s '%s' is not valid JSON (%s)" % (what, path, e)) from e


class Run:
    """A run directory (``pathkernel train`` or ``pathkernel.record``)."""

    def __init__(self, directory):
        self.directory = os.fspath(directory)
        if not os.path.isdir(self.directory):
            raise RunFormatError("run directory '%s' does not exist" % self.directory)
        path = os.path.join(self.directory, MANIFEST_FILE)
        if not os.path.isfile(path):
            raise RunFormatError("run directory '%s' has no manifest.json: was it written by 'pathkernel train' "
                                 "or pathkernel.record?" % self.directory)
        m = _load_json(path, "manifest")
        check_header(m, path)
        self.manifest = m
        self.status = m["status"]
        self.steps = m["steps"]
        self.dtype = m["dtype"]
        self.optimizer = m["optimizer"]
        self.training = m["training"]
        self.summary = m.get("summary")
        self.parameter_count = field(m["parameters"], "count", "parameters", int)
        self.parameters = field(m["parameters"], "tensors", "parameters", list)
        offset = 0
        for t in self.parameters:
            info = ParamInfo.from_json(t)
            if info.offset != offset or int(np.prod(info.shape, dtype=np.int64)) != info.numel:
                raise RunFormatError(f"manifest: parameter '{info.name}' has offset {t['offset']!r}, shape "
                                     f"{t['shape']!r} and numel {info.numel!r}; expected offset {offset} and numel "
                                     f"the product of the shape")
            offset += info.numel
        if offset != self.parameter_count:
            raise RunFormatError("manifest: parameter tensors hold %d values, count says %d"
                                 % (offset, self.parameter_count))
        self.learning_rates = np.asarray(m["learning_rates"], dtype=np.float64)[: self.steps]
        self._checkpoints = {}
        for c in m["checkpoints"]:
            self._checkpoints[CheckpointRecord.step_of(c)] = c
        self.checkpoint_steps = sorted(self._checkpoints)
        if not self.checkpoint_steps or self.checkpoint_steps[0] != 0:
            raise RunFormatError("run '%s': the first checkpoint must be step 0" % self.directory)
        self._batches = None
        self._metrics = None

    def __repr__(self):
        return "Run(%r: %s, %d steps, %d parameters, %s)" % (self.directory, self.status, self.steps,
                                                            self.parameter_count, self.optimizer.get("name"))

    def __getitem__(self, key):
        """The manifest's field ``key``."""
        return self.manifest[key]

    @property
    def recorded(self):
        """True for a run recorded from a Python loop (every step stored, or
        compact: checkpoints, the steps between replayed by the engine)."""
        return bool(self.training.get("recorded", False))

    def _vector(self, record, what):
        data = read_listed(self.directory, record, what)
        a = parse_npy(data, "run '%s': %s file '%s'" % (self.directory, what, record.get("file")))
        # A compact recording of a float32 loop stores float32: exact in float64.
        float32_ok = self.recorded and self.manifest.get("dtype") == "float32"
        dtype_ok = a.dtype == np.float64 or (float32_ok and a.dtype == np.float32)
        if not dtype_ok or a.shape != (self.parameter_count,):
            raise RunFormatError("run '%s': %s file '%s' holds %s of shape %s, expected %sfloat64 of shape [%d]"
                                 % (self.directory, what, record.get("file"), a.dtype, list(a.shape),
                                    "float32 or " if float32_ok else "", self.parameter_count))
        return a.astype(np.float64, copy=False)

    def _checkpoint(self, step):
        if step not in self._checkpoints:
            every = self.training.get("checkpoint_every")
            raise KeyError("run '%s' stores no weights for step %r (checkpoints every %s steps, at %s%s); the steps "
                           "between are reconstructed by replay (pathkernel check-path)"
                           % (self.directory, step, every, self.checkpoint_steps[:5],
                              "..." if len(self.checkpoint_steps) > 5 else ""))
        return self._checkpoints[step]

    def weights(self, step, by_name=False):
        """w_step: float64 [P] flat in the manifest's parameter order, or with
        ``by_name=True`` a dict of the model's tensors (reshaped, row-major)."""
        w = self._vector(self._checkpoint(step), "checkpoint %d" % step)
        if not by_name:
            return w
        return {t["name"]: w[t["offset"]: t["offset"] + t["numel"]].reshape(t["shape"]) for t in self.parameters}

    def optimizer_state(self, step):
        """The optimizer's state at checkpoint ``step`` (the state the step
        starts from): ``{"step": count, "buffers": {name: float64 [P]}}``."""
        c = self._checkpoint(step)
        st = field(c, "optimizer_state", f"checkpoint {step}", dict)
        buffers = {name: self._vector(f, "checkpoint %d %s" % (step, name))
                   for name, f in field(st, "buffers", f"checkpoint {step} optimizer_state", dict).items()}
        return {"step": st.get("step", 0), "buffers": buffers}

    @property
    def batches(self):
        """The training indices of every step (a list of int64 arrays), empty
        for full-batch training."""
        if self._batches is None:
            out = []
            for b in self.manifest["batches"]:
                first = BatchRecord.first_step_of(b)
                if first != len(out):
                    raise RunFormatError("run '%s': batch log starts at step %d, expected %d"
                                         % (self.directory, first, len(out)))
                data = read_listed(self.directory, b, "batch log")
                rows = parse_npy(data, "run '%s': batch log '%s'" % (self.directory, b["file"]))
                if rows.dtype != np.int32 or rows.ndim != 2 or rows.shape[0] != b.get("steps"):
                    raise RunFormatError("run '%s': batch log '%s' holds %s of shape %s, expected int32 of shape "
                                         "[%s, B]" % (self.directory, b["file"], rows.dtype, list(rows.shape),
                                                      b.get("steps")))
                for row in rows:
                    out.append(row[row >= 0].astype(np.int64))
            self._batches = out[: self.steps] if out else out
        return self._batches

    def batch(self, step):
        """The training indices of step ``step``."""
        return self.batches[step]

    @property
    def clip_factors(self):
        """Each step's gradient clip factor (float64 [N]), or None when the run
        declares none."""
        f = self.training.get("clip_factors")
        if f is None:
            return None
        data = read_listed(self.directory, f, "clip factors")
        a = parse_npy(data, "run '%s': clip factors '%s'" % (self.directory, f.get("file")))
        if a.dtype != np.float64 or a.ndim != 1 or a.shape[0] < self.steps:
            raise RunFormatError("run '%s': clip factors '%s' hold %s of shape %s, expected float64 [%d]"
                                 % (self.directory, f.get("file"), a.dtype, list(a.shape), self.steps))
        return a[: self.steps]

    @property
    def metrics(self):
        """metrics.csv as a dict of columns: step, lr, loss, batch_accuracy."""
        if self._metrics is None:
            path = os.path.join(self.directory, self.manifest["metrics"])
            try:
                with open(path) as f:
                    lines = [line.strip() for line in f if line.strip()]
            except OSError as e:
                raise RunFormatError("run '%s': cannot read metrics '%s': %s"
                                     % (self.directory, self.manifest["metrics"], e.strerror)) from e
            header = "step,lr,loss,batch_accuracy"
            if not lines or lines[0] != header:
                raise RunFormatError("run '%s': metrics.csv starts with %r, expected the header %r"
                                     % (self.directory, lines[0] if lines else "", header))
            rows = []
            for i, line in enumerate(lines[1:], start=2):
                cells = line.split(",")
                try:
                    if len(cells) != 4:
                        raise ValueError
                    rows.append([float(c) for c in cells])
                except ValueError:
                    raise RunFormatError("run '%s': metrics.csv line %d is %r, expected four numbers"
                                         % (self.directory, i, line)) from None
            a = np.asarray(rows, dtype=np.float64).reshape(-1, 4)
            self._metrics = {"step": a[:, 0].astype(np.int64), "lr": a[:, 1], "loss": a[:, 2],
                             "batch_accuracy": a[:, 3]}
        return self._metrics

    @property
    def module_path(self):
        """The TorchScript module's file in the run (checked), or None."""
        mod = self.manifest["model"].get("module")
        if not mod:
            return None
        read_listed(self.directory, mod, "model module")
        return os.path.join(self.directory, mod["file"])

    def data(self):
        """The run's arrays train_x, train_y, test_x, test_y, for npy data
        (stored in the run by pathkernel.record, or the npy:DIR it names)."""
        d = self.manifest["data"]
        source = d.get("source") or {}
        if source.get("kind") != "npy":
            raise RunFormatError("run '%s': data '%s' is not npy data; read it with pathkernel's loaders"
                                 % (self.directory, d.get("spec")))
        directory = source.get("directory", "")
        base = os.path.join(self.directory, directory) if source.get("in_run") else directory
        out = {name: read_array(base, name, "run '%s'" % self.directory)
               for name in ("train_x", "train_y", "test_x", "test_y")}
        if out["train_x"].shape[0] != d.get("num_train"):
            raise RunFormatError("run '%s': '%s' has %d rows, the manifest says num_train %s"
                                 % (self.directory, os.path.join(base, "train_x.npy"), out["train_x"].shape[0],
                                    d.get("num_train")))
        return out


class Explanation:
    """An explain directory (``pathkernel explain --out DIR``)."""

    def __init__(self, directory, run=None):
        self.directory = os.fspath(directory)
        if not os.path.isdir(self.directory):
            raise RunFormatError("explain directory '%s' does not exist: expected the directory 'pathkernel "
                                 "explain' writes" % self.directory)
        jpath = os.path.join(self.directory, "explain.json")
        if not os.path.isfile(jpath):
            raise RunFormatError("explain directory '%s' has no explain.json: was it written by 'pathkernel "
                                 "explain'?" % self.directory)
        j = _load_json(jpath, "explain.json")
        if not isinstance(j, dict) or not isinstance(j.get("points"), list) or not j["points"]:
            raise RunFormatError("'%s' has no \"points\" list: expected the output of 'pathkernel explain'" % jpath)
        self.json = j
        self.points = j["points"]
        for p in self.points:
            for key in ("test_index", "predicted", "proponents", "opponents"):
                if key not in p:
                    raise RunFormatError("'%s' has a point without %s: %r" % (jpath, key, p))
        cname = (j.get("contributions") or {}).get("file", "contributions.npy")
        cpath = os.path.join(self.directory, cname)
        if not os.path.isfile(cpath):
            raise RunFormatError("explain directory '%s' has no %s" % (self.directory, cname))
        with open(cpath, "rb") as f:
            c = parse_npy(f.read(), cpath)
        expected = (j.get("contributions") or {}).get("shape")
        if c.ndim != 3 or c.shape[0] != len(self.points) or (expected is not None and list(c.shape) != expected):
            raise RunFormatError("'%s' has shape %s; expected [%d, M, K] (explained points, training points, "
                                 "classes)%s" % (cpath, list(c.shape), len(self.points),
                                                 ", as explain.json says %s" % expected if expected else ""))
        self.contributions = c.astype(np.float64, copy=False)
        if run is not None:
            r = run if isinstance(run, Run) else Run(run)
            d = r.manifest["data"]
            if c.shape[1] != d.get("num_train") or c.shape[2] != d.get("num_classes"):
                raise RunFormatError("'%s' has shape %s; the run '%s' has %s training points and %s classes: was "
                                     "it explained from this run?" % (cpath, list(c.shape), r.directory,
                                                                      d.get("num_train"), d.get("num_classes")))
            for p in self.points if "inputs" not in j else ():  # --inputs: a row of inputs.npy
                if not 0 <= p["test_index"] < d.get("num_test", 0):
                    raise RunFormatError("'%s' explains test point %d, but the run has %s test points"
                                         % (jpath, p["test_index"], d.get("num_test")))
        for p in self.points:
            for side in ("proponents", "opponents"):
                for t in p[side]:
                    if not 0 <= t.get("index", -1) < c.shape[1]:
                        raise RunFormatError("'%s' lists training point %r among the %s; the contributions "
                                             "have %d training points" % (jpath, t.get("index"), side, c.shape[1]))
        self.test_indices = np.asarray([p["test_index"] for p in self.points], dtype=np.int64)
        self.predicted = np.asarray([p["predicted"] for p in self.points], dtype=np.int64)
        self.labels = np.asarray([-1 if p.get("label") is None else p["label"] for p in self.points],
                                 dtype=np.int64)
        self.proponents = [p["proponents"] for p in self.points]
        self.opponents = [p["opponents"] for p in self.points]
        self._kernel = None
        self._arrays = {}

    def __repr__(self):
        return "Explanation(%r: %d test points, %d training points, %d outputs)" % (
            (self.directory,) + tuple(self.contributions.shape))

    def point(self, test_index):
        """explain.json's entry of test point ``test_index``."""
        for p in self.points:
            if p["test_index"] == test_index:
                return p
        raise KeyError("test point %r is not explained in '%s' (explained: %s)"
                       % (test_index, self.directory, self.test_indices.tolist()))

    def top_proponents(self, test_index, k=None):
        """The training points that push test point ``test_index`` most
        towards its predicted class: a list of {index, label, value}."""
        props = self.point(test_index)["proponents"]
        return props if k is None else props[:k]

    def top_opponents(self, test_index, k=None):
        opps = self.point(test_index)["opponents"]
        return opps if k is None else opps[:k]

    @property
    def kernel(self):
        """kernel.npy (float64 [n_test, M, K, K], memory-mapped) when explain
        wrote it, else None."""
        k = self.json.get("kernel")
        if not k:
            return None
        if self._kernel is None:
            path = os.path.join(self.directory, k.get("file", "kernel.npy"))
            try:
                self._kernel = np.load(path, mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError) as e:
                raise RunFormatError("cannot read '%s' (%s)" % (path, e)) from e
            if list(self._kernel.shape) != k.get("shape", list(self._kernel.shape)):
                raise RunFormatError("'%s' has shape %s, explain.json says %s"
                                     % (path, list(self._kernel.shape), k.get("shape")))
        return self._kernel

    def _entry_array(self, key):
        """The .npy file explain.json's entry ``key`` names (None without the entry), its shape checked."""
        e = self.json.get(key)
        if not e:
            return None
        if key not in self._arrays:
            path = os.path.join(self.directory, e.get("file", key + ".npy"))
            try:
                a = np.load(path, allow_pickle=False)
            except (OSError, ValueError) as ex:
                raise RunFormatError("cannot read '%s' (%s)" % (path, ex)) from ex
            if list(a.shape) != e.get("shape", list(a.shape)):
                raise RunFormatError("'%s' has shape %s, explain.json says %s" % (path, list(a.shape), e.get("shape")))
            self._arrays[key] = a
        return self._arrays[key]

    @property
    def layer_contributions(self):
        """layer_contributions.npy (float64 [n, M, K, L]: each contribution
        split over the parameter tensors, named in
        ``json["layer_contributions"]["tensors"]``) when explain --by-layer
        wrote it, else None."""
        return self._entry_array("layer_contributions")

    @property
    def inputs(self):
        """inputs.npy (the inputs explained, one per point) when explain
        --inputs wrote it, else None; a point's test_index is then its row."""
        return self._entry_array("inputs")


def read_run(directory):
    """The run directory ``directory``: a Run (manifest, weights(s),
    optimizer_state(s), learning_rates, batches, clip_factors, metrics, data())."""
    return Run(directory)


def read_explain(directory, run=None):
    """The explain directory ``directory``: an Explanation (json, points,
    contributions, proponents, opponents, kernel). With ``run`` (a Run or a
    run directory) its shapes are checked against the run's."""
    return Explanation(directory, run=run)
