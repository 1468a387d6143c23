/* The chunked delta-rule CUDA kernels (kernels/cuda/delta/dr_chunk_cuda.h) against the CPU kernels on
 * the same random inputs (kernels/cpu/delta/delta_rule.h):
 *  - f32: forward (o, hT) and every gradient against the f64 recurrence, relative error norm
 *    ||x - ref|| / ||ref|| <= 1e-5; the CPU f32 chunked kernel's own error is printed beside it;
 *  - bf16 storage (q, k, v, beta, o, dout and their gradients; f32 gates and states): against the
 *    f64 recurrence on the same rounded inputs, <= 5e-3; both the tensor-core path (gate NONE or
 *    HEAD, chunk 64, K, V in {64, 128}) and the generic kernels, and the two against each other;
 *  - fp16 storage (the same arrays as IEEE binary16): against the f64 recurrence on the same
 *    fp16-rounded inputs, <= F16_TOL (6e-4, derived there) on the generic kernels and
 *    <= F16_MMA_TOL on the tensor-core ones (gate NONE or HEAD at their shapes), the two paths
 *    against each other, and KDA in fp16 the same bits as the generic path forced;
 *  - value heads of V = 192, 256, 320 on the tensor-core kernels as 3, 2, 5 heads of 64 or 128
 *    columns (kernels/cuda/delta/dr_chunk_vsplit.cu), bf16 and fp16, KDA too;
 *  - every gate kind, grouped value heads, cu_seqlens with an empty sequence, h0/hT present or
 *    absent, partial last chunks, T = 1, chunk 16/32/64, V tiles with a partial tile, NULL
 *    gradient pointers;
 *  - short sequences over many random draws (T = 1 and 130, with and without a gate): the worst
 *    error of each output over the draws <= 5e-3, the margin of the plain bf16 intermediates;
 *  - every backward variant (GDN dg from final dq/dk or partial terms; KDA fused or unfused;
 *    blocked or forward-substitution inverse): each against the reference and all against each
 *    other; the backward run twice gives identical bits;
 *  - bad arguments are rejected with a message naming them (these run without a GPU too).
 * Outputs are poisoned with NaN before each run, so an element left unwritten fails.  The GPU
 * tests skip where dg_cuda_device_count() is 0.  DG_TEST_FILTER selects tests by name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deltagrad.h"
#include "tests/support/test_support.h"

#ifdef DG_HAVE_CUDA
#include "core/f16.h"
#include "core/internal.h"
#include "kernels/cpu/delta/delta_rule.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/delta/dr_chunk_cuda.h"

/* ---- host helpers ---- */
static uint64_t rs = 0x2545F4914F6CDD1Dull;
static double urand(void) { return dg_test_xorshift(&rs); }
static double *rnd(int64_t n, double lo, double hi) {
    double *x = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * urand();
    return x;
}

/* Storage of q, k, v, beta, o, dout and their gradients in a run (gates and states are f32). */
enum { S_F32, S_BF16, S_F16 };
static const char *const st_names[3] = {"f32", "bf16", "f16"};
static uint16_t to16(int st, double x) { return st == S_BF16 ? dg_bf16_from_f32((float)x) : dg_f16_from_f64(x); }
static double from16(int st, uint16_t h) { return st == S_BF16 ? dg_bf16_to_f32(h) : dg_f16_to_f64(h); }
/* x as the device holds it in storage st */
static double stored(int st, double x) { return st == S_F32 ? (float)x : from16(st, to16(st, x)); }

/* Bound on ||x - ref|| / ||ref|| for fp16 storage.  The inputs are exact (the reference gets the
 * same fp16 values) and the generic kernels compute in f32, whose error e32 is <= 1e-5 here (the
 * f32 tests, same shapes and kernels).  Each fp16 output and gradient is then rounded once to
 * nearest: |fl(x) - x| <= u |x| with u = 2^-11 = 4.88e-4 (fp16 keeps 11 significant bits) for
 * every normal x, so ||fl(x) - ref|| <= u ||x|| + ||x - ref|| <= u (1 + e32) + e32 = 4.98e-4 of
 * ||ref|| (subnormal results, below 6.1e-5, err by at most 2^-25 each: nothing in these norms).
 * 6e-4 is that plus a margin; two roundings of the same value, or bf16 bits read as fp16, can
 * exceed it.  Typical values are u / sqrt(3)-like, about 2e-4 (the rounding errors are spread
 * uniformly).  Two fp16 runs of different variants differ by at most twice that bound. */
#define F16_TOL 6e-4
/* The same on the tensor-core path (fp16 build of the head-gate kernels): the structure and the
 * plain / split choices of bf16 (whose bound is 5e-3), every intermediate rounding now 2^-11
 * instead of 2^-8 relative: 5e-3 / 8 = 6.25e-4, plus the rounding of each fp16 result (4.9e-4,
 * above), 1.1e-3. */
#define F16_MMA_TOL 1.1e-3

/* device buffer of n elements of esz bytes, from host, or poisoned with 0xff (NaN) */
static void *dput(const void *host, int64_t n, size_t esz) {
    void *d = dg_cuda_malloc((size_t)(n ? n : 1) * esz);
    assert_non_null(d);
    void *p = (void *)host;
    if (!host) {
        p = malloc((size_t)(n ? n : 1) * esz);
        memset(p, 0xff, (size_t)(n ? n : 1) * esz);
    }
    if (n) assert_int_equal(dg_cuda_memcpy(d, p, (size_t)n * esz, 0), 0);
    if (!host) free(p);
    return d;
}
/* A device buffer's bytes back on the host (caller frees) */
static void *dget(const void *dev, size_t bytes) {
    void *h = malloc(bytes ? bytes : 1);
    if (bytes) assert_int_equal(dg_cuda_memcpy(h, dev, bytes, 1), 0);
    return h;
}

/* device copy of a double array as f32 (S_F32), bf16 bits (S_BF16) or fp16 bits (S_F16) */
static void *dput_as(const double *x, int64_t n, int st) {
    if (!x) return NULL;
    void *h = malloc((size_t)(n ? n : 1) * 4);
    for (int64_t i = 0; i < n; i++) {
        if (st != S_F32) ((uint16_t *)h)[i] = to16(st, x[i]);
        else ((float *)h)[i] = (float)x[i];
    }
    void *d = dput(h, n, st != S_F32 ? 2 : 4);
    free(h);
    return d;
}

/* ---- cases ---- */
typedef struct cfg {
    const char *name;
    int64_t B, T, H, HV, K, V;
    dg_gate_kind gate;
    int chunk;
    int ncu; /* 0, or the N+1 entries of cu */
    int64_t cu[8];
    int h0, dhT, some_grads; /* some_grads: only dk, dbeta, dh0 (and dg) are asked for */
} cfg;

typedef struct data { /* host inputs, already rounded to what the device holds */
    dg_dr_shape s;
    int64_t nq, nv, nb, ng, nh;
    double *q, *k, *v, *g, *beta, *h0, *dout, *dhT;
    double *rq, *rk; /* NULL, or 1/|x| per row [B*T*H] (16-bit only): the backward then gives dq, dk
                      * of the raw rows (the L2 norm's backward taken with it) */
} data;

static void make(const cfg *c, int st, data *d) {
    memset(d, 0, sizeof *d);
    d->s = (dg_dr_shape){.B = c->B, .T = c->T, .H = c->H, .HV = c->HV, .K = c->K, .V = c->V,
                         .cu_seqlens = c->ncu ? c->cu : NULL, .N = c->ncu ? c->ncu - 1 : c->B,
                         .gate = c->gate, .scale = 1.0 / sqrt((double)c->K), .chunk = c->chunk};
    const int64_t BT = c->B * c->T;
    d->nq = BT * c->H * c->K, d->nv = BT * c->HV * c->V, d->nb = BT * c->HV;
    d->ng = c->gate == DG_GATE_NONE ? 0 : c->gate == DG_GATE_HEAD ? BT * c->HV : BT * c->HV * c->K;
    d->nh = d->s.N * c->HV * c->K * c->V;
    d->q = rnd(d->nq, -1, 1), d->k = rnd(d->nq, -1, 1), d->v = rnd(d->nv, -1, 1);
    d->beta = rnd(d->nb, 0.1, 0.9), d->dout = rnd(d->nv, -1, 1);
    /* per-channel decays vary more than per-head ones */
    d->g = d->ng ? rnd(d->ng, c->gate == DG_GATE_CHANNEL ? -1.5 : -0.8, -0.02) : NULL;
    d->h0 = c->h0 ? rnd(d->nh, -1, 1) : NULL;
    d->dhT = c->dhT ? rnd(d->nh, -1, 1) : NULL;
    for (int64_t r = 0; r < BT * c->H; r++) { /* unit keys, as the layers feed them */
        double n2 = 0;
        for (int64_t i = 0; i < c->K; i++) n2 += d->k[r * c->K + i] * d->k[r * c->K + i];
        for (int64_t i = 0; i < c->K; i++) d->k[r * c->K + i] /= sqrt(n2);
    }
    double *lo[5] = {d->q, d->k, d->v, d->beta, d->dout};
    int64_t nlo[5] = {d->nq, d->nq, d->nv, d->nb, d->nv};
    for (int a = 0; a < 5; a++)
        for (int64_t i = 0; i < nlo[a]; i++)
            lo[a][i] = stored(st, lo[a][i]);
    double *hi[3] = {d->g, d->h0, d->dhT};
    int64_t nhi[3] = {d->ng, d->nh, d->nh};
    for (int a = 0; a < 3; a++)
        for (int64_t i = 0; hi[a] && i < nhi[a]; i++) hi[a][i] = (float)hi[a][i];
}

static void data_free(data *d) {
    free(d->q), free(d->k), free(d->v), free(d->g), free(d->beta), free(d->h0), free(d->dout),
        free(d->dhT), free(d->rq), free(d->rk);
}

enum { R_O, R_HT, R_DQ, R_DK, R_DV, R_DG, R_DB, R_DH0, R_N };
static const char *const r_names[R_N] = {"o", "hT", "dq", "dk", "dv", "dg", "dbeta", "dh0"};
typedef struct res {
    double *x[R_N];
    int64_t n[R_N];
} res;

static void res_alloc(const cfg *c, const data *d, res *r) {
    int64_t n[R_N] = {d->nv, d->nh, d->nq, d->nq, d->nv, d->ng, d->nb, d->nh};
    int want[R_N] = {1, 1, !c->some_grads, 1, !c->some_grads, d->ng > 0, 1, d->h0 != NULL};
    for (int i = 0; i < R_N; i++) {
        r->n[i] = want[i] ? n[i] : 0;
        r->x[i] = want[i] ? calloc((size_t)(n[i] ? n[i] : 1), sizeof(double)) : NULL;
    }
}
static void res_free(res *r) {
    for (int i = 0; i < R_N; i++) free(r->x[i]);
}

/* the f64 recurrence: the reference */
static void ref_f64(const data *d, res *r) {
    assert_int_equal(dg_dr_recurrent_fwd_f64(&d->s, d->q, d->k, d->v, d->g, d->beta, d->h0,
                                             r->x[R_O], r->x[R_HT]), 0);
    assert_int_equal(dg_dr_recurrent_bwd_f64(&d->s, d->q, d->k, d->v, d->g, d->beta, d->h0, d->dout,
                                             d->dhT, r->x[R_DQ], r->x[R_DK], r->x[R_DV], r->x[R_DG],
                                             r->x[R_DB], r->x[R_DH0]), 0);
}

/* the CPU f32 chunked kernel (for comparison of its error with ours) */
static void cpu_chunk_f32(const data *d, const dg_dr_variant *var, res *r) {
    const double *in[8] = {d->q, d->k, d->v, d->g, d->beta, d->h0, d->dout, d->dhT};
    int64_t nin[8] = {d->nq, d->nq, d->nv, d->ng, d->nb, d->nh, d->nv, d->nh};
    float *fi[8], *fo[R_N];
    for (int a = 0; a < 8; a++) {
        fi[a] = in[a] ? malloc(sizeof(float) * (size_t)(nin[a] ? nin[a] : 1)) : NULL;
        for (int64_t i = 0; fi[a] && i < nin[a]; i++) fi[a][i] = (float)in[a][i];
    }
    for (int a = 0; a < R_N; a++)
        fo[a] = r->x[a] ? malloc(sizeof(float) * (size_t)(r->n[a] ? r->n[a] : 1)) : NULL;
    assert_int_equal(dg_dr_chunk_fwd_f32(&d->s, fi[0], fi[1], fi[2], fi[3], fi[4], fi[5], fo[R_O],
                                         fo[R_HT]), 0);
    assert_int_equal(dg_dr_chunk_bwd_f32(&d->s, var, fi[0], fi[1], fi[2], fi[3], fi[4], fi[5], fi[6],
                                         fi[7], fo[R_DQ], fo[R_DK], fo[R_DV], fo[R_DG], fo[R_DB],
                                         fo[R_DH0]), 0);
    for (int a = 0; a < R_N; a++) {
        for (int64_t i = 0; fo[a] && i < r->n[a]; i++) r->x[a][i] = fo[a][i];
        free(fo[a]);
    }
    for (int a = 0; a < 8; a++) free(fi[a]);
}

/* the CUDA kernels with storage st for q k v beta o dout and their gradients.  Forward and
 * backward run twice and must give the same bits; with 16-bit storage on the tensor-core paths the
 * second forward keeps its working set (dg_cuda_dr_chunk_fwd_bf16_keep / _f16_keep) and the second backward runs from
 * it instead of recomputing it. */
static void run_gpu(const data *d, int st, const dg_dr_variant *var, res *r) {
    const int bf16 = st == S_BF16, f16 = st == S_F16;
    const size_t lo = st != S_F32 ? 2 : 4;
    const size_t esz[R_N] = {lo, 4, lo, lo, lo, 4, lo, 4};
    void *q = dput_as(d->q, d->nq, st), *k = dput_as(d->k, d->nq, st),
         *v = dput_as(d->v, d->nv, st), *beta = dput_as(d->beta, d->nb, st),
         *dout = dput_as(d->dout, d->nv, st);
    float *g = dput_as(d->g, d->ng, 0), *h0 = dput_as(d->h0, d->nh, 0), *dhT = dput_as(d->dhT, d->nh, 0);
    const int64_t nr = d->s.B * d->s.T * d->s.H;
    float *rq = d->rq ? dput_as(d->rq, nr, 0) : NULL, *rk = d->rk ? dput_as(d->rk, nr, 0) : NULL;
    void *o[R_N], *o2[R_N];
    for (int a = 0; a < R_N; a++) {
        o[a] = r->x[a] ? dput(NULL, r->n[a], esz[a]) : NULL;
        o2[a] = r->x[a] ? dput(NULL, r->n[a], esz[a]) : NULL;
    }
    const int64_t keep_bytes = bf16 ? dg_cuda_dr_chunk_kept_bytes(&d->s) : f16 ? dg_cuda_dr_chunk_kept_bytes_f16(&d->s) : 0;
    if (keep_bytes < 0) fail_msg("kept_bytes failed: %s", dg_last_error());
    void *keep = keep_bytes > 0 ? dput(NULL, keep_bytes, 1) : NULL;
    int kept = 0;
    for (int rep = 0; rep < 2; rep++) {
        void **w = rep ? o2 : o;
        int rc = f16 && rep && keep ? dg_cuda_dr_chunk_fwd_f16_keep(&d->s, q, k, v, g, beta, h0, w[R_O], w[R_HT], keep, &kept)
                 : f16  ? dg_cuda_dr_chunk_fwd_f16(&d->s, q, k, v, g, beta, h0, w[R_O], w[R_HT])
                 : !bf16 ? dg_cuda_dr_chunk_fwd_f32(&d->s, q, k, v, g, beta, h0, w[R_O], w[R_HT])
                 : rep && keep ? dg_cuda_dr_chunk_fwd_bf16_keep(&d->s, q, k, v, g, beta, h0, w[R_O], w[R_HT], keep, &kept)
                               : dg_cuda_dr_chunk_fwd_bf16(&d->s, q, k, v, g, beta, h0, w[R_O], w[R_HT]);
        if (rc) fail_msg("forward failed: %s", dg_last_error());
    }
    if (keep && !kept) fail_msg("kept_bytes is %lld but the forward kept nothing", (long long)keep_bytes);
    for (int rep = 0; rep < 2; rep++) {
        void **w = rep ? o2 : o;
        int rc = f16 ? dg_cuda_dr_chunk_bwd_f16_kept(&d->s, var, q, k, v, g, beta, h0, dout, dhT, w[R_DQ], w[R_DK],
                                                     w[R_DV], w[R_DG], w[R_DB], w[R_DH0], rep ? keep : NULL, rq, rk)
                 : bf16 ? dg_cuda_dr_chunk_bwd_bf16_kept(&d->s, var, q, k, v, g, beta, h0, dout, dhT, w[R_DQ],
                                                       w[R_DK], w[R_DV], w[R_DG], w[R_DB], w[R_DH0],
                                                       rep ? keep : NULL, rq, rk)
                      : dg_cuda_dr_chunk_bwd_f32(&d->s, var, q, k, v, g, beta, h0, dout, dhT, w[R_DQ],
                                                 w[R_DK], w[R_DV], w[R_DG], w[R_DB], w[R_DH0]);
        if (rc) fail_msg("backward failed: %s", dg_last_error());
    }
    assert_int_equal(dg_cuda_synchronize(), 0);
    for (int a = 0; a < R_N; a++) {
        if (!o[a]) continue;
        size_t bytes = (size_t)r->n[a] * esz[a];
        void *h1 = malloc(bytes ? bytes : 1), *h2 = malloc(bytes ? bytes : 1);
        assert_int_equal(dg_cuda_memcpy(h1, o[a], bytes, 1), 0);
        for (int64_t i = 0; i < r->n[a]; i++)
            r->x[a][i] = esz[a] == 2 ? from16(st, ((uint16_t *)h1)[i]) : ((float *)h1)[i];
        if (o2[a]) {
            assert_int_equal(dg_cuda_memcpy(h2, o2[a], bytes, 1), 0);
            if (memcmp(h1, h2, bytes))
                fail_msg("%s differs between two runs%s", r_names[a],
                         keep ? " (the second from the forward's kept working set)" : "");
        }
        free(h1), free(h2);
        dg_cuda_free(o[a]), dg_cuda_free(o2[a]);
    }
    dg_cuda_free(q), dg_cuda_free(k), dg_cuda_free(v), dg_cuda_free(beta), dg_cuda_free(dout);
    dg_cuda_free(g), dg_cuda_free(h0), dg_cuda_free(dhT), dg_cuda_free(keep);
    dg_cuda_free(rq), dg_cuda_free(rk);
}

/* every result within tol of the reference; prints the errors */
static void check(const char *what, const res *got, const res *ref, double tol) {
    char msg[512];
    int off = snprintf(msg, sizeof msg, "  %-44s", what);
    int bad = -1;
    double worst = 0;
    for (int a = 0; a < R_N; a++) {
        if (!ref->x[a]) continue;
        double e = dg_test_rel_err_norm(got->x[a], ref->x[a], ref->n[a]);
        off += snprintf(msg + off, sizeof msg - (size_t)off, " %s %.1e", r_names[a], e);
        if (!(e <= tol) && bad < 0) bad = a, worst = e;
    }
    printf("%s\n", msg);
    if (bad >= 0) fail_msg("%s: %s relative error %.3e > %.0e", what, r_names[bad], worst, tol);
}

static const dg_dr_variant var_default = {1, 1, 1};
static const dg_dr_variant var_all[8] = {{0, 0, 0}, {0, 0, 1}, {0, 1, 0}, {0, 1, 1},
                                         {1, 0, 0}, {1, 0, 1}, {1, 1, 0}, {1, 1, 1}};

/* whether fp16 calls of this case take the tensor-core kernels (dr_chunk_cuda.h; V = 192, 256 ...
 * as heads of 64 or 128 columns) */
static int f16_mma(const cfg *c) {
    return c->gate != DG_GATE_CHANNEL && c->chunk == 64 && (c->K == 64 || c->K == 128) && c->V % 64 == 0;
}

/* one case: GPU against the f64 recurrence; f32 runs print the CPU f32 chunked error too.
 * all_variants: every variant against the reference and against {1,1,1}. */
static void run_case(const cfg *c, int st, int all_variants) {
    data d;
    make(c, st, &d);
    res ref, got, base;
    res_alloc(c, &d, &ref), res_alloc(c, &d, &base);
    ref_f64(&d, &ref);
    const double tol = st == S_BF16 ? 5e-3 : st == S_F16 ? (f16_mma(c) ? F16_MMA_TOL : F16_TOL) : 1e-5;
    char what[160];
    if (st == S_F32) {
        res cpu;
        res_alloc(c, &d, &cpu);
        cpu_chunk_f32(&d, &var_default, &cpu);
        snprintf(what, sizeof what, "%s: CPU f32 chunked", c->name);
        printf("  %-44s", what);
        for (int a = 0; a < R_N; a++)
            if (ref.x[a]) printf(" %s %.1e", r_names[a], dg_test_rel_err_norm(cpu.x[a], ref.x[a], ref.n[a]));
        printf("\n");
        res_free(&cpu);
    }
    run_gpu(&d, st, &var_default, &base);
    snprintf(what, sizeof what, "%s: %s", c->name, st_names[st]);
    check(what, &base, &ref, tol);
    for (int vi = 0; all_variants && vi < 7; vi++) {
        const dg_dr_variant *v = &var_all[vi];
        res_alloc(c, &d, &got);
        run_gpu(&d, st, v, &got);
        snprintf(what, sizeof what, "%s: %s var %d%d%d", c->name, st_names[st],
                 v->gdn_dg_from_final, v->kda_fused, v->solve_tril_blocked);
        check(what, &got, &ref, tol);
        snprintf(what, sizeof what, "  ... against var 111");
        check(what, &got, &base, st == S_BF16 ? 2e-3 : st == S_F16 ? 2 * tol : 1e-5);
        res_free(&got);
    }
    res_free(&ref), res_free(&base), data_free(&d);
}

static const cfg f32_cases[] = {
    {"none, GVA, C16", 2, 37, 2, 4, 32, 24, DG_GATE_NONE, 16, 0, {0}, 1, 1, 0},
    {"head, C32", 2, 37, 1, 2, 64, 64, DG_GATE_HEAD, 32, 0, {0}, 1, 0, 0},
    {"channel, GVA, C64", 2, 70, 2, 4, 32, 40, DG_GATE_CHANNEL, 64, 0, {0}, 0, 1, 0},
    {"channel, varlen, C16", 1, 77, 1, 2, 48, 40, DG_GATE_CHANNEL, 16, 5, {0, 5, 5, 50, 77}, 1, 1, 0},
    {"head, K=V=128, T=300, C64", 1, 300, 1, 2, 128, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
    {"none, K=200, some grads, C32", 1, 40, 1, 1, 200, 33, DG_GATE_NONE, 32, 0, {0}, 1, 1, 1},
    {"channel, T=1, C16", 3, 1, 1, 1, 16, 8, DG_GATE_CHANNEL, 16, 0, {0}, 1, 1, 0},
    {"head, K=8, V=300, GVA, C64", 1, 70, 1, 3, 8, 300, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
};

static const cfg variant_cases[] = {
    {"head, varlen, C32 (variants)", 1, 90, 1, 2, 32, 48, DG_GATE_HEAD, 32, 4, {0, 33, 40, 90}, 1, 1, 0},
    {"channel, GVA, C64 (variants)", 1, 100, 1, 2, 32, 32, DG_GATE_CHANNEL, 64, 0, {0}, 1, 1, 0},
    {"none, C16 (variants)", 2, 40, 1, 1, 24, 16, DG_GATE_NONE, 16, 0, {0}, 0, 1, 0},
};

/* bf16: the first four take the tensor-core path, the rest the generic kernels */
static const cfg bf16_cases[] = {
    {"head, GVA, K=V=128 (mma)", 2, 150, 2, 4, 128, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
    {"none, varlen, K=V=64 (mma)", 1, 200, 1, 2, 64, 64, DG_GATE_NONE, 64, 5, {0, 64, 64, 130, 200}, 1, 1, 0},
    {"head, K=64, V=128, T=1 (mma)", 3, 1, 1, 1, 64, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
    {"head, K=128 V=64, some grads (mma)", 1, 129, 1, 1, 128, 64, DG_GATE_HEAD, 64, 0, {0}, 0, 0, 1},
    {"channel, GVA, C32", 2, 50, 1, 2, 64, 32, DG_GATE_CHANNEL, 32, 0, {0}, 1, 1, 0},
    {"head, C16", 1, 70, 1, 1, 32, 48, DG_GATE_HEAD, 16, 0, {0}, 1, 1, 0},
};

static void test_dr_chunk_f32(void **state) {
    (void)state;
    dg_test_require_cuda();
    for (size_t i = 0; i < sizeof f32_cases / sizeof f32_cases[0]; i++) run_case(&f32_cases[i], 0, 0);
}

static void test_dr_chunk_f32_variants(void **state) {
    (void)state;
    dg_test_require_cuda();
    for (size_t i = 0; i < sizeof variant_cases / sizeof variant_cases[0]; i++)
        run_case(&variant_cases[i], 0, 1);
}

static void test_dr_chunk_bf16(void **state) {
    (void)state;
    dg_test_require_cuda();
    for (size_t i = 0; i < sizeof bf16_cases / sizeof bf16_cases[0]; i++)
        run_case(&bf16_cases[i], S_BF16, i == 0 || i == 4);
}

/* case c with storage st as the call takes it and with the generic kernels forced, same inputs:
 * the two within tol of each other (what names the comparison) */
static void paths_compare(const cfg *c, int st, const char *what_kind, double tol) {
    data d;
    make(c, st, &d);
    res fast, gen;
    res_alloc(c, &d, &fast), res_alloc(c, &d, &gen);
    run_gpu(&d, st, &var_default, &fast);
    int old = dg_cuda_dr_chunk_force_generic(1);
    run_gpu(&d, st, &var_default, &gen);
    dg_cuda_dr_chunk_force_generic(old);
    char what[160];
    snprintf(what, sizeof what, "%s: %s %s", c->name, st_names[st], what_kind);
    check(what, &fast, &gen, tol);
    res_free(&fast), res_free(&gen), data_free(&d);
}

/* the tensor-core path and the generic kernels on the same bf16 inputs */
static void test_dr_chunk_bf16_paths_agree(void **state) {
    (void)state;
    dg_test_require_cuda();
    for (size_t i = 0; i < 2; i++) paths_compare(&bf16_cases[i], S_BF16, "mma vs generic", 5e-3);
}

/* Value heads wider than the tensor-core kernels take (V = R Vs, Vs in {64, 128}: R heads of Vs
 * columns on those kernels, kernels/cuda/delta/dr_chunk_vsplit.cu): against the f64 recurrence, the
 * first two against the generic kernels forced too, and the launches show that the split and the
 * tensor-core kernels ran (not the generic ones). */
static const cfg vsplit_cases[] = {
    {"head, GVA, K=64, V=256 (2 x 128)", 2, 130, 1, 2, 64, 256, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
    {"none, varlen, K=64, V=192 (3 x 64)", 1, 150, 1, 1, 64, 192, DG_GATE_NONE, 64, 4, {0, 70, 70, 150}, 1, 1, 0},
    {"channel, K=64, V=256 (2 x 128)", 1, 100, 1, 1, 64, 256, DG_GATE_CHANNEL, 64, 0, {0}, 1, 1, 0},
    {"head, K=128, V=320, some grads (5 x 64)", 1, 70, 1, 1, 128, 320, DG_GATE_HEAD, 64, 0, {0}, 1, 0, 1},
};

static int launches_of(const dg_cuda_ktime *kt, int m, const char *name) {
    for (int j = 0; j < m; j++)
        if (!strcmp(kt[j].name, name)) return kt[j].launches;
    return 0;
}

static void test_dr_chunk_vsplit(void **state) {
    (void)state;
    dg_test_require_cuda();
    for (size_t i = 0; i < sizeof vsplit_cases / sizeof vsplit_cases[0]; i++) {
        const cfg *c = &vsplit_cases[i];
        for (int st = S_BF16; st <= S_F16; st++) {
            if (st == S_F16 && c->gate == DG_GATE_CHANNEL) continue; /* (KDA in fp16: the generic kernels) */
            dg_cuda_ktime kt[32];
            int dropped = -1;
            assert_int_equal(dg_cuda_ktime_begin(), 0);
            run_case(c, st, 0);
            const int m = dg_cuda_ktime_end(kt, 32, &dropped);
            assert_int_equal(dropped, 0);
            const char *prep = c->gate == DG_GATE_CHANNEL ? "dr_chunk kda prep" : "dr_chunk mma prep";
            if (launches_of(kt, m, "dr_chunk vsplit") == 0 || launches_of(kt, m, prep) == 0)
                fail_msg("%s %s: the split (%d launches) or %s (%d) did not run", c->name, st_names[st],
                         launches_of(kt, m, "dr_chunk vsplit"), prep, launches_of(kt, m, prep));
        }
        if (i < 2) paths_compare(c, S_BF16, "split mma vs generic", 5e-3);
    }
}

/* views that start one element into their buffer (not 16-byte aligned) take the generic kernels
 * instead of the vectorised ones, with the same results */
static void test_dr_chunk_bf16_unaligned(void **state) {
    (void)state;
    dg_test_require_cuda();
    const cfg c = {"head, K=V=64, unaligned views", 1, 70, 1, 1, 64, 64, DG_GATE_HEAD, 64, 0, {0}, 1, 0, 0};
    data d;
    make(&c, S_BF16, &d);
    res ref, got;
    res_alloc(&c, &d, &ref), res_alloc(&c, &d, &got);
    ref_f64(&d, &ref);
    uint16_t *hq = malloc(sizeof(uint16_t) * (size_t)(d.nq + 1)), *ho = malloc(sizeof(uint16_t) * (size_t)(d.nv + 1));
    for (int64_t i = 0; i < d.nq; i++) hq[i + 1] = dg_bf16_from_f32((float)d.q[i]);
    uint16_t *q1 = dput(hq, d.nq + 1, 2), *o1 = dput(NULL, d.nv + 1, 2);
    void *k = dput_as(d.k, d.nq, S_BF16), *v = dput_as(d.v, d.nv, S_BF16), *beta = dput_as(d.beta, d.nb, S_BF16);
    float *g = dput_as(d.g, d.ng, S_F32), *h0 = dput_as(d.h0, d.nh, S_F32), *hT = dput(NULL, d.nh, 4);
    assert_int_equal(dg_cuda_dr_chunk_fwd_bf16(&d.s, q1 + 1, k, v, g, beta, h0, o1 + 1, hT), 0);
    assert_int_equal(dg_cuda_memcpy(ho, o1, sizeof(uint16_t) * (size_t)(d.nv + 1), 1), 0);
    for (int64_t i = 0; i < d.nv; i++) got.x[R_O][i] = dg_bf16_to_f32(ho[i + 1]);
    float *hh = malloc(sizeof(float) * (size_t)d.nh);
    assert_int_equal(dg_cuda_memcpy(hh, hT, sizeof(float) * (size_t)d.nh, 1), 0);
    for (int64_t i = 0; i < d.nh; i++) got.x[R_HT][i] = hh[i];
    double eo = dg_test_rel_err_norm(got.x[R_O], ref.x[R_O], d.nv), eh = dg_test_rel_err_norm(got.x[R_HT], ref.x[R_HT], d.nh);
    printf("  %-44s o %.1e hT %.1e\n", c.name, eo, eh);
    if (!(eo <= 5e-3) || !(eh <= 5e-3)) fail_msg("unaligned views: o %.3e, hT %.3e", eo, eh);
    free(hq), free(ho), free(hh);
    dg_cuda_free(q1), dg_cuda_free(o1), dg_cuda_free(k), dg_cuda_free(v), dg_cuda_free(beta);
    dg_cuda_free(g), dg_cuda_free(h0), dg_cuda_free(hT);
    res_free(&ref), res_free(&got), data_free(&d);
}

/* the tensor-core path over long sequences (the benchmark's S2 has T = 8192): the bf16 error of
 * the outputs and every gradient against the f64 recurrence, the same 5e-3 bound, where the state
 * has been carried across 128 chunks (errors of the stored intermediates accumulate with T) */
static void test_dr_chunk_bf16_long(void **state) {
    (void)state;
    dg_test_require_cuda();
    static const cfg longs[] = {
        {"head, K=V=128, T=8192 (mma)", 1, 8192, 1, 1, 128, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
        {"none, K=V=128, T=8192 (mma)", 1, 8192, 1, 1, 128, 128, DG_GATE_NONE, 64, 0, {0}, 1, 1, 0},
        /* many (sequence, head) pairs: the state passes take 64 value columns a block (fewer
         * take 32, as every case above on a GPU of up to 272 multiprocessors) */
        {"head, H=HV=136, K=V=128, T=70 (mma)", 1, 70, 136, 136, 128, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
    };
    for (size_t i = 0; i < sizeof longs / sizeof longs[0]; i++) run_case(&longs[i], S_BF16, 0);
    run_case(&longs[0], S_F16, 0); /* the fp16 build of the same kernels */
}

/* Short sequences over many random draws (the tensor-core path, bf16): with T = 1 the outputs are
 * a few values each (dbeta 3), so one unlucky rounding moves the relative error norm most; the
 * plain (single bf16 word) intermediates were chosen by the worst of such draws
 * (dr_chunk_mma.cuh).  The worst error of each output over the draws, printed, must stay <= 5e-3. */
static void test_dr_chunk_bf16_draws(void **state) {
    (void)state;
    dg_test_require_cuda();
    static const struct { cfg c; int draws; } cases[] = {
        {{"head, K=64, V=128, T=1", 3, 1, 1, 1, 64, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0}, 40},
        {{"none, K=64, V=128, T=1", 3, 1, 1, 1, 64, 128, DG_GATE_NONE, 64, 0, {0}, 1, 1, 0}, 40},
        {{"head, K=V=128, T=130", 1, 130, 1, 1, 128, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0}, 12},
        {{"none, K=V=128, T=130", 1, 130, 1, 1, 128, 128, DG_GATE_NONE, 64, 0, {0}, 1, 1, 0}, 12},
        /* two heads of V = 128 (dr_chunk_vsplit.cu): dbeta is their two bf16 words summed and
         * rounded again */
        {{"head, K=64, V=256, T=1 (split)", 3, 1, 1, 1, 64, 256, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0}, 40},
        {{"none, K=64, V=256, T=1 (split)", 3, 1, 1, 1, 64, 256, DG_GATE_NONE, 64, 0, {0}, 1, 1, 0}, 40},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const cfg *c = &cases[ci].c;
        double worst[R_N]; /* -1: not an output of this case */
        for (int a = 0; a < R_N; a++) worst[a] = -1;
        for (int dr = 0; dr < cases[ci].draws; dr++) {
            data d;
            make(c, S_BF16, &d);
            res ref, got;
            res_alloc(c, &d, &ref), res_alloc(c, &d, &got);
            ref_f64(&d, &ref);
            run_gpu(&d, S_BF16, &var_default, &got);
            for (int a = 0; a < R_N; a++) {
                if (!ref.x[a]) continue;
                const double e = dg_test_rel_err_norm(got.x[a], ref.x[a], ref.n[a]);
                if (!isnan(worst[a]) && !(e <= worst[a])) worst[a] = e; /* (a NaN sticks) */
            }
            res_free(&ref), res_free(&got), data_free(&d);
        }
        char msg[256];
        int off = snprintf(msg, sizeof msg, "  %-30s worst of %2d:", c->name, cases[ci].draws);
        for (int a = 0; a < R_N; a++)
            if (worst[a] != -1) off += snprintf(msg + off, sizeof msg - (size_t)off, " %s %.1e", r_names[a], worst[a]);
        printf("%s\n", msg);
        for (int a = 0; a < R_N; a++)
            if (!(worst[a] <= 5e-3)) fail_msg("%s: %s relative error %.3e > 5e-3 in one of %d draws", c->name, r_names[a], worst[a], cases[ci].draws);
    }
}

/* fp16: every gate kind, chunk 16/32/64, GVA, cu_seqlens with an empty sequence, T = 1, K = 200,
 * a partial V tile, some gradients only.  The first two take the tensor-core kernels (their fp16
 * build); the fourth has the shape of bf16's KDA tensor-core path, which fp16 calls do not take. */
static const cfg f16_cases[] = {
    {"head, GVA, K=V=128 (bf16 mma shape)", 2, 150, 2, 4, 128, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
    {"none, varlen, K=V=64 (bf16 mma shape)", 1, 200, 1, 2, 64, 64, DG_GATE_NONE, 64, 5, {0, 64, 64, 130, 200}, 1, 1, 0},
    {"channel, varlen, C16", 1, 77, 1, 2, 48, 40, DG_GATE_CHANNEL, 16, 5, {0, 5, 5, 50, 77}, 1, 1, 0},
    {"channel, GVA, K=V=64 (bf16 kda shape)", 1, 100, 1, 2, 64, 64, DG_GATE_CHANNEL, 64, 0, {0}, 1, 1, 0},
    {"head, C32, some grads", 1, 70, 1, 1, 32, 48, DG_GATE_HEAD, 32, 0, {0}, 1, 0, 1},
    {"none, K=200, C32", 1, 40, 1, 1, 200, 33, DG_GATE_NONE, 32, 0, {0}, 1, 1, 0},
    {"channel, T=1, C16", 3, 1, 1, 1, 16, 8, DG_GATE_CHANNEL, 16, 0, {0}, 1, 1, 0},
    {"head, K=8, V=300, GVA, C64", 1, 70, 1, 3, 8, 300, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
};

static void test_dr_chunk_f16(void **state) {
    (void)state;
    dg_test_require_cuda();
    for (size_t i = 0; i < sizeof f16_cases / sizeof f16_cases[0]; i++)
        run_case(&f16_cases[i], S_F16, i == 1 || i == 2);
}

/* fp16 on the tensor-core kernels and on the generic ones, same inputs: within both bounds; KDA in
 * fp16 (the fourth case, bf16's KDA tensor-core shape) takes the generic kernels: the same bits
 * with the generic path forced */
static void test_dr_chunk_f16_paths(void **state) {
    (void)state;
    dg_test_require_cuda();
    static const int which[3] = {0, 1, 3};
    for (int i = 0; i < 3; i++) {
        const cfg *c = &f16_cases[which[i]];
        if (f16_mma(c)) paths_compare(c, S_F16, "mma vs generic", F16_MMA_TOL + F16_TOL);
        else paths_compare(c, S_F16, "vs forced generic", 0.0);
    }
}

/* The L2 norm's backward taken by the chunk backward (rq, rk given): dq, dk of the raw rows against
 * the f64 reference's dq, dk put through the same formula, dx = r (dy - xn (dy . xn)) with xn the
 * stored q, k and r drawn in [0.5, 2]; bf16 and fp16, on the head-gate tensor-core kernels (folded
 * into their dq, dk stores), with grouped value heads (after the sums over value heads), on the
 * generic kernels and on KDA's (after them); the same bounds as without it. */
static void test_dr_chunk_l2_fold(void **state) {
    (void)state;
    dg_test_require_cuda();
    static const cfg cases[] = {
        {"l2 fold: head, K=V=128 (mma, direct)", 1, 130, 2, 2, 128, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
        {"l2 fold: none, GVA, K=V=64 (mma, after the sums)", 1, 100, 1, 2, 64, 64, DG_GATE_NONE, 64, 0, {0}, 1, 1, 0},
        {"l2 fold: head, C32 (generic)", 1, 70, 1, 1, 32, 48, DG_GATE_HEAD, 32, 0, {0}, 1, 1, 0},
        {"l2 fold: channel, K=V=64 (kda)", 1, 100, 1, 1, 64, 64, DG_GATE_CHANNEL, 64, 0, {0}, 1, 1, 0},
        /* value heads split (dr_chunk_vsplit.cu): the sums over the split heads come first */
        {"l2 fold: head, K=64, V=256 (split, after the sums)", 1, 100, 2, 2, 64, 256, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
        {"l2 fold: channel, K=64, V=192 (kda split)", 1, 100, 1, 1, 64, 192, DG_GATE_CHANNEL, 64, 0, {0}, 1, 1, 0},
    };
    for (int st = S_BF16; st <= S_F16; st++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            const cfg *c = &cases[ci];
            data d;
            make(c, st, &d);
            const int64_t nr = c->B * c->T * c->H;
            d.rq = rnd(nr, 0.5, 2), d.rk = rnd(nr, 0.5, 2);
            for (int64_t i = 0; i < nr; i++) d.rq[i] = (float)d.rq[i], d.rk[i] = (float)d.rk[i];
            res ref, got;
            res_alloc(c, &d, &ref), res_alloc(c, &d, &got);
            ref_f64(&d, &ref);
            for (int w = 0; w < 2; w++) { /* the reference's dq, dk of the raw rows */
                double *dy = ref.x[w ? R_DK : R_DQ];
                const double *xn = w ? d.k : d.q, *r = w ? d.rk : d.rq;
                for (int64_t i = 0; dy && i < nr; i++) {
                    double dot = 0;
                    for (int64_t cc = 0; cc < c->K; cc++) dot += dy[i * c->K + cc] * xn[i * c->K + cc];
                    for (int64_t cc = 0; cc < c->K; cc++)
                        dy[i * c->K + cc] = r[i] * (dy[i * c->K + cc] - xn[i * c->K + cc] * dot);
                }
            }
            run_gpu(&d, st, &var_default, &got);
            char what[160];
            snprintf(what, sizeof what, "%s: %s", c->name, st_names[st]);
            check(what, &got, &ref, st == S_BF16 ? 5e-3 : f16_mma(c) ? F16_MMA_TOL : F16_TOL);
            res_free(&ref), res_free(&got), data_free(&d);
        }
}

/* The forward with the L2 norm in it (dg_cuda_dr_chunk_fwd_l2_*): where the tensor-core kernels
 * normalise k and q as they load them, every output -- o, hT, the normalised q and k, their 1/|x|,
 * the kept working set -- is bit for bit that of the norm's kernel run first (the entry point with
 * dg_cuda_dr_chunk_l2_fuse(0): dg_cuda_dr_l2norm_*_fwd, then the forward), bf16 and fp16, with
 * grouped value heads (one value head writes a key head's rows), cu_seqlens with an empty sequence
 * and partial chunks, h0, the value split, and the paths that always run the norm first (KDA, the
 * generic kernels at chunk 32).  The normalised rows are also checked against the host: 1/|x| to
 * 1e-6 and each value to one rounding. */
static void test_dr_chunk_l2_fused(void **state) {
    (void)state;
    dg_test_require_cuda();
    static const cfg cases[] = {
        {"l2 fused: head, GVA, K=V=128, h0 (mma)", 1, 150, 2, 4, 128, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 0, 0},
        {"l2 fused: none, GVA, varlen, K=V=64 (mma)", 1, 200, 1, 2, 64, 64, DG_GATE_NONE, 64, 4, {0, 70, 70, 200}, 0, 0, 0},
        {"l2 fused: head, B2, K=128, V=64 (mma)", 2, 90, 1, 1, 128, 64, DG_GATE_HEAD, 64, 0, {0}, 1, 0, 0},
        {"l2 fused: head, K=64, V=256 (split)", 1, 100, 2, 2, 64, 256, DG_GATE_HEAD, 64, 0, {0}, 0, 0, 0},
        {"l2 fused: channel, K=V=64 (kda: norm first)", 1, 100, 1, 1, 64, 64, DG_GATE_CHANNEL, 64, 0, {0}, 1, 0, 0},
        {"l2 fused: head, C32, K=64 (generic: norm first)", 1, 70, 1, 1, 64, 48, DG_GATE_HEAD, 32, 0, {0}, 0, 0, 0},
    };
    const double eps = 1e-6;
    for (int st = S_BF16; st <= S_F16; st++)
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            const cfg *c = &cases[ci];
            data d;
            make(c, st, &d);
            for (int64_t i = 0; i < d.nq; i++) d.k[i] = stored(st, 3.0 * d.k[i]); /* raw rows, |k| = 3 */
            const int64_t nr = c->B * c->T * c->H;
            void *q = dput_as(d.q, d.nq, st), *k = dput_as(d.k, d.nq, st), *v = dput_as(d.v, d.nv, st);
            void *beta = dput_as(d.beta, d.nb, st);
            float *g = dput_as(d.g, d.ng, 0), *h0 = dput_as(d.h0, d.nh, 0);
            const int64_t kb = st == S_BF16 ? dg_cuda_dr_chunk_kept_bytes(&d.s) : dg_cuda_dr_chunk_kept_bytes_f16(&d.s);
            assert_true(kb >= 0);
            /* [0]: fused, [1]: the norm's kernel first, [2]: fused without qn, rq, rk, keep */
            void *o[3], *qn[3], *kn[3], *keep[3];
            float *hT[3], *rq[3], *rk[3];
            int kept[3] = {0, 0, 0};
            for (int r = 0; r < 3; r++) {
                o[r] = dput(NULL, d.nv, 2), hT[r] = dput(NULL, d.nh, 4), kn[r] = dput(NULL, d.nq, 2);
                qn[r] = r < 2 ? dput(NULL, d.nq, 2) : NULL;
                rq[r] = r < 2 ? dput(NULL, nr, 4) : NULL, rk[r] = r < 2 ? dput(NULL, nr, 4) : NULL;
                keep[r] = r < 2 && kb > 0 ? dput(NULL, kb, 1) : NULL;
                const int fuse = dg_cuda_dr_chunk_l2_fuse(r != 1);
                const int rc = (st == S_BF16 ? dg_cuda_dr_chunk_fwd_l2_bf16 : dg_cuda_dr_chunk_fwd_l2_f16)(
                    &d.s, q, k, v, g, beta, h0, o[r], hT[r], keep[r], keep[r] ? &kept[r] : NULL, eps, qn[r], kn[r],
                    rq[r], rk[r]);
                dg_cuda_dr_chunk_l2_fuse(fuse);
                if (rc) fail_msg("%s (%s), run %d: %s", c->name, st_names[st], r, dg_last_error());
            }
            assert_int_equal(dg_cuda_synchronize(), 0);
            assert_int_equal(kept[0], kept[1]);
            struct { const char *name; void *const *p; size_t bytes; int runs; } out[] = {
                {"o", o, (size_t)d.nv * 2, 3}, {"hT", (void *const *)hT, (size_t)d.nh * 4, 3},
                {"kn", kn, (size_t)d.nq * 2, 3}, {"qn", qn, (size_t)d.nq * 2, 2},
                {"rq", (void *const *)rq, (size_t)nr * 4, 2}, {"rk", (void *const *)rk, (size_t)nr * 4, 2},
                {"keep", keep, (size_t)kb, kb > 0 ? 2 : 0},
            };
            for (size_t a = 0; a < sizeof out / sizeof out[0]; a++) {
                if (out[a].runs == 0) continue;
                void *ref = dget(out[a].p[1], out[a].bytes);
                for (int r = 0; r < out[a].runs; r += r == 0 ? 2 : 1) {
                    void *got = dget(out[a].p[r], out[a].bytes);
                    if (memcmp(got, ref, out[a].bytes))
                        fail_msg("%s (%s): %s of run %d differs from the norm's kernel first", c->name, st_names[st],
                                 out[a].name, r);
                    free(got);
                }
                free(ref);
            }
            /* the normalised rows against the host */
            uint16_t *hq = dget(qn[0], (size_t)d.nq * 2), *hk = dget(kn[0], (size_t)d.nq * 2);
            float *hrq = dget(rq[0], (size_t)nr * 4), *hrk = dget(rk[0], (size_t)nr * 4);
            for (int w = 0; w < 2; w++) {
                const double *x = w ? d.k : d.q;
                const uint16_t *y = w ? hk : hq;
                const float *rr = w ? hrk : hrq;
                for (int64_t i = 0; i < nr; i++) {
                    double n2 = 0;
                    for (int64_t cc = 0; cc < c->K; cc++) n2 += x[i * c->K + cc] * x[i * c->K + cc];
                    const double r = 1.0 / sqrt(n2 + eps);
                    if (fabs(rr[i] - r) > 1e-6 * r) fail_msg("%s: 1/|x| of row %lld: %g, host %g", c->name, (long long)i, rr[i], r);
                    for (int64_t cc = 0; cc < c->K; cc++) {
                        const double want = x[i * c->K + cc] * r, got = from16(st, y[i * c->K + cc]);
                        /* one rounding (a unit in the last place: rsqrtf's own error too), fp16's
                         * subnormals below 2^-14 to 2^-25 */
                        if (fabs(got - want) > (st == S_BF16 ? 0x1p-8 : 0x1p-11) * fabs(want) + (st == S_F16 ? 0x1p-25 : 0))
                            fail_msg("%s (%s): %s[%lld, %lld] = %g, host %g", c->name, st_names[st], w ? "kn" : "qn",
                                     (long long)i, (long long)cc, got, want);
                    }
                }
            }
            free(hq), free(hk), free(hrq), free(hrk);
            for (int r = 0; r < 3; r++)
                dg_cuda_free(o[r]), dg_cuda_free(hT[r]), dg_cuda_free(qn[r]), dg_cuda_free(kn[r]), dg_cuda_free(rq[r]),
                    dg_cuda_free(rk[r]), dg_cuda_free(keep[r]);
            dg_cuda_free(q), dg_cuda_free(k), dg_cuda_free(v), dg_cuda_free(beta), dg_cuda_free(g), dg_cuda_free(h0);
            data_free(&d);
        }
}

/* small shapes through every kernel (generic and tensor-core, fused and unfused, both inverses,
 * both dg variants): the test to run under compute-sanitizer */
static void test_dr_chunk_sanitize(void **state) {
    (void)state;
    dg_test_require_cuda();
    static const cfg cases[] = {
        {"sanitize: channel, varlen, GVA, C16", 1, 40, 1, 2, 24, 40, DG_GATE_CHANNEL, 16, 4, {0, 7, 7, 40}, 1, 1, 0},
        {"sanitize: head, C32", 1, 40, 1, 1, 16, 72, DG_GATE_HEAD, 32, 0, {0}, 1, 1, 0},
    };
    static const cfg fast[] = {
        /* sequences of four chunks: the backward state pass's two slots are each filled twice */
        {"sanitize: head, varlen, K=V=64 (mma)", 1, 230, 1, 2, 64, 64, DG_GATE_HEAD, 64, 3, {0, 200, 230}, 1, 1, 0},
        {"sanitize: none, K=128, V=64 (mma)", 1, 200, 1, 1, 128, 64, DG_GATE_NONE, 64, 0, {0}, 1, 1, 0},
        /* V = 128: two value tiles per block of the state and output passes */
        {"sanitize: head, B2, K=64, V=128 (mma)", 2, 80, 1, 1, 64, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
        /* as many chains as the GPU has SMs (2 x 33 x 128 / 64 >= 132): both state passes in 64
         * value columns a block (state_bv, dhu_bv: U from device memory in f_state), four chunks */
        {"sanitize: head, B2, H33, K=64, V=128 (mma)", 2, 200, 33, 33, 64, 128, DG_GATE_HEAD, 64, 0, {0}, 1, 1, 0},
    };
    /* a value head as three of 64 columns (dr_chunk_vsplit.cu: its moves around the kernels) */
    static const cfg split = {"sanitize: head, GVA, varlen, K=64, V=192 (3 x 64)", 1, 140, 1, 2, 64, 192,
                              DG_GATE_HEAD, 64, 3, {0, 70, 140}, 1, 1, 0};
    static const dg_dr_variant v000 = {0, 0, 0};
    run_case(&cases[0], S_F16, 0); /* fp16: the generic kernels' f16bits loads and stores */
    run_case(&fast[0], S_F16, 0);  /* and the fp16 build of the tensor-core kernels */
    run_case(&split, S_BF16, 0);
    for (int i = 0; i < 4; i++) {
        for (int bf = 0; bf < 2; bf++) {
            if (!bf && i >= 2) continue;
            const cfg *c = bf ? &fast[i] : &cases[i];
            data d;
            make(c, bf, &d);
            res ref, got;
            res_alloc(c, &d, &ref);
            ref_f64(&d, &ref);
            for (int vi = 0; vi < 2; vi++) {
                res_alloc(c, &d, &got);
                run_gpu(&d, bf, vi ? &v000 : &var_default, &got);
                char what[160];
                snprintf(what, sizeof what, "%s var %s", c->name, vi ? "000" : "111");
                check(what, &got, &ref, bf ? 5e-3 : 1e-5);
                res_free(&got);
            }
            res_free(&ref), data_free(&d);
        }
    }
}

/* argument checks come before any device work: these run without a GPU too */
static void test_dr_chunk_bad_input(void **state) {
    (void)state;
    float *p = (float *)(uintptr_t)64; /* never dereferenced */
    int64_t cu[3] = {0, 5, 9};
    dg_dr_shape ok = {.B = 1, .T = 10, .H = 2, .HV = 4, .K = 16, .V = 16, .N = 1,
                      .gate = DG_GATE_NONE, .scale = 0.25, .chunk = 16};
    struct { dg_dr_shape s; const char *msg; } bad[7];
    for (int i = 0; i < 7; i++) bad[i].s = ok;
    bad[0].s.HV = 3, bad[0].msg = "multiple";
    bad[1].s.K = 300, bad[1].msg = "K = 300";
    bad[2].s.gate = DG_GATE_HEAD, bad[2].msg = "gate";
    bad[3].s.cu_seqlens = cu, bad[3].s.N = 2, bad[3].msg = "cu_seqlens"; /* ends at 9, not 10 */
    bad[4].s.cu_seqlens = cu, bad[4].s.N = 2, bad[4].s.B = 2, bad[4].s.T = 9, bad[4].msg = "B = 2";
    bad[5].s.chunk = 48, bad[5].msg = "chunk";
    bad[6].s.T = -1, bad[6].msg = "T = -1";
    for (int i = 0; i < 7; i++) {
        dg_clear_error();
        assert_int_equal(dg_cuda_dr_chunk_fwd_f32(&bad[i].s, p, p, p, NULL, p, NULL, p, NULL), -1);
        if (!strstr(dg_last_error(), bad[i].msg)) fail_msg("case %d: '%s' lacks '%s'", i, dg_last_error(), bad[i].msg);
        dg_clear_error();
        assert_int_equal(dg_cuda_dr_chunk_bwd_bf16(&bad[i].s, NULL, (uint16_t *)p, (uint16_t *)p,
                                                   (uint16_t *)p, NULL, (uint16_t *)p, NULL,
                                                   (uint16_t *)p, NULL, NULL, NULL, NULL, NULL,
                                                   NULL, NULL), -1);
        if (!strstr(dg_last_error(), bad[i].msg)) fail_msg("bwd case %d: '%s' lacks '%s'", i, dg_last_error(), bad[i].msg);
        dg_clear_error();
        assert_int_equal(dg_cuda_dr_chunk_fwd_f16(&bad[i].s, (uint16_t *)p, (uint16_t *)p, (uint16_t *)p, NULL,
                                                  (uint16_t *)p, NULL, (uint16_t *)p, NULL), -1);
        if (!strstr(dg_last_error(), bad[i].msg) || !strstr(dg_last_error(), "dr_chunk_fwd_f16"))
            fail_msg("f16 case %d: '%s' lacks '%s'", i, dg_last_error(), bad[i].msg);
    }
    uint16_t *u = (uint16_t *)p;
    dg_clear_error();
    assert_int_equal(dg_cuda_dr_chunk_fwd_l2_bf16(&ok, u, u + 8, u, NULL, u, NULL, u, NULL, NULL, NULL, 1e-6, u + 16, NULL,
                                                  NULL, NULL), -1);
    assert_true(strstr(dg_last_error(), "kn") != NULL && strstr(dg_last_error(), "fwd_l2_bf16") != NULL);
    dg_clear_error();
    assert_int_equal(dg_cuda_dr_chunk_fwd_l2_f16(&ok, u, u + 8, u, NULL, u, NULL, u, NULL, NULL, NULL, 1e-6, u, u + 16,
                                                 NULL, NULL), -1);
    assert_true(strstr(dg_last_error(), "qn overlaps") != NULL);
    dg_clear_error();
    assert_int_equal(dg_cuda_dr_chunk_fwd_l2_bf16(&ok, u, u + 8, u, NULL, u, NULL, u, NULL, NULL, NULL, -1.0, u + 24,
                                                  u + 16, NULL, NULL), -1);
    assert_true(strstr(dg_last_error(), "eps") != NULL);
    dg_clear_error();
    assert_int_equal(dg_cuda_dr_chunk_bwd_f32(&ok, NULL, p, p, p, NULL, p, NULL, p, NULL, p, p, p, p, p, NULL), -1);
    assert_true(strstr(dg_last_error(), "dg") != NULL);
    dg_clear_error();
    assert_int_equal(dg_cuda_dr_chunk_fwd_f32(&ok, NULL, p, p, NULL, p, NULL, p, NULL), -1);
    assert_true(strstr(dg_last_error(), "q is NULL") != NULL);
    dg_clear_error();
    assert_int_equal(dg_cuda_dr_chunk_fwd_f32(&ok, p, p, p, NULL, p, NULL, NULL, NULL), -1);
    assert_true(strstr(dg_last_error(), "o is NULL") != NULL);
    dg_clear_error();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dr_chunk_bad_input),
        cmocka_unit_test(test_dr_chunk_f32),
        cmocka_unit_test(test_dr_chunk_f32_variants),
        cmocka_unit_test(test_dr_chunk_bf16),
        cmocka_unit_test(test_dr_chunk_bf16_paths_agree),
        cmocka_unit_test(test_dr_chunk_vsplit),
        cmocka_unit_test(test_dr_chunk_bf16_unaligned),
        cmocka_unit_test(test_dr_chunk_bf16_long),
        cmocka_unit_test(test_dr_chunk_bf16_draws),
        cmocka_unit_test(test_dr_chunk_f16),
        cmocka_unit_test(test_dr_chunk_f16_paths),
        cmocka_unit_test(test_dr_chunk_l2_fold),
        cmocka_unit_test(test_dr_chunk_l2_fused),
        cmocka_unit_test(test_dr_chunk_sanitize),
    };
    return dg_test_run_filtered(tests);
}

#else /* no CUDA backend in this build */

int main(void) { return dg_test_main_without_cuda(); }

#endif
