/* Per-kernel times of the chunked delta-rule kernels, for benchmarks (cuda_kernels.h,
 * dg_cuda_ktime_*): while on, drc::launch (dr_chunk_internal.cuh) records a CUDA event on the
 * library's stream before and after each launch; dg_cuda_ktime_end waits for the stream and sums the
 * elapsed times by kernel name.  Events are created once (a fixed pool of KT_MAX launches) and
 * kept; a launch past the pool is counted as dropped, not timed.  Host-side state, one thread (the
 * library's one stream). */
#include "kernels/cuda/cuda_util.h"

namespace {

constexpr int KT_MAX = 512; /* launches timed between begin and end (tests/emu/cuda_runtime_host.c: the same) */

struct KTimer {
    bool on = false;
    int n = 0, dropped = 0;
    cudaEvent_t ev[2 * KT_MAX] = {};
    const char *name[KT_MAX] = {};
};

KTimer &kt() {
    static KTimer t;
    return t;
}

} // namespace

extern "C" {

bool dg_cuda_ktime_on(void) { return kt().on; }

int dg_cuda_ktime_begin(void) {
    if (dg_cuda_init()) return -1;
    KTimer &t = kt();
    for (int i = 0; i < 2 * KT_MAX; i++)
        if (!t.ev[i]) DG_CU_TRY(cudaEventCreate(&t.ev[i]));
    t.n = t.dropped = 0;
    t.on = true;
    return 0;
}

void dg_cuda_ktime_mark(const char *name, int after) {
    KTimer &t = kt();
    if (!t.on) return;
    if (t.n == KT_MAX) {
        t.dropped += after;
        return;
    }
    /* a failed record shows up as a failed elapsed-time query in dg_cuda_ktime_end */
    (void)cudaEventRecord(t.ev[2 * t.n + after], dg_cuda_stream());
    if (after) t.name[t.n++] = name;
}

int dg_cuda_ktime_end(dg_cuda_ktime *out, int max, int *dropped) {
    KTimer &t = kt();
    t.on = false;
    if (dropped) *dropped = t.dropped;
    if (dg_cuda_synchronize()) return -1;
    int m = 0;
    for (int i = 0; i < t.n; i++) {
        float ms = 0.0f;
        DG_CU_TRY(cudaEventElapsedTime(&ms, t.ev[2 * i], t.ev[2 * i + 1]));
        m = dg_cuda_ktime_add(out, m, max, t.name[i], ms);
    }
    return m;
}

/* ---- the op profiler's events (autograd/profiler.c): a pool that grows and is kept ---- */

namespace {
struct EvPool {
    cudaEvent_t *ev = nullptr;
    int n = 0;
};
EvPool &evpool() {
    static EvPool p;
    return p;
}
} // namespace

int dg_cuda_evpool_reserve(int n) {
    if (dg_cuda_init()) return -1;
    EvPool &p = evpool();
    if (n <= p.n) return 0;
    cudaEvent_t *ev = static_cast<cudaEvent_t *>(realloc(p.ev, sizeof *ev * (size_t)n));
    if (!ev) {
        dg_error("profiler: out of host memory for %d CUDA events", n);
        return -1;
    }
    p.ev = ev;
    for (; p.n < n; p.n++) DG_CU_TRY(cudaEventCreate(&p.ev[p.n]));
    return 0;
}

int dg_cuda_evpool_record(int i) {
    EvPool &p = evpool();
    if (i < 0 || i >= p.n) {
        dg_error("profiler: event %d outside the pool of %d", i, p.n);
        return -1;
    }
    DG_CU_TRY(cudaEventRecord(p.ev[i], dg_cuda_stream()));
    return 0;
}

int dg_cuda_evpool_elapsed(int i, int j, float *ms) {
    EvPool &p = evpool();
    if (i < 0 || j < 0 || i >= p.n || j >= p.n) {
        dg_error("profiler: events %d, %d outside the pool of %d", i, j, p.n);
        return -1;
    }
    DG_CU_TRY(cudaEventSynchronize(p.ev[j]));
    DG_CU_TRY(cudaEventElapsedTime(ms, p.ev[i], p.ev[j]));
    return 0;
}

void dg_cuda_evpool_free(void) {
    EvPool &p = evpool();
    for (int i = 0; i < p.n; i++) (void)cudaEventDestroy(p.ev[i]);
    free(p.ev);
    p.ev = nullptr;
    p.n = 0;
}

} // extern "C"
