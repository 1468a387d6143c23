#!/usr/bin/env bash
# Data-parallel scaling of `deltagrad train --gpus N` (docs/MULTI_GPU.md): the same text model on 1 GPU
# at its per-GPU batch and on N GPUs at N times that batch (the same work a GPU), training tokens a
# second over the steps after the first WARM, and the efficiency tokens_N / (N * tokens_1); then N
# independent 1-GPU runs at once, whose summed rate against N lone runs is the ceiling the machine
# sets (power, clocks, shared host) with no communication at all.
#
#   bench/multi_gpu_scaling.sh [N [MODEL [STEPS]]]
#     N      GPUs (default: every visible one)
#     MODEL  56m  (hidden 1024, 4 layers, 8 heads of 128, batch 8 x 2048 a GPU; the default)
#            400m (hidden 2048, 12 layers, 16 heads of 128, batch 4 x 4096 a GPU: 669M parameters)
#            both with FLA's MLP rule (hidden ratio 4), the models of bench/train_side_by_side.sh
#     STEPS  steps a run (default 30; the first WARM=5 are not timed)
# Environment: DG_BIN (default build/release/deltagrad), OUT (default a temporary directory), EXTRA
# (more options for both runs, e.g. EXTRA=--bf16-all-reduce), CEILING=0 (leave out the N independent
# runs).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${DG_BIN:-build/release/deltagrad}
N=${1:-$(nvidia-smi -L | grep -c '^GPU')}
MODEL=${2:-56m}
STEPS=${3:-30}
WARM=5
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/dg-scaling.XXXXXX")}
mkdir -p "$OUT"
case "$MODEL" in
56m) ARCH=(--hidden-size 1024 --layers 4 --heads 8 --head-dim 128 --expand-v 1 --hidden-ratio 4 --intermediate-size 0)
    PER=8; T=2048 ;;
400m) ARCH=(--hidden-size 2048 --layers 12 --heads 16 --head-dim 128 --expand-v 1 --hidden-ratio 4 --intermediate-size 0)
    PER=4; T=4096 ;;
*) echo "MODEL is 56m or 400m, not $MODEL" >&2; exit 2 ;;
esac
# a deterministic ~32 MB byte file (the numbers 1, 2, ... one a line): throughput does not depend on the text
DATA="$OUT/data.txt"
[ -s "$DATA" ] || { seq 1 5000000 || true; } | head -c 32000000 >"$DATA" # seq stops early when head has enough

# run GPUS NAME: trains on GPUS GPUs (in $OUT/NAME) and prints its training tokens a second after the warm-up steps
run() {
    local g=$1 dir="$OUT/$2"
    "$BIN" train --task text --data "$DATA" --device cuda "${ARCH[@]}" --seq-len $T --batch $((PER * g)) \
        --steps "$STEPS" --eval-every 0 --eval-batches 1 --save-every 0 --gpus "$g" --out "$dir" --overwrite \
        --quiet ${EXTRA:-} >"$dir.log" 2>&1 || { echo "the run $2 failed:" >&2; tail -5 "$dir.log" >&2; exit 1; }
    # elapsed_s of the rows after the warm-up: tokens / seconds between the first and the last of them
    awk -F, -v warm=$WARM -v tok=$((PER * g * T)) '
        NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
        $col["step"] == warm { t0 = $col["elapsed_s"]; s0 = $col["step"] }
        { t1 = $col["elapsed_s"]; s1 = $col["step"] }
        END { if (t1 <= t0) exit 1; printf "%.0f\n", (s1 - s0) * tok / (t1 - t0) }' "$dir/metrics.csv"
}

echo "model $MODEL: ${ARCH[*]} ${EXTRA:-}, batch $PER x $T a GPU, $STEPS steps (the first $WARM not timed); output in $OUT"
one=$(run 1 run-1gpu)
echo "1 GPU:  $one tokens/s"
if [ "$N" -gt 1 ]; then
    many=$(run "$N" "run-${N}gpu")
    eff=$(awk -v a="$many" -v b="$one" -v n="$N" 'BEGIN { printf "%.1f", 100 * a / (n * b) }')
    echo "$N GPUs: $many tokens/s, scaling efficiency $eff% (target: >= 90% for 56m on 4 GPUs, >= 95% for 400m)"
    [ "${CEILING:-1}" = 0 ] && exit 0
    # the ceiling that the machine itself sets: N independent 1-GPU runs at once (no communication),
    # each on its own GPU; their summed rate against N lone runs
    for ((i = 0; i < N; i++)); do
        (CUDA_VISIBLE_DEVICES=$i run 1 "alone-$i" >"$OUT/alone-$i.rate") &
    done
    wait
    for ((i = 0; i < N; i++)); do
        [ -s "$OUT/alone-$i.rate" ] || { echo "the independent run on GPU $i failed ($OUT/alone-$i.log)" >&2; exit 1; }
    done
    sum=$(cat "$OUT"/alone-*.rate | awk '{ s += $1 } END { printf "%.0f", s }')
    ceil=$(awk -v a="$sum" -v b="$one" -v n="$N" 'BEGIN { printf "%.1f", 100 * a / (n * b) }')
    echo "$N independent 1-GPU runs at once: $sum tokens/s together, $ceil% of $N lone runs (the ceiling)"
fi
