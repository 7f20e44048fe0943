#!/usr/bin/env bash
# The rows of docs/own-model.md, "Measured: the two routes": users' TorchScript modules trained,
# verified on both routes (structured and generic), and explained.
#   resnet       examples/export_model.py resnet (residual CNN, average pooling),
#                fashion-mnist 2000 train, SGD batch 100, lr 0.05, 100 steps
#   transformer  examples/export_model.py transformer (embedding, attention,
#                LayerNorm, GELU MLP), modular addition mod 23 as npy:DIR, AdamW
#   cnn          layers:conv(8,3,padding=1),relu,maxpool(2),conv(16,3,padding=1),
#                relu,maxpool(2): docs/cli.md's MNIST cnn:8,16 as a TorchScript
#                module, SGD batch 100, lr 0.05, 200 steps
#   dropout      layers:flatten,linear(128),relu,dropout(0.5) (DROPOUT=P sets
#                P), fashion-mnist 2000 train, SGD batch 100, lr 0.05, 100 steps
# Each row: verify --test N on the structured route (the default) and on the
# generic route (--route generic), their max_rel_error, evaluations and time
# side by side, and the load average.
# Usage: scripts/own_model_routes.sh resnet|transformer|cnn|dropout [TEST_POINTS] [GENERIC_TEST_POINTS]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/pathkernel}
PY=/usr/bin/python3
WHICH=${1:?usage: $0 resnet|transformer|cnn|dropout [TEST_POINTS] [GENERIC_TEST_POINTS]}
N=${2:-10}
NG=${3:-$N}
DIR=runs/own-model/$WHICH${DROPOUT:+-$DROPOUT}
mkdir -p "$DIR"

case "$WHICH" in
  resnet)
    $PY examples/export_model.py resnet "$DIR/resnet.pt"
    train=(train --model "torchscript:$DIR/resnet.pt" --data fashion-mnist --train-size 2000
           --optimizer sgd --lr 0.05 --batch 100 --steps 100)
    ;;
  transformer)
    $PY examples/export_model.py transformer "$DIR/tf.pt" --data-dir "$DIR/modadd"
    train=(train --model "torchscript:$DIR/tf.pt" --data "npy:$DIR/modadd" --optimizer adamw --lr 3e-3
           --weight-decay 0.1 --batch 64 --steps "${STEPS:-300}")
    ;;
  cnn)
    train=(train --model "layers:conv(8,3,padding=1),relu,maxpool(2),conv(16,3,padding=1),relu,maxpool(2)"
           --data mnist --optimizer sgd --lr 0.05 --batch 100 --steps 200)
    ;;
  dropout)
    train=(train --model "layers:flatten,linear(128),relu,dropout(${DROPOUT:-0.5})" --data fashion-mnist
           --train-size 2000 --optimizer sgd --lr 0.05 --batch 100 --steps 100)
    ;;
  *) echo "unknown model '$WHICH': expected resnet, transformer, cnn or dropout" >&2; exit 2 ;;
esac

echo "\`pathkernel ${train[*]} --out $DIR/run\`"
"$BIN" "${train[@]}" --quiet --force --out "$DIR/run" > /dev/null
for route in auto generic; do
  n=$N
  [ "$route" = generic ] && n=$NG
  [ "$n" -gt 0 ] || continue
  echo "\`pathkernel verify $DIR/run --test $n --route $route --json\`"
  /usr/bin/time -f "%e %U %S" -o "$DIR/time-$route.txt" \
    "$BIN" verify "$DIR/run" --test "$n" --route "$route" --json --quiet > "$DIR/verify-$route.json"
done
$PY - "$DIR" << 'PYEOF'
import json, os, sys
d = sys.argv[1]
print(f"load average {open('/proc/loadavg').read().split()[0]}")
print("| route | test points | max_rel_error | evaluations / point·step | forward | kinks | verify s | wall s | user s | per point s |")
print("|---|---|---|---|---|---|---|---|---|---|")
for route in ("auto", "generic"):
    path = f"{d}/verify-{route}.json"
    if not os.path.exists(path):
        continue
    v = json.load(open(path))
    wall, user, _ = open(f"{d}/time-{route}.txt").read().split()
    print(f"| {v['route']} | {v['test_points']} | {v['max_rel_error']:.2e} | {v['mean_evaluations_per_step']:.1f} "
          f"| {v['mean_forward_evaluations_per_step']:.1f} | {v['mean_kinks_per_step']:.1f} | {v['seconds']:.1f} "
          f"| {float(wall):.1f} | {float(user):.1f} | {v['seconds'] / v['test_points']:.2f} |")
PYEOF
