#!/usr/bin/env bash
# The step split's figures in docs/distributed.md: explain of two MNIST test
# points (one block of points, so 2 and 3 ranks split the steps) on 1, 2 and
# 3 ranks of one thread, the outputs compared byte for byte with one
# process's; then explain --test-index 0-7 (split by points) on 1 process
# against 2 ranks, timed by farm-bench (medians), with the load average.
#
#   scripts/measure_step_split.sh [BUILD_DIR] [RUNS_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build}/pathkernel
RUNS=${2:-runs}
REPEATS=${REPEATS:-3}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe"
RUN=$RUNS/demo-mnist

# The demo's run (scripts/demo.sh), trained with one thread: 300 steps, a
# checkpoint every 17 (the default), so 18 blocks of steps.
[[ -f $RUN/manifest.json ]] ||
  "$BIN" --threads 1 --quiet train --data mnist --model mlp:64 --optimizer sgd --lr 0.1 --batch 100 --steps 300 \
    --seed 0 --out "$RUN"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"

echo "== step split: explain $RUN --test-index 0,700 on 1, 2 and 3 ranks of 1 thread"
args=(--threads 1 --quiet explain "$RUN" --test-index 0,700 --checkpoint-seconds 1000000)
"$BIN" "${args[@]}" --out "$OUT/steps-1" > /dev/null
for np in 2 3; do
  $MPIRUN -np $np "$BIN" "${args[@]}" --out "$OUT/steps-$np" > "$OUT/steps-$np.txt"
  grep -o "rank [0-9]*: [0-9]* points in [0-9.]* s" "$OUT/steps-$np.txt" | sed 's/^/  /' || true
  for f in contributions.npy kernel.npy explain.json; do
    [[ -f $OUT/steps-1/$f ]] || continue
    if cmp "$OUT/steps-1/$f" "$OUT/steps-$np/$f"; then echo "  $np ranks: $f the same bytes as 1 process"
    else echo "  $np ranks: $f DIFFERENT"; fi
  done
done

echo "== split by points: explain $RUN --test-index 0-7, 2 ranks (A) against 1 process (B), 1 thread each"
args=(--threads 1 --quiet explain "$RUN" --test-index 0-7 --checkpoint-seconds 1000000)
"$BIN" "${args[@]}" --out "$OUT/points-1" > /dev/null
$MPIRUN -np 2 "$BIN" "${args[@]}" --out "$OUT/points-2" > /dev/null
cmp "$OUT/points-1/contributions.npy" "$OUT/points-2/contributions.npy" && echo "  contributions.npy: the same bytes"
farm-bench -n "$REPEATS" --timeout 3600 --vs "$BIN ${args[*]} --out $OUT/b" -- \
  $MPIRUN -np 2 "$BIN" "${args[@]}" --out "$OUT/a"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
