#!/usr/bin/env bash
# The metagradient's measured row (docs/cli.md, docs/attribution-quality.md): on
# MNIST mlp:64 (SGD, batch 100, lr 0.1, 300 steps, the demo's run), times
# `explain --method metagradient` on 10 test points (their predicted classes)
# against training, and checks it on the 5 training points of largest
# |metagradient| against central finite differences of retraining.
# The run is trained afresh each time, so training and the metagradient are
# timed side by side on the same machine state.
# Usage: scripts/metagradient_mnist.sh [RUN]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/pathkernel}
RUN=${1:-runs/metagradient-mnist}
PY=/usr/bin/python3

echo "\`pathkernel train --data mnist --model mlp:64 --optimizer sgd --lr 0.1 --batch 100 --steps 300 --seed 0 --out $RUN\`"
"$BIN" train --data mnist --model mlp:64 --optimizer sgd --lr 0.1 --batch 100 --steps 300 --seed 0 \
  --quiet --out "$RUN" --force > /dev/null
echo "\`pathkernel explain $RUN --method metagradient --test 10 --check 5 --json\`"
"$BIN" explain "$RUN" --method metagradient --test 10 --check 5 --json --quiet > "$RUN/metagradient.json"
$PY - "$RUN" << 'PYEOF'
import json, sys
run = sys.argv[1]
train = json.load(open(f"{run}/timing.json"))
mg = json.load(open(f"{run}/metagradient.json"))
t = train["seconds"] if "seconds" in train else train["train_seconds"]
c = mg["check"]
per = mg["seconds"] / mg["adjoints"]
print(f"load average {open('/proc/loadavg').read().split()[0]}")
print(f"training: {t:.2f} s for {mg['steps']} steps")
print(f"metagradient: {mg['seconds']:.2f} s for {mg['adjoints']} adjoints "
      f"({per:.2f} s each: {per / t:.2f} x training per test point and output; goal <= 4)")
print(f"check on {len(c['points'])} training points: max relative error {c['max_rel_error']:.2e} "
      f"(the differences resolve {c['max_rel_spread']:.1e}; goal <= 1e-6), {c['retrainings']} retrainings in "
      f"{c['seconds']:.1f} s")
PYEOF
