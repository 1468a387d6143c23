#!/usr/bin/env bash
# Runs a chunked-kernel CUDA test program on the CPU, the kernels executed by the host emulation
# (kernels/cuda/delta/dr_chunk_emu.h: every CUDA thread a fiber, barriers, warp collectives, ldmatrix
# and mma.sync emulated; shared memory and scratch filled with NaN before use, so a read of
# anything unwritten shows up).  For debugging kernels without a GPU; slow (minutes for the
# whole program): select tests by name with DG_TEST_FILTER.
#   scripts/emu_test.sh [test_cuda_dr_chunk | test_cuda_dr_chunk_kda]
#   DG_TEST_FILTER=test_dr_chunk_sanitize scripts/emu_test.sh
# Builds the CPU library (scons debug=1 cuda=0: build/debug) for the reference kernels, the .cu
# files with g++ -DDRC_EMU into build/emu (again when a kernel source is newer than its object),
# the test with DG_HAVE_CUDA, and tests/emu/cuda_runtime_host.c for the runtime calls it makes;
# links the CPU library's objects (not the archive: core/dtype.c is compiled again for it).
set -euo pipefail
cd "$(dirname "$0")/.."
test=${1:-test_cuda_dr_chunk}
[ -f "tests/$test.c" ] || { echo "emu_test: no tests/$test.c" >&2; exit 2; }
jobs=$(nproc 2>/dev/null || echo 2)
scons -Q -j"$jobs" debug=1 cuda=0 build/debug/libdeltagrad.a >/dev/null
out=build/emu
mkdir -p "$out"
cu=(dr_chunk dr_chunk_generic dr_chunk_mma_fwd dr_chunk_mma_bwd dr_chunk_mma_fwd_f16 dr_chunk_mma_bwd_f16
    dr_chunk_kda_mma_fwd dr_chunk_kda_mma_bwd dr_chunk_vsplit dr_chunk_heads)
flags=(-std=c++17 -O2 -g -DDRC_EMU -DDG_HAVE_CUDA -I. -Iinclude -w)
newest_header=$(ls -t kernels/cuda/delta/*.cuh kernels/cuda/delta/*.h kernels/cuda/*.h core/*.h | head -1)
objs=()
pids=()
for f in "${cu[@]}"; do
  o=$out/$f.o
  objs+=("$o")
  if [ ! -f "$o" ] || [ "kernels/cuda/delta/$f.cu" -nt "$o" ] || [ "$newest_header" -nt "$o" ] ||
     { [[ $f == *_f16 ]] && [ "kernels/cuda/delta/${f%_f16}.cu" -nt "$o" ]; }; then
    echo "emu_test: g++ kernels/cuda/$f.cu"
    g++ -x c++ "${flags[@]}" -c "kernels/cuda/delta/$f.cu" -o "$o" &
    pids+=($!)
    if [ ${#pids[@]} -ge "$jobs" ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
  fi
done
for p in "${pids[@]}"; do wait "$p"; done
cflags=(-std=c11 -O1 -g -D_GNU_SOURCE -DDG_HAVE_CUDA -I. -Iinclude $(pkg-config --cflags openblas))
gcc "${cflags[@]}" -c "tests/$test.c" -o "$out/$test.o"
gcc "${cflags[@]}" -c tests/support/test_support.c -o "$out/test_support.o"
gcc "${cflags[@]}" -c tests/emu/cuda_runtime_host.c -o "$out/cuda_runtime_host.o"
# the CPU library's objects, with core/dtype.c again under DG_HAVE_CUDA (dg_cuda_available asks
# the emulated runtime, which reports one device)
gcc "${cflags[@]}" -c core/dtype.c -o "$out/dtype.o"
lib=$(find build/debug/core build/debug/autograd build/debug/ops build/debug/kernels build/debug/models \
      -name '*.o' ! -path build/debug/core/dtype.o | sort)
g++ -o "$out/$test" "$out/$test.o" "$out/test_support.o" "$out/cuda_runtime_host.o" "$out/dtype.o" "${objs[@]}" \
    $lib $(pkg-config --libs openblas jemalloc cmocka) -fopenmp -pthread -lm
echo "emu_test: running $out/$test${DG_TEST_FILTER:+ (DG_TEST_FILTER=$DG_TEST_FILTER)}"
exec "$out/$test"
