"""pathkernel from Python: record a training loop (pathkernel.record), run the
engine on a run (verify, explain, evaluate, report) and read runs and
explanations (read_run, read_explain) as numpy arrays and dicts.

``pathkernel.record`` needs torch; the rest needs numpy and, to run the
engine, the pathkernel CLI ($PATHKERNEL_BIN, beside the package or on PATH).
"""
# The C++ project's VERSION (CMakeLists.txt), the one place the package's
# version is written (python/pyproject.toml reads it); manifests carry it.
__version__ = "0.1.0"

from .read import Explanation, Run, read_explain, read_run  # noqa: E402
from ._files import RunFormatError  # noqa: E402
from .engine import (EngineNotFoundError, EvaluateResult, PathkernelError, ReportResult, VerifyResult,  # noqa: E402
                     evaluate, explain, find_engine, report, verify)

__all__ = ["read_run", "read_explain", "Run", "Explanation", "RunFormatError", "verify", "explain", "evaluate",
           "report", "find_engine", "VerifyResult", "EvaluateResult", "ReportResult", "PathkernelError",
           "EngineNotFoundError", "__version__"]
