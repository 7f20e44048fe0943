"""pathkernel from Python: record a training loop (pathkernel.record) and read
runs and explanations (read_run, read_explain) as numpy arrays and dicts.

``pathkernel.record`` needs torch; reading needs numpy alone.
"""
__version__ = "0.1.0"  # the C++ project's VERSION (CMakeLists.txt); manifests carry it

from .read import Explanation, Run, read_explain, read_run  # noqa: E402
from ._files import RunFormatError  # noqa: E402

__all__ = ["read_run", "read_explain", "Run", "Explanation", "RunFormatError", "__version__"]
