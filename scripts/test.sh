#!/usr/bin/env bash
# The test suite: set up, build, run every test program (`scons test`).
#   scripts/test.sh              release build
#   scripts/test.sh sanitize=1   ASan + UBSan + LeakSanitizer build
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/setup.sh" "$@"
cd "$root"
scons -Q -j"$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 2)" "$@" test
