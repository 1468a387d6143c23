#!/usr/bin/env bash
# Builds the libFuzzer targets (scons fuzz) and runs each for SECONDS (default 30) from the seed
# corpus in fuzz/corpus/TARGET.  New inputs go to build/fuzz/corpus/TARGET (the seeds in the repository
# stay as they are); a crash, leak or sanitizer report stops the run, leaves the input that caused it
# in build/fuzz/findings/ and exits non-zero.  Installs clang, libFuzzer and libomp on Debian if
# they are missing (as scripts/setup.sh does).  docs/FUZZING.md describes the targets and the results.
#   fuzz/run.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}
shift || true
say() { echo "fuzz: $*" >&2; }
have_fuzzer() {
  command -v clang >/dev/null 2>&1 || return 1
  local rt; rt=$(clang -print-file-name=libclang_rt.fuzzer-x86_64.a)
  [ -f "$rt" ] && echo 'int main(void){return 0;}' | clang -fopenmp -x c - -o /dev/null 2>/dev/null
}
if ! have_fuzzer; then
  say "installing clang, libFuzzer and libomp with apt-get"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends clang libclang-rt-14-dev libomp-14-dev >/dev/null
fi
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 2)
say "building the targets (scons fuzz: the library again, with clang and the sanitizers)"
scons -Q -j"$jobs" progress=1 fuzz
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in fuzz/fuzz_*.c; do targets+=("$(basename "$f" .c)"); done
fi
mkdir -p build/fuzz/findings
for t in "${targets[@]}"; do
  name=${t#fuzz_}
  work=build/fuzz/corpus/$name
  mkdir -p "$work"
  say "$t: ${secs} s from fuzz/corpus/$name"
  rc=0
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
    "build/fuzz/$t" "$work" "fuzz/corpus/$name" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
      -max_len=65536 -print_final_stats=1 -artifact_prefix="build/fuzz/findings/$t-" >"build/fuzz/$t.log" 2>&1 ||
    rc=$?
  tail -15 "build/fuzz/$t.log"
  [ $rc -eq 0 ] || { say "$t: FAILED, exit status $rc (log build/fuzz/$t.log, input in build/fuzz/findings/)"; exit 1; }
done
say "no crash, leak or sanitizer report"
