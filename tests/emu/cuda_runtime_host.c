/* The few CUDA runtime entry points (core/internal.h) that the chunked-kernel test programs call
 * directly, on host memory, for their build against the host emulation of the kernels
 * (kernels/cuda/dr_chunk_emu.h; scripts/emu_test.sh builds and runs it).  "Device" memory is host
 * memory there: the emulated kernels read and write it directly, so a copy is a memcpy whatever
 * its direction, and the emulator reports one device.  Never part of the library build. */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

int dg_cuda_device_count(void) { return 1; }

void *dg_cuda_malloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) dg_error("emu: out of host memory (%zu bytes)", n);
    return p;
}

void dg_cuda_free(void *p) { free(p); }

int dg_cuda_memcpy(void *dst, const void *src, size_t n, int kind) {
    (void)kind; /* 0 h2d, 1 d2h, 2 d2d: all host memory here */
    if (n) memcpy(dst, src, n);
    return 0;
}

int dg_cuda_synchronize(void) { return 0; } /* launches run to completion in the calling thread */
