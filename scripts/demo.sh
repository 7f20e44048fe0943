#!/usr/bin/env bash
# make demo: train an MLP on real MNIST digits, record its path, show what was
# recorded, replay the whole path bit for bit, check the exact kernel machine
# against the network, and explain a few test digits by training digits.
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
echo "== 5. the exact kernel machine: f(w_N,x) = f(w_0,x) + sum_i C_i(x) + R(x) + E(x) on 10 test digits"
"$BIN" verify "$RUN" --test 10
echo
echo "== 6. which training digits pushed three test predictions (a 0, a 3, a 6) up (proponents) or down (opponents)"
"$BIN" explain "$RUN" --test-index 0,700,1200 --top 10   # test digits are ordered by class
echo
echo "== 7. the report: one self-contained HTML page of the run and its explanations"
"$BIN" report "$RUN" --out "$RUN/report.html"
echo
echo "run directory: $RUN"
echo "report: $RUN/report.html"
