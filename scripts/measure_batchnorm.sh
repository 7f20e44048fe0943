#!/usr/bin/env bash
# BatchNorm in training mode, exactly (docs/math.md §15): a residual CNN with
# BatchNorm2d after each convolution (examples/export_model.py resnet-bn),
# exported with torch.jit.script in training mode, trained by pathkernel on
# 2000 Fashion-MNIST images (momentum, batch 100, 60 steps) and verified on
# TEST_POINTS test points: prints verify's route, max_rel_error, the
# running-statistics term's size and the seconds it took.
# Usage: scripts/measure_batchnorm.sh [TEST_POINTS] (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/pathkernel}
PY=/usr/bin/python3
N=${1:-5}
DIR=runs/batchnorm
mkdir -p "$DIR"
$PY examples/export_model.py resnet-bn "$DIR/resnet_bn.pt" --channels 1 --size 28 --width 4 --classes 10
"$BIN" train --model "torchscript:$DIR/resnet_bn.pt" --data fashion-mnist --train-size 2000 --optimizer momentum \
  --lr 0.05 --batch 100 --steps 60 --out "$DIR/run" --force > /dev/null
"$BIN" verify "$DIR/run" --test "$N" --json > "$DIR/verify.json"
$PY - "$DIR/verify.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print({k: j[k] for k in ("route", "max_rel_error", "completeness_error", "max_abs_statistics",
                         "max_abs_rounding", "seconds") if k in j})
PY
