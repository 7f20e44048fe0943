#!/usr/bin/env bash
# Measures the exact decomposition for every optimizer on MNIST: mlp:64,
# batch 100, 200 steps, weight decay 1e-4, verified on 50 test points.
# Prints one JSON line per optimizer (verify's fields plus "optimizer").
#   usage: [OPTIMIZERS="rmsprop adagrad"] scripts/verify_optimizers.sh [BUILD_DIR] [RUNS_DIR]
# (rmsprop-momentum: RMSprop with momentum 0.9)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build}/pathkernel
RUNS=${2:-runs/optimizers}
TEST_POINTS=${TEST_POINTS:-50}
mkdir -p "$RUNS"

OPTIMIZERS=${OPTIMIZERS:-sgd momentum nesterov adam adamw rmsprop rmsprop-momentum adagrad}

for opt in $OPTIMIZERS; do
  kind=(--optimizer "$opt")
  case $opt in
    sgd) lr=0.1 ;;
    momentum|nesterov|adagrad) lr=0.01 ;;
    adam|adamw|rmsprop) lr=0.001 ;;
    rmsprop-momentum) lr=0.0001; kind=(--optimizer rmsprop --momentum 0.9) ;;
  esac
  "$BIN" train --data mnist --model mlp:64 "${kind[@]}" --lr "$lr" --weight-decay 1e-4 --batch 100 \
    --steps 200 --out "$RUNS/$opt" --force --quiet > /dev/null
  "$BIN" verify "$RUNS/$opt" --test "$TEST_POINTS" --json --quiet | sed "s/^{/{\"optimizer\":\"$opt\",/"
done
