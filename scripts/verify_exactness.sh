#!/usr/bin/env bash
# Measures the exact kernel machine against the network in the settings the
# docs/measurements.md quotes ("Measured exactness"): the paper's §4.1 (gaussians3, mlp:32, full-batch GD) with
# gauss, riemann:100 and dpk, and MNIST with mlp:64 and cnn:8,16 under
# minibatch SGD. Prints one JSON line per verify run.
#   usage: scripts/verify_exactness.sh [BUILD_DIR] [RUNS_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build}/pathkernel
RUNS=${2:-runs/exactness}
mkdir -p "$RUNS"

"$BIN" train --data gaussians3 --model mlp:32 --optimizer gd --lr 0.1 --steps 300 --zero-last-layer \
  --out "$RUNS/gaussians3" --force --quiet > /dev/null
"$BIN" verify "$RUNS/gaussians3" --test 100 --quadrature gauss --json --quiet
"$BIN" verify "$RUNS/gaussians3" --test 100 --quadrature dpk --json --quiet
# riemann:100 evaluates 100 nodes per step and point, about 12x gauss here
# (RIEMANN_TEST_POINTS=10 for a quicker run).
"$BIN" verify "$RUNS/gaussians3" --test "${RIEMANN_TEST_POINTS:-100}" --quadrature riemann:100 --json --quiet

"$BIN" train --data mnist --model mlp:64 --optimizer sgd --batch 100 --steps 300 \
  --out "$RUNS/mnist-mlp" --force --quiet > /dev/null
"$BIN" verify "$RUNS/mnist-mlp" --test "${MNIST_TEST_POINTS:-10}" --gauss-nodes 8 --tol 1e-14 --json --quiet
"$BIN" verify "$RUNS/mnist-mlp" --test "${MNIST_TEST_POINTS:-10}" --quadrature dpk --json --quiet

"$BIN" train --data mnist --model cnn:8,16 --optimizer sgd --lr 0.05 --batch 100 --steps 200 \
  --out "$RUNS/mnist-cnn" --force --quiet > /dev/null
"$BIN" verify "$RUNS/mnist-cnn" --test "${CNN_TEST_POINTS:-5}" --json --quiet
