#!/usr/bin/env bash
# The figures of docs/distributed.md: explain on 1 process against 2 MPI ranks
# of one thread each, on the MNIST mlp:64 run of `make demo` and on an MNIST
# cnn:8,16 run, timed whole by farm-bench (A: 2 ranks, B: 1 process, in
# turn), and a check that both write the same bytes.
#
#   scripts/measure_distributed.sh [BUILD_DIR] [RUNS_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build}/pathkernel
RUNS=${2:-runs}
REPEATS=${REPEATS:-3}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe -np 2"

# The demo's run (scripts/demo.sh), trained with one thread.
[[ -f $RUNS/demo-mnist/manifest.json ]] ||
  "$BIN" --threads 1 --quiet train --data mnist --model mlp:64 --optimizer sgd --lr 0.1 --batch 100 --steps 300 \
    --seed 0 --out "$RUNS/demo-mnist"
# docs/measurements.md's CNN (mnist, cnn:8,16, SGD batch 100, lr 0.05), its first 10 steps.
[[ -f $RUNS/cnn-mnist-10/manifest.json ]] ||
  "$BIN" --threads 1 --quiet train --data mnist --model cnn:8,16 --optimizer sgd --lr 0.05 --batch 100 --steps 10 \
    --seed 0 --out "$RUNS/cnn-mnist-10"

measure() {  # NAME RUN TEST-POINT-OPTIONS...
  local name=$1 run=$2
  shift 2
  local args=(--threads 1 --quiet explain "$run" "$@" --checkpoint-seconds 1000000)
  echo "== $name: explain $run $*, 1 process vs 2 ranks of 1 thread"
  "$BIN" "${args[@]}" --json --out "$OUT/$name-one" > "$OUT/$name-one.json"
  $MPIRUN "$BIN" "${args[@]}" --json --out "$OUT/$name-two" > "$OUT/$name-two.json"
  for f in contributions.npy explain.json; do
    cmp -s "$OUT/$name-one/$f" "$OUT/$name-two/$f" && echo "  $f: the same bytes" || echo "  $f: DIFFERENT"
  done
  /usr/bin/python3 - "$OUT/$name-two.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))["ranks"]
print("  ranks: points %s, decomposition seconds %s" % (r["points"], ["%.2f" % s for s in r["seconds"]]))
EOF
  farm-bench -n "$REPEATS" --timeout 3600 --vs "$BIN ${args[*]} --out $OUT/$name-b" -- \
    $MPIRUN "$BIN" "${args[@]}" --out "$OUT/$name-a"
}

measure mlp-8 "$RUNS/demo-mnist" --test 8
measure mlp-32 "$RUNS/demo-mnist" --test 32
measure cnn-4 "$RUNS/cnn-mnist-10" --test 4 --point-block 2
