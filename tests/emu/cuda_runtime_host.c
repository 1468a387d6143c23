/* The few CUDA runtime entry points (core/internal.h) that the chunked-kernel test programs call
 * directly, on host memory, for their build against the host emulation of the kernels
 * (kernels/cuda/delta/dr_chunk_emu.h; `scons test-emu` builds and runs them).  "Device" memory is host
 * memory there: the emulated kernels read and write it directly, so a copy is a memcpy whatever
 * its direction, and the emulator reports one device.  Never part of the library build. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/internal.h"
#include "kernels/cuda/cuda_kernels.h"

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

int dg_cuda_mem_info(size_t *free_bytes, size_t *total_bytes) { /* host memory: nothing to report */
    (void)free_bytes;
    (void)total_bytes;
    dg_error("emu: the emulated device has no memory of its own to report");
    return -1;
}

/* the per-kernel timer (kernel_timer.cu on the GPU): wall-clock time of each emulated launch */
enum { EMU_KT_MAX = 512 }; /* as kernels/cuda/kernel_timer.cu's KT_MAX */
static struct {
    bool on;
    int n, dropped;
    double t[2 * EMU_KT_MAX];
    const char *name[EMU_KT_MAX];
} emu_kt;

bool dg_cuda_ktime_on(void) { return emu_kt.on; }
int dg_cuda_ktime_begin(void) {
    emu_kt.on = true, emu_kt.n = emu_kt.dropped = 0;
    return 0;
}
void dg_cuda_ktime_mark(const char *name, int after) {
    if (!emu_kt.on || emu_kt.n == EMU_KT_MAX) {
        emu_kt.dropped += emu_kt.on && after;
        return;
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    emu_kt.t[2 * emu_kt.n + after] = ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
    if (after) emu_kt.name[emu_kt.n++] = name;
}
int dg_cuda_ktime_end(dg_cuda_ktime *out, int max, int *dropped) {
    emu_kt.on = false;
    if (dropped) *dropped = emu_kt.dropped;
    int m = 0;
    for (int i = 0; i < emu_kt.n; i++)
        m = dg_cuda_ktime_add(out, m, max, emu_kt.name[i], emu_kt.t[2 * i + 1] - emu_kt.t[2 * i]);
    return m;
}
