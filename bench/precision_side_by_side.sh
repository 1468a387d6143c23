#!/usr/bin/env bash
# bf16 mixed precision against f32 on the text task (docs/TRAINING.md, "Mixed precision"): the same
# model, data, seed and schedule trained twice on one GPU, the validation loss at every evaluation
# of both runs side by side, and the gap at the end (the margin bf16 training keeps to f32).
#
#   bench/precision_side_by_side.sh [STEPS]
#     STEPS  training steps (default 400; evaluated every 50)
# The model: hidden 512, 4 layers, 4 heads of 128 (a GatedDeltaNet LM of about 13M parameters),
# batch 16 x 512 bytes.  The text: this repository's own docs and C sources (a few MB of real text,
# the same for a given commit).
# Environment: DG_BIN (default build/release/deltagrad), OUT (default a temporary directory).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${DG_BIN:-build/release/deltagrad}
STEPS=${1:-400}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/dg-precision.XXXXXX")}
mkdir -p "$OUT"
DATA="$OUT/corpus.txt"
cat README.md docs/*.md core/*.c autograd/*.c ops/*.c ops/delta/*.c models/*.c tools/*.c kernels/cpu/*.c \
    kernels/cuda/*.cu tests/*.c >"$DATA"
for p in f32 bf16; do
    "$BIN" train --device cuda --task text --data "$DATA" --precision "$p" --hidden-size 512 --layers 4 --heads 4 \
        --head-dim 128 --batch 16 --seq-len 512 --steps "$STEPS" --warmup 50 --lr 1e-3 --eval-every 50 \
        --eval-batches 16 --save-every 0 --seed 7 --quiet --overwrite --out "$OUT/$p" >"$OUT/$p.log" 2>&1 ||
        { echo "the $p run failed: $(tail -3 "$OUT/$p.log")" >&2; exit 1; }
done
python3 - "$OUT" <<'PY'
import csv, os, sys
out = sys.argv[1]
def evals(p):
    with open(os.path.join(out, p, "metrics.csv")) as f:
        return {int(r["step"]): float(r["eval_loss"]) for r in csv.DictReader(f) if r["eval_loss"]}
a, b = evals("f32"), evals("bf16")
print(f"{'step':>6} {'f32 val loss':>13} {'bf16 val loss':>14} {'bf16 - f32':>11} {'relative':>9}")
for s in sorted(set(a) & set(b)):
    d = b[s] - a[s]
    print(f"{s:>6} {a[s]:>13.5f} {b[s]:>14.5f} {d:>+11.5f} {d / a[s]:>+9.2%}")
print(f"results in {out}")
PY
