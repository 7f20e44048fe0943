#!/usr/bin/env bash
# make demo: train an MLP on real MNIST digits, record its path, show what was
# recorded, and replay the whole path to check it reproduces bit for bit.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/pathkernel}
RUN=${2:-runs/demo-mnist}

echo "== 1. train mlp:64 on MNIST with SGD (batch 100, 300 steps), recording the path in $RUN"
"$BIN" train --data mnist --model mlp:64 --optimizer sgd --lr 0.1 --batch 100 --steps 300 \
  --seed 0 --out "$RUN" --force
echo
echo "== 2. what the run directory holds"
"$BIN" info "$RUN"
echo
echo "== 3. replay every step from the checkpoints and compare bit for bit"
"$BIN" check-path "$RUN"
if /usr/bin/python3 -c 'import numpy' 2> /dev/null; then
  echo
  echo "== 4. load w_0 and w_N with numpy alone (examples/load_path.py)"
  /usr/bin/python3 examples/load_path.py "$RUN"
fi
echo
echo "run directory: $RUN"
