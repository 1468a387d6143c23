/* Micro-benchmark of the chunked delta-rule kernels (f32) against this machine's SGEMM rate and
 * against the recurrent kernels.  Built by hand (not by scons), from the repository root, after
 * `scons`:
 *   gcc -O2 -fopenmp -Iinclude -I. $(pkg-config --cflags openblas) bench/dr_chunk_bench.c \
 *       build/release/libdeltagrad.a $(pkg-config --libs openblas jemalloc) \
 *       -L/usr/local/cuda/lib64 -lcublas -lcudart -lstdc++ -lm -o /tmp/dr_chunk_bench
 *   (the cuda libraries only when the library was built with CUDA)
 * Usage: [DR_CHUNK=32] /tmp/dr_chunk_bench [reps [threads]]
 *   threads: OpenMP and OpenBLAS threads (default all); DR_CHUNK: chunk size (default 64)
 *
 * FLOP conventions, per chunk of C rows and value head:
 *   dense:  every product of the algorithm as a dense GEMM (triangular operands in full, the K K^T
 *           Gram at half): forward 5 C^2 K + 4 C^2 V + 6 C K V, backward 17 C^2 K + 10 C^2 V +
 *           16 C K V + 4 C^3 (it recomputes the forward's chunk pieces and states);
 *   useful: products with a triangular L x L operand at half, solve_tril's backward at a third:
 *           12 C^2 K + 7 C^2 V + 22 C K V + 4/3 C^3 for forward + backward. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/cpu/delta/delta_rule.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}
static uint64_t rs = 12345;
static float frand(float lo, float hi) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return lo + (hi - lo) * (float)((rs >> 11) / 9007199254740992.0);
}
static float *arr(int64_t n, float lo, float hi) {
    float *p = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = frand(lo, hi);
    return p;
}

/* big SGEMM (all threads) and many small 64x64x64 SGEMMs, one per thread at a time */
static void sgemm_rates(double *big, double *small) {
    int n = 2048;
    float *a = arr((int64_t)n * n, -1, 1), *b = arr((int64_t)n * n, -1, 1), *c = arr((int64_t)n * n, 0, 0);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
        t = now() - t;
        if (t < best) best = t;
    }
    *big = 2.0 * n * n * n / best / 1e9;
    int reps = 4000;
    best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t = now();
#pragma omp parallel
        {
            int id = omp_get_thread_num();
            float *cc = malloc(sizeof(float) * 64 * 64);
#pragma omp for
            for (int i = 0; i < reps; i++)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 64, 64, 64, 1, a + id * 65536, 64,
                            b + id * 65536, 64, 0, cc, 64);
            free(cc);
        }
        t = now() - t;
        if (t < best) best = t;
    }
    *small = reps * 2.0 * 64 * 64 * 64 / best / 1e9;
    free(a), free(b), free(c);
}

typedef struct run {
    dg_dr_shape s;
    float *q, *k, *v, *g, *b, *h0, *o, *hT, *dO, *dhT, *dq, *dk, *dv, *dg, *db, *dh0;
} run;

static void run_make(run *r, int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, dg_gate_kind gate) {
    dg_dr_shape s = {B, T, H, H, K, V, NULL, B, gate, 1.0 / sqrt((double)K), 64};
    if (getenv("DR_CHUNK")) s.chunk = atoi(getenv("DR_CHUNK"));
    r->s = s;
    int64_t nq = B * T * H * K, nv = B * T * H * V, nb = B * T * H, nh = B * H * K * V;
    int64_t ng = gate == DG_GATE_NONE ? 0 : gate == DG_GATE_HEAD ? nb : nq;
    r->q = arr(nq, -1, 1);
    r->k = arr(nq, -1, 1);
    for (int64_t i = 0; i < nq / K; i++) { /* unit keys */
        double t = 0;
        for (int64_t j = 0; j < K; j++) t += r->k[i * K + j] * r->k[i * K + j];
        for (int64_t j = 0; j < K; j++) r->k[i * K + j] /= (float)sqrt(t);
    }
    r->v = arr(nv, -1, 1);
    r->g = ng ? arr(ng, -0.5f, -0.01f) : NULL;
    r->b = arr(nb, 0.1f, 0.9f);
    r->h0 = arr(nh, -1, 1);
    r->o = arr(nv, 0, 0);
    r->hT = arr(nh, 0, 0);
    r->dO = arr(nv, -1, 1);
    r->dhT = arr(nh, -1, 1);
    r->dq = arr(nq, 0, 0);
    r->dk = arr(nq, 0, 0);
    r->dv = arr(nv, 0, 0);
    r->dg = ng ? arr(ng, 0, 0) : NULL;
    r->db = arr(nb, 0, 0);
    r->dh0 = arr(nh, 0, 0);
}
static void run_free(run *r) {
    float *p[] = {r->q, r->k, r->v, r->g, r->b, r->h0, r->o, r->hT, r->dO, r->dhT, r->dq, r->dk, r->dv, r->dg, r->db, r->dh0};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
}

/* best-of-reps wall time of fwd + bwd, seconds */
static double time_chunk(run *r, const dg_dr_variant *var, int reps) {
    double best = 1e30;
    for (int i = 0; i < reps; i++) {
        double t = now();
        dg_dr_chunk_fwd_f32(&r->s, r->q, r->k, r->v, r->g, r->b, r->h0, r->o, r->hT);
        dg_dr_chunk_bwd_f32(&r->s, var, r->q, r->k, r->v, r->g, r->b, r->h0, r->dO, r->dhT, r->dq,
                            r->dk, r->dv, r->dg, r->db, r->dh0);
        t = now() - t;
        if (t < best) best = t;
    }
    return best;
}
static double time_rec(run *r, int reps) {
    double best = 1e30;
    for (int i = 0; i < reps; i++) {
        double t = now();
        dg_dr_recurrent_fwd_f32(&r->s, r->q, r->k, r->v, r->g, r->b, r->h0, r->o, r->hT);
        dg_dr_recurrent_bwd_f32(&r->s, r->q, r->k, r->v, r->g, r->b, r->h0, r->dO, r->dhT, r->dq,
                                r->dk, r->dv, r->dg, r->db, r->dh0);
        t = now() - t;
        if (t < best) best = t;
    }
    return best;
}
static double flops(const dg_dr_shape *s, int useful) {
    double C = s->chunk, K = s->K, V = s->V, nch = s->B * s->HV * ceil((double)s->T / C);
    if (useful) return nch * (12 * C * C * K + 7 * C * C * V + 22 * C * K * V + 4.0 / 3 * C * C * C);
    return nch * (22 * C * C * K + 14 * C * C * V + 22 * C * K * V + 4 * C * C * C);
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    if (argc > 2) { /* the benchmark's own setting, for per-core numbers */
        omp_set_num_threads(atoi(argv[2]));
        openblas_set_num_threads(atoi(argv[2]));
    }
    double big, small;
    sgemm_rates(&big, &small);
    printf("threads %d; SGEMM 2048^3: %.1f GFLOP/s; 64x64x64 SGEMMs on all threads: %.1f GFLOP/s\n",
           omp_get_max_threads(), big, small);
    const char *gn[3] = {"deltanet", "gdn", "kda"};
    dg_dr_variant var = {1, 1, 1};
    for (int K = 64; K <= 128; K *= 2)
        for (int gk = 0; gk < 3; gk++) {
            run r;
            run_make(&r, 2, 1024, 4, K, K, (dg_gate_kind)gk);
            double t = time_chunk(&r, &var, reps), f = flops(&r.s, 0), fu = flops(&r.s, 1);
            printf("chunked fwd+bwd f32 B=2 T=1024 H=4 K=V=%d %-8s: %6.1f ms  dense %5.1f GFLOP/s (%2.0f%% of SGEMM)"
                   "  useful %5.1f GFLOP/s (%2.0f%%)\n",
                   K, gn[gk], t * 1e3, f / t / 1e9, 100 * f / t / 1e9 / big, fu / t / 1e9, 100 * fu / t / 1e9 / big);
            run_free(&r);
        }
    for (int gk = 0; gk < 3; gk++) {
        dg_dr_variant v2 = {0, 0, 0};
        run r;
        run_make(&r, 2, 1024, 4, 64, 64, (dg_gate_kind)gk);
        double t1 = time_chunk(&r, &var, reps), t0 = time_chunk(&r, &v2, reps);
        printf("variants K=V=64 %-8s: {1,1,1} %.1f ms, {0,0,0} %.1f ms\n", gn[gk], t1 * 1e3, t0 * 1e3);
        run_free(&r);
    }
    for (int K = 64; K <= 128; K *= 2)
        for (int gk = 1; gk < 3; gk++) {
            run r;
            run_make(&r, 1, 4096, 4, K, K, (dg_gate_kind)gk);
            double tc = time_chunk(&r, &var, reps), tr = time_rec(&r, reps > 2 ? 2 : reps);
            printf("T=4096 B=1 H=4 K=V=%d %-8s: chunked %.1f ms, recurrent %.1f ms, speedup %.1fx\n", K,
                   gn[gk], tc * 1e3, tr * 1e3, tr / tc);
            run_free(&r);
        }
    return 0;
}
