#!/usr/bin/env bash
# float64 matrix products (2000×2000, one thread) with each of OpenBLAS's
# x86-64 kernels this CPU runs, and with OpenBLAS's own choice: the
# measurement behind pathkernel's choice of kernels (include/pathkernel/blas_kernels.h).
#   scripts/blas_kernels.sh [SIZE] [REPEATS]
set -euo pipefail
size=${1:-2000}
repeats=${2:-5}
measure() {
  # One thread: torch.set_num_threads leaves OpenBLAS's own count at the
  # number of cores, and 2-core machines then measured both cores.
  OPENBLAS_NUM_THREADS=1 /usr/bin/python3 - "$size" "$repeats" <<'PY'
import ctypes, statistics, sys, time
import torch
n, repeats = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(1)
core = "unknown"
for line in open("/proc/self/maps"):
    if "openblas" in line and ".so" in line:
        lib = ctypes.CDLL(line.split()[-1])
        lib.openblas_get_corename.restype = ctypes.c_char_p
        core = lib.openblas_get_corename().decode()
        break
a = torch.randn(n, n, dtype=torch.float64)
b = torch.randn(n, n, dtype=torch.float64)
a @ b
times = []
for _ in range(repeats):
    t = time.perf_counter()
    a @ b
    times.append(time.perf_counter() - t)
print(f"{core:12s} {2 * n**3 / statistics.median(times) / 1e9:7.1f} GFLOP/s (median of {repeats})")
PY
}
echo "OpenBLAS's own choice:"
(unset OPENBLAS_CORETYPE; measure)
flags=$(grep -m1 '^flags' /proc/cpuinfo)
cores=(Prescott Nehalem)
[[ $flags == *" avx "* ]] && cores+=(Sandybridge)
[[ $flags == *" avx2 "* && $flags == *" fma "* ]] && cores+=(Haswell)
[[ $flags == *" avx512f "* && $flags == *" avx512bw "* && $flags == *" avx512vl "* && $flags == *" avx512dq "* ]] && cores+=(SkylakeX)
[[ $flags == *" avx512_bf16 "* ]] && cores+=(Cooperlake)
echo "forced with OPENBLAS_CORETYPE:"
for c in "${cores[@]}"; do OPENBLAS_CORETYPE=$c measure; done
