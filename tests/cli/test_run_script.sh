# scripts/run.sh, the README's main command, with stand-ins for scons and the built binary: it says
# what it does at each stage before the long ones start, builds with the short progress lines, and
# a second run with no arguments continues the default run instead of being refused.
. "$(dirname "$0")/lib.sh"

make_copy() {
    mkdir -p root/scripts root/build/release bin
    cp "$DG_ROOT/scripts/run.sh" "$DG_ROOT/scripts/setup.sh" root/scripts/
    printf '#!/bin/sh\necho "scons $*" >>"%s/scons.log"\n' "$PWD" >bin/scons
    printf '#!/bin/sh\necho "deltagrad $*"\n' >root/build/release/deltagrad
    chmod +x bin/scons root/build/release/deltagrad
}

stages_are_announced() {
    make_copy
    PATH="$PWD/bin:$PATH" bash root/scripts/run.sh >out 2>&1 || fail "run.sh failed: $(cat out)"
    cat out
    grep -q '^setup: dependencies present' out || fail "no line about the dependencies"
    grep -q '^setup: building' out || fail "no line before the build"
    grep -q '^setup: build done' out || fail "no line after the build"
    grep -q '^run: .*deltagrad train' out || fail "no line before the run"
    grep -q 'progress=1' scons.log || fail "the build does not show its progress: $(cat scons.log)"
    [ "$(tail -1 out)" = "deltagrad train" ] || fail "the default run was not started as train with no options"
}

second_run_continues() {
    make_copy
    mkdir -p runs/mqar-gdn && touch runs/mqar-gdn/model.safetensors
    PATH="$PWD/bin:$PATH" bash root/scripts/run.sh >out 2>&1 || fail "run.sh failed: $(cat out)"
    [ "$(tail -1 out)" = "deltagrad train --resume runs/mqar-gdn" ] || fail "second run: $(tail -1 out)"
    PATH="$PWD/bin:$PATH" bash root/scripts/run.sh --overwrite >out 2>&1 || fail "run.sh failed: $(cat out)"
    [ "$(tail -1 out)" = "deltagrad train --overwrite" ] || fail "options not passed on: $(tail -1 out)"
}

run_case stages_are_announced
run_case second_run_continues
finish
