# Helpers of the shell-level tests (tests/cli/test_*.sh), which `scons test` runs after the test
# programs with DG_BIN (the built deltagrad) and DG_BUILD_DIR in the environment.  A test file
# defines functions and calls `run_case NAME`; the output follows cmocka's line format so that the
# runner counts them with the rest.
set -u
: "${DG_BIN:?run through scons test, which sets DG_BIN, DG_BUILD_DIR and DG_ROOT}"
export DG_NO_REEXEC=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
TMP=$(mktemp -d "${TMPDIR:-/tmp}/dg-cli.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
_failures=0

# A tiny MQAR run: a few steps in well under a second.
TINY=(--layers 1 --hidden-size 32 --heads 2 --head-dim 16 --vocab-size 64 --seq-len 64 --kv-pairs 4
      --batch 4 --eval-examples 16 --threads 1 --device cpu)

# fail MESSAGE: ends the case (each runs in a subshell) as failed.  Every check in a case ends in
# `|| fail ...`: errexit does not apply inside a function run as part of a condition.
fail() {
    echo "  $*"
    exit 1
}

# run_case NAME: runs the function NAME in a subshell (its own working directory under $TMP).
run_case() {
    local name=$1
    echo "[ RUN      ] $name"
    mkdir -p "$TMP/$name"
    local rc=0
    (cd "$TMP/$name" && "$name") || rc=$?
    if [ $rc -eq 0 ]; then
        echo "[       OK ] $name"
    elif [ $rc -eq 77 ]; then
        echo "[  SKIPPED ] $name"
    else
        echo "[  FAILED  ] $name"
        _failures=$((_failures + 1))
    fi
}

# skip_case WHY: inside a case, skips it with a reason (exit status 77).
skip_case() {
    echo "  skipped: $*"
    exit 77
}

finish() {
    echo "[==========] done."
    [ "$_failures" -eq 0 ]
}
