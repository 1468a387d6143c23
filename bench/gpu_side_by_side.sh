#!/bin/bash
# The GPU benchmark in one command: `deltagrad bench --device cuda` (our kernels at S1/S2/S3 with
# every backward variant, the recurrent reference, the GEMM and copy ceilings), then
# bench/fla_side_by_side.py (FLA 0.5.2 and ours on the same inputs, one table).  docs/PERF.md shows
# the results and says how to read them.
#
#   FLA_GIT=PATH bash bench/gpu_side_by_side.sh prepare
#       on the build machine: builds build/release/deltagrad (scons cuda=1), copies it stripped with
#       this script and the Python one into .gpu-bench/ (git-ignored), and extracts FLA's fla/
#       folder at tag v0.5.2 into third_party_fla/ (git-ignored) from FLA_GIT, a clone or bare
#       mirror of https://github.com/fla-org/flash-linear-attention (needed only while
#       third_party_fla/ is missing; FLA_GIT=clone clones it from GitHub into a temporary folder).
#   bash .gpu-bench/gpu_side_by_side.sh            (on the GPU machine, from the repository root,
#                                                   with .gpu-bench/ and third_party_fla/ copied there)
#       Writes to $OUT (default: a new temporary folder, printed): bench_cuda.txt (versions first),
#       bench_cuda.json, side_by_side.txt, side_by_side.json, side_by_side.md, and
#       triton_cache.tgz.NN (Triton's compiled kernels and autotuning results in parts of 15 MiB;
#       copy them into .gpu-bench/ and the next run skips most of the autotuning: FLA's first run
#       autotunes for minutes).
# Environment: BENCH_T (seconds for our benchmark, 100), SBS_T (seconds for the side by side, 190;
# both keep the call under 5 minutes: with the Triton cache it needs about 3),
# SBS_ARGS (extra arguments of fla_side_by_side.py, e.g. "--shapes S1"), BENCH_ARGS (extra arguments
# of our benchmark, e.g. "--shapes S1,S2,S3,S4": S4, V = 2K, runs only when asked, in both),
# SKIP_BENCH=1 (only the side by side), ENV_SETUP (a shell file sourced first, e.g. one that puts
# nvcc, python3 and torch on the PATH), TRITON_CACHE_DIR (default: a new temporary folder).
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(pwd)

if [ "${1:-}" = prepare ]; then
    set -e
    scons -j2 cuda=1 build/release/deltagrad
    mkdir -p .gpu-bench
    strip -o .gpu-bench/deltagrad build/release/deltagrad
    cp bench/gpu_side_by_side.sh bench/fla_side_by_side.py bench/triton_cache.sh .gpu-bench/
    echo "$(git log -1 --format='%h %cd %s' --date=iso-strict | cut -c1-120)$(git diff --quiet HEAD -- . || echo ' (+ uncommitted changes)')" \
        > .gpu-bench/BUILD_INFO
    if [ ! -f third_party_fla/fla/__init__.py ]; then
        src=${FLA_GIT:-}
        if [ -z "$src" ]; then
            echo "error: third_party_fla/ is missing and FLA_GIT is not set: set FLA_GIT to a clone or bare" >&2
            echo "mirror of https://github.com/fla-org/flash-linear-attention, or FLA_GIT=clone to clone it" >&2
            exit 2
        elif [ "$src" = clone ]; then
            src=$(mktemp -d)/fla
            git clone --quiet --bare https://github.com/fla-org/flash-linear-attention "$src"
        elif [ ! -d "$src" ]; then
            echo "error: FLA_GIT=$src is not a folder (a clone or bare mirror of fla-org/flash-linear-attention)" >&2
            exit 2
        fi
        mkdir -p third_party_fla
        git --git-dir="$src" archive v0.5.2 fla | tar -x -C third_party_fla/
        echo "v0.5.2 $(git --git-dir="$src" rev-parse 'v0.5.2^{commit}')" > third_party_fla/VERSION
    fi
    echo "prepared: .gpu-bench/ ($(du -sh .gpu-bench | cut -f1)), third_party_fla/ ($(cat third_party_fla/VERSION 2>/dev/null))"
    exit 0
fi

if [ -n "${ENV_SETUP:-}" ]; then
    [ -f "$ENV_SETUP" ] || { echo "error: ENV_SETUP=$ENV_SETUP is not a file" >&2; exit 2; }
    source "$ENV_SETUP" >/dev/null 2>&1
fi
[ -d third_party_fla/fla ] || { echo "error: no third_party_fla/fla here: run 'bash bench/gpu_side_by_side.sh prepare' first" >&2; exit 2; }
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
echo "results in $OUT"
bin=.gpu-bench/deltagrad
[ -x "$bin" ] || bin=build/release/deltagrad
if [ ! -x "$bin" ]; then
    echo "no deltagrad binary: building it here (scons -j16 cuda=1, a minute or two)"
    timeout 300 scons -j16 cuda=1 build/release/deltagrad >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
fi
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$(mktemp -d)}
source "$here/triton_cache.sh"
triton_cache_restore triton_cache
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
    nvcc --version 2>/dev/null | tail -2
    python3 -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
    echo "FLA: $(cat third_party_fla/VERSION 2>/dev/null || echo '?')"
    echo "deltagrad binary: $(cat .gpu-bench/BUILD_INFO 2>/dev/null || echo "$bin (no BUILD_INFO)")"
} >"$OUT/bench_cuda.txt" 2>&1
cat "$OUT/bench_cuda.txt"

if [ -z "${SKIP_BENCH:-}" ]; then
    echo "== deltagrad bench --device cuda" | tee -a "$OUT/bench_cuda.txt"
    timeout "${BENCH_T:-100}" "$bin" bench --device cuda --json "$OUT/bench_cuda.json" ${BENCH_ARGS:-} 2>&1 | tee -a "$OUT/bench_cuda.txt"
fi

echo "== FLA side by side"
PYTHONUNBUFFERED=1 timeout "${SBS_T:-190}" python3 "$here/fla_side_by_side.py" --deltagrad "$bin" \
    --fla third_party_fla --out "$OUT" ${SBS_ARGS:-} 2>&1 | tee "$OUT/side_by_side.txt"

triton_cache_save triton_cache "$OUT"
ls -la "$OUT"
