"""Whether the build compiles the CUDA backend (SConstruct's cuda=auto|0|1).

cuda=auto compiles it only where it can run: nvcc is installed AND a GPU is visible (`nvidia-smi -L`
succeeds, or /dev/nvidia0 exists).  On a machine with nvcc and no GPU (CI runners, many laptops)
the CUDA kernels would take minutes to compile and the binary would load cuBLAS and cudart at
start, for a backend that cannot be used there.  CI passes cuda=1 where nvcc exists, so the CUDA
code is still compiled on every change.  The sanitizer build leaves CUDA out under auto: ASan's
shadow memory and the CUDA driver do not mix (the driver maps memory where ASan reserves its
shadow gap)."""
import os
import shutil
import subprocess


def find_nvcc():
    """Path of nvcc (PATH, then /usr/local/cuda/bin), or None."""
    found = shutil.which('nvcc')
    if found:
        return found
    default = '/usr/local/cuda/bin/nvcc'
    return default if os.access(default, os.X_OK) else None


def gpu_visible(device_node='/dev/nvidia0'):
    """(True/False, how it was decided)."""
    try:
        r = subprocess.run(['nvidia-smi', '-L'], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=30)
        if r.returncode == 0 and r.stdout.strip():
            return True, 'nvidia-smi -L lists %s' % r.stdout.decode('utf-8', 'replace').splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    if os.path.exists(device_node):
        return True, '%s exists' % device_node
    return False, 'no GPU is visible (nvidia-smi -L fails, no %s)' % device_node


def choose(option, sanitize, nvcc, gpu_probe=gpu_visible):
    """(compile CUDA?, one line saying what was chosen and why)."""
    if option == '1':
        return True, 'cuda=1: compiling the CUDA backend (%s)' % nvcc
    if option == '0':
        return False, 'cuda=0: CPU only'
    if sanitize:
        return False, 'cuda=auto: CPU only, as the sanitizer build always is (cuda=1 to force)'
    if not nvcc:
        return False, 'cuda=auto: CPU only: nvcc was not found'
    gpu, how = gpu_probe()
    if not gpu:
        return False, ('cuda=auto: CPU only: nvcc is here but %s; cuda=1 compiles the CUDA backend anyway'
                       % how)
    return True, 'cuda=auto: compiling the CUDA backend: nvcc at %s and %s' % (nvcc, how)
