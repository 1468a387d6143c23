# SIGTERM (schedulers, docker stop) and SIGINT (Ctrl-C) end training with a checkpoint and exit
# 128 + the signal (143, 130), as a shell reports a killed command; the run resumes from it, removing
# a killed writer's temporary files and reporting a metrics log cut short.
. "$(dirname "$0")/lib.sh"

# stop_with SIGNAL STATUS: a long tiny run, stopped by SIGNAL once it has made a few steps
stop_with() {
    "$DG_BIN" train "${TINY[@]}" --steps 1000000 --eval-every 0 --save-every 0 --out run --log-every 1 \
        >log 2>&1 &
    local pid=$! i rc=0
    for i in $(seq 600); do # up to 60 s for 3 logged steps
        [ "$(grep -c '^step ' log 2>/dev/null)" -ge 3 ] && break
        sleep 0.1
    done
    kill -"$1" $pid
    wait $pid || rc=$?
    cat log | tail -3
    [ $rc -eq "$2" ] || fail "exit status $rc after SIG$1, expected $2"
    [ -f run/model.safetensors ] || fail "no checkpoint after SIG$1"
    grep -q "interrupted by SIG$1" log || fail "no message naming SIG$1"
    ls run/optimizer-*.safetensors >/dev/null || fail "no optimizer state after SIG$1"
    local step
    step=$(ls run/optimizer-*.safetensors | sed 's/.*optimizer-0*\([0-9]*\)\.safetensors/\1/')
    # what a kill in the middle of a checkpoint leaves (a dead writer's temporary file), and a log
    # cut short after its second row: the resume removes the one and reports the other
    local dead; dead=$(sh -c 'echo $$')
    touch "run/.model.safetensors.tmp-$dead-0"
    head -3 run/metrics.csv >m && mv m run/metrics.csv
    "$DG_BIN" train --resume run --steps $((step + 2)) >resume.log 2>&1 || fail "resume failed: $(cat resume.log)"
    grep -q "finished $((step + 2)) steps" resume.log || fail "the resumed run did not finish: $(cat resume.log)"
    [ ! -e "run/.model.safetensors.tmp-$dead-0" ] || fail "the killed writer's temporary file is still there"
    grep -q "removed 1 temporary file" resume.log || fail "no line about the removed temporary file"
    grep -q "has no rows for $((step - 2)) of the $step steps" resume.log || fail "the gap in metrics.csv went unreported"
}

sigterm_checkpoints_and_exits_143() { stop_with TERM 143; }
sigint_checkpoints_and_exits_130() { stop_with INT 130; }

run_case sigterm_checkpoints_and_exits_143
run_case sigint_checkpoints_and_exits_130
finish
