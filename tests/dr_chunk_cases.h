/* The helpers of test_cuda_dr_chunk.c (its only includer): random cases and their host data, the
 * f64 recurrence and the CPU f32 chunked kernel as references, the CUDA kernels run through the
 * call descriptor (run_gpu: twice, the second from the kept working set, same bits required) and
 * the error check.  Static functions of one test program: C, not a library. */
#ifndef DG_TESTS_DR_CHUNK_CASES_H
#define DG_TESTS_DR_CHUNK_CASES_H

#include "tests/support/dr_shape.h"
#include "core/f16.h"
#include "core/internal.h"
#include "kernels/cpu/delta/delta_rule.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/dr_chunk_call.h"
#include "tests/dr_chunk_tol.h"

static bool g_force_generic; /* run_gpu's calls take the generic kernels */

/* ---- host helpers ---- */
/* the stream's start (each test of test_cuda_dr_chunk.c restarts it) */
#define RS0 0x2545F4914F6CDD1Dull
static uint64_t rs = RS0;
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
    d->s = dg_test_dr_shape(c->B, c->T, c->H, c->HV, c->K, c->V, c->cu, c->ncu, c->gate, c->chunk);
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
        for (int64_t i = 0; i < nlo[a]; i++) lo[a][i] = stored(st, lo[a][i]);
    double *hi[3] = {d->g, d->h0, d->dhT};
    int64_t nhi[3] = {d->ng, d->nh, d->nh};
    for (int a = 0; a < 3; a++)
        for (int64_t i = 0; hi[a] && i < nhi[a]; i++) hi[a][i] = (float)hi[a][i];
}

static void data_free(data *d) {
    free(d->q), free(d->k), free(d->v), free(d->g), free(d->beta), free(d->h0), free(d->dout), free(d->dhT),
        free(d->rq), free(d->rk);
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
    assert_int_equal(dg_dr_recurrent_fwd_f64(&d->s, d->q, d->k, d->v, d->g, d->beta, d->h0, r->x[R_O], r->x[R_HT]), 0);
    assert_int_equal(dg_dr_recurrent_bwd_f64(&d->s, d->q, d->k, d->v, d->g, d->beta, d->h0, d->dout, d->dhT, r->x[R_DQ],
                                             r->x[R_DK], r->x[R_DV], r->x[R_DG], r->x[R_DB], r->x[R_DH0]),
                     0);
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
    for (int a = 0; a < R_N; a++) fo[a] = r->x[a] ? malloc(sizeof(float) * (size_t)(r->n[a] ? r->n[a] : 1)) : NULL;
    assert_int_equal(dg_dr_chunk_fwd_f32(&d->s, fi[0], fi[1], fi[2], fi[3], fi[4], fi[5], fo[R_O], fo[R_HT]), 0);
    assert_int_equal(dg_dr_chunk_bwd_f32(&d->s, var, fi[0], fi[1], fi[2], fi[3], fi[4], fi[5], fi[6], fi[7], fo[R_DQ],
                                         fo[R_DK], fo[R_DV], fo[R_DG], fo[R_DB], fo[R_DH0]),
                     0);
    for (int a = 0; a < R_N; a++) {
        for (int64_t i = 0; fo[a] && i < r->n[a]; i++) r->x[a][i] = fo[a][i];
        free(fo[a]);
    }
    for (int a = 0; a < 8; a++) free(fi[a]);
}

/* the CUDA kernels with storage st for q k v beta o dout and their gradients.  Forward and
 * backward run twice and must give the same bits; with 16-bit storage on the tensor-core paths the
 * second forward keeps its working set (the call's keep) and the second backward runs from it
 * instead of recomputing it.  g_force_generic: the generic kernels (the call's force_generic). */
static void run_gpu(const data *d, int st, const dg_dr_variant *var, res *r) {
    const int bf16 = st == S_BF16, f16 = st == S_F16;
    const size_t lo = st != S_F32 ? 2 : 4;
    const size_t esz[R_N] = {lo, 4, lo, lo, lo, 4, lo, 4};
    void *q = dput_as(d->q, d->nq, st), *k = dput_as(d->k, d->nq, st), *v = dput_as(d->v, d->nv, st),
         *beta = dput_as(d->beta, d->nb, st), *dout = dput_as(d->dout, d->nv, st);
    float *g = dput_as(d->g, d->ng, 0), *h0 = dput_as(d->h0, d->nh, 0), *dhT = dput_as(d->dhT, d->nh, 0);
    const int64_t nr = d->s.B * d->s.T * d->s.H;
    float *rq = d->rq ? dput_as(d->rq, nr, 0) : NULL, *rk = d->rk ? dput_as(d->rk, nr, 0) : NULL;
    void *o[R_N], *o2[R_N];
    for (int a = 0; a < R_N; a++) {
        o[a] = r->x[a] ? dput(NULL, r->n[a], esz[a]) : NULL;
        o2[a] = r->x[a] ? dput(NULL, r->n[a], esz[a]) : NULL;
    }
    const dg_dtype dt = bf16 ? DG_BF16 : f16 ? DG_F16 : DG_F32;
    const dg_delta_call base = {.op = "test",
                                .s = d->s,
                                .dtype = dt,
                                .device = DG_CUDA,
                                .bwd = drc_flags(var),
                                .q = q,
                                .k = k,
                                .v = v,
                                .g = g,
                                .beta = beta,
                                .h0 = h0,
                                .dout = dout,
                                .dhT = dhT,
                                .force_generic = g_force_generic,
                                .l2 = {.on = rq != NULL, .rq = rq, .rk = rk}};
    dg_delta_call fc = base;
    fc.o = o[R_O], fc.hT = o[R_HT], fc.l2.on = false; /* (the forward of normalised rows: rq, rk are the backward's) */
    const int64_t keep_bytes = drc_kept_bytes(&fc);
    if (keep_bytes < 0) fail_msg("kept_bytes failed: %s", dg_last_error());
    void *keep = keep_bytes > 0 ? dput(NULL, keep_bytes, 1) : NULL;
    bool kept = false;
    for (int rep = 0; rep < 2; rep++) {
        void **w = rep ? o2 : o;
        fc.o = w[R_O], fc.hT = w[R_HT], fc.keep = rep ? keep : NULL;
        if (drc_fwd(&fc)) fail_msg("forward failed: %s", dg_last_error());
        if (rep) kept = fc.kept;
    }
    if (keep && !kept) fail_msg("kept_bytes is %lld but the forward kept nothing", (long long)keep_bytes);
    for (int rep = 0; rep < 2; rep++) {
        void **w = rep ? o2 : o;
        dg_delta_call bc = base;
        bc.dq = w[R_DQ], bc.dk = w[R_DK], bc.dv = w[R_DV], bc.dg = w[R_DG], bc.dbeta = w[R_DB], bc.dh0 = w[R_DH0];
        bc.keep = rep ? keep : NULL, bc.kept = rep && keep;
        if (drc_bwd(&bc)) fail_msg("backward failed: %s", dg_last_error());
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

#endif
