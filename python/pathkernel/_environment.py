"""The machine a loop is recorded on, as the manifest's ``environment``
describes it (the C++ side: src/core/environment.cpp)."""
import ctypes
import re
from typing import Optional, Tuple

import torch

from ._manifest import Environment


def cpu_model() -> str:
    """/proc/cpuinfo's model name, or "unknown"."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and ":" in line:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def torch_config_value(key: str) -> str:
    """The rest of the line of ``torch.__config__.show()`` holding ``key``."""
    try:
        text = torch.__config__.show()
    except Exception:
        return ""
    for line in text.splitlines():
        if key in line:
            return line.split(key, 1)[1].strip()
    return ""


def libtorch_version() -> str:
    """The LibTorch version as the C++ side writes it (TORCH_VERSION, e.g.
    "1.13.0"): Python's torch.__version__ may carry a suffix ("1.13.0a0",
    "1.13.1+cpu")."""
    m = re.search(r"TORCH_VERSION=(\d+\.\d+\.\d+)", torch_config_value("Build settings:"))
    if m:
        return m.group(1)
    m = re.match(r"\d+\.\d+\.\d+", torch.__version__)
    return m.group(0) if m else torch.__version__


def _openblas_library() -> Optional[ctypes.CDLL]:
    """The OpenBLAS this process loaded (torch's BLAS), or None."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line and ".so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)  # the library already loaded: no second copy
            lib.openblas_get_config.restype = ctypes.c_char_p
            lib.openblas_get_corename.restype = ctypes.c_char_p
            lib.openblas_get_num_threads.restype = ctypes.c_int
            return lib
        except (OSError, AttributeError):
            continue
    return None


def openblas() -> Tuple[str, str, int]:
    """The OpenBLAS this process loaded (torch's BLAS), as the C++ side names
    it: its configuration, the kernels it picked for this CPU (what
    OPENBLAS_CORETYPE names) and its thread count, or ("", "", 0) when no
    OpenBLAS is loaded. A run is replayed with the kernels and threads it was
    recorded with: kernels differ in their rounding
    (include/pathkernel/blas_kernels.h), and a product split over more
    threads may add in another order. OpenBLAS's threads are its own:
    torch.set_num_threads does not set them."""
    lib = _openblas_library()
    if lib is None:
        return "", "", 0
    return (lib.openblas_get_config().decode().strip(), lib.openblas_get_corename().decode().strip(),
            int(lib.openblas_get_num_threads()))


def set_threads(n: int) -> None:
    """Sets the loop's thread count: torch's (``torch.set_num_threads``) and
    OpenBLAS's own, which torch's leaves at the number of cores. The Recorder
    records both, and the engine replays the loop's steps at both, bit for
    bit. A loop whose two counts are 1 replays on a thread of its own while
    ``verify`` works: on a user's CNN of one epoch (2 cores), verify --test 1
    took 62 s against 78 s for the loop with torch alone on one thread,
    whose replay ran in turn. Any other loop replays so only where one thread
    reproduces its steps bit for bit, which the engine checks first.
    Exported as ``pathkernel.record.set_threads``."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"set_threads: n is {n!r}, expected a whole number >= 1")
    torch.set_num_threads(n)
    lib = _openblas_library()
    if lib is not None:
        lib.openblas_set_num_threads(n)


def environment() -> Environment:
    """This process's environment, its intra-op threads as they are now."""
    blas, kernels, blas_threads = openblas()
    return Environment(cpu=cpu_model(), cpu_capability=torch_config_value("CPU capability usage:"),
                       libtorch=libtorch_version(), threads=torch.get_num_threads(), blas=blas,
                       blas_kernels=kernels, blas_threads=blas_threads)
