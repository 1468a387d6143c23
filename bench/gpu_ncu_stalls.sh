#!/bin/bash
# Where one chunked kernel's warps wait, instruction by instruction (ncu source counters), on the
# GPU machine from the repository root:
#   bash bench/gpu_ncu_stalls.sh KERNEL [OP] [SHAPE]      e.g.  bash bench/gpu_ncu_stalls.sh f_state gated_delta_rule S1
# KERNEL: a regular expression on the kernel's name (f_prep, f_state, f_out, b_dhu_ws, b_qkwy, ...);
# the second launch that matches is profiled (the first is a warm-up of the benchmark).  Builds
# build/release/deltagrad with -lineinfo (same code, source lines attached), profiles one call of
# `deltagrad bench --device cuda OP --shapes SHAPE`, exports the source table and prints
# bench/ncu_stalls.py's summary.  Writes to $OUT (default: a new temporary folder, printed):
# KERNEL.csv (feed it to bench/ncu_stalls.py again with --lines or --range), KERNEL.txt, the logs.
# About a minute.  ENV_SETUP: a shell file sourced first (e.g. one that puts nvcc and ncu on the PATH).
# docs/PERF.md, "Per kernel: ncu", says how to read the summary.
set -euo pipefail
[ $# -ge 1 ] || { sed -n 2,12p "$0"; exit 2; }
kernel=$1 op=${2:-gated_delta_rule} shape=${3:-S1}
if [ -n "${ENV_SETUP:-}" ]; then
    [ -f "$ENV_SETUP" ] || { echo "error: ENV_SETUP=$ENV_SETUP is not a file" >&2; exit 2; }
    source "$ENV_SETUP" >/dev/null 2>&1
fi
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
echo "results in $OUT"
scons -Q -j"$(nproc)" cuda=1 cuda_arch="-gencode=arch=compute_90a,code=sm_90a -lineinfo" build/release/deltagrad \
    >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
ncu --clock-control none -k "regex:$kernel" --launch-skip 1 --launch-count 1 --section SourceCounters \
    --section WarpStateStats --section SpeedOfLight --import-source yes -f -o "$OUT/$kernel" \
    build/release/deltagrad bench --device cuda "$op" --shapes "$shape" --no-variants --no-recurrent --no-ceilings \
    --reps 1 >"$OUT/ncu_run.txt" 2>&1 || { tail -20 "$OUT/ncu_run.txt"; exit 1; }
ncu -i "$OUT/$kernel.ncu-rep" --page source --csv --print-source cuda,sass >"$OUT/$kernel.csv"
python3 bench/ncu_stalls.py "$OUT/$kernel.csv" --top 30 | tee "$OUT/$kernel.txt"
