/* The chunked (WY-form) delta-rule kernels (kernels/cpu/delta/dr_chunk_*.c) and their pieces
 * (kernels/cpu/chunk_pieces_*.c), on raw arrays:
 *  - f64 forward and every gradient against a naive token-by-token recurrence with a hand-derived
 *    backward written independently here (relative error <= 1e-10), for each gate kind, grouped
 *    value heads, varlen with an empty sequence, h0/hT present or not, partial chunks, T = 1,
 *    chunk 16/32/64, and KDA gates strong enough to take the element-by-element path;
 *  - the chunked backward against central finite differences in f64 on tiny sizes;
 *  - all eight backward variants against each other (<= 1e-12 relative);
 *  - the pieces (chunk_local_cumsum, chunk_scaled_dot_kkt, solve_tril) forward against direct
 *    loops and backward against finite differences (cumsum: the adjoint identity);
 *    loops and backward against finite differences;
 *  - f32 against f64;
 *  - the chunk walk against phase by phase, bit for bit (f64 and f32);
 *  - bad shapes rejected with a message. */
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
#include "kernels/cpu/delta/chunk_pieces.h"
#include "kernels/cpu/delta/delta_rule.h"

/* ---- deterministic generator ---- */
static uint64_t rs = 0x9E3779B97F4A7C15ull;
static double urand(void) { return dg_test_xorshift(&rs); }
static void fill(double *x, int64_t n, double lo, double hi) {
    for (int64_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * urand();
}
static double *dalloc(int64_t n) {
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    assert_non_null(p);
    return p;
}
/* max |a - b| / max |b| (0/0 = 0) */
static double rel_err(const double *a, const double *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]);
        if (!(d <= num)) num = d; /* NaN wins */
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return den > 0 ? num / den : num;
}

/* ---- a problem: shape + inputs + a random linear functional of (o, hT) ---- */
typedef struct cfg {
    const char *name;
    int64_t B, T, H, HV, K, V;
    int chunk;
    int ncu; /* 0: no cu_seqlens, else N+1 offsets */
    int64_t cu[8];
    int h0, hT;
    double glo, ghi; /* gate range (per token) */
    double blo, bhi; /* beta range */
} cfg;

typedef struct prob {
    dg_dr_shape s;
    int64_t nq, nv, nb, ng, nh;
    double *q, *k, *v, *g, *beta, *h0, *wo, *wh;
} prob;

static void prob_make(const cfg *c, dg_gate_kind gate, prob *p) {
    memset(p, 0, sizeof *p);
    p->s.B = c->B;
    p->s.T = c->T;
    p->s.H = c->H;
    p->s.HV = c->HV;
    p->s.K = c->K;
    p->s.V = c->V;
    p->s.cu_seqlens = c->ncu ? c->cu : NULL;
    p->s.N = c->ncu ? c->ncu - 1 : c->B;
    p->s.gate = gate;
    p->s.scale = 1.0 / sqrt((double)c->K);
    p->s.chunk = c->chunk;
    int64_t BT = c->B * c->T;
    p->nq = BT * c->H * c->K;
    p->nv = BT * c->HV * c->V;
    p->nb = BT * c->HV;
    p->ng = gate == DG_GATE_NONE ? 0 : gate == DG_GATE_HEAD ? BT * c->HV : BT * c->HV * c->K;
    p->nh = p->s.N * c->HV * c->K * c->V;
    p->q = dalloc(p->nq);
    p->k = dalloc(p->nq);
    p->v = dalloc(p->nv);
    p->wo = dalloc(p->nv);
    p->beta = dalloc(p->nb);
    p->g = p->ng ? dalloc(p->ng) : NULL;
    p->h0 = c->h0 ? dalloc(p->nh) : NULL;
    p->wh = c->hT ? dalloc(p->nh) : NULL;
    fill(p->q, p->nq, -1, 1);
    fill(p->k, p->nq, -1, 1);
    for (int64_t r = 0; r < p->nq / c->K; r++) { /* k L2-normalised, as in the models */
        double s = 0;
        for (int64_t j = 0; j < c->K; j++) s += p->k[r * c->K + j] * p->k[r * c->K + j];
        for (int64_t j = 0; j < c->K; j++) p->k[r * c->K + j] /= sqrt(s);
    }
    fill(p->v, p->nv, -1, 1);
    fill(p->wo, p->nv, -1, 1);
    fill(p->beta, p->nb, c->blo, c->bhi);
    if (p->g) fill(p->g, p->ng, c->glo, c->ghi);
    if (p->h0) fill(p->h0, p->nh, -1, 1);
    if (p->wh) fill(p->wh, p->nh, -1, 1);
}

static void prob_free(prob *p) {
    free(p->q), free(p->k), free(p->v), free(p->wo), free(p->beta), free(p->g), free(p->h0), free(p->wh);
}

/* ---- naive reference: the recurrence token by token, and its backward through stored states ----
 * S' = D_t S (D = exp(g_t) or Diag(exp(g_t))), u = b (v - S'^T k), S = S' + k u^T, o = S^T (scale q). */
typedef struct grads {
    double *o, *hT, *dq, *dk, *dv, *dg, *dbeta, *dh0;
} grads;

static void grads_alloc(const prob *p, grads *r) {
    r->o = dalloc(p->nv);
    r->hT = dalloc(p->nh);
    r->dq = dalloc(p->nq);
    r->dk = dalloc(p->nq);
    r->dv = dalloc(p->nv);
    r->dg = dalloc(p->ng);
    r->dbeta = dalloc(p->nb);
    r->dh0 = dalloc(p->nh);
}
static void grads_free(grads *r) {
    free(r->o), free(r->hT), free(r->dq), free(r->dk), free(r->dv), free(r->dg), free(r->dbeta), free(r->dh0);
}

static void reference(const prob *p, grads *r) {
    const dg_dr_shape *s = &p->s;
    int64_t K = s->K, V = s->V, H = s->H, HV = s->HV, grp = HV / H, N = s->N;
    memset(r->dq, 0, sizeof(double) * (size_t)p->nq);
    memset(r->dk, 0, sizeof(double) * (size_t)p->nq);
    for (int64_t n = 0; n < N; n++)
        for (int64_t hv = 0; hv < HV; hv++) {
            int64_t h = hv / grp;
            int64_t bos = s->cu_seqlens ? s->cu_seqlens[n] : n * s->T;
            int64_t len = s->cu_seqlens ? s->cu_seqlens[n + 1] - bos : s->T;
            double *St = dalloc((len + 1) * K * V); /* St[t+1] = state after token t; St[0] = h0 */
            double *Sp = dalloc((len + 1) * K * V); /* decayed state before the update of token t */
            double *u = dalloc(len * V + 1), *e = dalloc(K);
            if (p->h0) memcpy(St, p->h0 + (n * HV + hv) * K * V, sizeof(double) * (size_t)(K * V));
            for (int64_t t = 0; t < len; t++) {
                int64_t row = bos + t;
                const double *q = p->q + (row * H + h) * K, *k = p->k + (row * H + h) * K;
                const double *v = p->v + (row * HV + hv) * V;
                double b = p->beta[row * HV + hv];
                double *S0 = St + t * K * V, *S1 = St + (t + 1) * K * V, *D = Sp + t * K * V;
                for (int64_t i = 0; i < K; i++)
                    e[i] = s->gate == DG_GATE_NONE   ? 1
                           : s->gate == DG_GATE_HEAD ? exp(p->g[row * HV + hv])
                                                     : exp(p->g[(row * HV + hv) * K + i]);
                for (int64_t i = 0; i < K; i++)
                    for (int64_t j = 0; j < V; j++) D[i * V + j] = e[i] * S0[i * V + j];
                for (int64_t j = 0; j < V; j++) {
                    double a = 0;
                    for (int64_t i = 0; i < K; i++) a += D[i * V + j] * k[i];
                    u[t * V + j] = b * (v[j] - a);
                }
                for (int64_t i = 0; i < K; i++)
                    for (int64_t j = 0; j < V; j++) S1[i * V + j] = D[i * V + j] + k[i] * u[t * V + j];
                double *o = r->o + (row * HV + hv) * V;
                for (int64_t j = 0; j < V; j++) {
                    double a = 0;
                    for (int64_t i = 0; i < K; i++) a += S1[i * V + j] * q[i];
                    o[j] = s->scale * a;
                }
            }
            memcpy(r->hT + (n * HV + hv) * K * V, St + len * K * V, sizeof(double) * (size_t)(K * V));
            /* backward of loss = sum(o wo) + sum(hT wh) */
            double *dS = dalloc(K * V), *du = dalloc(V);
            if (p->wh) memcpy(dS, p->wh + (n * HV + hv) * K * V, sizeof(double) * (size_t)(K * V));
            for (int64_t t = len - 1; t >= 0; t--) {
                int64_t row = bos + t;
                const double *q = p->q + (row * H + h) * K, *k = p->k + (row * H + h) * K;
                const double *v = p->v + (row * HV + hv) * V, *wo = p->wo + (row * HV + hv) * V;
                double b = p->beta[row * HV + hv];
                double *S1 = St + (t + 1) * K * V, *D = Sp + t * K * V, *S0 = St + t * K * V;
                double *dq = r->dq + (row * H + h) * K, *dk = r->dk + (row * H + h) * K;
                /* o = scale S1^T q */
                for (int64_t i = 0; i < K; i++) {
                    double a = 0;
                    for (int64_t j = 0; j < V; j++) {
                        dS[i * V + j] += s->scale * q[i] * wo[j];
                        a += S1[i * V + j] * wo[j];
                    }
                    dq[i] += s->scale * a;
                }
                /* S1 = D + k u^T */
                for (int64_t j = 0; j < V; j++) {
                    double a = 0;
                    for (int64_t i = 0; i < K; i++) a += dS[i * V + j] * k[i];
                    du[j] = a;
                }
                for (int64_t i = 0; i < K; i++) {
                    double a = 0;
                    for (int64_t j = 0; j < V; j++) a += dS[i * V + j] * u[t * V + j];
                    dk[i] += a;
                }
                /* u = b (v - D^T k) */
                double db = 0;
                for (int64_t j = 0; j < V; j++) {
                    double a = 0;
                    for (int64_t i = 0; i < K; i++) a += D[i * V + j] * k[i];
                    db += du[j] * (v[j] - a);
                    r->dv[(row * HV + hv) * V + j] = b * du[j];
                }
                r->dbeta[row * HV + hv] = db;
                for (int64_t i = 0; i < K; i++) {
                    double a = 0;
                    for (int64_t j = 0; j < V; j++) {
                        dS[i * V + j] -= b * k[i] * du[j]; /* dD */
                        a += D[i * V + j] * du[j];
                    }
                    dk[i] -= b * a;
                }
                /* D = e o S0 */
                if (s->gate == DG_GATE_HEAD) {
                    double a = 0;
                    for (int64_t i = 0; i < K * V; i++) a += dS[i] * D[i];
                    r->dg[row * HV + hv] = a;
                } else if (s->gate == DG_GATE_CHANNEL) {
                    for (int64_t i = 0; i < K; i++) {
                        double a = 0;
                        for (int64_t j = 0; j < V; j++) a += dS[i * V + j] * D[i * V + j];
                        r->dg[(row * HV + hv) * K + i] = a;
                    }
                }
                for (int64_t i = 0; i < K; i++) {
                    double f = s->gate == DG_GATE_NONE   ? 1
                               : s->gate == DG_GATE_HEAD ? exp(p->g[row * HV + hv])
                                                         : exp(p->g[(row * HV + hv) * K + i]);
                    for (int64_t j = 0; j < V; j++) dS[i * V + j] *= f;
                }
                (void)S0;
            }
            memcpy(r->dh0 + (n * HV + hv) * K * V, dS, sizeof(double) * (size_t)(K * V));
            free(St), free(Sp), free(u), free(e), free(dS), free(du);
        }
}

/* chunked f64 forward + backward of the same functional */
static void chunked(const prob *p, const dg_dr_variant *var, grads *r) {
    assert_int_equal(dg_dr_chunk_fwd_f64(&p->s, p->q, p->k, p->v, p->g, p->beta, p->h0, r->o, p->wh ? r->hT : NULL), 0);
    assert_int_equal(dg_dr_chunk_bwd_f64(&p->s, var, p->q, p->k, p->v, p->g, p->beta, p->h0, p->wo, p->wh, r->dq, r->dk,
                                         r->dv, p->g ? r->dg : NULL, r->dbeta, p->h0 ? r->dh0 : NULL),
                     0);
}

static const char *gname[3] = {"deltanet", "gdn", "kda"};

/* returns the worst relative error over outputs and gradients */
static double compare(const char *what, const prob *p, const grads *a, const grads *b, double tol) {
    struct {
        const char *n;
        const double *x, *y;
        int64_t len;
        int on;
    } f[] = {
        {"o", a->o, b->o, p->nv, 1},
        {"hT", a->hT, b->hT, p->nh, p->wh != NULL},
        {"dq", a->dq, b->dq, p->nq, 1},
        {"dk", a->dk, b->dk, p->nq, 1},
        {"dv", a->dv, b->dv, p->nv, 1},
        {"dg", a->dg, b->dg, p->ng, p->ng > 0},
        {"dbeta", a->dbeta, b->dbeta, p->nb, 1},
        {"dh0", a->dh0, b->dh0, p->nh, p->h0 != NULL},
    };
    double worst = 0;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (!f[i].on) continue;
        double e = rel_err(f[i].x, f[i].y, f[i].len);
        if (!(e <= tol)) fail_msg("%s %s: %s relative error %.3g > %.3g", what, gname[p->s.gate], f[i].n, e, tol);
        if (e > worst) worst = e;
    }
    return worst;
}

static const cfg CFGS[] = {
    {"gva+partial", 2, 37, 2, 4, 8, 6, 16, 0, {0}, 1, 1, -0.8, -0.02, 0.1, 0.9},
    {"varlen", 1, 71, 1, 2, 8, 8, 32, 5, {0, 5, 5, 40, 71}, 1, 1, -0.8, -0.02, 0.1, 0.9},
    {"T=1", 2, 1, 2, 2, 4, 4, 64, 0, {0}, 1, 1, -0.8, -0.02, 0.1, 0.9},
    {"c64", 1, 130, 1, 1, 16, 8, 64, 0, {0}, 0, 1, -0.3, -0.01, 0.1, 0.9},
    {"c32-oddK", 2, 70, 1, 3, 5, 3, 32, 0, {0}, 1, 0, -0.8, -0.02, 0.0, 1.9},
    {"c16-noh", 1, 50, 2, 2, 7, 5, 16, 0, {0}, 0, 0, -0.8, -0.02, 0.1, 0.9},
    /* many short sequences: each with its head through every phase on one thread */
    {"seqs", 12, 100, 1, 2, 16, 8, 64, 0, {0}, 0, 1, -0.5, -0.01, 0.1, 0.9},
    /* big enough for the kernels to use their threads */
    {"threaded", 2, 160, 2, 4, 16, 16, 64, 0, {0}, 1, 1, -0.5, -0.01, 0.1, 0.9},
    {"threaded-varlen", 1, 300, 1, 2, 32, 16, 32, 4, {0, 100, 101, 300}, 1, 1, -0.5, -0.01, 0.1, 0.9},
};
static double worst_ref = 0;

static void test_vs_reference(void **st) {
    (void)st;
    dg_dr_variant var = {1, 1, 1}, alt = {0, 0, 0};
    for (size_t c = 0; c < sizeof CFGS / sizeof CFGS[0]; c++)
        for (int gk = 0; gk < 3; gk++) {
            prob p;
            prob_make(&CFGS[c], (dg_gate_kind)gk, &p);
            grads ref, got;
            grads_alloc(&p, &ref);
            grads_alloc(&p, &got);
            reference(&p, &ref);
            chunked(&p, c % 2 ? &alt : &var, &got);
            double e = compare(CFGS[c].name, &p, &got, &ref, 1e-10);
            if (e > worst_ref) worst_ref = e;
            grads_free(&ref);
            grads_free(&got);
            prob_free(&p);
        }
    printf("chunked f64 vs naive recurrence: worst relative error %.3g\n", worst_ref);
}

/* KDA / GDN gates strong enough that a 16-row sub-block spans more than the safe exponent range
 * (400 in f64): the diagonal blocks go element by element.  Nothing may overflow. */
static void test_strong_gates(void **st) {
    (void)st;
    cfg c = {"strong", 1, 90, 1, 2, 8, 6, 32, 0, {0}, 1, 1, -60, -0.05, 0.1, 0.9};
    for (int gk = 1; gk < 3; gk++) {
        prob p;
        prob_make(&c, (dg_gate_kind)gk, &p);
        for (int64_t i = 0; i < p.ng; i += 3) p.g[i] = -0.01; /* some channels barely decay */
        grads ref, got;
        grads_alloc(&p, &ref);
        grads_alloc(&p, &got);
        reference(&p, &ref);
        chunked(&p, NULL, &got);
        double e = compare("strong gates", &p, &got, &ref, 1e-10);
        printf("strong gates (%s, g down to -60): relative error %.3g\n", gname[gk], e);
        grads_free(&ref);
        grads_free(&got);
        prob_free(&p);
    }
}

/* ---- finite differences of the chunked kernels themselves ---- */
static double fd_loss(const prob *p, double *o, double *hT) {
    assert_int_equal(dg_dr_chunk_fwd_f64(&p->s, p->q, p->k, p->v, p->g, p->beta, p->h0, o, p->wh ? hT : NULL), 0);
    double l = 0;
    for (int64_t i = 0; i < p->nv; i++) l += o[i] * p->wo[i];
    if (p->wh)
        for (int64_t i = 0; i < p->nh; i++) l += hT[i] * p->wh[i];
    return l;
}

static double fd_check(prob *p, double *x, int64_t n, const double *an, const char *what) {
    double *o = dalloc(p->nv), *hT = dalloc(p->nh), worst = 0, amax = 0;
    for (int64_t i = 0; i < n; i++) amax = fmax(amax, fabs(an[i]));
    const double h = 1e-5;
    for (int64_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + h;
        double lp = fd_loss(p, o, hT);
        x[i] = x0 - h;
        double lm = fd_loss(p, o, hT);
        x[i] = x0;
        double fd = (lp - lm) / (2 * h), err = fabs(fd - an[i]) / (amax > 1 ? amax : 1);
        if (err > worst) worst = err;
        if (err > 1e-7)
            fail_msg("%s: d%s[%ld] analytic %.12g, finite difference %.12g", gname[p->s.gate], what, (long)i, an[i],
                     fd);
    }
    free(o), free(hT);
    return worst;
}

static void test_finite_differences(void **st) {
    (void)st;
    cfg cs[] = {
        {"fd", 1, 21, 1, 2, 3, 2, 16, 0, {0}, 1, 1, -0.9, -0.05, 0.1, 0.9},
        {"fd-varlen", 1, 23, 2, 2, 3, 2, 16, 4, {0, 18, 18, 23}, 1, 1, -0.9, -0.05, 0.1, 0.9},
    };
    double worst = 0;
    for (size_t c = 0; c < 2; c++)
        for (int gk = 0; gk < 3; gk++) {
            prob p;
            prob_make(&cs[c], (dg_gate_kind)gk, &p);
            grads got;
            grads_alloc(&p, &got);
            chunked(&p, NULL, &got);
            worst = fmax(worst, fd_check(&p, p.q, p.nq, got.dq, "q"));
            worst = fmax(worst, fd_check(&p, p.k, p.nq, got.dk, "k"));
            worst = fmax(worst, fd_check(&p, p.v, p.nv, got.dv, "v"));
            worst = fmax(worst, fd_check(&p, p.beta, p.nb, got.dbeta, "beta"));
            if (p.g) worst = fmax(worst, fd_check(&p, p.g, p.ng, got.dg, "g"));
            worst = fmax(worst, fd_check(&p, p.h0, p.nh, got.dh0, "h0"));
            grads_free(&got);
            prob_free(&p);
        }
    printf("chunked backward vs central differences: worst error %.3g (of max |grad|)\n", worst);
}

/* ---- the eight backward variants agree ---- */
static void test_variants(void **st) {
    (void)st;
    cfg cs[] = {
        {"variants-c64", 2, 150, 2, 4, 16, 12, 64, 0, {0}, 1, 1, -0.5, -0.01, 0.1, 0.9},
        {"variants-c32", 1, 77, 1, 2, 8, 8, 32, 4, {0, 30, 30, 77}, 1, 1, -3, -0.01, 0.1, 0.9},
    };
    double worst = 0;
    for (size_t c = 0; c < 2; c++)
        for (int gk = 0; gk < 3; gk++) {
            prob p;
            prob_make(&cs[c], (dg_gate_kind)gk, &p);
            grads base;
            grads_alloc(&p, &base);
            dg_dr_variant v0 = {1, 1, 1};
            chunked(&p, &v0, &base);
            for (int m = 0; m < 7; m++) {
                dg_dr_variant v = {m & 1, (m >> 1) & 1, (m >> 2) & 1};
                grads got;
                grads_alloc(&p, &got);
                chunked(&p, &v, &got);
                char name[64];
                snprintf(name, sizeof name, "%s variant {%d,%d,%d}", cs[c].name, v.gdn_dg_from_final, v.dw_on_chip,
                         v.solve_tril_blocked);
                worst = fmax(worst, compare(name, &p, &got, &base, 1e-12));
                grads_free(&got);
            }
            grads_free(&base);
            prob_free(&p);
        }
    printf("backward variants vs each other: worst relative difference %.3g\n", worst);
}

/* ---- f32 against f64 ---- */
static float *tof(const double *x, int64_t n) {
    float *y = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    assert_non_null(y);
    for (int64_t i = 0; i < n; i++) y[i] = (float)x[i];
    return y;
}
static double rel_err_f(const float *a, const double *b, int64_t n) {
    double *t = dalloc(n);
    for (int64_t i = 0; i < n; i++) t[i] = a[i];
    double e = rel_err(t, b, n);
    free(t);
    return e;
}

/* f32 tolerance: unit roundoff 6e-8 times the growth through T = 200 tokens of state and the
 * C = 64 products; measured worst case 1.0e-6 on this machine, bound at 2e-5. */
#define F32_TOL 2e-5

static void test_f32_vs_f64(void **st) {
    (void)st;
    cfg cs[] = {
        {"f32", 2, 200, 2, 2, 32, 32, 64, 0, {0}, 1, 1, -0.5, -0.01, 0.1, 0.9},
        {"f32-strong", 1, 100, 1, 2, 16, 16, 16, 3, {0, 40, 100}, 1, 1, -8, -0.05, 0.1, 0.9},
        /* widths that leave partial register tiles (kernels/cpu/gemm_small.c), partial chunks */
        {"f32-odd", 3, 90, 1, 2, 20, 13, 32, 0, {0}, 1, 1, -0.5, -0.01, 0.1, 0.9},
        /* many short sequences: a sequence and head a thread through every phase */
        {"f32-seqs", 6, 100, 1, 2, 24, 40, 64, 0, {0}, 1, 1, -0.5, -0.01, 0.1, 0.9},
    };
    double worst = 0;
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++)
        for (int gk = 0; gk < 3; gk++) {
            prob p;
            prob_make(&cs[c], (dg_gate_kind)gk, &p);
            grads r;
            grads_alloc(&p, &r);
            chunked(&p, NULL, &r);
            float *q = tof(p.q, p.nq), *k = tof(p.k, p.nq), *v = tof(p.v, p.nv), *g = p.g ? tof(p.g, p.ng) : NULL,
                  *b = tof(p.beta, p.nb), *h0 = tof(p.h0, p.nh), *wo = tof(p.wo, p.nv), *wh = tof(p.wh, p.nh);
            float *o = tof(r.o, p.nv), *hT = tof(r.hT, p.nh), *dq = tof(r.dq, p.nq), *dk = tof(r.dk, p.nq),
                  *dv = tof(r.dv, p.nv), *dg = tof(r.dg, p.ng), *db = tof(r.dbeta, p.nb), *dh0 = tof(r.dh0, p.nh);
            assert_int_equal(dg_dr_chunk_fwd_f32(&p.s, q, k, v, g, b, h0, o, hT), 0);
            assert_int_equal(
                dg_dr_chunk_bwd_f32(&p.s, NULL, q, k, v, g, b, h0, wo, wh, dq, dk, dv, g ? dg : NULL, db, dh0), 0);
            double e[8] = {rel_err_f(o, r.o, p.nv),      rel_err_f(hT, r.hT, p.nh),  rel_err_f(dq, r.dq, p.nq),
                           rel_err_f(dk, r.dk, p.nq),    rel_err_f(dv, r.dv, p.nv),  g ? rel_err_f(dg, r.dg, p.ng) : 0,
                           rel_err_f(db, r.dbeta, p.nb), rel_err_f(dh0, r.dh0, p.nh)};
            for (int i = 0; i < 8; i++) {
                if (!(e[i] <= F32_TOL))
                    fail_msg("%s %s: f32 output/gradient #%d relative error %.3g", cs[c].name, gname[gk], i, e[i]);
                worst = fmax(worst, e[i]);
            }
            free(q), free(k), free(v), free(g), free(b), free(h0), free(wo), free(wh);
            free(o), free(hT), free(dq), free(dk), free(dv), free(dg), free(db), free(dh0);
            grads_free(&r);
            prob_free(&p);
        }
    printf("f32 vs f64: worst relative error %.3g (tolerance %.0e)\n", worst, F32_TOL);
}

/* ---- the two schedules (kernels/cpu/delta/dr_chunk_fwd_impl.h, FN(use_walk)): the chunk walk
 * gives the bits of phase by phase, in f64 and in f32, with every gate kind and both dw paths, on
 * shapes with one chunk or several a sequence, an empty sequence (varlen), grouped value heads,
 * h0/hT or none, and sizes that put the kernels on their threads ---- */
static int same_bits(const void *a, const void *b, int64_t n, size_t sz) {
    return n == 0 || memcmp(a, b, (size_t)n * sz) == 0;
}

/* every output of the chunked forward and backward in f32 from p's inputs, into one buffer per
 * output (freed by the caller) */
static void chunked_f32(const prob *p, const dg_dr_variant *var, float *out[8]) {
    const int64_t n[8] = {p->nv, p->nh, p->nq, p->nq, p->nv, p->ng, p->nb, p->nh};
    for (int i = 0; i < 8; i++) out[i] = malloc(sizeof(float) * (size_t)(n[i] + 1));
    float *q = tof(p->q, p->nq), *k = tof(p->k, p->nq), *v = tof(p->v, p->nv), *g = p->g ? tof(p->g, p->ng) : NULL,
          *b = tof(p->beta, p->nb), *h0 = p->h0 ? tof(p->h0, p->nh) : NULL, *wo = tof(p->wo, p->nv),
          *wh = p->wh ? tof(p->wh, p->nh) : NULL;
    assert_int_equal(dg_dr_chunk_fwd_f32(&p->s, q, k, v, g, b, h0, out[0], wh ? out[1] : NULL), 0);
    assert_int_equal(dg_dr_chunk_bwd_f32(&p->s, var, q, k, v, g, b, h0, wo, wh, out[2], out[3], out[4],
                                         g ? out[5] : NULL, out[6], h0 ? out[7] : NULL),
                     0);
    free(q), free(k), free(v), free(g), free(b), free(h0), free(wo), free(wh);
}

static void test_schedules(void **st) {
    (void)st;
    dg_dr_variant vars[2] = {{1, 1, 1}, {0, 0, 0}};
    int runs = 0;
    for (size_t c = 0; c < sizeof CFGS / sizeof CFGS[0]; c++)
        for (int gk = 0; gk < 3; gk++)
            for (int vi = 0; vi < 2; vi++) {
                prob p;
                prob_make(&CFGS[c], (dg_gate_kind)gk, &p);
                grads a, b;
                grads_alloc(&p, &a);
                grads_alloc(&p, &b);
                float *fa[8], *fb[8];
                setenv("DG_DR_CHUNK_SCHEDULE", "phases", 1);
                chunked(&p, &vars[vi], &a);
                chunked_f32(&p, &vars[vi], fa);
                setenv("DG_DR_CHUNK_SCHEDULE", "walk", 1);
                chunked(&p, &vars[vi], &b);
                chunked_f32(&p, &vars[vi], fb);
                unsetenv("DG_DR_CHUNK_SCHEDULE");
                const char *nm[8] = {"o", "hT", "dq", "dk", "dv", "dg", "dbeta", "dh0"};
                const double *da[8] = {a.o, a.hT, a.dq, a.dk, a.dv, a.dg, a.dbeta, a.dh0},
                             *db[8] = {b.o, b.hT, b.dq, b.dk, b.dv, b.dg, b.dbeta, b.dh0};
                const int64_t n[8] = {p.nv, p.wh ? p.nh : 0, p.nq, p.nq, p.nv, p.ng, p.nb, p.h0 ? p.nh : 0};
                for (int i = 0; i < 8; i++) {
                    if (!same_bits(da[i], db[i], n[i], sizeof(double)))
                        fail_msg("%s %s variant %d: f64 %s differs between the schedules", CFGS[c].name, gname[gk], vi,
                                 nm[i]);
                    if (!same_bits(fa[i], fb[i], n[i], sizeof(float)))
                        fail_msg("%s %s variant %d: f32 %s differs between the schedules", CFGS[c].name, gname[gk], vi,
                                 nm[i]);
                    free(fa[i]), free(fb[i]);
                }
                runs++;
                grads_free(&a);
                grads_free(&b);
                prob_free(&p);
            }
    printf("chunk walk against phase by phase: the same bits in %d cases (f64 and f32)\n", runs);
}

/* ---- NULL gradients: the others are unchanged ---- */
static void test_null_grads(void **st) {
    (void)st;
    prob p;
    prob_make(&CFGS[0], DG_GATE_CHANNEL, &p);
    grads a;
    grads_alloc(&p, &a);
    chunked(&p, NULL, &a);
    double *dv = dalloc(p.nv), *dg = dalloc(p.ng);
    assert_int_equal(
        dg_dr_chunk_bwd_f64(&p.s, NULL, p.q, p.k, p.v, p.g, p.beta, p.h0, p.wo, NULL, NULL, NULL, dv, dg, NULL, NULL),
        0);
    /* without dhT the gradients differ from a's (which had dhT) except where hT does not matter:
     * compare with a run without dhT instead */
    grads b;
    grads_alloc(&p, &b);
    assert_int_equal(dg_dr_chunk_bwd_f64(&p.s, NULL, p.q, p.k, p.v, p.g, p.beta, p.h0, p.wo, NULL, b.dq, b.dk, b.dv,
                                         b.dg, b.dbeta, b.dh0),
                     0);
    assert_true(rel_err(dv, b.dv, p.nv) == 0);
    assert_true(rel_err(dg, b.dg, p.ng) == 0);
    free(dv), free(dg);
    grads_free(&a);
    grads_free(&b);
    prob_free(&p);
}

/* ---- bad input ---- */
static void test_bad_input(void **st) {
    (void)st;
    prob p;
    prob_make(&CFGS[0], DG_GATE_HEAD, &p);
    double *o = dalloc(p.nv);
    dg_dr_shape s = p.s;
    s.chunk = 48;
    dg_clear_error();
    assert_int_equal(dg_dr_chunk_fwd_f64(&s, p.q, p.k, p.v, p.g, p.beta, NULL, o, NULL), -1);
    assert_non_null(strstr(dg_last_error(), "chunk"));
    s = p.s;
    s.HV = 3;
    dg_clear_error();
    assert_int_equal(
        dg_dr_chunk_bwd_f64(&s, NULL, p.q, p.k, p.v, p.g, p.beta, NULL, p.wo, NULL, NULL, NULL, o, NULL, NULL, NULL),
        -1);
    assert_non_null(strstr(dg_last_error(), "HV"));
    s = p.s;
    int64_t cu[3] = {0, 10, 74};
    s.cu_seqlens = cu;
    s.N = 2;
    dg_clear_error();
    assert_int_equal(dg_dr_chunk_fwd_f64(&s, p.q, p.k, p.v, p.g, p.beta, NULL, o, NULL), -1);
    assert_non_null(strstr(dg_last_error(), "cu_seqlens"));
    s = p.s;
    dg_clear_error();
    assert_int_equal(dg_dr_chunk_fwd_f64(&s, p.q, p.k, p.v, NULL, p.beta, NULL, o, NULL), -1);
    assert_non_null(strstr(dg_last_error(), "g is NULL"));
    dg_clear_error();
    free(o);
    prob_free(&p);
}


/* ---- the pieces ---- */
typedef struct pcfg {
    int64_t B, T, H, HV, K;
    int chunk, ncu;
    int64_t cu[6];
} pcfg;
static const pcfg PCFGS[] = {
    {2, 45, 2, 4, 5, 16, 0, {0}},               /* GVA, partial chunks */
    {1, 100, 1, 2, 6, 64, 4, {0, 70, 70, 100}}, /* varlen with an empty sequence, blocked 64 */
    {1, 40, 1, 1, 3, 32, 0, {0}},
};

static dg_dr_shape pshape(const pcfg *c, dg_gate_kind gate) {
    dg_dr_shape s = {c->B, c->T, c->H,    c->HV, c->K, 1, c->ncu ? c->cu : NULL, c->ncu ? c->ncu - 1 : c->B,
                     gate, 1.0,  c->chunk};
    return s;
}
/* position of row r in its chunk, and the first row of that chunk */
static void chunk_of(const dg_dr_shape *s, int64_t r, int64_t *pos, int64_t *start) {
    int64_t bos = (r / s->T) * s->T;
    if (s->cu_seqlens)
        for (int64_t n = 0; n < s->N; n++)
            if (r >= s->cu_seqlens[n] && r < s->cu_seqlens[n + 1]) bos = s->cu_seqlens[n];
    *pos = (r - bos) % s->chunk;
    *start = r - *pos;
}
static double dot(const double *a, const double *b, int64_t n) {
    double t = 0;
    for (int64_t i = 0; i < n; i++) t += a[i] * b[i];
    return t;
}

static void test_piece_cumsum(void **st) {
    (void)st;
    for (size_t c = 0; c < sizeof PCFGS / sizeof PCFGS[0]; c++)
        for (int S = 1; S <= 3; S += 2)
            for (int rev = 0; rev < 2; rev++) {
                dg_dr_shape s = pshape(&PCFGS[c], DG_GATE_NONE);
                int64_t rows = s.B * s.T, n = rows * s.HV * S;
                double *x = dalloc(n), *y = dalloc(n), *w = dalloc(n), *dx = dalloc(n);
                fill(x, n, -1, 1);
                fill(w, n, -1, 1);
                assert_int_equal(
                    dg_chunk_local_cumsum_fwd_f64(s.B, s.T, s.HV, S, s.cu_seqlens, s.N, s.chunk, rev, x, y), 0);
                for (int64_t r = 0; r < rows; r++) {
                    int64_t pos, start;
                    chunk_of(&s, r, &pos, &start);
                    for (int64_t e = 0; e < s.HV * S; e++) {
                        double t = 0;
                        for (int64_t r2 = start; r2 < rows; r2++) {
                            int64_t p2, s2;
                            chunk_of(&s, r2, &p2, &s2);
                            if (s2 != start) break;
                            if (rev ? p2 >= pos : p2 <= pos) t += x[r2 * s.HV * S + e];
                        }
                        assert_true(fabs(t - y[r * s.HV * S + e]) <= 1e-13);
                    }
                }
                /* backward: the adjoint identity <w, cumsum(x)> = <cumsum_bwd(w), x> */
                assert_int_equal(
                    dg_chunk_local_cumsum_bwd_f64(s.B, s.T, s.HV, S, s.cu_seqlens, s.N, s.chunk, rev, w, dx), 0);
                assert_true(fabs(dot(w, y, n) - dot(dx, x, n)) <= 1e-12 * (1 + fabs(dot(w, y, n))));
                /* f32, in place */
                float *xf = tof(x, n);
                assert_int_equal(
                    dg_chunk_local_cumsum_fwd_f32(s.B, s.T, s.HV, S, s.cu_seqlens, s.N, s.chunk, rev, xf, xf), 0);
                assert_true(rel_err_f(xf, y, n) <= 1e-6);
                free(x), free(y), free(w), free(dx), free(xf);
            }
}

/* random k (L2-normalised rows), beta, and a cumulative gate made by the cumsum piece */
typedef struct kin {
    dg_dr_shape s;
    int64_t nk, nb, ng, nA;
    double *k, *beta, *g, *W;
} kin;
static void kin_make(const pcfg *c, dg_gate_kind gate, kin *p) {
    p->s = pshape(c, gate);
    int64_t rows = c->B * c->T;
    p->nk = rows * c->H * c->K;
    p->nb = rows * c->HV;
    p->ng = gate == DG_GATE_NONE ? 0 : gate == DG_GATE_HEAD ? p->nb : p->nb * c->K;
    p->nA = rows * c->HV * c->chunk;
    p->k = dalloc(p->nk);
    p->beta = dalloc(p->nb);
    p->g = p->ng ? dalloc(p->ng) : NULL;
    p->W = dalloc(p->nA);
    fill(p->k, p->nk, -1, 1);
    for (int64_t r = 0; r < p->nk / c->K; r++) {
        double t = sqrt(dot(p->k + r * c->K, p->k + r * c->K, c->K));
        for (int64_t j = 0; j < c->K; j++) p->k[r * c->K + j] /= t;
    }
    fill(p->beta, p->nb, 0.1, 0.9);
    fill(p->W, p->nA, -1, 1);
    if (p->g) {
        fill(p->g, p->ng, -0.9, -0.02);
        assert_int_equal(dg_chunk_local_cumsum_fwd_f64(c->B, c->T, c->HV, p->ng / p->nb, p->s.cu_seqlens, p->s.N,
                                                       c->chunk, 0, p->g, p->g),
                         0);
    }
}
static void kin_free(kin *p) { free(p->k), free(p->beta), free(p->g), free(p->W); }

static double kkt_loss(const kin *p, double *A) {
    assert_int_equal(dg_chunk_scaled_dot_kkt_fwd_f64(&p->s, p->k, p->beta, p->g, A), 0);
    return dot(A, p->W, p->nA);
}
static void fd_piece(const kin *p, double *x, int64_t n, const double *an, double *A, const char *what) {
    double amax = 1;
    for (int64_t i = 0; i < n; i++) amax = fmax(amax, fabs(an[i]));
    for (int64_t i = 0; i < n; i++) {
        double x0 = x[i], h = 1e-6;
        x[i] = x0 + h;
        double lp = kkt_loss(p, A);
        x[i] = x0 - h;
        double lm = kkt_loss(p, A);
        x[i] = x0;
        double fd = (lp - lm) / (2 * h);
        if (fabs(fd - an[i]) > 1e-7 * amax)
            fail_msg("kkt %s: d%s[%ld] analytic %.12g, finite difference %.12g", gname[p->s.gate], what, (long)i, an[i],
                     fd);
    }
}

static void test_piece_kkt(void **st) {
    (void)st;
    for (size_t c = 0; c < sizeof PCFGS / sizeof PCFGS[0]; c++)
        for (int gk = 0; gk < 3; gk++) {
            kin p;
            kin_make(&PCFGS[c], (dg_gate_kind)gk, &p);
            const dg_dr_shape *s = &p.s;
            int64_t rows = s->B * s->T, C = s->chunk, H = s->H, HV = s->HV, K = s->K;
            double *A = dalloc(p.nA);
            kkt_loss(&p, A);
            /* forward against the definition */
            for (int64_t r = 0; r < rows; r++)
                for (int64_t hv = 0; hv < HV; hv++) {
                    int64_t pos, start, h = hv / (HV / H);
                    chunk_of(s, r, &pos, &start);
                    for (int64_t j = 0; j < C; j++) {
                        double ref = 0;
                        if (j < pos) {
                            int64_t rj = start + j;
                            for (int64_t ch = 0; ch < K; ch++) {
                                double e = gk == 0   ? 1
                                           : gk == 1 ? exp(p.g[r * HV + hv] - p.g[rj * HV + hv])
                                                     : exp(p.g[(r * HV + hv) * K + ch] - p.g[(rj * HV + hv) * K + ch]);
                                ref += p.k[(r * H + h) * K + ch] * p.k[(rj * H + h) * K + ch] * e;
                            }
                            ref *= p.beta[r * HV + hv];
                        }
                        assert_true(fabs(A[(r * HV + hv) * C + j] - ref) <= 1e-14);
                    }
                }
            /* backward against finite differences of sum(A o W) */
            double *dk = dalloc(p.nk), *db = dalloc(p.nb), *dg = dalloc(p.ng);
            assert_int_equal(dg_chunk_scaled_dot_kkt_bwd_f64(s, p.k, p.beta, p.g, p.W, dk, db, p.g ? dg : NULL), 0);
            fd_piece(&p, p.k, p.nk, dk, A, "k");
            fd_piece(&p, p.beta, p.nb, db, A, "beta");
            if (p.g) fd_piece(&p, p.g, p.ng, dg, A, "g");
            free(A), free(dk), free(db), free(dg);
            kin_free(&p);
        }
}

static double tril_loss(const dg_dr_shape *s, int blocked, const double *A, const double *W, double *Y, int64_t n) {
    assert_int_equal(dg_solve_tril_fwd_f64(s, blocked, A, Y), 0);
    return dot(Y, W, n);
}

static void test_piece_solve_tril(void **st) {
    (void)st;
    for (size_t c = 0; c < sizeof PCFGS / sizeof PCFGS[0]; c++) {
        kin p;
        kin_make(&PCFGS[c], DG_GATE_CHANNEL, &p);
        const dg_dr_shape *s = &p.s;
        int64_t rows = s->B * s->T, C = s->chunk, HV = s->HV, n = p.nA;
        double *A = dalloc(n), *Y = dalloc(n), *Y2 = dalloc(n), *dA = dalloc(n);
        assert_int_equal(dg_chunk_scaled_dot_kkt_fwd_f64(s, p.k, p.beta, p.g, A), 0);
        for (int64_t i = 0; i < n; i++) A[i] *= 3; /* a less gentle matrix */
        tril_loss(s, 1, A, p.W, Y, n);
        tril_loss(s, 0, A, p.W, Y2, n);
        assert_true(rel_err(Y, Y2, n) <= 1e-13);
        /* (I + A) Y = I on every chunk, zeros above the diagonal */
        for (int64_t r = 0; r < rows; r++)
            for (int64_t hv = 0; hv < HV; hv++) {
                int64_t pos, start;
                chunk_of(s, r, &pos, &start);
                for (int64_t j = 0; j < C; j++) {
                    double t = Y[(r * HV + hv) * C + j];
                    if (j > pos) {
                        assert_true(t == 0);
                        continue;
                    }
                    for (int64_t m = 0; m < pos; m++)
                        t += A[(r * HV + hv) * C + m] * Y[((start + m) * HV + hv) * C + j];
                    assert_true(fabs(t - (j == pos)) <= 1e-12);
                }
            }
        /* backward against finite differences in the strictly lower entries */
        assert_int_equal(dg_solve_tril_bwd_f64(s, Y, p.W, dA), 0);
        double amax = 1;
        for (int64_t i = 0; i < n; i++) amax = fmax(amax, fabs(dA[i]));
        for (int64_t r = 0; r < rows; r++)
            for (int64_t hv = 0; hv < HV; hv++) {
                int64_t pos, start;
                chunk_of(s, r, &pos, &start);
                for (int64_t j = 0; j < C; j++) {
                    int64_t i = (r * HV + hv) * C + j;
                    if (j >= pos) {
                        assert_true(dA[i] == 0);
                        continue;
                    }
                    if ((r + j) % 3) continue; /* a third of the entries keeps this fast */
                    double a0 = A[i], h = 1e-6;
                    A[i] = a0 + h;
                    double lp = tril_loss(s, (int)(r & 1), A, p.W, Y2, n);
                    A[i] = a0 - h;
                    double lm = tril_loss(s, (int)(r & 1), A, p.W, Y2, n);
                    A[i] = a0;
                    double fd = (lp - lm) / (2 * h);
                    if (fabs(fd - dA[i]) > 1e-7 * amax)
                        fail_msg("solve_tril: dA[%ld] analytic %.12g, finite difference %.12g", (long)i, dA[i], fd);
                }
            }
        /* f32 */
        float *Af = tof(A, n), *Yf = tof(Y, n);
        assert_int_equal(dg_solve_tril_fwd_f32(s, 1, Af, Yf), 0);
        assert_true(rel_err_f(Yf, Y, n) <= 1e-5);
        free(Af), free(Yf);
        free(A), free(Y), free(Y2), free(dA);
        kin_free(&p);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vs_reference),       cmocka_unit_test(test_strong_gates),
        cmocka_unit_test(test_finite_differences), cmocka_unit_test(test_variants),
        cmocka_unit_test(test_f32_vs_f64),         cmocka_unit_test(test_schedules),
        cmocka_unit_test(test_null_grads),         cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_piece_cumsum),       cmocka_unit_test(test_piece_kkt),
        cmocka_unit_test(test_piece_solve_tril),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
