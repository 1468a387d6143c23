/* The cases of `deltagrad bench --device cuda` (bench_cuda_case.h): random numbers, the shapes, a
 * case's device arrays, the timed bodies on the family's backend table, and the counting. */
#include "tools/bench_cuda_case.h"

#ifdef DG_HAVE_CUDA

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bf16.h"
#include "core/f16.h"
#include "core/internal.h"
#include "kernels/cuda/cuda_kernels.h"
#include "models/safetensors.h"

/* R1: S1's 16384 tokens packed as documents of mixed lengths (cu_seqlens), most not a multiple of the
 * chunk, one of a single token, the longest last; bench/fla_side_by_side.py has the same list */
static const int64_t R1_LENS[12] = {1000, 37, 2500, 129, 3000, 64, 1, 777, 2048, 1500, 1232, 4096};

const shape_def BENCH_SHAPES[BENCH_NSHAPES] = {
    {"S1", 8, 2048, 16, 16, 128, 128, NULL, 0, DG_BF16, true, 7u},
    {"S2", 2, 8192, 16, 16, 128, 128, NULL, 0, DG_BF16, true, 7u},
    {"S3", 16, 4096, 8, 8, 256, 256, NULL, 0, DG_F16, true, 1u},
    {"S4", 8, 2048, 16, 16, 128, 256, NULL, 0, DG_BF16, false, 3u},
    {"L1", 4, 4096, 6, 6, 256, 512, NULL, 0, DG_BF16, false, 1u},
    {"Q1", 4, 4096, 16, 32, 128, 128, NULL, 0, DG_BF16, false, 1u},
    {"O1", 8, 2048, 16, 16, 96, 96, NULL, 0, DG_BF16, false, 7u},
    {"R1", 1, 16384, 16, 16, 128, 128, R1_LENS, 12, DG_BF16, false, 7u},
    {"K1", 8, 2048, 16, 16, 64, 64, NULL, 0, DG_BF16, false, 7u},
};
const char *const BENCH_OPS[3] = {"gated_delta_rule", "kda", "delta_rule"};

/* ---- host random numbers (xorshift64*) ---------------------------------------------------------- */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double urand(void) {
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return ((rng_state * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0);
}
/* mean 0, variance 1: the sum of two uniforms, rescaled (triangular; enough for timing data, and
 * fast: S3 draws half a billion values) */
static float nrand(void) { return (float)((urand() + urand() - 1.0) * 2.449489742783178); }
static float logsigmoidf(float x) { return fminf(x, 0.0f) - log1pf(expf(-fabsf(x))); }

/* a device array of n random values of dtype dt: bf16 or fp16 bits, or f32 */
void *bench_dev_random(int64_t n, dg_dtype dt, rand_kind kind) {
    if (dt != DG_F32 && dt != DG_BF16 && dt != DG_F16) {
        dg_error("bench: random values of dtype %s (only f32, bf16, f16)", dg_dtype_name(dt));
        return NULL;
    }
    size_t es = dg_dtype_size(dt);
    void *h = malloc((size_t)n * es), *d = dg_cuda_malloc((size_t)n * es);
    if (!h || !d) {
        free(h);
        dg_cuda_free(d);
        if (!h) dg_error("bench: out of host memory (%lld values)", (long long)n);
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) {
        float x = nrand();
        if (kind == R_SIGMOID) x = 1.0f / (1.0f + expf(-x));
        else if (kind == R_LOGSIGMOID) x = fmaxf(logsigmoidf(x), -5.0f);
        if (dt == DG_BF16) ((uint16_t *)h)[i] = dg_bf16_from_f32(x);
        else if (dt == DG_F16) ((uint16_t *)h)[i] = dg_f16_from_f32(x);
        else ((float *)h)[i] = x;
    }
    int rc = dg_cuda_memcpy(d, h, (size_t)n * es, 0);
    free(h);
    if (rc) {
        dg_cuda_free(d);
        return NULL;
    }
    return d;
}


/* ---- one benchmark case: shape, device arrays ---------------------------------------------------- */


static void case_free_work(bcase *c) {
    void *p[] = {c->qn,    c->kn, c->o,  c->dqn, c->dkn,  c->dq, c->dk, c->dv,
                 c->dbeta, c->rq, c->rk, c->dg,  c->keep, c->hT, c->dh0};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) dg_cuda_free(p[i]);
    c->qn = c->kn = c->o = c->dqn = c->dkn = c->dq = c->dk = c->dv = c->dbeta = NULL;
    c->rq = c->rk = c->dg = c->hT = c->dh0 = NULL;
    c->keep = NULL;
}
void bench_case_free(bcase *c) {
    case_free_work(c);
    void *p[] = {c->q, c->k, c->v, c->beta, c->dout, c->g, c->h0, c->dht};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) dg_cuda_free(p[i]);
    c->q = c->k = c->v = c->beta = c->dout = NULL;
    c->g = c->h0 = c->dht = NULL;
    free(c->cu);
    c->cu = NULL;
}

int64_t bench_nqk(const bcase *c) { return c->s.B * c->s.T * c->s.H * c->s.K; }
int64_t bench_nvo(const bcase *c) { return c->s.B * c->s.T * c->s.HV * c->s.V; }
int64_t bench_nbt(const bcase *c) { return c->s.B * c->s.T * c->s.HV; }
static int64_t n_state(const bcase *c) { return c->s.N * c->s.HV * c->s.K * c->s.V; } /* of h0, hT */

static dg_delta_call fwd_call(const bcase *c, bench_what w, bool recurrent);

/* outputs and gradients (inputs already there) */
static int case_alloc_work(bcase *c) {
    size_t q2 = (size_t)bench_nqk(c) * 2, v2 = (size_t)bench_nvo(c) * 2, b2 = (size_t)bench_nbt(c) * 2;
    size_t rows4 = (size_t)(c->s.B * c->s.T * c->s.H) * 4;
    c->qn = dg_cuda_malloc(q2), c->kn = dg_cuda_malloc(q2), c->dqn = dg_cuda_malloc(q2);
    c->dkn = dg_cuda_malloc(q2), c->dq = dg_cuda_malloc(q2), c->dk = dg_cuda_malloc(q2);
    c->o = dg_cuda_malloc(v2), c->dv = dg_cuda_malloc(v2), c->dbeta = dg_cuda_malloc(b2);
    c->rq = dg_cuda_malloc(rows4), c->rk = dg_cuda_malloc(rows4);
    bool ok = c->qn && c->kn && c->dqn && c->dkn && c->dq && c->dk && c->o && c->dv && c->dbeta && c->rq && c->rk;
    if (c->G) ok = ok && (c->dg = dg_cuda_malloc((size_t)bench_nbt(c) * c->G * 4));
    /* the final state wherever the case has state tensors (dht is its gradient), h0's gradient with h0 */
    if (c->h0 || c->dht) ok = ok && (c->hT = dg_cuda_malloc((size_t)n_state(c) * 4));
    if (c->h0) ok = ok && (c->dh0 = dg_cuda_malloc((size_t)n_state(c) * 4));
    const dg_delta_call f = fwd_call(c, W_FWDBWD, false);
    const int64_t kb = dg_delta_kept_bytes(NULL, &f);
    if (kb < 0) return -1;
    if (kb > 0) ok = ok && (c->keep = dg_cuda_malloc((size_t)kb));
    return ok ? 0 : -1;
}

/* ---- the timed bodies ---------------------------------------------------------------------------- */
static int norm_fwd(bcase *c) {
    int64_t rows = c->s.B * c->s.T * c->s.H;
    if (dg_delta_k_l2norm_fwd(c->op, DG_CUDA, c->dt, rows, c->s.K, c->q, c->qn, c->rq)) return -1;
    return dg_delta_k_l2norm_fwd(c->op, DG_CUDA, c->dt, rows, c->s.K, c->k, c->kn, c->rk);
}
static int norm_bwd(bcase *c) {
    int64_t rows = c->s.B * c->s.T * c->s.H;
    if (dg_delta_k_l2norm_bwd(c->op, DG_CUDA, c->dt, rows, c->s.K, c->q, c->rq, c->dqn, c->dq)) return -1;
    return dg_delta_k_l2norm_bwd(c->op, DG_CUDA, c->dt, rows, c->s.K, c->k, c->rk, c->dkn, c->dk);
}

/* the forward's call of w (the ops' call with use_qk_l2norm_in_kernel); h0 and the final state where
 * the case has them (a file's h0, dht), else none */
static dg_delta_call fwd_call(const bcase *c, bench_what w, bool recurrent) {
    /* a forward alone keeps nothing (as the ops without autograd); fwd+bwd keeps unless keep_off */
    void *keep = w == W_FWDBWD && !recurrent && !c->keep_off ? c->keep : NULL;
    dg_delta_call f = {
        .op = c->op,
        .s = c->s,
        .dtype = c->dt,
        .device = DG_CUDA,
        .algorithm = recurrent ? DG_DELTA_RECURRENT : DG_DELTA_CHUNKED,
        .q = c->qn,
        .k = c->kn,
        .v = c->v,
        .g = c->g,
        .beta = c->beta,
        .h0 = c->h0,
        .o = c->o,
        .hT = c->hT,
        .keep = keep,
        /* (a forward alone: q not written) */
        .l2 = {.on = true, .qraw = c->q, .kraw = c->k, .rq = c->rq, .rk = c->rk, .for_bwd = w == W_FWDBWD},
        .l2_norm_first = c->norm_first};
    return f;
}

int bench_body(bcase *c, bench_what w, const dg_delta_bwd_flags *var, bool recurrent) {
    if (w == W_NORM) return norm_fwd(c) || norm_bwd(c) ? -1 : 0;
    dg_delta_call f = fwd_call(c, w, recurrent);
    int rc = dg_delta_fwd(NULL, &f);
    if (rc || w == W_FWD) return rc;
    /* as the ops call them: the 16-bit chunked kernels take the norm's backward with them (dq, dk of
     * the raw rows); the recurrent ones give dqn, dkn, and the norm's backward follows */
    dg_delta_call b = {.op = c->op,
                       .s = c->s,
                       .dtype = c->dt,
                       .device = DG_CUDA,
                       .algorithm = f.algorithm,
                       .bwd = var ? *var : (dg_delta_bwd_flags){0},
                       .q = c->qn,
                       .k = c->kn,
                       .v = c->v,
                       .g = c->g,
                       .beta = c->beta,
                       .h0 = c->h0,
                       .dout = c->dout,
                       .dhT = c->dht,
                       .dq = recurrent ? c->dqn : c->dq,
                       .dk = recurrent ? c->dkn : c->dk,
                       .dv = c->dv,
                       .dg = c->dg,
                       .dbeta = c->dbeta,
                       .dh0 = c->dh0,
                       .keep = f.kept ? f.keep : NULL,
                       .kept = f.kept,
                       .l2 = {.on = true, .rq = c->rq, .rk = c->rk}};
    rc = dg_delta_bwd(NULL, &b);
    if (rc || b.l2_done) return rc;
    if (!recurrent) {
        dg_error("bench: the chunked backward did not apply the L2 norm's backward");
        return -1;
    }
    return norm_bwd(c);
}


/* ---- counting (see the file comment) ---------------------------------------------------------------- */
static double n_chunks(const dg_dr_shape *s) {
    if (!s->cu_seqlens) return (double)s->B * s->HV * ceil((double)s->T / s->chunk);
    double n = 0;
    for (int64_t i = 0; i < s->N; i++) n += ceil((double)(s->cu_seqlens[i + 1] - s->cu_seqlens[i]) / s->chunk);
    return n * s->HV;
}
double bench_flops_fwd(const dg_dr_shape *s) {
    double C = s->chunk, K = s->K, V = s->V;
    return n_chunks(s) * (5 * C * C * K + 4 * C * C * V + 6 * C * K * V);
}
double bench_flops_bwd(const dg_dr_shape *s) {
    double C = s->chunk, K = s->K, V = s->V;
    return n_chunks(s) * (17 * C * C * K + 10 * C * C * V + 16 * C * K * V + 4 * C * C * C);
}
double bench_bytes_fwd(const bcase *c) {
    const dg_dr_shape *s = &c->s;
    double K = s->K, V = s->V, G = (double)c->G;
    return (double)s->B * s->T * (s->H * (2 * K + 2 * K) + s->HV * (2 * V + 2 + 4 * G + 2 * V));
}
double bench_bytes_bwd(const bcase *c) {
    const dg_dr_shape *s = &c->s;
    double K = s->K, V = s->V, G = (double)c->G;
    return (double)s->B * s->T * (s->H * (4 * K + 4 * K) + s->HV * (2 * V + 2 * V + 2 + 4 * G + 2 * V + 2 + 4 * G));
}


/* ---- cases: generated at the benchmark shapes, or read from a safetensors file ------------------------ */
static void set_shape(bcase *c, const char *op, int64_t B, int64_t T, int64_t H, int64_t HV, int64_t K, int64_t V) {
    const dg_delta_gate *gt = dg_delta_gate_of_op(op);
    snprintf(c->op, sizeof c->op, "%s", op);
    c->s = (dg_dr_shape){.B = B,
                         .T = T,
                         .H = H,
                         .HV = HV,
                         .K = K,
                         .V = V,
                         .cu_seqlens = c->cu,
                         .N = c->cu ? c->ncu - 1 : B,
                         .gate = gt->kind,
                         .scale = 1.0 / sqrt((double)K),
                         .chunk = 64};
    c->G = dg_delta_gate_width(gt, K);
}
/* c->cu = the offsets of n sequences of lengths len[] (host) */
static int case_set_seqlens(bcase *c, int n, const int64_t *len) {
    if (!(c->cu = malloc(sizeof(int64_t) * (size_t)(n + 1)))) {
        dg_error("bench: out of host memory (cu_seqlens of %d sequences)", n);
        return -1;
    }
    c->ncu = n + 1;
    c->cu[0] = 0;
    for (int i = 0; i < n; i++) c->cu[i + 1] = c->cu[i] + len[i];
    return 0;
}
int bench_case_random(bcase *c, const shape_def *d, dg_dtype dt) {
    memset(c, 0, sizeof *c);
    snprintf(c->label, sizeof c->label, "%s", d->name);
    if (d->nseq && case_set_seqlens(c, d->nseq, d->seqlens)) return -1;
    if (d->nseq && (d->B != 1 || c->cu[d->nseq] != d->T)) {
        dg_error("bench: shape %s: its sequences hold %lld tokens in B = %lld, expected T = %lld in B = 1", d->name,
                 (long long)c->cu[d->nseq], (long long)d->B, (long long)d->T);
        return -1;
    }
    set_shape(c, "delta_rule", d->B, d->T, d->H, d->HV, d->K, d->V);
    c->dt = dt;
    c->q = bench_dev_random(bench_nqk(c), dt, R_NORMAL), c->k = bench_dev_random(bench_nqk(c), dt, R_NORMAL);
    c->v = bench_dev_random(bench_nvo(c), dt, R_NORMAL), c->dout = bench_dev_random(bench_nvo(c), dt, R_NORMAL);
    c->beta = bench_dev_random(bench_nbt(c), dt, R_SIGMOID);
    return c->q && c->k && c->v && c->dout && c->beta ? 0 : -1;
}
int bench_case_set_op(bcase *c, const char *op) {
    case_free_work(c);
    dg_cuda_free(c->g);
    c->g = NULL;
    set_shape(c, op, c->s.B, c->s.T, c->s.H, c->s.HV, c->s.K, c->s.V);
    if (c->G && !(c->g = bench_dev_random(bench_nbt(c) * c->G, DG_F32, R_LOGSIGMOID))) return -1;
    return case_alloc_work(c);
}

static const dg_tensor *st_need(const dg_st_file *f, const char *name, dg_dtype dt, int ndim, bool optional) {
    const dg_tensor *t = dg_st_get(f, name);
    if (!t) {
        if (!optional) dg_error("bench: --inputs '%s': tensor '%s' is missing", f->path, name);
        return NULL;
    }
    if (t->dtype != dt || (ndim && t->ndim != ndim)) {
        dg_error("bench: --inputs '%s': tensor '%s' is %s %s, expected %s with %d dims", f->path, name,
                 dg_st_dtype_name(t->dtype), dg_shp(t), dg_st_dtype_name(dt), ndim);
        return NULL;
    }
    return t;
}
static void *upload(const dg_tensor *t) {
    size_t n = (size_t)dg_numel(t) * dg_dtype_size(t->dtype);
    void *d = dg_cuda_malloc(n);
    if (d && dg_cuda_memcpy(d, dg_data_ptr(t), n, 0)) {
        dg_cuda_free(d);
        return NULL;
    }
    return d;
}
/* q, k [B,T,H,K], v, do [B,T,HV,V], beta [B,T,HV] bf16 or f16 (all five the same); g f32 [B,T,HV] (gated_delta_rule) or
 * [B,T,HV,K] (kda) or absent (delta_rule); h0 (the initial state) and dht (the final state's gradient)
 * f32 [B,HV,K,V], each optional; metadata "op" (checked against g) and "label" */
int bench_case_from_file(bcase *c, const char *path) {
    memset(c, 0, sizeof *c);
    dg_st_file *f = dg_st_read(path);
    if (!f) return -1;
    int rc = -1;
    const dg_tensor *q0 = dg_st_get(f, "q");
    const dg_dtype dt = q0 && q0->dtype == DG_F16 ? DG_F16 : DG_BF16;
    const dg_tensor *q = st_need(f, "q", dt, 4, false), *k = st_need(f, "k", dt, 4, false);
    const dg_tensor *v = st_need(f, "v", dt, 4, false), *dout = st_need(f, "do", dt, 4, false);
    const dg_tensor *beta = st_need(f, "beta", dt, 3, false), *g = st_need(f, "g", DG_F32, 0, true);
    const dg_tensor *h0 = st_need(f, "h0", DG_F32, 4, true), *dht = st_need(f, "dht", DG_F32, 4, true);
    const dg_tensor *cu = st_need(f, "cu_seqlens", DG_I64, 1, true);
    if (!q || !k || !v || !dout || !beta || dg_has_error()) goto out;
    const int64_t B = q->shape[0], T = q->shape[1], H = q->shape[2], K = q->shape[3], HV = v->shape[2], V = v->shape[3];
    const char *op = NULL; /* the op whose gate has g's dims (none: delta_rule) */
    for (int i = 0; i < dg_delta_gate_count(); i++)
        if (dg_delta_gate_ndim(dg_delta_gate_at(i)) == (g ? g->ndim : 0)) op = dg_delta_gate_at(i)->op;
    const char *mop = dg_st_meta(f, "op");
    bool bad = !op || memcmp(k->shape, q->shape, sizeof(int64_t) * 4) || v->shape[0] != B || v->shape[1] != T ||
               memcmp(dout->shape, v->shape, sizeof(int64_t) * 4) || beta->shape[0] != B || beta->shape[1] != T ||
               beta->shape[2] != HV ||
               (g && (g->ndim < 3 || g->ndim > 4 || g->shape[0] != B || g->shape[1] != T || g->shape[2] != HV ||
                      (g->ndim == 4 && g->shape[3] != K)));
    if (bad) {
        dg_error("bench: --inputs '%s': shapes do not fit q [B,T,H,K] %s, k %s, v [B,T,HV,V] %s, do %s, beta "
                 "[B,T,HV] %s, g [B,T,HV] or [B,T,HV,K] %s",
                 path, dg_shp(q), dg_shp(k), dg_shp(v), dg_shp(dout), dg_shp(beta), g ? dg_shp(g) : "absent");
        goto out;
    }
    if (cu && (B != 1 || cu->shape[0] < 2)) {
        dg_error("bench: --inputs '%s': cu_seqlens %s needs B = 1 (q %s) and at least one sequence", path, dg_shp(cu),
                 dg_shp(q));
        goto out;
    }
    if (cu) { /* the op checks the offsets themselves (from 0 to T, not decreasing) */
        if (!(c->cu = malloc(sizeof(int64_t) * (size_t)cu->shape[0]))) {
            dg_error("bench: out of host memory (cu_seqlens %s)", dg_shp(cu));
            goto out;
        }
        c->ncu = cu->shape[0];
        memcpy(c->cu, dg_data_ptr(cu), sizeof(int64_t) * (size_t)c->ncu);
    }
    const int64_t N = cu ? cu->shape[0] - 1 : B;
    const int64_t sh[4] = {N, HV, K, V}; /* h0, dht: one state a sequence */
    const dg_tensor *st[2] = {h0, dht};
    for (int i = 0; i < 2; i++)
        if (st[i] && memcmp(st[i]->shape, sh, sizeof sh)) {
            dg_error("bench: --inputs '%s': tensor '%s' is %s, expected [N,HV,K,V] %s (q %s, v %s)", path,
                     i ? "dht" : "h0", dg_shp(st[i]), dg_shape_text(4, sh), dg_shp(q), dg_shp(v));
            goto out;
        }
    if (mop && strcmp(mop, op)) {
        dg_error("bench: --inputs '%s': metadata op '%s' does not fit g %s (that is %s)", path, mop,
                 g ? dg_shp(g) : "absent", op);
        goto out;
    }
    const char *lab = dg_st_meta(f, "label"), *base = strrchr(path, '/');
    snprintf(c->label, sizeof c->label, "%s", lab ? lab : base ? base + 1 : path);
    set_shape(c, op, B, T, H, HV, K, V);
    c->dt = dt;
    c->q = upload(q), c->k = upload(k), c->v = upload(v), c->dout = upload(dout), c->beta = upload(beta);
    if (g) c->g = upload(g);
    if (h0) c->h0 = upload(h0);
    if (dht) c->dht = upload(dht);
    if (!c->q || !c->k || !c->v || !c->dout || !c->beta || (g && !c->g) || (h0 && !c->h0) || (dht && !c->dht) ||
        case_alloc_work(c))
        goto out;
    rc = 0;
out:
    dg_st_free(f);
    return rc;
}

/* o, dq, dk, dv, dbeta (the case's 16-bit dtype), and dg, hT, dh0 (f32) where the case has them, of
 * the last call, to PATH (safetensors) */
int bench_dump_outputs(const bcase *c, const char *path) {
    const dg_dr_shape *s = &c->s;
    dg_scope_begin();
    const int64_t sq[4] = {s->B, s->T, s->H, s->K}, sv[4] = {s->B, s->T, s->HV, s->V}, sb[3] = {s->B, s->T, s->HV};
    const int64_t sg[4] = {s->B, s->T, s->HV, s->K}, sh[4] = {s->N, s->HV, s->K, s->V};
    const char *names[8] = {"o", "dq", "dk", "dv", "dbeta"};
    const void *src[8] = {c->o, c->dq, c->dk, c->dv, c->dbeta};
    dg_tensor *t[8] = {dg_empty(4, sv, c->dt), dg_empty(4, sq, c->dt), dg_empty(4, sq, c->dt), dg_empty(4, sv, c->dt),
                       dg_empty(3, sb, c->dt)};
    int n = 5, rc = 0;
    if (c->G) names[n] = "dg", src[n] = c->dg, t[n++] = dg_empty(c->G == 1 ? 3 : 4, sg, DG_F32);
    if (c->hT) names[n] = "hT", src[n] = c->hT, t[n++] = dg_empty(4, sh, DG_F32);
    if (c->dh0) names[n] = "dh0", src[n] = c->dh0, t[n++] = dg_empty(4, sh, DG_F32);
    for (int i = 0; i < n && rc == 0; i++) {
        const size_t bytes = t[i] ? (size_t)dg_numel(t[i]) * dg_dtype_size(t[i]->dtype) : 0;
        rc = !t[i] ? -1 : dg_cuda_memcpy(dg_data_ptr(t[i]), src[i], bytes, 1);
    }
    if (rc == 0) rc = dg_st_write(path, n, names, t, 0, NULL, NULL);
    dg_scope_end();
    return rc;
}
/* 16-bit values that are inf or NaN (all exponent bits set) among o, dq, dk, dv of the last call
 * (-1 on a failed copy) */
int64_t bench_nonfinite(const bcase *c) {
    const uint16_t *a[4] = {c->o, c->dq, c->dk, c->dv};
    const uint16_t ex = c->dt == DG_F16 ? 0x7c00u : 0x7f80u;
    int64_t n[4] = {bench_nvo(c), bench_nqk(c), bench_nqk(c), bench_nvo(c)}, bad = 0;
    for (int i = 0; i < 4; i++) {
        uint16_t *h = malloc((size_t)n[i] * 2);
        if (!h || dg_cuda_memcpy(h, a[i], (size_t)n[i] * 2, 1)) {
            free(h);
            return -1;
        }
        for (int64_t j = 0; j < n[i]; j++) bad += (h[j] & ex) == ex;
        free(h);
    }
    return bad;
}


#endif /* DG_HAVE_CUDA */
