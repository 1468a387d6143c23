#!/usr/bin/env bash
# Runs a chunked-kernel CUDA test program on the CPU, the kernels executed by the host emulation
# (kernels/cuda/delta/dr_chunk_emu.h: every CUDA thread a fiber, barriers, warp collectives, ldmatrix
# and mma.sync emulated; shared memory and scratch filled with NaN before use, so a read of
# anything unwritten shows up).  For debugging kernels without a GPU; slow (minutes for the
# whole program): select tests by name with DG_TEST_FILTER.
#   scripts/emu_test.sh [test_cuda_dr_chunk | test_cuda_dr_chunk_kda] [scons options...]
#   DG_TEST_FILTER=test_dr_chunk_sanitize scripts/emu_test.sh
# scons builds it (the emulator block at the end of SConstruct: build/<variant>/emu/);
# `scons test-emu` builds and runs every such program.
set -euo pipefail
cd "$(dirname "$0")/.."
test=${1:-test_cuda_dr_chunk}
shift || true
[ -f "tests/$test.c" ] || { echo "emu_test: no tests/$test.c" >&2; exit 2; }
variant=release
for a in "$@"; do
  case $a in sanitize=1) variant=sanitize ;; debug=1) variant=debug ;; esac
done
scons -Q -j"$(nproc 2>/dev/null || echo 2)" "$@" "build/$variant/emu/tests/$test"
echo "emu_test: running build/$variant/emu/tests/$test${DG_TEST_FILTER:+ (DG_TEST_FILTER=$DG_TEST_FILTER)}"
exec "build/$variant/emu/tests/$test"
