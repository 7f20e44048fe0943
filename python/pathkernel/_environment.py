"""The machine a loop is recorded on, as the manifest's ``environment``
describes it (the C++ side: src/core/environment.cpp)."""
import re

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


def environment() -> Environment:
    """This process's environment, its intra-op threads as they are now."""
    return Environment(cpu=cpu_model(), cpu_capability=torch_config_value("CPU capability usage:"),
                       libtorch=libtorch_version(), threads=torch.get_num_threads())
