#!/bin/bash
# Where one chunked kernel's warps wait, instruction by instruction (ncu source counters), on the
# GPU machine from the repository root:
#   bash bench/gpu_ncu_stalls.sh KERNEL [OP] [SHAPE]      e.g.  bash bench/gpu_ncu_stalls.sh f_state gated_delta_rule S1
#   (in this workplace: run(command="bash bench/gpu_ncu_stalls.sh b_qkwy delta_rule S1", carry=[".devkit"]))
# KERNEL: a regular expression on the kernel's name (f_prep, f_state, f_out, b_dhu_ws, b_qkwy, ...);
# the second launch that matches is profiled (the first is a warm-up of the benchmark).  Builds
# build/release/deltagrad with -lineinfo (same code, source lines attached), profiles one call of
# `deltagrad bench --device cuda OP --shapes SHAPE`, exports the source table and prints
# bench/ncu_stalls.py's summary.  Writes to $OUT (default /tmp/ncu_stalls): KERNEL.csv (feed it to
# bench/ncu_stalls.py again with --lines or --range), KERNEL.txt, the logs.  About a minute.
# The same commands, one by one, made docs/PERF_KERNELS.md's session 13 findings.
set -euo pipefail
[ $# -ge 1 ] || { sed -n 2,12p "$0"; exit 2; }
kernel=$1 op=${2:-gated_delta_rule} shape=${3:-S1}
[ -f .devkit/setup-on-device ] && source .devkit/setup-on-device >/dev/null 2>&1
OUT=${OUT:-/tmp/ncu_stalls}
mkdir -p "$OUT"
scons -Q -j"$(nproc)" cuda=1 cuda_arch="-gencode=arch=compute_90a,code=sm_90a -lineinfo" build/release/deltagrad \
    >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
ncu --clock-control none -k "regex:$kernel" --launch-skip 1 --launch-count 1 --section SourceCounters \
    --section WarpStateStats --section SpeedOfLight --import-source yes -f -o "$OUT/$kernel" \
    build/release/deltagrad bench --device cuda "$op" --shapes "$shape" --no-variants --no-recurrent --no-ceilings \
    --reps 1 >"$OUT/ncu_run.txt" 2>&1 || { tail -20 "$OUT/ncu_run.txt"; exit 1; }
ncu -i "$OUT/$kernel.ncu-rep" --page source --csv --print-source cuda,sass >"$OUT/$kernel.csv"
python3 bench/ncu_stalls.py "$OUT/$kernel.csv" --top 30 | tee "$OUT/$kernel.txt"
