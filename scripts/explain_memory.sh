#!/usr/bin/env bash
# Peak memory of `explain` for 10 test points as the training set grows:
# Fashion-MNIST, mlp:64, momentum, batch 100, 200 steps, at --train-size
# 1000 and 10000. Prints one JSON line per size. M x P doubles would be
# 0.4 GB and 4.1 GB here; the reverse accumulators take 3 n K P doubles.
#   usage: scripts/explain_memory.sh [BUILD_DIR] [RUNS_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build}/pathkernel
RUNS=${2:-runs/memory}
mkdir -p "$RUNS"

for m in 1000 10000; do
  "$BIN" train --data fashion-mnist --train-size "$m" --model mlp:64 --optimizer momentum --lr 0.01 --batch 100 \
    --steps 200 --out "$RUNS/m$m" --force --quiet > /dev/null
  /usr/bin/time -f "%M %e" -o "$RUNS/m$m.time" "$BIN" explain "$RUNS/m$m" --test-index 0,1,2,3,4,5,6,7,8,9 \
    --out "$RUNS/m$m/explain" --quiet > /dev/null
  read -r kb seconds < "$RUNS/m$m.time"
  params=$(python3 -c "import json;print(json.load(open('$RUNS/m$m/manifest.json'))['parameters']['count'])")
  echo "{\"train_size\":$m,\"parameters\":$params,\"test_points\":10,\"peak_rss_mb\":$((kb / 1024)),\"seconds\":$seconds}"
done
