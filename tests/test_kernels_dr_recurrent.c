/* The token-by-token delta-rule kernels (kernels/cpu/delta/dr_recurrent*.c) and the gate kernels
 * (kernels/cpu/delta/gate.c) on raw arrays:
 *  - the forward against a naive matrix-form recurrence written independently here;
 *  - every gradient of the hand-written backward against central finite differences in f64, for
 *    each gate kind, grouped value heads, varlen (with an empty sequence), h0/hT present or not, T=1,
 *    and sequences long enough for several recompute segments;
 *  - f32 against f64;
 *  - the gate forward and backward against finite differences. */
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

#include "kernels/cpu/delta/delta_rule.h"
#include "kernels/cpu/delta/gate.h"
#include "tests/support/test_support.h"

/* ---- small deterministic generator (independent of the runtime) ---- */
static uint64_t rs = 88172645463325252ull;
static double urand(void) { return dg_test_xorshift(&rs); }
static void fill(double *x, int64_t n, double lo, double hi) {
    for (int64_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * urand();
}

typedef struct cfg {
    const char *name;
    int64_t B, T, H, HV, K, V;
    dg_gate_kind gate;
    int ncu; /* 0: no cu_seqlens; else N+1 entries in cu */
    int64_t cu[8];
    int h0, hT;
} cfg;

typedef struct prob {
    dg_dr_shape s;
    int64_t nq, nv, nb, ng, nh;
    double *q, *k, *v, *g, *beta, *h0, *wo, *wh;
} prob;

static void prob_make(const cfg *c, prob *p) {
    memset(p, 0, sizeof *p);
    p->s = dg_test_dr_shape(c->B, c->T, c->H, c->HV, c->K, c->V, c->cu, c->ncu, c->gate, 16);
    const int64_t BT = c->B * c->T;
    p->nq = BT * c->H * c->K;
    p->nv = BT * c->HV * c->V;
    p->nb = BT * c->HV;
    p->ng = c->gate == DG_GATE_NONE ? 0 : c->gate == DG_GATE_HEAD ? BT * c->HV : BT * c->HV * c->K;
    p->nh = p->s.N * c->HV * c->K * c->V;
    p->q = malloc(sizeof(double) * p->nq);
    p->k = malloc(sizeof(double) * p->nq);
    p->v = malloc(sizeof(double) * p->nv);
    p->wo = malloc(sizeof(double) * p->nv);
    p->beta = malloc(sizeof(double) * p->nb);
    p->g = p->ng ? malloc(sizeof(double) * p->ng) : NULL;
    p->h0 = c->h0 ? malloc(sizeof(double) * p->nh) : NULL;
    p->wh = c->hT ? malloc(sizeof(double) * p->nh) : NULL;
    fill(p->q, p->nq, -1, 1);
    fill(p->k, p->nq, -0.7, 0.7);
    fill(p->v, p->nv, -1, 1);
    fill(p->wo, p->nv, -1, 1);
    fill(p->beta, p->nb, 0.1, 0.9);
    if (p->g) fill(p->g, p->ng, -0.8, -0.02);
    if (p->h0) fill(p->h0, p->nh, -1, 1);
    if (p->wh) fill(p->wh, p->nh, -1, 1);
}

static void prob_free(prob *p) {
    free(p->q), free(p->k), free(p->v), free(p->wo), free(p->beta), free(p->g), free(p->h0), free(p->wh);
}

/* loss = sum(o * wo) + sum(hT * wh) */
static double loss(const prob *p) {
    double *o = malloc(sizeof(double) * p->nv);
    double *hT = p->wh ? malloc(sizeof(double) * p->nh) : NULL;
    assert_int_equal(dg_dr_recurrent_fwd_f64(&p->s, p->q, p->k, p->v, p->g, p->beta, p->h0, o, hT), 0);
    double l = 0;
    for (int64_t i = 0; i < p->nv; i++) l += o[i] * p->wo[i];
    if (hT)
        for (int64_t i = 0; i < p->nh; i++) l += hT[i] * p->wh[i];
    free(o);
    free(hT);
    return l;
}

static double max_fd_err(prob *p, double *x, int64_t n, const double *grad, const char *what, const char *cname) {
    const double h = 1e-5;
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        const double x0 = x[i];
        x[i] = x0 + h;
        const double lp = loss(p);
        x[i] = x0 - h;
        const double lm = loss(p);
        x[i] = x0;
        const double fd = (lp - lm) / (2 * h);
        const double err = fabs(fd - grad[i]) / (1e-6 + fabs(fd));
        if (err > worst) worst = err;
        if (err > 1e-6) {
            fprintf(stderr, "%s: d%s[%ld] analytic %.12g finite difference %.12g\n", cname, what, (long)i, grad[i], fd);
            break;
        }
    }
    return worst;
}

static void check_cfg(const cfg *c) {
    prob p;
    prob_make(c, &p);
    double *dq = malloc(sizeof(double) * p.nq), *dk = malloc(sizeof(double) * p.nq);
    double *dv = malloc(sizeof(double) * p.nv), *db = malloc(sizeof(double) * p.nb);
    double *dg = p.ng ? malloc(sizeof(double) * p.ng) : NULL;
    double *dh0 = p.h0 ? malloc(sizeof(double) * p.nh) : NULL;
    assert_int_equal(
        dg_dr_recurrent_bwd_f64(&p.s, p.q, p.k, p.v, p.g, p.beta, p.h0, p.wo, p.wh, dq, dk, dv, dg, db, dh0), 0);
    double e = 0, w;
    e = fmax(e, w = max_fd_err(&p, p.q, p.nq, dq, "q", c->name));
    e = fmax(e, w = max_fd_err(&p, p.k, p.nq, dk, "k", c->name));
    e = fmax(e, w = max_fd_err(&p, p.v, p.nv, dv, "v", c->name));
    e = fmax(e, w = max_fd_err(&p, p.beta, p.nb, db, "beta", c->name));
    if (dg) e = fmax(e, w = max_fd_err(&p, p.g, p.ng, dg, "g", c->name));
    if (dh0) e = fmax(e, w = max_fd_err(&p, p.h0, p.nh, dh0, "h0", c->name));
    printf("  %-28s max rel err vs finite differences %.2e\n", c->name, e);
    assert_true(e < 1e-6);

    /* NULL gradient pointers leave the others unchanged */
    double *dk2 = malloc(sizeof(double) * p.nq);
    assert_int_equal(
        dg_dr_recurrent_bwd_f64(&p.s, p.q, p.k, p.v, p.g, p.beta, p.h0, p.wo, p.wh, NULL, dk2, NULL, NULL, NULL, NULL),
        0);
    assert_memory_equal(dk, dk2, sizeof(double) * p.nq);
    free(dk2);
    free(dq), free(dk), free(dv), free(db), free(dg), free(dh0);
    prob_free(&p);
}

static void test_fd_deltanet(void **st) {
    (void)st;
    cfg c = {"deltanet", 2, 5, 2, 2, 3, 4, DG_GATE_NONE, 0, {0}, 1, 1};
    check_cfg(&c);
    cfg c2 = {"deltanet no h0/hT", 1, 4, 1, 1, 3, 2, DG_GATE_NONE, 0, {0}, 0, 0};
    check_cfg(&c2);
}

static void test_fd_gdn(void **st) {
    (void)st;
    cfg c = {"gdn", 2, 6, 1, 1, 3, 3, DG_GATE_HEAD, 0, {0}, 1, 1};
    check_cfg(&c);
    cfg c2 = {"gdn gva HV=3H, h0 only", 1, 5, 2, 6, 2, 3, DG_GATE_HEAD, 0, {0}, 1, 0};
    check_cfg(&c2);
    cfg c3 = {"gdn hT only, long (segments)", 1, 19, 1, 2, 2, 2, DG_GATE_HEAD, 0, {0}, 0, 1};
    check_cfg(&c3);
}

static void test_fd_kda(void **st) {
    (void)st;
    cfg c = {"kda", 2, 5, 1, 1, 4, 3, DG_GATE_CHANNEL, 0, {0}, 1, 1};
    check_cfg(&c);
    cfg c2 = {"kda gva HV=2H", 1, 6, 2, 4, 3, 2, DG_GATE_CHANNEL, 0, {0}, 1, 1};
    check_cfg(&c2);
}

static void test_fd_varlen(void **st) {
    (void)st;
    cfg c = {"gdn varlen (empty seq)", 1, 9, 1, 2, 3, 2, DG_GATE_HEAD, 4, {0, 4, 4, 9}, 1, 1};
    check_cfg(&c);
    cfg c2 = {"kda varlen gva", 1, 7, 1, 2, 2, 3, DG_GATE_CHANNEL, 3, {0, 2, 7}, 1, 1};
    check_cfg(&c2);
    cfg c3 = {"deltanet varlen", 1, 6, 2, 2, 2, 2, DG_GATE_NONE, 3, {0, 1, 6}, 0, 1};
    check_cfg(&c3);
}

static void test_fd_t1(void **st) {
    (void)st;
    cfg c = {"gdn T=1", 3, 1, 1, 2, 3, 2, DG_GATE_HEAD, 0, {0}, 1, 1};
    check_cfg(&c);
    cfg c2 = {"kda T=1", 1, 1, 1, 1, 3, 3, DG_GATE_CHANNEL, 0, {0}, 1, 1};
    check_cfg(&c2);
}

/* Naive matrix form: S_t = M_t S_{t-1} + b k v^T with M = (I - b k k^T) Diag(d), and
 * o_t = S_t^T scale q.  Compared with the kernel on a larger problem. */
static void test_forward_naive(void **st) {
    (void)st;
    const dg_gate_kind kinds[3] = {DG_GATE_NONE, DG_GATE_HEAD, DG_GATE_CHANNEL};
    for (int gk = 0; gk < 3; gk++) {
        cfg c = {"naive", 2, 23, 2, 4, 8, 5, kinds[gk], 0, {0}, 1, 1};
        prob p;
        prob_make(&c, &p);
        double *o = malloc(sizeof(double) * p.nv), *hT = malloc(sizeof(double) * p.nh);
        assert_int_equal(dg_dr_recurrent_fwd_f64(&p.s, p.q, p.k, p.v, p.g, p.beta, p.h0, o, hT), 0);
        const int64_t K = c.K, V = c.V, G = c.HV / c.H;
        double S[64 * 8], M[64], S2[64 * 8], worst = 0;
        for (int64_t b = 0; b < c.B; b++)
            for (int64_t hv = 0; hv < c.HV; hv++) {
                memcpy(S, p.h0 + (b * c.HV + hv) * K * V, sizeof(double) * K * V);
                for (int64_t t = 0; t < c.T; t++) {
                    const int64_t tok = b * c.T + t, hk = hv / G;
                    const double *kt = p.k + (tok * c.H + hk) * K, *qt = p.q + (tok * c.H + hk) * K;
                    const double *vt = p.v + (tok * c.HV + hv) * V, bt = p.beta[tok * c.HV + hv];
                    for (int64_t i = 0; i < K; i++)
                        for (int64_t j = 0; j < K; j++) {
                            double d = 1;
                            if (c.gate == DG_GATE_HEAD) d = exp(p.g[tok * c.HV + hv]);
                            if (c.gate == DG_GATE_CHANNEL) d = exp(p.g[(tok * c.HV + hv) * K + j]);
                            M[i * K + j] = ((i == j) - bt * kt[i] * kt[j]) * d;
                        }
                    for (int64_t i = 0; i < K; i++)
                        for (int64_t j = 0; j < V; j++) {
                            double a = bt * kt[i] * vt[j];
                            for (int64_t l = 0; l < K; l++) a += M[i * K + l] * S[l * V + j];
                            S2[i * V + j] = a;
                        }
                    memcpy(S, S2, sizeof(double) * K * V);
                    for (int64_t j = 0; j < V; j++) {
                        double a = 0;
                        for (int64_t i = 0; i < K; i++) a += S[i * V + j] * qt[i] * p.s.scale;
                        worst = fmax(worst, fabs(a - o[(tok * c.HV + hv) * V + j]));
                    }
                }
                for (int64_t i = 0; i < K * V; i++) worst = fmax(worst, fabs(S[i] - hT[(b * c.HV + hv) * K * V + i]));
            }
        printf("  naive forward gate %d: max abs diff %.2e\n", gk, worst);
        assert_true(worst < 1e-12);
        free(o), free(hT);
        prob_free(&p);
    }
}

/* f32 forward and backward against f64 on the same inputs */
static void test_f32_vs_f64(void **st) {
    (void)st;
    cfg c = {"f32", 2, 40, 2, 4, 16, 16, DG_GATE_CHANNEL, 0, {0}, 1, 1};
    prob p;
    prob_make(&c, &p);
    /* k normalised, as the layer does, so the recurrence is a contraction */
    for (int64_t r = 0; r < p.nq / c.K; r++) {
        double n = 0;
        for (int64_t i = 0; i < c.K; i++) n += p.k[r * c.K + i] * p.k[r * c.K + i];
        for (int64_t i = 0; i < c.K; i++) p.k[r * c.K + i] /= sqrt(n);
    }
    const int64_t n_in[7] = {p.nq, p.nq, p.nv, p.ng, p.nb, p.nh, p.nv};
    double *in64[7] = {p.q, p.k, p.v, p.g, p.beta, p.h0, p.wo};
    float *in32[7];
    for (int i = 0; i < 7; i++) {
        in32[i] = malloc(sizeof(float) * n_in[i]);
        for (int64_t j = 0; j < n_in[i]; j++) in32[i][j] = (float)in64[i][j];
    }
    float *wh32 = malloc(sizeof(float) * p.nh);
    for (int64_t j = 0; j < p.nh; j++) wh32[j] = (float)p.wh[j];
    double *o64 = malloc(sizeof(double) * p.nv), *dk64 = malloc(sizeof(double) * p.nq);
    double *dg64 = malloc(sizeof(double) * p.ng), *dh64 = malloc(sizeof(double) * p.nh);
    float *o32 = malloc(sizeof(float) * p.nv), *dk32 = malloc(sizeof(float) * p.nq);
    float *dg32 = malloc(sizeof(float) * p.ng), *dh32 = malloc(sizeof(float) * p.nh);
    assert_int_equal(dg_dr_recurrent_fwd_f64(&p.s, p.q, p.k, p.v, p.g, p.beta, p.h0, o64, NULL), 0);
    assert_int_equal(dg_dr_recurrent_fwd_f32(&p.s, in32[0], in32[1], in32[2], in32[3], in32[4], in32[5], o32, NULL), 0);
    assert_int_equal(
        dg_dr_recurrent_bwd_f64(&p.s, p.q, p.k, p.v, p.g, p.beta, p.h0, p.wo, p.wh, NULL, dk64, NULL, dg64, NULL, dh64),
        0);
    assert_int_equal(dg_dr_recurrent_bwd_f32(&p.s, in32[0], in32[1], in32[2], in32[3], in32[4], in32[5], in32[6], wh32,
                                             NULL, dk32, NULL, dg32, NULL, dh32),
                     0);
    double eo = 0, ek = 0, eg = 0, eh = 0, mo = 0, mk = 0, mg = 0, mh = 0;
    for (int64_t j = 0; j < p.nv; j++) eo = fmax(eo, fabs(o32[j] - o64[j])), mo = fmax(mo, fabs(o64[j]));
    for (int64_t j = 0; j < p.nq; j++) ek = fmax(ek, fabs(dk32[j] - dk64[j])), mk = fmax(mk, fabs(dk64[j]));
    for (int64_t j = 0; j < p.ng; j++) eg = fmax(eg, fabs(dg32[j] - dg64[j])), mg = fmax(mg, fabs(dg64[j]));
    for (int64_t j = 0; j < p.nh; j++) eh = fmax(eh, fabs(dh32[j] - dh64[j])), mh = fmax(mh, fabs(dh64[j]));
    printf("  f32 vs f64 (relative to max): o %.1e dk %.1e dg %.1e dh0 %.1e\n", eo / mo, ek / mk, eg / mg, eh / mh);
    assert_true(eo / mo < 1e-5 && ek / mk < 1e-5 && eg / mg < 1e-5 && eh / mh < 1e-5);
    for (int i = 0; i < 7; i++) free(in32[i]);
    free(wh32), free(o64), free(dk64), free(dg64), free(dh64), free(o32), free(dk32), free(dg32), free(dh32);
    prob_free(&p);
}

/* ---- gate ---- */
static double gate_loss(int64_t R, int64_t HV, int64_t C, const double *a, const double *A, const double *b,
                        const double *w) {
    double *g = malloc(sizeof(double) * R * HV * C), l = 0;
    dg_gate_fwd_f64(R, HV, C, a, A, b, g);
    for (int64_t i = 0; i < R * HV * C; i++) l += g[i] * w[i];
    free(g);
    return l;
}

static void check_gate(int64_t R, int64_t HV, int64_t C, int with_bias) {
    const int64_t n = R * HV * C;
    double *a = malloc(sizeof(double) * n), *w = malloc(sizeof(double) * n);
    double *A = malloc(sizeof(double) * HV), *b = malloc(sizeof(double) * HV * C);
    double *da = malloc(sizeof(double) * n), *dA = malloc(sizeof(double) * HV);
    double *db = malloc(sizeof(double) * HV * C);
    fill(a, n, -6, 6);
    a[0] = 25; /* above the softplus threshold */
    a[n - 1] = -40;
    fill(w, n, -1, 1);
    fill(A, HV, -1, 2);
    fill(b, HV * C, -2, 1);
    const double *bp = with_bias ? b : NULL;
    assert_int_equal(dg_gate_bwd_f64(R, HV, C, a, A, bp, w, da, dA, with_bias ? db : NULL), 0);
    const double h = 1e-5; /* 1e-6 leaves round-off of ~1e-9 in the difference quotient */
    double worst = 0;
    struct {
        double *x;
        int64_t n;
        double *gr;
    } xs[3] = {{a, n, da}, {A, HV, dA}, {b, HV * C, db}};
    for (int xi = 0; xi < (with_bias ? 3 : 2); xi++)
        for (int64_t i = 0; i < xs[xi].n; i++) {
            double x0 = xs[xi].x[i];
            xs[xi].x[i] = x0 + h;
            double lp = gate_loss(R, HV, C, a, A, bp, w);
            xs[xi].x[i] = x0 - h;
            double lm = gate_loss(R, HV, C, a, A, bp, w);
            xs[xi].x[i] = x0;
            double fd = (lp - lm) / (2 * h);
            const double err = fabs(fd - xs[xi].gr[i]) / (1e-6 + fabs(fd));
            if (err > 1e-6)
                fprintf(stderr, "gate input %d [%ld]: analytic %.12g finite difference %.12g\n", xi, (long)i,
                        xs[xi].gr[i], fd);
            worst = fmax(worst, err);
        }
    printf("  gate R=%ld HV=%ld C=%ld bias=%d: max rel err %.2e\n", (long)R, (long)HV, (long)C, with_bias, worst);
    assert_true(worst < 1e-6);
    /* forward values: g <= 0 and finite at extreme inputs */
    double *g = malloc(sizeof(double) * n);
    dg_gate_fwd_f64(R, HV, C, a, A, bp, g);
    for (int64_t i = 0; i < n; i++) assert_true(g[i] <= 0 && isfinite(g[i]));
    free(g), free(a), free(w), free(A), free(b), free(da), free(dA), free(db);
}

static void test_gate(void **st) {
    (void)st;
    check_gate(7, 3, 1, 1); /* GDN */
    check_gate(5, 2, 4, 1); /* KDA */
    check_gate(4, 2, 3, 0); /* no dt_bias */
    /* softplus: no overflow, exact asymptotes */
    assert_true(dg_softplus_d(1000) == 1000);
    assert_true(dg_softplus_d(-1000) == 0);
    assert_true(fabs(dg_softplus_d(0) - log(2)) < 1e-15);
    assert_true(fabs(dg_softplus_d(-30) - exp(-30)) < 1e-25);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_naive), cmocka_unit_test(test_fd_deltanet), cmocka_unit_test(test_fd_gdn),
        cmocka_unit_test(test_fd_kda),        cmocka_unit_test(test_fd_varlen),   cmocka_unit_test(test_fd_t1),
        cmocka_unit_test(test_f32_vs_f64),    cmocka_unit_test(test_gate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
