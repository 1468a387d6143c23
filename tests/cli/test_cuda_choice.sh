# cuda=auto (site_scons/cuda_choice.py) compiles the CUDA backend only where nvcc AND a GPU are, and
# says so in one line; checked with stand-in nvcc and nvidia-smi programs on PATH.
. "$(dirname "$0")/lib.sh"

# choice OPTION SANITIZE NVCC: prints "want|line" with only $TMP/$CASE/bin on PATH
choice() {
    PATH="$PWD/bin:/usr/bin:/bin" PYTHONPATH="$DG_ROOT/site_scons" python3 -c '
import sys, cuda_choice
probe = lambda: cuda_choice.gpu_visible(device_node="/nonexistent/nvidia0")
want, line = cuda_choice.choose(sys.argv[1], sys.argv[2] == "1", sys.argv[3] or None, probe)
print("%s|%s" % (want, line))' "$@"
}

stub() { # stub NAME EXIT [OUTPUT]
    mkdir -p bin
    printf '#!/bin/sh\n%s\nexit %s\n' "${3:+echo \"$3\"}" "$2" >"bin/$1"
    chmod +x "bin/$1"
}

nvcc_without_gpu_builds_cpu_only() {
    stub nvidia-smi 9
    local r; r=$(choice auto 0 /opt/cuda/bin/nvcc)
    echo "$r"
    [ "${r%%|*}" = False ] || fail "compiled CUDA without a GPU"
    echo "$r" | grep -q 'no GPU is visible' || fail "the line does not say why"
}

nvcc_with_gpu_builds_cuda() {
    stub nvidia-smi 0 "GPU 0: NVIDIA H100 (UUID: GPU-0)"
    local r; r=$(choice auto 0 /opt/cuda/bin/nvcc)
    echo "$r"
    [ "${r%%|*}" = True ] || fail "a GPU and nvcc, yet no CUDA"
    echo "$r" | grep -q 'nvidia-smi -L lists GPU 0' || fail "the line does not say why"
}

no_nvcc_builds_cpu_only() {
    stub nvidia-smi 0 "GPU 0: NVIDIA H100 (UUID: GPU-0)"
    local r; r=$(choice auto 0 "")
    [ "${r%%|*}" = False ] && echo "$r" | grep -q 'nvcc was not found' || fail "$r"
}

forced_and_sanitizer() {
    stub nvidia-smi 9
    [ "$(choice 1 0 /opt/cuda/bin/nvcc | cut -d'|' -f1)" = True ] || fail "cuda=1 did not compile CUDA"
    stub nvidia-smi 0 "GPU 0: NVIDIA H100 (UUID: GPU-0)"
    [ "$(choice auto 1 /opt/cuda/bin/nvcc | cut -d'|' -f1)" = False ] || fail "the sanitizer build took CUDA"
    [ "$(choice 0 0 /opt/cuda/bin/nvcc | cut -d'|' -f1)" = False ] || fail "cuda=0 compiled CUDA"
}

run_case nvcc_without_gpu_builds_cpu_only
run_case nvcc_with_gpu_builds_cuda
run_case no_nvcc_builds_cpu_only
run_case forced_and_sanitizer
finish
