/* Storage: host memory from jemalloc (the build links it as the process allocator; 64-byte aligned
 * via aligned_alloc), device memory from the CUDA backend's stream-ordered pool.  Live and peak
 * bytes are counted per device for the comparison tables and the leak tests.
 *
 * A new storage is not cleared unless asked (dg_zeros): most are outputs that the next kernel
 * overwrites whole, and clearing them cost 7% of a CPU training step.  DG_DEBUG_FILL_NAN=1 fills
 * every uncleared storage with 0xFF bytes instead (NaN in every float dtype, -1 in the integer
 * ones), so that code that reads memory it did not write fails its tests. */
#include "core/internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#ifdef DG_JEMALLOC
/* jemalloc's settings for every program that links the library (jemalloc reads this symbol when it
 * starts; MALLOC_CONF in the environment still overrides it).  Its default decay hands the pages of
 * freed activations back to the kernel a few seconds after each training step and page-faults them
 * in again in the next (a quarter of a CPU step on the 2-core machine, and the chunked bench swung
 * from 360 to 655 ms on it); memory stays flat from step to step, so keeping the freed pages costs
 * nothing beyond the step's own peak. */
const char *malloc_conf = "dirty_decay_ms:-1,muzzy_decay_ms:-1";
#endif

/* DG_DEBUG_FILL_NAN, read once: -1 not yet read, 0 off, 1 on */
static _Atomic int fill_nan = -1;

static bool debug_fill_nan(void) {
    int v = atomic_load_explicit(&fill_nan, memory_order_relaxed);
    if (v < 0) {
        const char *e = getenv("DG_DEBUG_FILL_NAN");
        v = e && *e && strcmp(e, "0") != 0;
        atomic_store(&fill_nan, v);
    }
    return v;
}

static _Atomic int64_t live[2], peak[2];

void dg_mem_account(dg_device d, int64_t delta) {
    int64_t now = atomic_fetch_add(&live[d], delta) + delta;
    int64_t p = atomic_load(&peak[d]);
    while (now > p && !atomic_compare_exchange_weak(&peak[d], &p, now)) {}
}

size_t dg_live_bytes(dg_device d) { return (size_t)atomic_load(&live[d]); }
size_t dg_peak_bytes(dg_device d) { return (size_t)atomic_load(&peak[d]); }
void dg_reset_peak_bytes(dg_device d) { atomic_store(&peak[d], atomic_load(&live[d])); }

dg_storage *dg_storage_new(size_t nbytes, dg_device dev, bool zero) {
    dg_storage *s = calloc(1, sizeof *s);
    if (!s) {
        dg_error("out of host memory allocating a storage header");
        return NULL;
    }
    size_t rounded = (nbytes + 63) & ~(size_t)63;
    if (rounded == 0) rounded = 64;
    if (dev == DG_CPU) {
        s->data = aligned_alloc(64, rounded);
        if (s->data && (zero || debug_fill_nan())) memset(s->data, zero ? 0 : 0xFF, rounded);
    } else {
#ifdef DG_HAVE_CUDA
        s->data = dg_cuda_malloc(rounded);
        if (s->data && (zero || debug_fill_nan()) && dg_cuda_memset(s->data, zero ? 0 : 0xFF, rounded) != 0) {
            dg_cuda_free(s->data);
            s->data = NULL;
        }
#else
        dg_error("cuda: this build has no CUDA backend (rebuild with nvcc present, cuda=1)");
#endif
    }
    if (!s->data) {
        dg_error("out of %s memory allocating %zu bytes", dg_device_name(dev), rounded);
        free(s);
        return NULL;
    }
    s->nbytes = nbytes;
    s->refcount = 1;
    s->device = dev;
    dg_mem_account(dev, (int64_t)rounded);
    return s;
}

void dg_storage_release(dg_storage *s) {
    if (!s || --s->refcount > 0) return;
    size_t rounded = (s->nbytes + 63) & ~(size_t)63;
    if (rounded == 0) rounded = 64;
    dg_mem_account(s->device, -(int64_t)rounded);
    if (s->device == DG_CPU) free(s->data);
#ifdef DG_HAVE_CUDA
    else dg_cuda_free(s->data);
#endif
    free(s);
}
