/* The delta-rule kernels on raw device pointers (kernels/cuda/cuda_kernels.h, dr_pieces_cuda.h)
 * against host references on the same random inputs:
 *  - the delta-rule recurrence, forward and every gradient, each gate kind, grouped value heads,
 *    varlen with an empty sequence, h0/hT present or absent, K up to 200, several recompute
 *    stretches: against the CPU kernels (kernels/cpu/delta/dr_recurrent*.c) in f64 and f32, relative
 *    error norm <= 1e-4; bf16 storage against the f64 CPU kernel on the same rounded inputs,
 *    <= 5e-3 for bf16 outputs; the backward run twice gives identical bits;
 *  - the delta ops' 16-bit L2 norm (bf16, f16; scalar and vector kernels) against f64.
 * Outputs are poisoned with NaN before each run, so an unwritten element fails.  Tests that need
 * a GPU skip where dg_cuda_device_count() is 0; argument checks run everywhere. */
#include "tests/support/dr_shape.h"
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
#include "kernels/cpu/delta/delta_rule.h"
#include "kernels/cuda/delta/dr_pieces_cuda.h"
#include "tests/support/cuda_buffers.h"

/* ---- host helpers ---- */
static uint64_t rs = 0x9E3779B97F4A7C15ull;
static double urand(void) { return dg_test_xorshift(&rs); }
static double *rnd(int64_t n, double lo, double hi) {
    double *x = malloc(sizeof(double) * (n ? n : 1));
    for (int64_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * urand();
    return x;
}

/* ---- the delta-rule recurrence ---- */
typedef struct dr_cfg {
    const char *name;
    int64_t B, T, H, HV, K, V;
    dg_gate_kind gate;
    int ncu; /* 0, or the N+1 entries of cu */
    int64_t cu[8];
    int h0, dhT, some_grads; /* some_grads: only dk, dbeta and dh0 are asked for */
} dr_cfg;

typedef struct dr_data { /* host inputs, already rounded to what the device holds */
    dg_dr_shape s;
    int64_t nq, nv, nb, ng, nh;
    double *q, *k, *v, *g, *beta, *h0, *dout, *dhT;
} dr_data;

static void dr_make(const dr_cfg *c, int bf16, dr_data *d) {
    memset(d, 0, sizeof *d);
    d->s = dg_test_dr_shape(c->B, c->T, c->H, c->HV, c->K, c->V, c->cu, c->ncu, c->gate, 16);
    const int64_t BT = c->B * c->T;
    d->nq = BT * c->H * c->K, d->nv = BT * c->HV * c->V, d->nb = BT * c->HV;
    d->ng = c->gate == DG_GATE_NONE ? 0 : c->gate == DG_GATE_HEAD ? BT * c->HV : BT * c->HV * c->K;
    d->nh = d->s.N * c->HV * c->K * c->V;
    d->q = rnd(d->nq, -1, 1), d->k = rnd(d->nq, -1, 1), d->v = rnd(d->nv, -1, 1);
    d->beta = rnd(d->nb, 0.1, 0.9), d->dout = rnd(d->nv, -1, 1);
    d->g = d->ng ? rnd(d->ng, -0.8, -0.02) : NULL;
    d->h0 = c->h0 ? rnd(d->nh, -1, 1) : NULL;
    d->dhT = c->dhT ? rnd(d->nh, -1, 1) : NULL;
    for (int64_t r = 0; r < BT * c->H; r++) { /* unit keys, as the layers feed them */
        double n2 = 0;
        for (int64_t i = 0; i < c->K; i++) n2 += d->k[r * c->K + i] * d->k[r * c->K + i];
        for (int64_t i = 0; i < c->K; i++) d->k[r * c->K + i] /= sqrt(n2);
    }
    /* round: bf16 storage for q, k, v, beta, dout in the bf16 run; f32 otherwise and for the rest */
    double *lo[5] = {d->q, d->k, d->v, d->beta, d->dout};
    int64_t nlo[5] = {d->nq, d->nq, d->nv, d->nb, d->nv};
    for (int a = 0; a < 5; a++)
        for (int64_t i = 0; i < nlo[a]; i++)
            lo[a][i] = bf16 ? dg_bf16_to_f32(dg_bf16_from_f32((float)lo[a][i])) : (float)lo[a][i];
    double *hi[3] = {d->g, d->h0, d->dhT};
    int64_t nhi[3] = {d->ng, d->nh, d->nh};
    for (int a = 0; a < 3; a++)
        for (int64_t i = 0; hi[a] && i < nhi[a]; i++) hi[a][i] = (float)hi[a][i];
}

static void dr_free(dr_data *d) {
    free(d->q), free(d->k), free(d->v), free(d->g), free(d->beta), free(d->h0), free(d->dout), free(d->dhT);
}

/* the results of one run, as doubles: o, hT, dq, dk, dv, dg, dbeta, dh0 */
enum { R_O, R_HT, R_DQ, R_DK, R_DV, R_DG, R_DB, R_DH0, R_N };
static const char *const r_names[R_N] = {"o", "hT", "dq", "dk", "dv", "dg", "dbeta", "dh0"};
typedef struct dr_res {
    double *x[R_N];
    int64_t n[R_N];
} dr_res;

static void res_alloc(const dr_cfg *c, const dr_data *d, dr_res *r) {
    int64_t n[R_N] = {d->nv, d->nh, d->nq, d->nq, d->nv, d->ng, d->nb, d->h0 ? d->nh : 0};
    int want[R_N] = {1, 1, !c->some_grads, 1, !c->some_grads, !c->some_grads && d->ng, 1, d->h0 != NULL};
    for (int i = 0; i < R_N; i++) {
        r->n[i] = want[i] ? n[i] : 0;
        r->x[i] = want[i] ? calloc(n[i] ? n[i] : 1, sizeof(double)) : NULL;
    }
}
static void res_free(dr_res *r) {
    for (int i = 0; i < R_N; i++) free(r->x[i]);
}

/* the CPU kernels, f64 or f32 */
static void dr_cpu(const dr_data *d, int f32, dr_res *r) {
    if (!f32) {
        assert_int_equal(dg_dr_recurrent_fwd_f64(&d->s, d->q, d->k, d->v, d->g, d->beta, d->h0, r->x[R_O], r->x[R_HT]),
                         0);
        assert_int_equal(dg_dr_recurrent_bwd_f64(&d->s, d->q, d->k, d->v, d->g, d->beta, d->h0, d->dout, d->dhT,
                                                 r->x[R_DQ], r->x[R_DK], r->x[R_DV], r->x[R_DG], r->x[R_DB],
                                                 r->x[R_DH0]),
                         0);
        return;
    }
    const double *in[8] = {d->q, d->k, d->v, d->g, d->beta, d->h0, d->dout, d->dhT};
    int64_t nin[8] = {d->nq, d->nq, d->nv, d->ng, d->nb, d->nh, d->nv, d->nh};
    float *fi[8], *fo[R_N];
    for (int a = 0; a < 8; a++) {
        fi[a] = in[a] ? malloc(sizeof(float) * (nin[a] ? nin[a] : 1)) : NULL;
        for (int64_t i = 0; fi[a] && i < nin[a]; i++) fi[a][i] = (float)in[a][i];
    }
    for (int a = 0; a < R_N; a++) fo[a] = r->x[a] ? malloc(sizeof(float) * (r->n[a] ? r->n[a] : 1)) : NULL;
    assert_int_equal(dg_dr_recurrent_fwd_f32(&d->s, fi[0], fi[1], fi[2], fi[3], fi[4], fi[5], fo[R_O], fo[R_HT]), 0);
    assert_int_equal(dg_dr_recurrent_bwd_f32(&d->s, fi[0], fi[1], fi[2], fi[3], fi[4], fi[5], fi[6], fi[7], fo[R_DQ],
                                             fo[R_DK], fo[R_DV], fo[R_DG], fo[R_DB], fo[R_DH0]),
                     0);
    for (int a = 0; a < R_N; a++) {
        for (int64_t i = 0; fo[a] && i < r->n[a]; i++) r->x[a][i] = fo[a][i];
        free(fo[a]);
    }
    for (int a = 0; a < 8; a++) free(fi[a]);
}

/* the CUDA kernels: bf16 = 0 (f32 storage) or 1 (bf16 storage for q k v beta o dout and their
 * gradients); the backward runs twice and must give the same bits */
static void dr_gpu(const dr_data *d, int bf16, dr_res *r) {
    const dg_dtype lo = bf16 ? DG_BF16 : DG_F32;
    const dg_dtype rt[R_N] = {lo, DG_F32, lo, lo, lo, DG_F32, lo, DG_F32};
    void *q = dput_as(d->q, d->nq, lo), *k = dput_as(d->k, d->nq, lo), *v = dput_as(d->v, d->nv, lo),
         *beta = dput_as(d->beta, d->nb, lo), *dout = dput_as(d->dout, d->nv, lo);
    float *g = dput_as(d->g, d->ng, DG_F32), *h0 = dput_as(d->h0, d->nh, DG_F32), *dhT = dput_as(d->dhT, d->nh, DG_F32);
    void *o[R_N], *o2[R_N];
    for (int a = 0; a < R_N; a++) {
        o[a] = r->x[a] ? dput(NULL, r->n[a], dg_dtype_size(rt[a])) : NULL;
        o2[a] = r->x[a] && a >= R_DQ ? dput(NULL, r->n[a], dg_dtype_size(rt[a])) : NULL;
    }
    for (int rep = 0; rep < 2; rep++) {
        void **w = rep ? o2 : o;
        if (bf16) {
            if (!rep) assert_int_equal(dg_cuda_dr_recurrent_fwd_bf16(&d->s, q, k, v, g, beta, h0, o[R_O], o[R_HT]), 0);
            assert_int_equal(dg_cuda_dr_recurrent_bwd_bf16(&d->s, q, k, v, g, beta, h0, dout, dhT, w[R_DQ], w[R_DK],
                                                           w[R_DV], w[R_DG], w[R_DB], w[R_DH0]),
                             0);
        } else {
            if (!rep) assert_int_equal(dg_cuda_dr_recurrent_fwd_f32(&d->s, q, k, v, g, beta, h0, o[R_O], o[R_HT]), 0);
            assert_int_equal(dg_cuda_dr_recurrent_bwd_f32(&d->s, q, k, v, g, beta, h0, dout, dhT, w[R_DQ], w[R_DK],
                                                          w[R_DV], w[R_DG], w[R_DB], w[R_DH0]),
                             0);
        }
    }
    assert_int_equal(dg_cuda_synchronize(), 0);
    for (int a = 0; a < R_N; a++) {
        if (!o[a]) continue;
        double *x = dget_d(o[a], r->n[a], rt[a]);
        memcpy(r->x[a], x, sizeof(double) * r->n[a]);
        free(x);
        if (o2[a]) {
            size_t bytes = (size_t)r->n[a] * dg_dtype_size(rt[a]);
            void *h1 = dget(o[a], r->n[a], dg_dtype_size(rt[a])), *h2 = dget(o2[a], r->n[a], dg_dtype_size(rt[a]));
            if (memcmp(h1, h2, bytes)) fail_msg("%s differs between two identical backward runs", r_names[a]);
            free(h1), free(h2);
        }
        dg_cuda_free(o[a]), dg_cuda_free(o2[a]);
    }
    dg_cuda_free(q), dg_cuda_free(k), dg_cuda_free(v), dg_cuda_free(beta), dg_cuda_free(dout);
    dg_cuda_free(g), dg_cuda_free(h0), dg_cuda_free(dhT);
}

static const dr_cfg dr_cases[] = {
    {"none, GVA", 2, 37, 2, 4, 32, 24, DG_GATE_NONE, 0, {0}, 1, 1, 0},
    {"head", 2, 37, 1, 2, 64, 64, DG_GATE_HEAD, 0, {0}, 1, 0, 0},
    {"channel, GVA", 2, 37, 2, 4, 32, 40, DG_GATE_CHANNEL, 0, {0}, 0, 1, 0},
    {"channel, varlen", 1, 77, 1, 2, 48, 40, DG_GATE_CHANNEL, 5, {0, 5, 5, 50, 77}, 1, 1, 0},
    {"head, K=V=128, T=300", 1, 300, 1, 2, 128, 128, DG_GATE_HEAD, 0, {0}, 1, 1, 0},
    {"none, K=200, some grads", 1, 20, 1, 1, 200, 33, DG_GATE_NONE, 0, {0}, 1, 1, 1},
    {"channel, T=1", 3, 1, 1, 1, 16, 8, DG_GATE_CHANNEL, 0, {0}, 1, 1, 0},
    {"head, K=8, V=300, GVA", 1, 40, 1, 3, 8, 300, DG_GATE_HEAD, 0, {0}, 1, 1, 0},
};

static void dr_run(int bf16) {
    for (size_t ci = 0; ci < sizeof dr_cases / sizeof dr_cases[0]; ci++) {
        const dr_cfg *c = &dr_cases[ci];
        dr_data d;
        dr_make(c, bf16, &d);
        dr_res ref, cpu32, got;
        res_alloc(c, &d, &ref), res_alloc(c, &d, &cpu32), res_alloc(c, &d, &got);
        dr_cpu(&d, 0, &ref);
        if (!bf16) dr_cpu(&d, 1, &cpu32);
        dr_gpu(&d, bf16, &got);
        printf("  %-26s %s rel err vs CPU f64:", c->name, bf16 ? "bf16" : "f32 ");
        for (int a = 0; a < R_N; a++) {
            if (!ref.x[a]) continue;
            double e = dg_test_rel_err_norm(got.x[a], ref.x[a], ref.n[a]);
            printf(" %s %.1e", r_names[a], e);
            /* bf16 outputs carry their rounding (2^-9 relative per element) */
            int rounded = bf16 && a != R_HT && a != R_DG && a != R_DH0;
            double tol = rounded ? 5e-3 : 1e-4;
            if (!(e <= tol))
                fail_msg("%s (%s): %s relative error %.3e > %.0e", c->name, bf16 ? "bf16" : "f32", r_names[a], e, tol);
            if (!bf16) {
                double e32 = dg_test_rel_err_norm(got.x[a], cpu32.x[a], ref.n[a]);
                if (!(e32 <= 1e-4))
                    fail_msg("%s: %s differs from the CPU f32 kernel by %.3e", c->name, r_names[a], e32);
            }
        }
        printf("\n");
        res_free(&ref), res_free(&cpu32), res_free(&got), dr_free(&d);
    }
}

static void test_dr_recurrent_f32(void **state) {
    (void)state;
    REQUIRE_GPU();
    dr_run(0);
}

static void test_dr_recurrent_bf16(void **state) {
    (void)state;
    REQUIRE_GPU();
    dr_run(1);
}

/* The 16-bit L2 norm of the delta ops (dr_pieces_cuda.h), bf16 and f16, rows of D = 32, 200 (the
 * scalar kernels), 128, 256, 512 (the 8-byte vector kernels), 64 (the forward's 4-byte vector
 * kernel; its backward the scalar one) and 128 at an address 2 bytes off (the scalar ones again): y and dx against the f64 formulas on the same 16-bit x, dy; relative error
 * norm <= u + 1e-5 (u = 2^-8 bf16, 2^-11 f16: each output is rounded once, the arithmetic is
 * f32), r against f64 <= 1e-5. */
static void test_dr_l2norm16(void **state) {
    (void)state;
    REQUIRE_GPU();
    static const int64_t Ds[7] = {32, 200, 128, 256, 512, 64, 128};
    const int64_t N = 37;
    const double eps = 1e-6;
    for (int f16 = 0; f16 < 2; f16++) {
        const dg_dtype dt = f16 ? DG_F16 : DG_BF16;
        const double tol = (f16 ? 1.0 / 2048 : 1.0 / 256) + 1e-5;
        for (int di = 0; di < 7; di++) {
            const int64_t D = Ds[di], n = N * D, off = di == 6 ? 1 : 0;
            double *x = rnd(n + off, -1, 1), *dy = rnd(n + off, -1, 1);
            uint16_t *dx16 = dput_as(x, n + off, dt), *ddy = dput_as(dy, n + off, dt);
            double *xs = dget_d(dx16, n + off, dt), *dys = dget_d(ddy, n + off, dt); /* the rounded values */
            uint16_t *y = dput(NULL, n + off, 2), *gx = dput(NULL, n + off, 2);
            float *r = dput(NULL, N, 4);
            assert_int_equal(
                (f16 ? dg_cuda_dr_l2norm_f16_fwd : dg_cuda_dr_l2norm_bf16_fwd)(N, D, dx16 + off, eps, y + off, r), 0);
            assert_int_equal((f16 ? dg_cuda_dr_l2norm_f16_bwd : dg_cuda_dr_l2norm_bf16_bwd)(N, D, dx16 + off, r,
                                                                                            ddy + off, gx + off),
                             0);
            double *yg = dget_d(y, n + off, dt), *gg = dget_d(gx, n + off, dt), *rg = dget_d(r, N, DG_F32);
            double *yr = malloc(sizeof(double) * (size_t)n), *gr = malloc(sizeof(double) * (size_t)n);
            double *rr = malloc(sizeof(double) * (size_t)N);
            for (int64_t i = 0; i < N; i++) {
                const double *xi = xs + off + i * D, *gi = dys + off + i * D;
                double ss = 0, dot = 0;
                for (int64_t d = 0; d < D; d++) ss += xi[d] * xi[d], dot += gi[d] * xi[d];
                const double ri = 1.0 / sqrt(ss + eps);
                rr[i] = ri;
                for (int64_t d = 0; d < D; d++) {
                    yr[i * D + d] = xi[d] * ri;
                    gr[i * D + d] = ri * (gi[d] - xi[d] * ri * ri * dot);
                }
            }
            char what[96];
            snprintf(what, sizeof what, "l2norm %s D=%lld%s: y", dg_dtype_name(dt), (long long)D,
                     off ? " (unaligned)" : "");
            CHECK_REL(what, yg + off, yr, n, tol);
            snprintf(what, sizeof what, "l2norm %s D=%lld%s: dx", dg_dtype_name(dt), (long long)D,
                     off ? " (unaligned)" : "");
            CHECK_REL(what, gg + off, gr, n, tol);
            snprintf(what, sizeof what, "l2norm %s D=%lld%s: r", dg_dtype_name(dt), (long long)D,
                     off ? " (unaligned)" : "");
            CHECK_REL(what, rg, rr, N, 1e-5);
            free(x), free(dy), free(xs), free(dys), free(yg), free(gg), free(rg), free(yr), free(gr), free(rr);
            dg_cuda_free(dx16), dg_cuda_free(ddy), dg_cuda_free(y), dg_cuda_free(gx), dg_cuda_free(r);
        }
    }
}

/* argument checks come before any device work: these run without a GPU too */
static void test_dr_bad_input(void **state) {
    (void)state;
    float *p = (float *)(uintptr_t)64; /* never dereferenced */
    int64_t cu[3] = {0, 5, 9};
    dg_dr_shape ok = {.B = 1, .T = 10, .H = 2, .HV = 4, .K = 16, .V = 16, .N = 1, .gate = DG_GATE_NONE, .scale = 0.25};
    struct {
        dg_dr_shape s;
        const float *g;
        const char *msg;
    } bad[5];
    for (int i = 0; i < 5; i++) bad[i].s = ok, bad[i].g = NULL;
    bad[0].s.HV = 3, bad[0].msg = "multiple";
    bad[1].s.K = 600, bad[1].msg = "K=600";
    bad[2].s.gate = DG_GATE_HEAD, bad[2].msg = "gate";
    bad[3].s.cu_seqlens = cu, bad[3].s.N = 2, bad[3].msg = "cu_seqlens"; /* ends at 9, not 10 */
    bad[4].s.cu_seqlens = cu, bad[4].s.N = 2, bad[4].s.B = 2, bad[4].s.T = 9, bad[4].msg = "B = 1";
    for (int i = 0; i < 5; i++) {
        dg_clear_error();
        assert_int_equal(dg_cuda_dr_recurrent_fwd_f32(&bad[i].s, p, p, p, bad[i].g, p, NULL, p, NULL), -1);
        if (!strstr(dg_last_error(), bad[i].msg)) fail_msg("case %d: '%s' lacks '%s'", i, dg_last_error(), bad[i].msg);
        dg_clear_error();
        assert_int_equal(
            dg_cuda_dr_recurrent_bwd_f32(&bad[i].s, p, p, p, bad[i].g, p, NULL, p, NULL, p, p, p, NULL, p, NULL), -1);
        if (!strstr(dg_last_error(), bad[i].msg))
            fail_msg("bwd case %d: '%s' lacks '%s'", i, dg_last_error(), bad[i].msg);
    }
    dg_clear_error();
    ok.gate = DG_GATE_NONE;
    assert_int_equal(dg_cuda_dr_recurrent_bwd_f32(&ok, p, p, p, NULL, p, NULL, p, NULL, p, p, p, p, p, NULL), -1);
    assert_true(strstr(dg_last_error(), "dg") != NULL);
    dg_clear_error();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dr_bad_input),
        cmocka_unit_test(test_dr_recurrent_f32),
        cmocka_unit_test(test_dr_recurrent_bf16),
        cmocka_unit_test(test_dr_l2norm16),
    };
    /* DG_TEST_FILTER=test_dr* runs a subset (for compute-sanitizer's slower tools) */
    return dg_test_run_filtered(tests);
}

#else /* no CUDA backend in this build */

int main(void) { return dg_test_main_without_cuda(); }

#endif
