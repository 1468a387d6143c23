#!/bin/bash
# Training throughput, deltagrad against PyTorch + flash-linear-attention, in one command on the
# GPU machine (docs/PERF.md, "Training side by side"):
#
#   bash bench/train_side_by_side.sh [OUTDIR] [OPTIONS of bench/train_side_by_side.py]
#
# from the repository root, after building build/release/deltagrad (scons cuda=1).  OUTDIR (default:
# $OUT when set, else a new folder in /tmp) gets train_side_by_side.{md,csv,json} and logs/.
# Options, e.g.: --configs a,b,c  --steps 30  --precision bf16|f32  --skip-fla  --timeout SECONDS
# (python3 bench/train_side_by_side.py --help lists them all).
# Triton's compiled kernels and autotuning results are kept in .triton-cache/ (git-ignored) unless
# TRITON_CACHE_DIR is set: FLA autotunes its kernels on first use, minutes per configuration, and
# the next call on the same machine reuses them. For a fresh machine the cache travels in parts
# (bench/triton_cache.sh): restored from .gpu-bench/train_triton_cache.tgz.* when there, and
# written to OUTDIR/train_triton_cache.tgz.* when the run compiled new kernels.  ENV_SETUP: a shell file sourced first (e.g. one
# that puts python3 with torch on the PATH).
set -eu
root=$(pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -n "${ENV_SETUP:-}" ]; then
    [ -f "$ENV_SETUP" ] || { echo "error: ENV_SETUP=$ENV_SETUP is not a file" >&2; exit 2; }
    source "$ENV_SETUP" >/dev/null 2>&1
fi
out=${OUT:-}
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
    out=$1
    shift
fi
command -v python3 >/dev/null || { echo "error: no python3 on the PATH" >&2; exit 2; }
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$root/.triton-cache}
source "$here/triton_cache.sh"
triton_cache_restore train_triton_cache
out=${out:-$(mktemp -d /tmp/train_side_by_side_XXXXXX)}
# the Python script in the background so that the cache is saved after it; a signal sent to this
# command is passed on to it, and it ends its runs
set +e
python3 "$here/train_side_by_side.py" --out "$out" "$@" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null' TERM INT HUP
wait $pid
rc=$?
[ $rc -gt 128 ] && kill -0 $pid 2>/dev/null && { wait $pid; rc=$?; } # a trapped signal ended the first wait
triton_cache_save train_triton_cache "$out"
exit $rc
