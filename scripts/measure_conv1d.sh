#!/usr/bin/env bash
# A Conv1d network (Conv1d, ReLU, MaxPool1d, Linear: examples/export_model.py
# conv1d) on sequences [1, 16] (noisy waves whose class is their frequency,
# written as npy:DIR), trained by pathkernel and verified on the structured
# route: prints verify's route, max_rel_error and its certificate.
# Usage: scripts/measure_conv1d.sh [TEST_POINTS] (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/pathkernel}
PY=/usr/bin/python3
N=${1:-5}
DIR=runs/conv1d
mkdir -p "$DIR"
$PY examples/export_model.py conv1d "$DIR/conv1d.pt" --data-dir "$DIR/data" --classes 3 --length 16 --width 4
"$BIN" train --model "torchscript:$DIR/conv1d.pt" --data "npy:$DIR/data" --optimizer sgd --lr 0.05 --batch 50 \
  --steps 60 --out "$DIR/run" --force > /dev/null
"$BIN" verify "$DIR/run" --test "$N" --json > "$DIR/verify.json"
$PY - "$DIR/verify.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print({k: j[k] for k in ("route", "max_rel_error") if k in j})
PY
