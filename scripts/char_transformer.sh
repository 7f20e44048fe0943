#!/bin/sh
# A character-level causal transformer on a text Debian ships, decomposed
# exactly: builds the sequence data set and the module
# (examples/char_transformer.py), trains it with AdamW, checks the kernel
# machine at the last position and at one more, and explains a test sequence.
#
#   scripts/char_transformer.sh [OUT]     (default OUT: /tmp/pathkernel-char)
#
# Environment: PATHKERNEL (default build/pathkernel), TEXT (default
# /usr/share/common-licenses/GPL-3), STEPS (200), LENGTH (16), WIDTH (16),
# POSITION (7), TEST (5: the test sequences verify checks).
set -eu
cd "$(dirname "$0")/.."
BIN=${PATHKERNEL:-build/pathkernel}
OUT=${1:-/tmp/pathkernel-char}
TEXT=${TEXT:-/usr/share/common-licenses/GPL-3}
STEPS=${STEPS:-200}
LENGTH=${LENGTH:-16}
POSITION=${POSITION:-7}
WIDTH=${WIDTH:-16}
TEST=${TEST:-5}
PY=/usr/bin/python3

mkdir -p "$OUT"
$PY examples/char_transformer.py data "$OUT/data" --text "$TEXT" --length "$LENGTH" --train 256 --test 32
V=$($PY -c "import json, sys; print(len(json.load(open(sys.argv[1]))))" "$OUT/data/vocabulary.json")
$PY examples/char_transformer.py export "$OUT/model.pt" --vocab "$V" --length "$LENGTH" --width "$WIDTH"
"$BIN" train --model "torchscript:$OUT/model.pt" --data "npy:$OUT/data" --output logits \
  --optimizer adamw --lr 0.01 --weight-decay 0.01 --batch 32 --steps "$STEPS" --checkpoint-every 50 \
  --out "$OUT/run" --force --quiet
"$BIN" verify "$OUT/run" --test "$TEST" --json --quiet > "$OUT/verify_last.json"
"$BIN" verify "$OUT/run" --test "$TEST" --position "$POSITION" --json --quiet > "$OUT/verify_position.json"
"$BIN" explain "$OUT/run" --test-index 0 --top 5 --quiet
$PY - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
for name in ["verify_last", "verify_position"]:
    v = json.load(open(f"{out}/{name}.json"))
    print(f"{name}: position {v['position']}, max_rel_error {v['max_rel_error']:.3e}, route {v['route']}, "
          f"{v['steps']} steps, {v['seconds']:.0f} s")
e = json.load(open(f"{out}/run/explain/explain.json"))
p = e["points"][0]
print(f"test sequence {p['test_index']} {p['text']!r}, position {p['position']}: label {p['label']}, "
      f"predicted {p['predicted']}")
for r in p["proponents"]:
    print(f"  proponent #{r['index']} {r['text']!r} {r['value']:+.3e}")
PY
