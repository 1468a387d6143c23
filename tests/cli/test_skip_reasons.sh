# Every skipped test says why (tests/support/test_support.c: dg_test_skip), the reason printed just
# before cmocka's SKIPPED line, where `scons test` picks it up for its summary.
. "$(dirname "$0")/lib.sh"

skips_carry_reasons() {
    local out
    out=$("$DG_BUILD_DIR/tests/test_model_cuda" 2>&1) || fail "test_model_cuda failed"
    # each per-test SKIPPED line (before the summary) follows a "  skipped: why" line
    echo "$out" | awk '/^\[==========\].*run\./ {exit} /^\[  SKIPPED \]/ && prev !~ /^  skipped: ./ {bad=1; print "no reason before: " $0} {prev=$0} END {exit bad}' ||
        fail "a skip without a reason"
    # without a GPU, the GPU tests skip, and the reason names what is missing
    if ! nvidia-smi -L >/dev/null 2>&1; then
        echo "$out" | grep -q '^  skipped: needs .*\(GPU\|CUDA backend\)' || fail "no GPU, yet no skip says it needs one"
    fi
}

run_case skips_carry_reasons
finish
