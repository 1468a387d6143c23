# `deltagrad train --gpus N`: the refusals any machine can check, and on two GPUs (skipped with fewer,
# or in a build without NCCL) the faults: a rank killed in the middle of the run stops the other one
# within the grace period with a message naming it, and the last checkpoint resumes; a Ctrl-C to the
# launcher stops both ranks after the same step with a checkpoint.
. "$(dirname "$0")/lib.sh"

cpu_device_is_refused() {
    local rc=0
    "$DG_BIN" train "${TINY[@]}" --steps 2 --gpus 2 --out run >log 2>&1 || rc=$?
    [ $rc -eq 2 ] || fail "exit status $rc, expected 2: $(cat log)"
    grep -q -- "--gpus 2 trains on GPUs; --device cpu cannot" log || fail "no message: $(cat log)"
    [ ! -e run/model.safetensors ] || fail "a refused run wrote a checkpoint"
}

absent_gpus_are_named() {
    local rc=0
    "$DG_BIN" train "${TINY[@]}" --device cuda --steps 2 --gpus 64 --out run >log 2>&1 || rc=$?
    [ $rc -eq 2 ] || fail "exit status $rc, expected 2: $(cat log)"
    # without NCCL the build says so; with it, the count of visible devices
    grep -q -e "--gpus 64: [0-9]* CUDA devices\? \(is\|are\) visible" -e "no NCCL" log || fail "no message: $(cat log)"
}

uneven_batch_is_refused() {
    command -v nvidia-smi >/dev/null && [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge 2 ] ||
        skip_case "needs 2 GPUs"
    ldd "$DG_BIN" | grep -q libnccl || skip_case "needs a CUDA build with NCCL"
    local rc=0
    "$DG_BIN" train "${TINY[@]}" --device cuda --batch 5 --steps 2 --gpus 2 --out run >log 2>&1 || rc=$?
    [ $rc -eq 2 ] || fail "exit status $rc, expected 2: $(cat log)"
    grep -q "does not split into 2 equal slices" log || fail "no message: $(cat log)"
}

worker_needs_a_rank() {
    local rc=0
    DG_WORLD=2 "$DG_BIN" train "${TINY[@]}" --steps 2 --out run >log 2>&1 || rc=$?
    [ $rc -eq 2 ] || fail "exit status $rc, expected 2: $(cat log)"
    grep -q "DG_WORLD=2 is set but DG_RANK is not" log || fail "no message: $(cat log)"
}

need_two_gpus() {
    command -v nvidia-smi >/dev/null && [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" -ge 2 ] ||
        skip_case "needs 2 GPUs"
    ldd "$DG_BIN" | grep -q libnccl || skip_case "needs a CUDA build with NCCL"
}

TINY_GPU=(--layers 1 --hidden-size 32 --heads 2 --head-dim 16 --vocab-size 64 --seq-len 64 --kv-pairs 4
          --batch 8 --eval-examples 16 --eval-every 0 --device cuda)

# start_two LOG: a long run on two GPUs in the background (its pid in $launcher), once it logged 6 steps
start_two() {
    "$DG_BIN" train "${TINY_GPU[@]}" --steps 1000000 --save-every 3 --gpus 2 --out run --log-every 1 >"$1" 2>&1 &
    launcher=$!
    local i
    for i in $(seq 1200); do # up to 120 s: the start of NCCL, then 6 steps
        [ "$(grep -c '^step ' "$1" 2>/dev/null)" -ge 6 ] && return 0
        kill -0 $launcher 2>/dev/null || break
        sleep 0.1
    done
    kill -9 $launcher 2>/dev/null
    fail "the 2-GPU run did not log 6 steps: $(tail -5 "$1")"
}

# rank_pid R: the pid of rank R among the launcher's children
rank_pid() {
    local c
    for c in $(pgrep -P $launcher); do
        tr '\0' '\n' <"/proc/$c/environ" 2>/dev/null | grep -qx "DG_RANK=$1" && echo "$c" && return 0
    done
    return 1
}

last_step() { ls run/optimizer-*.safetensors | tail -1 | sed 's/.*optimizer-0*\([0-9]*\)\.safetensors/\1/'; }

killed_rank_stops_the_run() {
    need_two_gpus
    start_two log
    local victim rc=0 t0
    victim=$(rank_pid 1) || fail "no rank 1 among the launcher's children"
    kill -9 "$victim"
    t0=$SECONDS
    wait $launcher || rc=$?
    [ $rc -eq 1 ] || fail "exit status $rc after rank 1 was killed, expected 1"
    [ $((SECONDS - t0)) -le 30 ] || fail "the launcher took $((SECONDS - t0)) s to stop"
    grep -q "rank 1 (GPU 1, pid $victim) was killed by signal 9" log || fail "no message naming rank 1: $(tail -3 log)"
    local step
    step=$(last_step)
    [ -n "$step" ] || fail "no checkpoint"
    "$DG_BIN" train --resume run --steps $((step + 2)) --gpus 2 >resume.log 2>&1 ||
        fail "resume failed: $(tail -5 resume.log)"
    grep -q "finished $((step + 2)) steps" resume.log || fail "the resumed run did not finish: $(tail -3 resume.log)"
}

sigint_stops_both_ranks_together() {
    need_two_gpus
    start_two log
    local rc=0
    kill -INT $launcher
    wait $launcher || rc=$?
    [ $rc -eq 130 ] || fail "exit status $rc after SIGINT, expected 130: $(tail -3 log)"
    grep -q "interrupted by SIGINT" log || fail "no message naming SIGINT: $(tail -3 log)"
    local step
    step=$(last_step)
    grep -q "interrupted by SIGINT at step $step," log || fail "the checkpoint (step $step) is not the last step"
}

run_case cpu_device_is_refused
run_case absent_gpus_are_named
run_case uneven_batch_is_refused
run_case worker_needs_a_rank
run_case killed_rank_stops_the_run
run_case sigint_stops_both_ranks_together
finish
