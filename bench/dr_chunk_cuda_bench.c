/* Timings of the chunked delta-rule CUDA kernels (kernels/cuda/dr_chunk_cuda.h) at the shapes of
 * issue 6: CUDA events around each call on the library's stream, 2 warm-up calls, median of the
 * repetitions.  Built by hand (not by scons), from the repository root, after
 * `scons cuda=1 build/release/libdeltagrad.a`:
 *   gcc -O2 -std=c11 -D_GNU_SOURCE -DDG_HAVE_CUDA -Iinclude -I. -I/usr/local/cuda/include \
 *       bench/dr_chunk_cuda_bench.c build/release/libdeltagrad.a $(pkg-config --libs openblas \
 *       jemalloc) -L/usr/local/cuda/lib64 -lcublas -lcudart -lstdc++ -lm -fopenmp \
 *       -o /tmp/dr_chunk_cuda_bench
 * Usage: dr_chunk_cuda_bench [all | s1 | s2 | ncu]
 *   s1, s2: the tensor-core path at S1 (B8 T2048 H16 K=V=128 bf16) or S2 (B2 T8192 H16), for
 *   gated_delta_rule (every backward variant: fused / unfused, dg from the final dq, dk or partial,
 *   blocked or substitution solve) and delta_rule; all: s1, s2, the recurrent and generic kernels;
 *   ncu: one fwd+bwd of each op at S1 (for per-kernel times under
 *   `ncu --clock-control none --metrics gpu__time_duration.sum`).
 * FLA on an H100 (issue 6), ms fwd / fwd+bwd: gated_delta_rule S1 1.025 / 3.113, S2 0.953 / 3.174;
 * delta_rule S1 1.052 / 2.805, S2 0.768 / 2.854. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "core/internal.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/dr_chunk_cuda.h"

cudaStream_t dg_cuda_stream(void);

static uint64_t rs = 1234567;
static float ur(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (float)((rs >> 11) / 9007199254740992.0);
}
static uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
/* random device array; unit rows of length K for keys when unit_k > 0 */
static void *dev_rand(int64_t n, int bf16, float lo, float hi, int unit_k) {
    float *x = malloc(n * 4);
    for (int64_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * ur();
    if (unit_k)
        for (int64_t r = 0; r < n / unit_k; r++) {
            double s = 0;
            for (int c = 0; c < unit_k; c++) s += x[r * unit_k + c] * x[r * unit_k + c];
            for (int c = 0; c < unit_k; c++) x[r * unit_k + c] /= sqrt(s);
        }
    size_t es = bf16 ? 2 : 4;
    void *h = malloc(n * es);
    for (int64_t i = 0; i < n; i++) {
        if (bf16) ((uint16_t *)h)[i] = f2bf(x[i]);
        else ((float *)h)[i] = x[i];
    }
    void *d = dg_cuda_malloc(n * es);
    if (!d || dg_cuda_memcpy(d, h, n * es, 0)) {
        printf("alloc/copy failed: %s\n", dg_last_error());
        exit(1);
    }
    free(h), free(x);
    return d;
}
static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static cudaEvent_t e0, e1;
#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (c) {                                                                                   \
            printf("failed: %s\n", dg_last_error());                                               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
/* median ms of `reps` runs of body (2 warm-ups) */
#define TIME(label, reps, body)                                                                    \
    do {                                                                                           \
        double ts_[64];                                                                            \
        for (int w_ = 0; w_ < ((reps) > 1 ? 2 : 0); w_++) { body; }                                                   \
        CHECK(dg_cuda_synchronize());                                                              \
        for (int r_ = 0; r_ < (reps); r_++) {                                                      \
            cudaEventRecord(e0, dg_cuda_stream());                                                 \
            body;                                                                                  \
            cudaEventRecord(e1, dg_cuda_stream());                                                 \
            cudaEventSynchronize(e1);                                                              \
            float ms_;                                                                             \
            cudaEventElapsedTime(&ms_, e0, e1);                                                    \
            ts_[r_] = ms_;                                                                         \
        }                                                                                          \
        CHECK(dg_cuda_synchronize());                                                              \
        qsort(ts_, (reps), sizeof(double), cmpd);                                                  \
        printf("%-84s %8.3f ms  (min %.3f, max %.3f, n=%d)\n", label, ts_[(reps) / 2], ts_[0],      \
               ts_[(reps) - 1], (reps));                                                           \
        fflush(stdout);                                                                            \
    } while (0)

static void bench(const char *name, int64_t B, int64_t T, int64_t H, int64_t K, int64_t V,
                  dg_gate_kind gate, int bf16, int generic, int recurrent, int reps, int variants) {
    dg_dr_shape s = {.B = B, .T = T, .H = H, .HV = H, .K = K, .V = V, .N = B, .gate = gate,
                     .scale = 1.0 / sqrt((double)K), .chunk = 64};
    int64_t nq = B * T * H * K, nv = B * T * H * V, nb = B * T * H;
    int64_t ng = gate == DG_GATE_NONE ? 0 : gate == DG_GATE_HEAD ? nb : nq;
    void *q = dev_rand(nq, bf16, -1, 1, 0), *k = dev_rand(nq, bf16, -1, 1, (int)K),
         *v = dev_rand(nv, bf16, -1, 1, 0), *beta = dev_rand(nb, bf16, 0.1f, 0.9f, 0),
         *dout = dev_rand(nv, bf16, -1, 1, 0);
    float *g = ng ? dev_rand(ng, 0, -0.5f, -0.01f, 0) : NULL;
    size_t es = bf16 ? 2 : 4;
    void *o = dg_cuda_malloc(nv * es), *dq = dg_cuda_malloc(nq * es), *dk = dg_cuda_malloc(nq * es),
         *dv = dg_cuda_malloc(nv * es), *db = dg_cuda_malloc(nb * es);
    float *dg = ng ? dg_cuda_malloc(ng * 4) : NULL;
    char label[192];
    const char *path = recurrent ? "recurrent" : generic ? "chunk generic" : "chunk";
    const char *op = gate == DG_GATE_HEAD ? "gdn" : gate == DG_GATE_NONE ? "delta_rule" : "kda";
    int old = dg_cuda_dr_chunk_force_generic(generic);
    static const dg_dr_variant vars[4] = {{1, 1, 1}, {0, 1, 1}, {1, 0, 1}, {1, 1, 0}};
    static const char *vname[4] = {"var 111 (dg final, fused, blocked)", "var 011 (dg partial)",
                                   "var 101 (unfused)", "var 110 (substitution)"};
    snprintf(label, sizeof label, "%s %s %s %s fwd", op, name, bf16 ? "bf16" : "f32", path);
    if (recurrent) {
        if (bf16) {
            TIME(label, reps, CHECK(dg_cuda_dr_recurrent_fwd_bf16(&s, q, k, v, g, beta, NULL, o, NULL)));
            snprintf(label, sizeof label, "%s %s bf16 %s fwd+bwd", op, name, path);
            TIME(label, reps, CHECK(dg_cuda_dr_recurrent_fwd_bf16(&s, q, k, v, g, beta, NULL, o, NULL));
                 CHECK(dg_cuda_dr_recurrent_bwd_bf16(&s, q, k, v, g, beta, NULL, dout, NULL, dq, dk, dv, dg, db, NULL)));
        }
    } else if (bf16) {
        TIME(label, reps, CHECK(dg_cuda_dr_chunk_fwd_bf16(&s, q, k, v, g, beta, NULL, o, NULL)));
        for (int vi = 0; vi < (variants ? 4 : 1); vi++) {
            snprintf(label, sizeof label, "%s %s bf16 %s fwd+bwd %s", op, name, path, vname[vi]);
            TIME(label, reps, CHECK(dg_cuda_dr_chunk_fwd_bf16(&s, q, k, v, g, beta, NULL, o, NULL));
                 CHECK(dg_cuda_dr_chunk_bwd_bf16(&s, &vars[vi], q, k, v, g, beta, NULL, dout, NULL, dq, dk, dv, dg, db, NULL)));
        }
    } else {
        TIME(label, reps, CHECK(dg_cuda_dr_chunk_fwd_f32(&s, q, k, v, g, beta, NULL, o, NULL)));
        snprintf(label, sizeof label, "%s %s f32 %s fwd+bwd", op, name, path);
        TIME(label, reps, CHECK(dg_cuda_dr_chunk_fwd_f32(&s, q, k, v, g, beta, NULL, o, NULL));
             CHECK(dg_cuda_dr_chunk_bwd_f32(&s, NULL, q, k, v, g, beta, NULL, dout, NULL, dq, dk, dv, dg, db, NULL)));
    }
    dg_cuda_dr_chunk_force_generic(old);
    void *ps[] = {q, k, v, beta, dout, g, o, dq, dk, dv, db, dg};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) dg_cuda_free(ps[i]);
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "all";
    if (dg_cuda_init()) {
        printf("no cuda: %s\n", dg_last_error());
        return 1;
    }
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    struct cudaDeviceProp pr;
    cudaGetDeviceProperties(&pr, 0);
    printf("device %s, %d SMs\n", pr.name, pr.multiProcessorCount);
    const char *S1 = "S1 B8 T2048 H16 K=V=128", *S2 = "S2 B2 T8192 H16 K=V=128";
    const int all = strcmp(what, "all") == 0, ncu = strcmp(what, "ncu") == 0;
    if (ncu) {
        bench(S1, 8, 2048, 16, 128, 128, DG_GATE_HEAD, 1, 0, 0, 1, 1); /* gdn, every variant */
        bench(S1, 8, 2048, 16, 128, 128, DG_GATE_NONE, 1, 0, 0, 1, 0); /* delta_rule */
        return 0;
    }
    if (all || strcmp(what, "s1") == 0) {
        bench(S1, 8, 2048, 16, 128, 128, DG_GATE_HEAD, 1, 0, 0, 20, 1); /* gdn, tensor cores */
        bench(S1, 8, 2048, 16, 128, 128, DG_GATE_NONE, 1, 0, 0, 20, 1); /* delta_rule */
    }
    if (all || strcmp(what, "s2") == 0) {
        bench(S2, 2, 8192, 16, 128, 128, DG_GATE_HEAD, 1, 0, 0, 20, 1);
        bench(S2, 2, 8192, 16, 128, 128, DG_GATE_NONE, 1, 0, 0, 20, 1);
    }
    if (all) {
        bench(S1, 8, 2048, 16, 128, 128, DG_GATE_HEAD, 1, 0, 1, 5, 0);    /* recurrent */
        bench(S1, 8, 2048, 16, 128, 128, DG_GATE_HEAD, 1, 1, 0, 3, 0);    /* generic bf16 */
        bench(S1, 8, 2048, 16, 128, 128, DG_GATE_CHANNEL, 1, 1, 0, 3, 0); /* kda generic */
    }
    return 0;
}
