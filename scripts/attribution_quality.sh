#!/usr/bin/env bash
# The measurements of docs/attribution-quality.md: trains three runs (skipped
# when they exist) and tests the attribution methods against retraining on
# each with `pathkernel evaluate`, printing each table in Markdown after the
# command that produced it. Usage:
#   scripts/attribution_quality.sh [SETTING ...]    (default: all)
# with SETTING one of mlp-demo mlp-balanced mlp-kept mlp-metagradient mlp-steps gaussians3 gaussians3-kept cnn.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/pathkernel}
OUT=${OUT:-runs/attribution-quality}
PY=/usr/bin/python3
mkdir -p "$OUT"

train() {  # NAME TRAIN-ARGS...
  local name=$1
  shift
  if ! grep -qs '"status": "complete"' "$OUT/$name/manifest.json"; then
    "$BIN" train "$@" --seed 0 --quiet --out "$OUT/$name" --force > /dev/null
  fi
}

evaluate() {  # RUN TAG EVALUATE-ARGS...
  local run=$1 tag=$2
  shift 2
  echo "#### $tag"
  echo
  echo "\`pathkernel evaluate $OUT/$run $* --json\`"
  echo
  "$BIN" evaluate "$OUT/$run" "$@" --json --quiet --out "$OUT/$run/evaluate-$tag" > "$OUT/$run/evaluate-$tag.json"
  $PY - "$OUT/$run/evaluate-$tag/evaluate.json" << 'PYEOF'
import json, sys
j = json.load(open(sys.argv[1]))
cols = j["columns"]
print("| method | " + " | ".join(cols) + " |")
print("|---" * (len(cols) + 1) + "|")
def fmt(v):
    if v is None:
        return "–"
    return f"{v:.3g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.2e}"
for m, row in j["table"].items():
    print(f"| {m} | " + " | ".join(fmt(row.get(c)) for c in cols) + " |")
r, s = j["retrain"], j["seconds"]
print()
print(f"{r['retrainings']} retrainings ({r['scaling']} removal, {r['workers']} at once) in {r['seconds']:.0f} s; "
      f"{len(j['test_indices'])} test points; {s['total']:.0f} s in all.", end="")
if "loo" in j:
    import statistics
    eff = [abs(e) for t in j["loo"]["per_test"] for e in t["effect"]]
    sc = [abs(v) for t in j["loo"]["per_test"] for v in t["scores"].get("epk", [])]
    print(f" Leave-one-out: {len(j['loo']['removed'])} points removed; median |effect| {statistics.median(eff):.2e}", end="")
    if sc:
        print(f", median |epk score| on the same points {statistics.median(sc):.2e}", end="")
    print(".", end="")
print("\n")
PYEOF
}

settings=("$@")
[[ ${#settings[@]} -eq 0 ]] && settings=(mlp-demo mlp-balanced mlp-kept mlp-metagradient mlp-steps gaussians3 gaussians3-kept cnn)
for s in "${settings[@]}"; do
  case $s in
    mlp-demo)
      train mnist-mlp --data mnist --model mlp:64 --optimizer sgd --lr 0.1 --batch 100 --steps 300
      evaluate mnist-mlp demo --test 20 --methods epk,dpk,tracin-cp,grad-dot,random --metrics loo,lds,mislabel ;;
    mlp-balanced)
      train mnist-mlp --data mnist --model mlp:64 --optimizer sgd --lr 0.1 --batch 100 --steps 300
      evaluate mnist-mlp balanced --test-balanced 20 --metrics loo,lds,brittleness ;;
    mlp-kept)
      train mnist-mlp --data mnist --model mlp:64 --optimizer sgd --lr 0.1 --batch 100 --steps 300
      evaluate mnist-mlp kept --test-balanced 20 --metrics loo,lds --removal kept ;;
    mlp-metagradient)
      # The exact contribution beside the metagradient, whose removal is a
      # loss weight going to 0: the batch keeps its size (kept removal).
      train mnist-mlp --data mnist --model mlp:64 --optimizer sgd --lr 0.1 --batch 100 --steps 300
      evaluate mnist-mlp metagradient --test-balanced 20 --methods epk,metagradient,grad-dot,random \
        --metrics loo,lds --removal kept ;;
    mlp-steps)
      # The same model and data trained for 1 to 300 steps: how the
      # counterfactual parts from the contribution as training goes on.
      for n in 1 10 30 100 300; do
        train "mnist-mlp-$n" --data mnist --model mlp:64 --optimizer sgd --lr 0.1 --batch 100 --steps "$n"
        evaluate "mnist-mlp-$n" steps --test-balanced 10 --methods epk,grad-dot,random --metrics loo --removal kept
      done ;;
    gaussians3)
      train gaussians3-mlp --data gaussians3 --model mlp:32 --optimizer gd --lr 0.1 --steps 300 --zero-last-layer
      evaluate gaussians3-mlp balanced --test-balanced 20 --metrics loo,lds,mislabel ;;
    gaussians3-kept)
      train gaussians3-mlp --data gaussians3 --model mlp:32 --optimizer gd --lr 0.1 --steps 300 --zero-last-layer
      evaluate gaussians3-mlp kept --test-balanced 20 --metrics loo --removal kept ;;
    cnn)
      train mnist-cnn --data mnist --model cnn:8,16 --optimizer sgd --lr 0.05 --batch 100 --steps 200
      # mislabel is left out: epk's self-attribution of 40 training points
      # on this CNN takes longer than the rest together.
      evaluate mnist-cnn balanced --test-balanced 10 --metrics loo,lds ;;
    *) echo "unknown setting '$s': expected mlp-demo, mlp-balanced, mlp-kept, mlp-metagradient, mlp-steps, gaussians3, gaussians3-kept or cnn" >&2
       exit 2 ;;
  esac
done
