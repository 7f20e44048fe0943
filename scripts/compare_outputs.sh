#!/usr/bin/env bash
# Runs a fixed set of pathkernel commands with two binaries and compares every
# file they write (every .npy byte for byte; JSON with its timings removed;
# every other file byte for byte). A restructuring of the engine proves it
# changed no number with it: build the commit before and after, then
#   scripts/compare_outputs.sh OLD/pathkernel NEW/pathkernel [WORK_DIR]
# prints one line per file that differs and "identical: N files" at the end;
# exit status 1 when any file differs or one side lacks it.
#
# The commands: the exactness settings (scripts/verify_exactness.sh, fewer
# test points), explain on own networks (an MLP and a CNN), a layers: network,
# a TorchScript module on both routes, a recorded loop (record_loop.py, once,
# read by both binaries; stored every step, the format every pathkernel binary
# reads), evaluate and the metagradient on a small run, and a Fashion-MNIST
# subset (inputs that are bytes) with sgd and gd, through every command that
# reads its training rows.
# Both binaries run one after the other on one thread, so that BLAS sees the
# same machine for both. THREADS=N runs every command on N threads instead: a
# change to what runs in parallel shows there (pathkernel's own MLP trains
# its Linear products in pieces on two threads or more, so its runs differ
# from a binary before 039b871 by design; everything else should not).
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=$(readlink -f "${1:?usage: $0 OLD_BINARY NEW_BINARY [WORK_DIR]}")
NEW=$(readlink -f "${2:?usage: $0 OLD_BINARY NEW_BINARY [WORK_DIR]}")
WORK=${3:-runs/compare-outputs}
PY=/usr/bin/python3
rm -rf "$WORK"
mkdir -p "$WORK/shared"

# Inputs both binaries read: a TorchScript module and a recorded loop.
$PY examples/export_model.py mlp "$WORK/shared/mlp.pt" --inputs 100 --hidden 16 --classes 3 > /dev/null
PYTHONPATH=python $PY examples/record_loop.py "$WORK/shared/loop" --train 120 --test 20 --epochs 2 \
  --every-step > /dev/null

commands() {  # $1: binary, $2: output directory
  local bin=$1 out=$2
  local pk=("$bin" --threads "${THREADS:-1}" --quiet)
  mkdir -p "$out"
  # The exactness settings.
  "${pk[@]}" train --data gaussians3 --model mlp:32 --optimizer gd --lr 0.1 --steps 300 --zero-last-layer \
    --out "$out/gaussians3" --force > /dev/null
  for q in gauss dpk riemann:20; do
    "${pk[@]}" verify "$out/gaussians3" --test 20 --quadrature "$q" --json > "$out/gaussians3-verify-${q%%:*}.json"
  done
  "${pk[@]}" explain "$out/gaussians3" --test-index 0-3 --out "$out/gaussians3/explain" > /dev/null
  "${pk[@]}" train --data mnist --model mlp:64 --optimizer sgd --batch 100 --steps 60 \
    --out "$out/mnist-mlp" --force > /dev/null
  "${pk[@]}" verify "$out/mnist-mlp" --test 4 --json > "$out/mnist-mlp-verify.json"
  "${pk[@]}" verify "$out/mnist-mlp" --test 4 --pieces adaptive --kinks bracket --json \
    > "$out/mnist-mlp-verify-adaptive.json"
  "${pk[@]}" explain "$out/mnist-mlp" --test-index 0,1 --out "$out/mnist-mlp/explain" > /dev/null
  # Own CNN (momentum: the segment replay).
  "${pk[@]}" train --data mnist --model cnn:4,8 --optimizer momentum --lr 0.05 --batch 50 --steps 20 \
    --out "$out/mnist-cnn" --force > /dev/null
  "${pk[@]}" verify "$out/mnist-cnn" --test 2 --json > "$out/mnist-cnn-verify.json"
  "${pk[@]}" explain "$out/mnist-cnn" --test-index 0,1 --out "$out/mnist-cnn/explain" > /dev/null
  # A layers: network (a TorchScript module pathkernel builds) on both routes.
  "${pk[@]}" train --model "layers:conv(4,3,padding=1),relu,maxpool(2),conv(8,3,padding=1),relu,maxpool(2)" \
    --data mnist --optimizer sgd --lr 0.05 --batch 50 --steps 15 --out "$out/layers" --force > /dev/null
  for route in auto generic; do
    "${pk[@]}" verify "$out/layers" --test 2 --route "$route" --json > "$out/layers-verify-$route.json"
  done
  "${pk[@]}" explain "$out/layers" --test-index 0 --out "$out/layers/explain" > /dev/null
  # A user's TorchScript module on both routes.
  "${pk[@]}" train --model "torchscript:$WORK/shared/mlp.pt" --data gaussians3 --optimizer adam --lr 0.01 \
    --batch 32 --steps 30 --out "$out/script" --force > /dev/null
  for route in auto generic; do
    "${pk[@]}" verify "$out/script" --test 4 --route "$route" --json > "$out/script-verify-$route.json"
    "${pk[@]}" explain "$out/script" --test-index 0,1 --route "$route" --out "$out/script/explain-$route" > /dev/null
    "${pk[@]}" gram "$out/script" --kernel epk --rows test --cols test --test 3 --route "$route" \
      --out "$out/script/gram-test-$route.npy" > /dev/null
  done
  # A recorded loop, read in place (both binaries read the same directory).
  "${pk[@]}" verify "$WORK/shared/loop" --test 3 --json > "$out/loop-verify.json"
  "${pk[@]}" explain "$WORK/shared/loop" --test-index 0 --out "$out/loop-explain" > /dev/null
  # evaluate and the metagradient on a small run.
  "${pk[@]}" train --data gaussians3 --model mlp:16 --optimizer sgd --lr 0.1 --batch 20 --steps 30 \
    --train-size 100 --out "$out/small" --force > /dev/null
  "${pk[@]}" explain "$out/small" --method metagradient --test 3 --check 2 --out "$out/small/metagradient" > /dev/null
  "${pk[@]}" evaluate "$out/small" --test 3 --methods epk,metagradient,dpk,tracin-cp,grad-dot \
    --metrics loo,lds --loo-extremes 2 --loo-random 2 --lds-subsets 4 --workers 1 --json > "$out/small-evaluate.json"
  "${pk[@]}" gram "$out/small" --kernel epk --rows test --cols train --test 3 --train 20 --outputs trace \
    --out "$out/small/gram.npy" > /dev/null
  "${pk[@]}" gram "$out/mnist-cnn" --kernel epk --rows test --cols test --test 2 --out "$out/mnist-cnn/gram-test.npy" \
    > /dev/null
  # Inputs that are bytes (fashion-mnist), which a run's reader holds as codes:
  # a batch's rows decoded (sgd), the whole set (gd), the images explain draws.
  for opt in sgd gd; do
    local batch=60
    [ "$opt" = gd ] && batch=600
    "${pk[@]}" train --data fashion-mnist --train-size 600 --test-size 50 --model mlp:16 --optimizer "$opt" \
      --lr 0.1 --batch "$batch" --steps 20 --out "$out/fashion-$opt" --force > /dev/null
    "${pk[@]}" verify "$out/fashion-$opt" --test 3 --json > "$out/fashion-$opt-verify.json"
    "${pk[@]}" explain "$out/fashion-$opt" --test-index 0,1 --out "$out/fashion-$opt/explain" > /dev/null
  done
  "${pk[@]}" gram "$out/fashion-sgd" --kernel epk --rows test --cols train --test 2 --train 30 \
    --out "$out/fashion-sgd/gram.npy" > /dev/null
  "${pk[@]}" explain "$out/fashion-sgd" --method metagradient --test 2 --check 1 \
    --out "$out/fashion-sgd/metagradient" > /dev/null
  # What reads chosen training rows (compare, refit), every batch of a
  # retraining (evaluate), and a full batch's metagradient.
  "${pk[@]}" compare "$out/fashion-sgd" --kernels epk,ntk --train-count 30 --test 3 --json \
    > "$out/fashion-sgd-compare.json"
  "${pk[@]}" refit "$out/fashion-sgd" --train-count 30 --test 3 --json > "$out/fashion-sgd-refit.json"
  "${pk[@]}" evaluate "$out/fashion-gd" --test 2 --methods epk,grad-dot --metrics loo --loo-extremes 1 \
    --loo-random 1 --workers 1 --json > "$out/fashion-gd-evaluate.json"
  "${pk[@]}" explain "$out/fashion-gd" --method metagradient --test 1 --check 1 \
    --out "$out/fashion-gd/metagradient" > /dev/null
  # A retraining on flipped labels, from a data directory the command writes.
  "${pk[@]}" evaluate "$out/fashion-sgd" --test 2 --methods grad-dot --metrics mislabel --mislabel-candidates 20 \
    --workers 1 --json > "$out/fashion-sgd-mislabel.json"
}

for side in old new; do
  bin=$OLD
  [ "$side" = new ] && bin=$NEW
  echo "running the commands with $bin" >&2
  start=$(date +%s)
  commands "$bin" "$WORK/$side"
  echo "  $side: $(( $(date +%s) - start )) s" >&2
done

$PY - "$WORK/old" "$WORK/new" << 'PYEOF'
import json, os, re, sys

old_root, new_root = sys.argv[1], sys.argv[2]
# Keys whose values measure time or the machine: left out of the comparison
# of JSON files (strings naming a side's own directory read "<side>").
VOLATILE = re.compile(r"(seconds|^cpu|^load|elapsed|^time$|^wall)")

def strip(value, root):
    if isinstance(value, dict):
        return {k: strip(v, root) for k, v in value.items() if not VOLATILE.search(k)}
    if isinstance(value, list):
        return [strip(v, root) for v in value]
    if isinstance(value, str):
        return value.replace(root, "<side>")
    return value

def files(root):
    found = []
    for d, _, names in os.walk(root):
        for n in names:
            found.append(os.path.relpath(os.path.join(d, n), root))
    return set(found)

def json_of(path, root):
    with open(path) as f:
        text = f.read()
    try:
        return strip(json.loads(text), root)
    except json.JSONDecodeError:  # --json lines: one object per line
        return [strip(json.loads(l), root) for l in text.splitlines() if l.strip().startswith("{")]

def markdown_of(path, root):
    with open(path) as f:
        return re.sub(r"Took [0-9.e+-]+ s", "Took <time> s", f.read().replace(root, "<side>"))

old_files, new_files = files(old_root), files(new_root)
different = 0
for rel in sorted(old_files ^ new_files):
    print(f"only in {'old' if rel in old_files else 'new'}: {rel}")
    different += 1
same = 0
for rel in sorted(old_files & new_files):
    a, b = os.path.join(old_root, rel), os.path.join(new_root, rel)
    if rel.endswith(".json"):
        equal = json_of(a, old_root) == json_of(b, new_root)
    elif rel.endswith((".log", ".txt")) or "/.progress/" in rel:
        continue  # progress logs and timings
    elif rel.endswith(".md"):  # a report's text: its side's directory and its time left out
        equal = markdown_of(a, old_root) == markdown_of(b, new_root)
    else:
        with open(a, "rb") as fa, open(b, "rb") as fb:
            equal = fa.read() == fb.read()
    if equal:
        same += 1
    else:
        print(f"differs: {rel}")
        different += 1
print(f"identical: {same} files; different or missing: {different}")
sys.exit(1 if different else 0)
PYEOF
