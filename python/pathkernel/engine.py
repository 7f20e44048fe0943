"""The C++ engine from Python: verify, explain, evaluate and report a run.

Each function runs the ``pathkernel`` CLI on a run directory and returns its
result as a typed object with numpy arrays; no compiled extension.

    import pathkernel
    v = pathkernel.verify("runs/mine", test=10, threads=2)
    v.max_rel_error, v.updates_explained
    ex = pathkernel.explain("runs/mine", test_index=[0, 1])
    ex.contributions                       # float64 [2, M, K]

Keyword arguments are the CLI's options, mapped mechanically:
``test_index=[0, 1]`` -> ``--test-index 0,1``, ``True`` -> a bare flag,
``False``/``None`` -> omitted, ``threads=2`` -> the global ``--threads 2``.
The engine validates them; its error reaches Python as PathkernelError.

The engine is the executable named by ``$PATHKERNEL_BIN``, else a
``pathkernel`` beside this package, else ``pathkernel`` on PATH.
"""
import codecs
import json as _json
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .read import Explanation, read_explain

__all__ = ["PathkernelError", "EngineNotFoundError", "VerifyResult", "EvaluateResult", "ReportResult",
           "find_engine", "verify", "explain", "evaluate", "report"]

PathLike = Union[str, "os.PathLike[str]"]

# The CLI's options that go before the subcommand (``pathkernel --help``);
# --json and --quiet are set by these functions themselves.
GLOBAL_OPTIONS = ("threads",)


class PathkernelError(RuntimeError):
    """The engine exited non-zero. ``message`` is its error text (stderr,
    stripped, from its ``pathkernel: error:`` line on), ``returncode`` its exit
    status, ``command`` the argument list, ``stderr``/``stdout`` all it wrote."""

    def __init__(self, message: str, returncode: int, command: Sequence[str], stderr: str = "", stdout: str = ""):
        super().__init__("%s (exit status %d of: %s)" % (message, returncode, " ".join(command)))
        self.message = message
        self.returncode = returncode
        self.command = list(command)
        self.stderr = stderr
        self.stdout = stdout


class EngineNotFoundError(FileNotFoundError):
    """No pathkernel executable where the engine is looked for."""


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_engine() -> str:
    """The pathkernel executable these functions run: ``$PATHKERNEL_BIN``,
    else ``pathkernel`` beside this package, else on PATH. Raises
    EngineNotFoundError naming every place looked in."""
    env = os.environ.get("PATHKERNEL_BIN")
    if env:
        if _executable(env):
            return env
        raise EngineNotFoundError("PATHKERNEL_BIN is '%s', which is not an executable file: expected the path of "
                                  "the pathkernel CLI (e.g. build/pathkernel), or unset it to use the one beside the "
                                  "package or on PATH" % env)
    beside = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pathkernel")
    if _executable(beside):
        return beside
    on_path = shutil.which("pathkernel")
    if on_path:
        return on_path
    raise EngineNotFoundError("the pathkernel engine was not found: PATHKERNEL_BIN is not set, there is no "
                              "executable '%s' beside the package, and no 'pathkernel' on PATH; build it (make) "
                              "and set PATHKERNEL_BIN=/path/to/build/pathkernel" % beside)


def _value(value: Any) -> Optional[str]:
    """An option's value as the CLI takes it, or None when it is omitted."""
    if value is None or value is False:
        return None
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple, range)):
        return ",".join(str(v) for v in value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


def _options(options: Dict[str, Any]) -> Tuple[List[str], List[str]]:
    """Keyword arguments as (global arguments, subcommand arguments):
    ``foo_bar=3`` -> ``--foo-bar 3``, True -> a bare flag, False/None omitted,
    lists comma-joined."""
    before: List[str] = []
    after: List[str] = []
    for name, value in options.items():
        text = _value(value)
        if text is None:
            continue
        args = before if name in GLOBAL_OPTIONS else after
        args.append("--" + name.replace("_", "-"))
        if value is not True:
            args.append(text)
    return before, after


def _error_message(stderr: str) -> str:
    """The engine's error text: from its first ``pathkernel: error:`` line on
    (progress lines before it dropped), else all of stderr, stripped."""
    lines = stderr.replace("\r", "\n").splitlines()
    for i, line in enumerate(lines):
        if line.startswith("pathkernel: error:"):
            return "\n".join(lines[i:]).strip()
    return stderr.strip() or "the engine wrote no message"


def _stream(pipe: Any, echo: bool, out: List[str]) -> None:
    """Reads ``pipe`` to its end into ``out``, echoing it to sys.stderr."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    while True:
        chunk = os.read(pipe.fileno(), 4096)
        text = decoder.decode(chunk, final=not chunk)
        if text:
            out.append(text)
            if echo:
                sys.stderr.write(text)
                sys.stderr.flush()
        if not chunk:
            return


def _run(subcommand: str, run: PathLike, quiet: bool, options: Dict[str, Any]) -> Dict[str, Any]:
    """Runs ``pathkernel [globals] --json subcommand RUN [options]``; returns
    its JSON object. Progress goes to sys.stderr unless ``quiet``."""
    before, after = _options(options)
    command = [find_engine()] + before + ["--json"] + (["--quiet"] if quiet else []) + \
        [subcommand, os.fspath(run)] + after
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err: List[str] = []
    reader = threading.Thread(target=_stream, args=(proc.stderr, not quiet, err), daemon=True)
    reader.start()
    try:
        stdout = proc.stdout.read().decode("utf-8", "replace")
        reader.join()
        returncode = proc.wait()
    except BaseException:  # KeyboardInterrupt included: no engine left running
        proc.kill()
        proc.wait()
        reader.join(5)
        raise
    finally:
        proc.stdout.close()
        proc.stderr.close()
    stderr = "".join(err)
    if returncode != 0:
        raise PathkernelError(_error_message(stderr), returncode, command, stderr, stdout)
    return _parse_json(stdout, command)


def _parse_json(stdout: str, command: Sequence[str]) -> Dict[str, Any]:
    start = stdout.find("{")
    try:
        j = _json.loads(stdout[start:]) if start >= 0 else None
    except ValueError as e:
        raise PathkernelError("the engine's --json output is not JSON (%s): %r" % (e, stdout[-500:]), 0,
                              command, "", stdout) from e
    if not isinstance(j, dict):
        raise PathkernelError("the engine printed no JSON object, expected one on stdout: %r" % stdout[-500:], 0,
                              command, "", stdout)
    return j


@dataclass
class VerifyResult:
    """``pathkernel verify``: the kernel machine against the network.
    ``max_rel_error`` is the error relative to max(1, |f|), ``error_bound``
    the certificate's bound on it, which leaves out the sums' rounding, about
    machine epsilon times ``cancellation``; ``json`` holds every field."""
    run: str
    test_points: int
    steps: int
    max_abs_error: float
    max_rel_error: float
    completeness_error: float
    max_abs_rounding: float
    error_bound: float
    cancellation: float
    updates_explained: bool
    first_unexplained_step: Optional[int]
    route: str
    seconds: float
    json: Dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, j: Dict[str, Any]) -> "VerifyResult":
        return cls(run=j["run"], test_points=j["test_points"], steps=j["steps"],
                   max_abs_error=j["max_abs_error"], max_rel_error=j["max_rel_error"],
                   completeness_error=j["completeness_error"], max_abs_rounding=j["max_abs_rounding"],
                   error_bound=j["error_bound"], cancellation=j["cancellation"],
                   updates_explained=j["updates_explained"],
                   first_unexplained_step=j["first_unexplained_step"], route=j["route"], seconds=j["seconds"],
                   json=j)


@dataclass
class EvaluateResult:
    """``pathkernel evaluate``: each method's metrics (``table[method][metric]``,
    e.g. ``table["epk"]["loo_spearman"]``), its scores as numpy arrays
    (``scores[method]``, from OUT/scores_<method>.npy), the output directory,
    and the full JSON."""
    out: str
    test_points: int
    table: Dict[str, Dict[str, float]]
    scores: Dict[str, np.ndarray] = field(repr=False)
    json: Dict[str, Any] = field(repr=False)


@dataclass
class ReportResult:
    """``pathkernel report``: the HTML file written and its size."""
    path: str
    bytes: int
    seconds: float
    json: Dict[str, Any] = field(repr=False)


def verify(run: PathLike, *, quiet: bool = False, **options: Any) -> VerifyResult:
    """Checks the exact kernel machine against the network on test points
    (``pathkernel verify RUN``), e.g. ``verify(run, test=10, threads=2)``.
    Options that make the engine exit non-zero (``fail_above=``) raise
    PathkernelError."""
    return VerifyResult.from_json(_run("verify", run, quiet, options))


def explain(run: PathLike, *, out: Optional[PathLike] = None, quiet: bool = False,
            **options: Any) -> Explanation:
    """Splits test predictions into per-training-point contributions
    (``pathkernel explain RUN``) and returns the Explanation read from the
    directory written (contributions float64 [n, M, K], proponents, opponents,
    kernel, json), checked against the run.

    The directory is ``out``, or as on the CLI RUN/explain (RUN/metagradient
    for ``method="metagradient"``): it is kept, so that ``report`` shows it,
    an interrupted explain continues from its saved progress, and the
    memory-mapped ``kernel`` stays readable. It is overwritten by the next
    explain into the same place."""
    if out is not None:
        options["out"] = out
    j = _run("explain", run, quiet, options)
    return read_explain(j.get("out") or options.get("out"), run=run)


def evaluate(run: PathLike, *, quiet: bool = False, **options: Any) -> EvaluateResult:
    """Tests attribution methods against retraining (``pathkernel evaluate
    RUN``), e.g. ``evaluate(run, methods=["epk", "random"], metrics=["loo"])``.
    Writes to ``out=`` (default RUN/evaluate, kept, as on the CLI)."""
    j = _run("evaluate", run, quiet, options)
    directory = j["out"]
    scores = {}
    for method in j.get("table", {}):
        path = os.path.join(directory, "scores_%s.npy" % method)
        if os.path.isfile(path):
            scores[method] = np.load(path, allow_pickle=False)
    return EvaluateResult(out=directory, test_points=j["test_points"], table=j["table"], scores=scores, json=j)


def report(run: PathLike, *, quiet: bool = False, **options: Any) -> ReportResult:
    """Writes the run's self-contained HTML report (``pathkernel report
    RUN``; ``out=`` the file, default RUN/report.html)."""
    j = _run("report", run, quiet, options)
    return ReportResult(path=j["out"], bytes=j["bytes"], seconds=j["seconds"], json=j)
