# What train and eval say when something is off: no silent success, no hang, no misleading message.
. "$(dirname "$0")/lib.sh"

eval_unknown_option() {
    local rc=0
    "$DG_BIN" eval --bogus >out 2>&1 || rc=$?
    cat out
    [ $rc -eq 2 ] || fail "exit status $rc"
    grep -q "unknown option '--bogus'" out || fail "the message does not say unknown option"
}

diverging_run_fails() {
    local rc=0
    "$DG_BIN" train "${TINY[@]}" --steps 200 --eval-every 0 --lr 1e30 --warmup 0 --quiet --out run >out 2>&1 || rc=$?
    tail -2 out
    [ $rc -eq 1 ] || fail "exit status $rc after a diverging run"
    grep -q "diverged" out || fail "no message saying the run diverged"
}

# the first tensor's bytes of a checkpoint set to NaN, with the data CRC fixed up so that the file is
# well formed: the NaN is a diverged run's, not a corrupted file's
poison_checkpoint() {
    python3 - "$1" <<'PY'
import json, struct, sys, zlib
path = sys.argv[1]
b = bytearray(open(path, 'rb').read())
n = struct.unpack('<Q', b[:8])[0]
hdr = json.loads(b[8:8 + n])
data = 8 + n
name = sorted(k for k in hdr if k != '__metadata__')[0]
lo, hi = hdr[name]['data_offsets']
b[data + lo:data + lo + 4] = struct.pack('<f', float('nan'))
old = hdr['__metadata__']['deltagrad.data_crc32']
new = '%08x' % (zlib.crc32(bytes(b[data:])) & 0xffffffff)
text = bytes(b[8:8 + n]).replace(('"%s"' % old).encode(), ('"%s"' % new).encode())
assert len(text) == n
b[8:8 + n] = text
open(path, 'wb').write(bytes(b))
PY
}

nan_weights_refused() {
    "$DG_BIN" train "${TINY[@]}" --steps 2 --quiet --out run >/dev/null 2>&1 || fail "the tiny run failed"
    poison_checkpoint run/model.safetensors || fail "could not write the NaN checkpoint"
    local rc=0
    "$DG_BIN" eval --ckpt run >out 2>&1 || rc=$?
    cat out
    [ $rc -ne 0 ] || fail "eval of NaN weights exited 0"
    grep -q "NaN or infinite" out || fail "the message does not name the NaN"
    rc=0
    "$DG_BIN" train --resume run --steps 4 >out 2>&1 || rc=$?
    [ $rc -ne 0 ] && grep -q "NaN or infinite" out || fail "resuming NaN weights: status $rc, $(cat out)"
}

quiet_keeps_the_result_line() {
    "$DG_BIN" train "${TINY[@]}" --steps 3 --quiet --out run >out 2>&1 || fail "$(cat out)"
    cat out
    grep -q "^finished 3 steps" out || fail "--quiet hid the result line"
    ! grep -q "^step " out || fail "--quiet printed progress"
}

rerun_refused_then_overwrite() {
    "$DG_BIN" train "${TINY[@]}" --steps 3 --quiet --out run >/dev/null 2>&1 || fail "first run failed"
    local rc=0
    "$DG_BIN" train "${TINY[@]}" --steps 3 --quiet --out run >out 2>&1 || rc=$?
    cat out
    [ $rc -eq 2 ] || fail "a second run into the same directory: exit status $rc"
    grep -q -- "--resume run" out && grep -q -- "--overwrite" out || fail "the message does not give both ways"
    touch run/notes.txt run/optimizer-00000999.safetensors
    "$DG_BIN" train "${TINY[@]}" --steps 2 --quiet --overwrite --out run >out 2>&1 || fail "--overwrite: $(cat out)"
    grep -q "^finished 2 steps" out || fail "--overwrite did not start over: $(cat out)"
    [ -f run/notes.txt ] || fail "--overwrite removed a file that is not the run's"
    [ ! -f run/optimizer-00000999.safetensors ] || fail "--overwrite left the old run's optimizer state"
    rc=0
    "$DG_BIN" train --resume run --overwrite >out 2>&1 || rc=$?
    [ $rc -eq 2 ] || fail "--resume with --overwrite accepted"
}

eval_of_a_fifo_does_not_hang() {
    mkfifo pipe
    local rc=0
    timeout 20 "$DG_BIN" eval --ckpt pipe >out 2>&1 || rc=$?
    cat out
    [ $rc -ne 124 ] || fail "eval --ckpt FIFO hung"
    [ $rc -eq 1 ] && grep -q "FIFO" out || fail "exit status $rc, no message naming the FIFO"
}

run_too_big_is_refused() {
    local rc=0
    timeout 60 "$DG_BIN" train --device cpu --batch 1000000000 --out run >out 2>&1 || rc=$?
    cat out
    [ $rc -eq 1 ] && grep -q "lower --batch or --seq-len" out || fail "exit status $rc"
    rc=0
    timeout 60 "$DG_BIN" train --device cpu --seq-len 1000000000 --out run >out 2>&1 || rc=$?
    [ $rc -eq 1 ] && grep -q "this run needs about" out || fail "--seq-len: exit status $rc, $(cat out)"
}

# on a GPU the floor of a step's activations (every layer's input) is checked against the free
# memory beside the training state (models/trainer.c); skipped without a GPU or a CUDA build
gpu_run_too_big_is_refused() {
    local rc=0
    timeout 60 "$DG_BIN" train --device cuda --batch 1000000000 --out run >out 2>&1 || rc=$?
    cat out
    grep -q -e "no CUDA backend" -e "no CUDA device was found" out && skip_case "needs a GPU and a CUDA build"
    [ $rc -eq 1 ] && grep -q "keeps at least .* of activations on the GPU" out &&
        grep -q "lower --batch or --seq-len" out || fail "exit status $rc"
    [ ! -e run/model.safetensors ] || fail "a refused run wrote a checkpoint"
}

# DG_PROFILE=ops: a table of the ops' time from the third step on, printed even when quiet
profile_ops_prints_a_table() {
    DG_PROFILE=ops "$DG_BIN" train "${TINY[@]}" --steps 4 --eval-every 0 --quiet --out run >out 2>&1 || fail "$(cat out)"
    cat out
    grep -q "^op profile, per step over 2 steps" out || fail "no op profile over the last 2 steps"
    grep -Eq "^  gated_delta_rule +backward" out || fail "no row for the delta rule's backward"
}

# --keep-delta-work trades memory for time; the losses are the same bits
keep_delta_work_same_losses() {
    "$DG_BIN" train "${TINY[@]}" --steps 3 --quiet --out a >/dev/null 2>&1 || fail "the plain run failed"
    "$DG_BIN" train "${TINY[@]}" --steps 3 --quiet --keep-delta-work --out b >/dev/null 2>&1 || fail "the keeping run failed"
    cut -d, -f3 a/metrics.csv >la && cut -d, -f3 b/metrics.csv >lb || fail "no metrics"
    cmp -s la lb || fail "the losses differ: $(paste la lb | tr '\n' ' ')"
}

# --no-graph runs the step eagerly: on a GPU the same kernels as the captured graph, so the same
# bits; on the CPU (no graph there) it is accepted and changes nothing
no_graph_same_losses() {
    "$DG_BIN" train "${TINY[@]}" --steps 3 --quiet --out a >/dev/null 2>&1 || fail "the default run failed"
    "$DG_BIN" train "${TINY[@]}" --steps 3 --quiet --no-graph --out b >/dev/null 2>&1 || fail "the --no-graph run failed"
    cut -d, -f3 a/metrics.csv >la && cut -d, -f3 b/metrics.csv >lb || fail "no metrics"
    cmp -s la lb || fail "the losses differ: $(paste la lb | tr '\n' ' ')"
}

run_case eval_unknown_option
run_case run_too_big_is_refused
run_case gpu_run_too_big_is_refused
run_case diverging_run_fails
run_case nan_weights_refused
run_case quiet_keeps_the_result_line
run_case rerun_refused_then_overwrite
run_case eval_of_a_fifo_does_not_hang
run_case profile_ops_prints_a_table
run_case keep_delta_work_same_losses
run_case no_graph_same_losses
finish
