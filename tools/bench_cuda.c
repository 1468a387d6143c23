/* deltagrad bench --device cuda: the chunked delta-rule kernels (gated_delta_rule, kda, delta_rule)
 * on the GPU at the shapes of issue 6, 16-bit q, k, v, beta, dout; f32 gates; chunk 64:
 *   S1  B8  T2048 H16 K=V=128   bf16
 *   S2  B2  T8192 H16 K=V=128   bf16
 *   S3  B16 T4096 H8  K=V=256   fp16, gated_delta_rule only (as the table; K = V = 256
 *                               takes the generic kernels: the tensor-core ones stop at K = 128)
 *   S4  B8  T2048 H16 K=128 V=256 bf16, gated_delta_rule only, with --shapes S4 only (FLA's layer
 *                               default V = 2K: the tensor-core kernels as two heads of V = 128)
 * (--dtype bf16|f16 puts every shape in one dtype)
 * or at the shapes of safetensors files (--inputs FILE, written by bench/fla_side_by_side.py, so
 * that FLA and these kernels run on the same numbers).
 *
 * What one timed call is.  The kernels are called through the ops' kernel dispatch
 * (ops/delta/delta_kernels.c: dr_chunk_cuda.h's chunked or cuda_kernels.h's recurrent entry points) the
 * way the ops call them with use_qk_l2norm_in_kernel, so every time below includes the L2 norm of
 * the raw q and k: the tensor-core forward of gate NONE and HEAD takes it in its loads
 * (dg_cuda_dr_chunk_fwd_l2_*, session 14), the other paths run the norm's kernel first (the row
 * "as default, norm kernel first" times that for the tensor-core paths too):
 *   fwd     = chunk forward with the norm (o; no final state)
 *   fwd+bwd = fwd, then chunk backward (dq, dk, dv, dbeta, dg), given 1/|q|, 1/|k|, so that its
 *             dq, dk are those of the raw q, k: the head-gate tensor-core kernels apply the norm's
 *             backward as they store dq, dk, the others run its kernel after (session 5; before,
 *             the norm's backward always ran after, over q, k, dq, dk).  As the ops do when they
 *             record for autograd, the forward keeps its working set (W, U, the states, V', the
 *             inverse; dr_chunk_cuda.h) for the backward, which then does not recompute it; the
 *             row "recompute in bwd" times the other way (FLA's: the backward recomputes)
 * Norm and kernels are called through the ops' own dispatch (ops/delta/delta_kernels.c: the 16-bit row
 * kernel of the norm, the chunked or recurrent entry points).  The norm's own fwd+bwd time is
 * printed beside each case.
 *
 * Timing: CUDA events around each call on the library's stream; 2 warm-up calls, then
 * max(5, min(reps, 300 ms / one call)) timed calls, the median reported; before every timed call a
 * 256 MiB buffer is written (the H100's L2 is 50 MB), so no call finds its inputs in L2.  Below each
 * chunked variant's line (not with --no-variants), "kernels, ms a call": every chunked kernel of
 * one fwd+bwd call with its own time (dg_cuda_ktime: events around each launch; the mean of 5 calls
 * back to back, L2 warm), e.g. kda's fused qkwy against the dqkwg + wy pair it replaces.
 * Ceilings, measured in the same run: cuBLAS bf16 GEMM 8192^3 (random inputs, bf16 out, f32
 * accumulation) and a 1 GiB device-to-device copy (bytes read + bytes written).
 *
 * Counting (per chunk of C = 64 tokens and value head; 2 FLOPs a multiply-add; every product as
 * the dense GEMM the chunked algorithm does, the K K^T Gram at half; the elementwise gating, the
 * norm and the exponentials are left out):
 *   forward  5 C^2 K + 4 C^2 V + 6 C K V
 *            (K K^T: C^2 K; W = T (beta K): 2 C^2 K; Q K^T: 2 C^2 K; U = T (beta V), (Q K^T) V':
 *            2 C^2 V each; W S, K^T V' (state update), Q S: 2 C K V each)
 *   backward 17 C^2 K + 10 C^2 V + 16 C K V + 4 C^3
 *            (recompute W, U and the states; dv local (K Q^T) dO; the state gradient recurrence
 *            Q^T dO, K dS, W^T dv; dq, dk, dw inter-chunk; the WY backward A^T dw, A^T du,
 *            dw (beta K)^T, du (beta V)^T, dA K, dA^T K and dA = -T^T dA T^T: 4 C^3)
 *   as bench/dr_chunk_bench.c ("dense").  Bytes: the compulsory traffic, each input read once
 *   and each output written once per pass (bf16 / fp16 2 bytes, f32 4; G = 0, 1 or K gate values per
 *   token and value head for delta_rule, gated_delta_rule, kda):
 *   forward  B T (H (2K + 2K) + HV (2V + 2 + 4G + 2V))                     q, k, v, beta, g; o
 *   backward B T (H (4K + 4K) + HV (2V + 2V + 2 + 4G + 2V + 2 + 4G))       q, k, v, dO, beta, g;
 *                                                                           dq, dk, dv, dbeta, dg
 *   fwd+bwd = forward + backward.  floor = max(FLOPs / GEMM rate, bytes / copy rate): no kernel
 *   can beat it; "x floor" is the measured time over it. */
#include "tools/bench_cuda.h"

#include "deltagrad.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef DG_HAVE_CUDA

int dg_bench_cuda(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "bench: --device cuda: this build has no CUDA backend (build with `scons cuda=1`)\n");
    return 2;
}

#else

#include <cuda_runtime_api.h>

#include "core/bf16.h"
#include "core/f16.h"
#include "core/internal.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/delta/dr_chunk_cuda.h"
#include "models/safetensors.h"
#include "ops/delta/delta_common.h"

cudaStream_t dg_cuda_stream(void); /* kernels/cuda/runtime.cu */

#define FLUSH_BYTES ((size_t)256 << 20)
#define MAX_REPS 200

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

typedef enum { R_NORMAL, R_SIGMOID, R_LOGSIGMOID } rand_kind;

/* a device array of n random values of dtype dt: bf16 or fp16 bits, or f32 */
static void *dev_random(int64_t n, dg_dtype dt, rand_kind kind) {
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
typedef struct bcase {
    char label[64], op[24];
    dg_dr_shape s;
    int64_t G;                                  /* gate values per token and value head: 0, 1, K */
    dg_dtype dt;                                /* of q, k, v, beta, dout, o and the gradients: bf16 or f16 */
    uint16_t *q, *k, *v, *beta, *dout;          /* raw inputs (16-bit words) */
    float *g;                                   /* per-token log decay, NULL for delta_rule */
    uint16_t *qn, *kn, *o, *dqn, *dkn, *dq, *dk, *dv, *dbeta;
    float *rq, *rk, *dg;
    void *keep;     /* the forward's working set kept for the backward (NULL: none for this shape) */
    bool keep_off;  /* time the recomputing backward instead */
} bcase;

static void case_free_work(bcase *c) {
    void *p[] = {c->qn, c->kn, c->o, c->dqn, c->dkn, c->dq, c->dk, c->dv, c->dbeta, c->rq, c->rk,
                 c->dg, c->keep};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) dg_cuda_free(p[i]);
    c->qn = c->kn = c->o = c->dqn = c->dkn = c->dq = c->dk = c->dv = c->dbeta = NULL;
    c->rq = c->rk = c->dg = NULL;
    c->keep = NULL;
}
static void case_free(bcase *c) {
    case_free_work(c);
    void *p[] = {c->q, c->k, c->v, c->beta, c->dout, c->g};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) dg_cuda_free(p[i]);
    c->q = c->k = c->v = c->beta = c->dout = NULL;
    c->g = NULL;
}

static int64_t nqk(const bcase *c) { return c->s.B * c->s.T * c->s.H * c->s.K; }
static int64_t nvo(const bcase *c) { return c->s.B * c->s.T * c->s.HV * c->s.V; }
static int64_t nbt(const bcase *c) { return c->s.B * c->s.T * c->s.HV; }

/* outputs and gradients (inputs already there) */
static int case_alloc_work(bcase *c) {
    size_t q2 = (size_t)nqk(c) * 2, v2 = (size_t)nvo(c) * 2, b2 = (size_t)nbt(c) * 2;
    size_t rows4 = (size_t)(c->s.B * c->s.T * c->s.H) * 4;
    c->qn = dg_cuda_malloc(q2), c->kn = dg_cuda_malloc(q2), c->dqn = dg_cuda_malloc(q2);
    c->dkn = dg_cuda_malloc(q2), c->dq = dg_cuda_malloc(q2), c->dk = dg_cuda_malloc(q2);
    c->o = dg_cuda_malloc(v2), c->dv = dg_cuda_malloc(v2), c->dbeta = dg_cuda_malloc(b2);
    c->rq = dg_cuda_malloc(rows4), c->rk = dg_cuda_malloc(rows4);
    bool ok = c->qn && c->kn && c->dqn && c->dkn && c->dq && c->dk && c->o && c->dv && c->dbeta && c->rq && c->rk;
    if (c->G) ok = ok && (c->dg = dg_cuda_malloc((size_t)nbt(c) * c->G * 4));
    const int64_t kb = dg_delta_k_kept_bytes(c->op, DG_DELTA_CHUNKED, &c->s, DG_CUDA, c->dt);
    if (kb < 0) return -1;
    if (kb > 0) ok = ok && (c->keep = dg_cuda_malloc((size_t)kb));
    return ok ? 0 : -1;
}

/* ---- the timed bodies ---- */
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

typedef enum { W_FWD, W_FWDBWD, W_NORM } what_t;

static int body(bcase *c, what_t w, const dg_dr_variant *var, bool recurrent) {
    const dg_dr_shape *s = &c->s;
    if (w == W_NORM) return norm_fwd(c) || norm_bwd(c) ? -1 : 0;
    /* a forward alone keeps nothing (as the ops without autograd); fwd+bwd keeps unless keep_off */
    void *keep = w == W_FWDBWD && !recurrent && !c->keep_off ? c->keep : NULL;
    int kept = 0;
    const dg_delta_l2 l2 = {c->q, c->k, c->rq, c->rk, w == W_FWDBWD}; /* (a forward alone: q not written) */
    int rc = dg_delta_k_fwd_l2(c->op, recurrent ? DG_DELTA_RECURRENT : DG_DELTA_CHUNKED, s, DG_CUDA, c->dt, c->qn,
                               c->kn, c->v, c->g, c->beta, NULL, c->o, NULL, keep, &kept, &l2);
    if (rc || w == W_FWD) return rc;
    /* as the ops call them: the 16-bit chunked kernels take the norm's backward with them (dq, dk of
     * the raw rows); the recurrent ones give dqn, dkn, and the norm's backward follows */
    int l2_done = 0;
    rc = dg_delta_k_bwd(c->op, recurrent, var, s, DG_CUDA, c->dt, c->qn, c->kn, c->v, c->g, c->beta, NULL, c->dout,
                        NULL, recurrent ? c->dqn : c->dq, recurrent ? c->dkn : c->dk, c->dv, c->dg, c->dbeta, NULL,
                        kept ? keep : NULL, c->rq, c->rk, &l2_done);
    if (rc || l2_done) return rc;
    if (!recurrent) {
        dg_error("bench: the chunked backward did not apply the L2 norm's backward");
        return -1;
    }
    return norm_bwd(c);
}

/* ---- timing ---------------------------------------------------------------------------------------- */
static cudaEvent_t ev0, ev1;
static void *flush_buf;

static int cu_check(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    dg_error("bench: %s failed: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
    return -1;
}
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
/* one call between events, L2 flushed before; milliseconds or NAN (dg_error set) */
static double timed_once(bcase *c, what_t w, const dg_dr_variant *var, bool recurrent) {
    if (dg_cuda_memset0(flush_buf, FLUSH_BYTES)) return NAN;
    if (cu_check(cudaEventRecord(ev0, dg_cuda_stream()), "cudaEventRecord")) return NAN;
    if (body(c, w, var, recurrent)) return NAN;
    if (cu_check(cudaEventRecord(ev1, dg_cuda_stream()), "cudaEventRecord")) return NAN;
    if (cu_check(cudaEventSynchronize(ev1), "the timed kernels (cudaEventSynchronize)")) return NAN;
    float ms = 0;
    if (cu_check(cudaEventElapsedTime(&ms, ev0, ev1), "cudaEventElapsedTime")) return NAN;
    return ms;
}
/* median of the timed calls after 2 warm-ups; *n gets their number */
static double time_median(bcase *c, what_t w, const dg_dr_variant *var, bool recurrent, int max_reps, int *n) {
    *n = 0;
    for (int i = 0; i < 2; i++)
        if (body(c, w, var, recurrent)) return NAN;
    if (dg_cuda_synchronize()) return NAN;
    double t[MAX_REPS];
    t[0] = timed_once(c, w, var, recurrent);
    if (isnan(t[0])) return NAN;
    int reps = (int)ceil(300.0 / fmax(t[0], 1e-3));
    reps = reps < 5 ? 5 : reps > max_reps ? max_reps : reps;
    for (int r = 1; r < reps; r++)
        if (isnan(t[r] = timed_once(c, w, var, recurrent))) return NAN;
    qsort(t, reps, sizeof t[0], cmp_double);
    *n = reps;
    return reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
}

/* ---- counting (see the file comment) ---------------------------------------------------------------- */
static double n_chunks(const dg_dr_shape *s) { return (double)s->B * s->HV * ceil((double)s->T / s->chunk); }
static double flops_fwd(const dg_dr_shape *s) {
    double C = s->chunk, K = s->K, V = s->V;
    return n_chunks(s) * (5 * C * C * K + 4 * C * C * V + 6 * C * K * V);
}
static double flops_bwd(const dg_dr_shape *s) {
    double C = s->chunk, K = s->K, V = s->V;
    return n_chunks(s) * (17 * C * C * K + 10 * C * C * V + 16 * C * K * V + 4 * C * C * C);
}
static double bytes_fwd(const bcase *c) {
    const dg_dr_shape *s = &c->s;
    double K = s->K, V = s->V, G = (double)c->G;
    return (double)s->B * s->T * (s->H * (2 * K + 2 * K) + s->HV * (2 * V + 2 + 4 * G + 2 * V));
}
static double bytes_bwd(const bcase *c) {
    const dg_dr_shape *s = &c->s;
    double K = s->K, V = s->V, G = (double)c->G;
    return (double)s->B * s->T * (s->H * (4 * K + 4 * K) + s->HV * (2 * V + 2 * V + 2 + 4 * G + 2 * V + 2 + 4 * G));
}

/* ---- ceilings -------------------------------------------------------------------------------------- */
static double gemm_tflops(void) {
    const int64_t n = 8192;
    void *a = dev_random(n * n, DG_BF16, R_NORMAL), *b = dev_random(n * n, DG_BF16, R_NORMAL);
    void *cc = dg_cuda_malloc((size_t)(n * n * 2));
    double res = NAN, t[10];
    if (!a || !b || !cc) goto out;
    for (int r = 0; r < 13; r++) {
        if (cu_check(cudaEventRecord(ev0, dg_cuda_stream()), "cudaEventRecord")) goto out;
        if (dg_cuda_gemm(DG_BF16, DG_BF16, false, false, n, n, n, 1.0, a, n, 0, b, n, 0, 0.0, cc, n, 0, 1)) goto out;
        if (cu_check(cudaEventRecord(ev1, dg_cuda_stream()), "cudaEventRecord") ||
            cu_check(cudaEventSynchronize(ev1), "cuBLAS GEMM"))
            goto out;
        float ms;
        cudaEventElapsedTime(&ms, ev0, ev1);
        if (r >= 3) t[r - 3] = ms; /* 3 warm-ups */
    }
    qsort(t, 10, sizeof t[0], cmp_double);
    res = 2.0 * n * n * n / (0.5 * (t[4] + t[5]) * 1e-3) / 1e12;
out:
    dg_cuda_free(a), dg_cuda_free(b), dg_cuda_free(cc);
    return res;
}
static double copy_gbs(void) {
    const int64_t n = (int64_t)1 << 29; /* bf16 values: 1 GiB */
    void *a = dg_cuda_malloc((size_t)n * 2), *b = dg_cuda_malloc((size_t)n * 2);
    double res = NAN, t[10];
    /* a copy's speed does not depend on the values: a constant fill saves drawing 2^29 numbers */
    if (!a || !b || dg_cuda_fill(DG_BF16, n, a, 0.5)) goto out;
    for (int r = 0; r < 13; r++) {
        if (cu_check(cudaEventRecord(ev0, dg_cuda_stream()), "cudaEventRecord")) goto out;
        if (dg_cuda_memcpy(b, a, (size_t)n * 2, 2)) goto out;
        if (cu_check(cudaEventRecord(ev1, dg_cuda_stream()), "cudaEventRecord") ||
            cu_check(cudaEventSynchronize(ev1), "device copy"))
            goto out;
        float ms;
        cudaEventElapsedTime(&ms, ev0, ev1);
        if (r >= 3) t[r - 3] = ms;
    }
    qsort(t, 10, sizeof t[0], cmp_double);
    res = 2.0 * n * 2 / (0.5 * (t[4] + t[5]) * 1e-3) / 1e9;
out:
    dg_cuda_free(a), dg_cuda_free(b);
    return res;
}

/* ---- cases: generated at the shapes, or read from a safetensors file ------------------------ */
typedef struct shape_def {
    const char *name;
    int64_t B, T, H, K, V;
    dg_dtype dt;
    bool by_default; /* run without --shapes */
} shape_def;
enum { NSHAPES = 4 };
static const shape_def SHAPES[NSHAPES] = {{"S1", 8, 2048, 16, 128, 128, DG_BF16, true},
                                          {"S2", 2, 8192, 16, 128, 128, DG_BF16, true},
                                          {"S3", 16, 4096, 8, 256, 256, DG_F16, true},
                                          {"S4", 8, 2048, 16, 128, 256, DG_BF16, false}};
static const char *OPS[3] = {"gated_delta_rule", "kda", "delta_rule"};

static dg_gate_kind gate_of(const char *op) {
    return !strcmp(op, "kda") ? DG_GATE_CHANNEL : !strcmp(op, "gated_delta_rule") ? DG_GATE_HEAD : DG_GATE_NONE;
}
static void set_shape(bcase *c, const char *op, int64_t B, int64_t T, int64_t H, int64_t HV, int64_t K, int64_t V) {
    snprintf(c->op, sizeof c->op, "%s", op);
    c->s = (dg_dr_shape){.B = B, .T = T, .H = H, .HV = HV, .K = K, .V = V, .cu_seqlens = NULL, .N = B,
                         .gate = gate_of(op), .scale = 1.0 / sqrt((double)K), .chunk = 64};
    c->G = c->s.gate == DG_GATE_CHANNEL ? K : c->s.gate == DG_GATE_HEAD ? 1 : 0;
}
/* random q, k, v, dout ~ N(0,1), beta = sigmoid(N(0,1)) (dtype dt), shared by the ops of a shape */
static int case_random(bcase *c, const shape_def *d, dg_dtype dt) {
    memset(c, 0, sizeof *c);
    snprintf(c->label, sizeof c->label, "%s", d->name);
    set_shape(c, "delta_rule", d->B, d->T, d->H, d->H, d->K, d->V);
    c->dt = dt;
    c->q = dev_random(nqk(c), dt, R_NORMAL), c->k = dev_random(nqk(c), dt, R_NORMAL);
    c->v = dev_random(nvo(c), dt, R_NORMAL), c->dout = dev_random(nvo(c), dt, R_NORMAL);
    c->beta = dev_random(nbt(c), dt, R_SIGMOID);
    return c->q && c->k && c->v && c->dout && c->beta ? 0 : -1;
}
/* the op's gate: g = max(logsigmoid(N(0,1)), -5), f32, per head or per channel (FLA's benchmark draws) */
static int case_set_op(bcase *c, const char *op) {
    case_free_work(c);
    dg_cuda_free(c->g);
    c->g = NULL;
    set_shape(c, op, c->s.B, c->s.T, c->s.H, c->s.HV, c->s.K, c->s.V);
    if (c->G && !(c->g = dev_random(nbt(c) * c->G, DG_F32, R_LOGSIGMOID))) return -1;
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
 * [B,T,HV,K] (kda) or absent (delta_rule); metadata "op" (checked against g) and "label" */
static int case_from_file(bcase *c, const char *path) {
    memset(c, 0, sizeof *c);
    dg_st_file *f = dg_st_read(path);
    if (!f) return -1;
    int rc = -1;
    const dg_tensor *q0 = dg_st_get(f, "q");
    const dg_dtype dt = q0 && q0->dtype == DG_F16 ? DG_F16 : DG_BF16;
    const dg_tensor *q = st_need(f, "q", dt, 4, false), *k = st_need(f, "k", dt, 4, false);
    const dg_tensor *v = st_need(f, "v", dt, 4, false), *dout = st_need(f, "do", dt, 4, false);
    const dg_tensor *beta = st_need(f, "beta", dt, 3, false), *g = st_need(f, "g", DG_F32, 0, true);
    if (!q || !k || !v || !dout || !beta || dg_has_error()) goto out;
    const int64_t B = q->shape[0], T = q->shape[1], H = q->shape[2], K = q->shape[3], HV = v->shape[2], V = v->shape[3];
    const char *op = g ? (g->ndim == 3 ? "gated_delta_rule" : "kda") : "delta_rule";
    const char *mop = dg_st_meta(f, "op");
    bool bad = memcmp(k->shape, q->shape, sizeof(int64_t) * 4) || v->shape[0] != B || v->shape[1] != T ||
               memcmp(dout->shape, v->shape, sizeof(int64_t) * 4) || beta->shape[0] != B || beta->shape[1] != T ||
               beta->shape[2] != HV || (g && (g->ndim < 3 || g->ndim > 4 || g->shape[0] != B || g->shape[1] != T ||
                                             g->shape[2] != HV || (g->ndim == 4 && g->shape[3] != K)));
    if (bad) {
        dg_error("bench: --inputs '%s': shapes do not fit q [B,T,H,K] %s, k %s, v [B,T,HV,V] %s, do %s, beta "
                 "[B,T,HV] %s, g [B,T,HV] or [B,T,HV,K] %s",
                 path, dg_shp(q), dg_shp(k), dg_shp(v), dg_shp(dout), dg_shp(beta), g ? dg_shp(g) : "absent");
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
    if (!c->q || !c->k || !c->v || !c->dout || !c->beta || (g && !c->g) || case_alloc_work(c)) goto out;
    rc = 0;
out:
    dg_st_free(f);
    return rc;
}

/* o, dq, dk, dv, dbeta (the case's 16-bit dtype) and dg (f32) of the last call, to PATH (safetensors) */
static int dump_outputs(const bcase *c, const char *path) {
    const dg_dr_shape *s = &c->s;
    dg_scope_begin();
    const int64_t sq[4] = {s->B, s->T, s->H, s->K}, sv[4] = {s->B, s->T, s->HV, s->V}, sb[3] = {s->B, s->T, s->HV};
    const int64_t sg[4] = {s->B, s->T, s->HV, s->K};
    const char *names[6] = {"o", "dq", "dk", "dv", "dbeta", "dg"};
    const void *src[6] = {c->o, c->dq, c->dk, c->dv, c->dbeta, c->dg};
    dg_tensor *t[6] = {dg_empty(4, sv, c->dt), dg_empty(4, sq, c->dt), dg_empty(4, sq, c->dt),
                       dg_empty(4, sv, c->dt), dg_empty(3, sb, c->dt),
                       c->G ? dg_empty(c->G == 1 ? 3 : 4, sg, DG_F32) : NULL};
    int n = c->G ? 6 : 5, rc = 0;
    for (int i = 0; i < n && rc == 0; i++)
        rc = !t[i] ? -1 : dg_cuda_memcpy(dg_data_ptr(t[i]), src[i], (size_t)dg_numel(t[i]) * (i == 5 ? 4 : 2), 1);
    if (rc == 0) rc = dg_st_write(path, n, names, t, 0, NULL, NULL);
    dg_scope_end();
    return rc;
}
/* 16-bit values that are inf or NaN (all exponent bits set) among o, dq, dk, dv of the last call
 * (-1 on a failed copy) */
static int64_t nonfinite(const bcase *c) {
    const uint16_t *a[4] = {c->o, c->dq, c->dk, c->dv};
    const uint16_t ex = c->dt == DG_F16 ? 0x7c00u : 0x7f80u;
    int64_t n[4] = {nvo(c), nqk(c), nqk(c), nvo(c)}, bad = 0;
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

/* ---- results ------------------------------------------------------------------------------------------ */
typedef struct rec {
    char op[24], shape[64], kernel[12], variant[32], desc[48];
    dg_dtype dt;
    int64_t B, T, H, HV, K, V;
    double fwd_ms, fb_ms, norm_ms, flops_f, flops_fb, bytes_f, bytes_fb;
    int fwd_n, fb_n;
    int64_t nonfinite; /* -2: not checked */
} rec;
#define MAX_RECS 256
static rec recs[MAX_RECS];
static int n_recs;
static double ceil_tflops = NAN, ceil_gbs = NAN;

/* the op's backward variants as its op file declares them (ops/delta/delta_common.h: the registry's
 * entries run the same specs): the default on CUDA, and the other chunked ones */
static const dg_delta_variant *default_variant(const char *op) {
    const dg_delta_variants *t = dg_delta_variants_of(op);
    return t ? &t->v[t->cuda_default] : NULL;
}
/* the token-by-token variant (its row times the recurrent kernels, forward and backward) */
static const dg_delta_variant *recurrent_variant(const char *op) {
    const dg_delta_variants *t = dg_delta_variants_of(op);
    for (int i = 0; t && i < t->n; i++)
        if (t->v[i].spec.algo == DG_DBWD_RECURRENT) return &t->v[i];
    return NULL;
}
static int other_variants(const char *op, const dg_delta_variant **out) {
    const dg_delta_variants *t = dg_delta_variants_of(op);
    int n = 0;
    for (int i = 0; t && i < t->n; i++)
        if (i != t->cuda_default && t->v[i].spec.algo == DG_DBWD_CHUNK) out[n++] = &t->v[i];
    return n;
}

static void print_header(void) {
    printf("%-16s %-5s %-5s %-9s %-29s %8s %9s %7s %7s %7s %7s %8s %7s %8s\n", "op", "shape", "dtype", "kernel", "bwd variant",
           "fwd ms", "f+b ms", "TF/s f", "TF/s fb", "GB/s f", "GB/s fb", "floor fb", "x floor", "norm ms");
}
static void print_rec(const rec *r) {
    double floor_ms = fmax(r->flops_fb / (ceil_tflops * 1e12), r->bytes_fb / (ceil_gbs * 1e9)) * 1e3;
    bool cnt = strcmp(r->kernel, "chunk") == 0; /* the counting is the chunked algorithm's */
    printf("%-16s %-5s %-5s %-9s %-29s %8.3f %9.3f %7.1f %7.1f %7.0f %7.0f %8.3f %7.1f %8.3f%s\n", r->op, r->shape,
           dg_dtype_name(r->dt), r->kernel, r->desc, r->fwd_ms, r->fb_ms, cnt ? r->flops_f / r->fwd_ms / 1e9 : NAN,
           cnt ? r->flops_fb / r->fb_ms / 1e9 : NAN, r->bytes_f / r->fwd_ms / 1e6, r->bytes_fb / r->fb_ms / 1e6,
           cnt ? floor_ms : NAN, cnt ? r->fb_ms / floor_ms : NAN, r->norm_ms,
           r->nonfinite > 0 ? "  NON-FINITE OUTPUT" : r->nonfinite == -1 ? "  (output check failed)" : "");
    fflush(stdout);
}
static void jnum(FILE *f, const char *key, double x, bool comma) {
    if (isfinite(x)) fprintf(f, "\"%s\": %.6g%s", key, x, comma ? ", " : "");
    else fprintf(f, "\"%s\": null%s", key, comma ? ", " : "");
}
static int write_json(const char *path, const char *device, int sms, int drv, int rt) {
    FILE *f = strcmp(path, "-") ? fopen(path, "w") : stdout;
    if (!f) {
        fprintf(stderr, "bench: cannot write --json '%s'\n", path);
        return -1;
    }
    fprintf(f, "{\"device\": \"%s\", \"sm_count\": %d, \"cuda_driver\": %d, \"cuda_runtime\": %d, ", device, sms, drv, rt);
    fprintf(f, "\"l2norm\": \"%s\", \"timing\": \"CUDA events, 2 warm-ups, median, L2 flushed (256 MiB written)\", ",
            "dg_cuda_dr_l2norm_bf16 / _f16");
    jnum(f, "gemm_bf16_8192_tflops", ceil_tflops, true);
    jnum(f, "copy_gbs", ceil_gbs, true);
    fprintf(f, "\"results\": [\n");
    for (int i = 0; i < n_recs; i++) {
        const rec *r = &recs[i];
        fprintf(f, "  {\"op\": \"%s\", \"shape\": \"%s\", \"kernel\": \"%s\", \"variant\": \"%s\", \"variant_desc\": \"%s\", ",
                r->op, r->shape, r->kernel, r->variant, r->desc);
        fprintf(f, "\"B\": %lld, \"T\": %lld, \"H\": %lld, \"HV\": %lld, \"K\": %lld, \"V\": %lld, \"dtype\": \"%s\", ",
                (long long)r->B, (long long)r->T, (long long)r->H, (long long)r->HV, (long long)r->K, (long long)r->V,
                dg_dtype_name(r->dt));
        jnum(f, "fwd_ms", r->fwd_ms, true);
        jnum(f, "fwdbwd_ms", r->fb_ms, true);
        jnum(f, "l2norm_fwdbwd_ms", r->norm_ms, true);
        fprintf(f, "\"fwd_reps\": %d, \"fwdbwd_reps\": %d, ", r->fwd_n, r->fb_n);
        jnum(f, "flops_fwd", r->flops_f, true);
        jnum(f, "flops_fwdbwd", r->flops_fb, true);
        jnum(f, "bytes_fwd", r->bytes_f, true);
        jnum(f, "bytes_fwdbwd", r->bytes_fb, true);
        fprintf(f, "\"nonfinite_outputs\": %lld}%s\n", (long long)r->nonfinite, i + 1 < n_recs ? "," : "");
    }
    fprintf(f, "]}\n");
    if (f != stdout) fclose(f);
    return 0;
}

static rec *new_rec(const bcase *c, const char *kernel, const char *tag, const char *desc) {
    if (n_recs == MAX_RECS) return NULL;
    rec *r = &recs[n_recs++];
    memset(r, 0, sizeof *r);
    snprintf(r->op, sizeof r->op, "%s", c->op);
    snprintf(r->shape, sizeof r->shape, "%s", c->label);
    snprintf(r->kernel, sizeof r->kernel, "%s", kernel);
    snprintf(r->variant, sizeof r->variant, "%s", tag);
    snprintf(r->desc, sizeof r->desc, "%s", desc);
    r->dt = c->dt;
    r->B = c->s.B, r->T = c->s.T, r->H = c->s.H, r->HV = c->s.HV, r->K = c->s.K, r->V = c->s.V;
    r->fwd_ms = r->fb_ms = r->norm_ms = NAN;
    r->flops_f = flops_fwd(&c->s), r->flops_fb = r->flops_f + flops_bwd(&c->s);
    r->bytes_f = bytes_fwd(c), r->bytes_fb = r->bytes_f + bytes_bwd(c);
    r->nonfinite = -2;
    return r;
}
static int report_failure(const bcase *c, const char *what) {
    printf("%-16s %-5s %s FAILED: %s\n", c->op, c->label, what, dg_last_error());
    fflush(stdout);
    dg_clear_error();
    return 1;
}

/* The chunked kernels of one fwd+bwd call of variant var, each with its time (dg_cuda_ktime: CUDA
 * events around every launch; the mean of KT_CALLS calls run back to back after the timed medians,
 * L2 warm), on a line of their own below the variant's: a fused kernel beside the pair it replaces
 * (kda: qkwy against dqkwg + wy, as seed 000 reports them).  Returns the number of failures. */
enum { KT_CALLS = 5, KT_NAMES = 16 };
static int print_kernels(bcase *c, const dg_dr_variant *var, double fb_ms) {
    if (fb_ms > 50.0) return 0; /* not for the generic kernels' slow shapes (S3: 560 ms a call) */
    dg_cuda_ktime kt[KT_NAMES];
    int dropped = 0, rc = dg_cuda_ktime_begin();
    for (int i = 0; i < KT_CALLS && !rc; i++) rc = body(c, W_FWDBWD, var, false);
    const int m = dg_cuda_ktime_end(kt, KT_NAMES, &dropped); /* stops the timer in any case */
    if (rc || m < 0) return report_failure(c, "kernel times");
    printf("  kernels, ms a call:");
    for (int j = 0; j < m; j++) {
        const char *nm = strncmp(kt[j].name, "dr_chunk ", 9) ? kt[j].name : kt[j].name + 9;
        printf("%s %s %.3f", j ? "," : "", nm, kt[j].ms / KT_CALLS);
    }
    printf(dropped ? " (%d launches not timed)\n" : "\n", dropped);
    fflush(stdout);
    return 0;
}

typedef struct run_opts {
    int max_reps;
    bool variants, recurrent;
    const char *dump; /* NULL, or the file for the default variant's outputs */
} run_opts;

/* every measurement of one case; returns the number of failures */
static int run_case(bcase *c, const run_opts *o) {
    const dg_delta_variant *dv = default_variant(c->op);
    if (!dv) {
        dg_error("bench: %s has no backward variants (not a delta-rule op)", c->op);
        return report_failure(c, "chunk default");
    }
    const dg_dr_variant dflt = dv->spec.var;
    int fails = 0;
    rec *r = new_rec(c, "chunk", "default", dv->desc);
    if (!r) return 1;
    r->fwd_ms = time_median(c, W_FWD, &dflt, false, o->max_reps, &r->fwd_n);
    if (!isnan(r->fwd_ms)) r->fb_ms = time_median(c, W_FWDBWD, &dflt, false, o->max_reps, &r->fb_n);
    if (isnan(r->fb_ms)) {
        n_recs--;
        return report_failure(c, "chunk default");
    }
    int nn;
    r->norm_ms = time_median(c, W_NORM, &dflt, false, o->max_reps, &nn);
    if (body(c, W_FWDBWD, &dflt, false) || dg_cuda_synchronize()) return report_failure(c, "chunk default");
    r->nonfinite = nonfinite(c);
    if (o->dump && dump_outputs(c, o->dump)) fails += report_failure(c, "writing the outputs");
    print_rec(r);
    if (o->variants) fails += print_kernels(c, &dflt, r->fb_ms);
    if (o->variants && c->keep) { /* the same default variant, the backward recomputing the working set */
        rec *rk = new_rec(c, "chunk", "recompute", "as default, recompute in bwd");
        if (!rk) return fails + 1;
        rk->fwd_ms = r->fwd_ms, rk->fwd_n = r->fwd_n;
        c->keep_off = true;
        rk->fb_ms = time_median(c, W_FWDBWD, &dflt, false, o->max_reps, &rk->fb_n);
        c->keep_off = false;
        if (isnan(rk->fb_ms)) {
            n_recs--;
            fails += report_failure(c, "recompute");
        } else {
            print_rec(rk);
        }
    }
    if (o->variants && c->keep && c->s.gate != DG_GATE_CHANNEL) { /* the default variant, the norm's kernel
                                                                    * first (KDA always runs it first) */
        rec *rn = new_rec(c, "chunk", "norm_first", "as default, norm kernel first");
        if (!rn) return fails + 1;
        const int fuse = dg_cuda_dr_chunk_l2_fuse(0);
        rn->fwd_ms = time_median(c, W_FWD, &dflt, false, o->max_reps, &rn->fwd_n);
        rn->fb_ms = time_median(c, W_FWDBWD, &dflt, false, o->max_reps, &rn->fb_n);
        dg_cuda_dr_chunk_l2_fuse(fuse);
        if (isnan(rn->fb_ms) || isnan(rn->fwd_ms)) {
            n_recs--;
            fails += report_failure(c, "norm kernel first");
        } else {
            print_rec(rn);
        }
    }
    const dg_delta_variant *vs[8];
    int nv = o->variants ? other_variants(c->op, vs) : 0;
    for (int i = 0; i < nv; i++) {
        rec *rv = new_rec(c, "chunk", vs[i]->name, vs[i]->desc);
        if (!rv) return fails + 1;
        rv->fwd_ms = r->fwd_ms, rv->fwd_n = r->fwd_n; /* the forward has no variants */
        rv->fb_ms = time_median(c, W_FWDBWD, &vs[i]->spec.var, false, o->max_reps, &rv->fb_n);
        if (isnan(rv->fb_ms)) {
            n_recs--;
            fails += report_failure(c, vs[i]->name);
            continue;
        }
        print_rec(rv);
        fails += print_kernels(c, &vs[i]->spec.var, rv->fb_ms);
    }
    const dg_delta_variant *rec_var = o->recurrent ? recurrent_variant(c->op) : NULL;
    if (rec_var) {
        rec *rr = new_rec(c, "recurrent", rec_var->name, rec_var->desc);
        if (!rr) return fails + 1;
        rr->fwd_ms = time_median(c, W_FWD, NULL, true, 5, &rr->fwd_n);
        if (!isnan(rr->fwd_ms)) rr->fb_ms = time_median(c, W_FWDBWD, NULL, true, 5, &rr->fb_n);
        if (isnan(rr->fb_ms)) {
            n_recs--;
            return fails + report_failure(c, rec_var->name);
        }
        print_rec(rr);
    }
    return fails;
}

static int usage(void) {
    printf("usage: deltagrad bench --device cuda [OP] [--shapes S1,S2,S3,S4] [--dtype bf16|f16] [--inputs FILE]...\n"
           "                       [--dump] [--json PATH|-] [--reps N] [--no-variants] [--no-recurrent] [--no-ceilings]\n"
           "OP: gated_delta_rule | kda | delta_rule (default: all; S3, S4 run gated_delta_rule only).\n"
           "Shapes: S1 B8 T2048 H16 K=V=128 bf16, S2 B2 T8192 H16 K=V=128 bf16, S3 B16 T4096 H8 K=V=256 fp16\n"
           "(default: those three, as issue 6); S4 B8 T2048 H16 K=128 V=256 bf16 (FLA's layer default V = 2K)\n"
           "(--dtype: every shape in that dtype).  Times include the L2 norm of q, k (forward and backward) as the\n"
           "ops apply it.  --inputs FILE: time the op and shape of a safetensors file (q, k, v, do, beta bf16 or f16;\n"
           "g f32; as written by bench/fla_side_by_side.py) instead; --dump writes the default variant's\n"
           "o, dq, dk, dv, dbeta, dg to FILE.ours.safetensors.  The recurrent kernels run at S1 (reference).\n");
    return 0;
}

int dg_bench_cuda(int argc, char **argv) {
    const char *only = NULL, *json = NULL, *inputs[32];
    int n_inputs = 0;
    bool want_shape[NSHAPES], dump = false, ceilings = true;
    for (int s = 0; s < NSHAPES; s++) want_shape[s] = SHAPES[s].by_default;
    int dtype_all = -1; /* --dtype: every shape in it */
    run_opts o = {.max_reps = 50, .variants = true, .recurrent = true, .dump = NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage();
        else if (!strcmp(a, "--device") && v) i++;
        else if (!strcmp(a, "--shapes") && v) {
            for (int s = 0; s < NSHAPES; s++) want_shape[s] = strstr(v, SHAPES[s].name) != NULL;
            i++;
        } else if (!strcmp(a, "--inputs") && v) {
            if (n_inputs == 32) {
                fprintf(stderr, "bench: at most 32 --inputs files\n");
                return 2;
            }
            inputs[n_inputs++] = argv[++i];
        } else if (!strcmp(a, "--dtype") && v) {
            if (strcmp(v, "bf16") && strcmp(v, "f16")) {
                fprintf(stderr, "bench: --dtype must be bf16 or f16 (got %s)\n", v);
                return 2;
            }
            dtype_all = strcmp(v, "f16") ? DG_BF16 : DG_F16;
            i++;
        } else if (!strcmp(a, "--json") && v) json = argv[++i];
        else if (!strcmp(a, "--reps") && v) {
            o.max_reps = atoi(argv[++i]);
            o.max_reps = o.max_reps < 5 ? 5 : o.max_reps > MAX_REPS ? MAX_REPS : o.max_reps;
        } else if (!strcmp(a, "--dump")) dump = true;
        else if (!strcmp(a, "--no-variants")) o.variants = false;
        else if (!strcmp(a, "--no-recurrent")) o.recurrent = false;
        else if (!strcmp(a, "--no-ceilings")) ceilings = false;
        else if (a[0] != '-' && !only) only = a;
        else {
            fprintf(stderr, "bench: unknown argument '%s' (--help)\n", a);
            return 2;
        }
    }
    if (only && strcmp(only, OPS[0]) && strcmp(only, OPS[1]) && strcmp(only, OPS[2])) {
        fprintf(stderr, "bench: OP must be gated_delta_rule, kda or delta_rule (got %s)\n", only);
        return 2;
    }
    if (dg_cuda_init()) {
        fprintf(stderr, "bench: --device cuda: %s\n", dg_last_error());
        return 2;
    }
    struct cudaDeviceProp prop;
    int drv = 0, rtv = 0;
    if (cu_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties") ||
        cu_check(cudaEventCreate(&ev0), "cudaEventCreate") || cu_check(cudaEventCreate(&ev1), "cudaEventCreate") ||
        !(flush_buf = dg_cuda_malloc(FLUSH_BYTES))) {
        fprintf(stderr, "bench: %s\n", dg_last_error());
        return 2;
    }
    cudaDriverGetVersion(&drv), cudaRuntimeGetVersion(&rtv);
    printf("device: %s, %d SMs, CUDA driver %d, runtime %d\n", prop.name, prop.multiProcessorCount, drv, rtv);
    if (ceilings) {
        ceil_tflops = gemm_tflops();
        ceil_gbs = copy_gbs();
        if (dg_has_error()) {
            printf("ceilings: %s\n", dg_last_error());
            dg_clear_error();
        }
        printf("ceilings: cuBLAS bf16 GEMM 8192^3 %.1f TFLOP/s; device copy 1 GiB %.0f GB/s (read + write)\n",
               ceil_tflops, ceil_gbs);
    }
    printf("timing: CUDA events, 2 warm-ups, median of 5..%d calls, L2 flushed (256 MiB written) before each;\n"
           "every time includes the L2 norm of q and k (%s), forward and backward\n"
           "TF/s and GB/s count the chunked algorithm's products and the compulsory bytes (tools/bench_cuda.c);\n"
           "floor fb = max(FLOPs / GEMM rate, bytes / copy rate); norm ms = the L2 norm alone, fwd+bwd\n\n",
           o.max_reps, "16-bit row kernel");
    print_header();
    int fails = 0;
    if (n_inputs) {
        for (int i = 0; i < n_inputs; i++) {
            bcase c;
            if (case_from_file(&c, inputs[i])) {
                printf("--inputs %s: %s\n", inputs[i], dg_last_error());
                dg_clear_error();
                case_free(&c);
                fails++;
                continue;
            }
            char dpath[4096];
            snprintf(dpath, sizeof dpath, "%s.ours.safetensors", inputs[i]);
            run_opts oi = o;
            oi.dump = dump ? dpath : NULL;
            oi.recurrent = false;
            if (!only || !strcmp(only, c.op)) fails += run_case(&c, &oi);
            case_free(&c);
        }
    } else {
        for (int si = 0; si < NSHAPES; si++) {
            if (!want_shape[si]) continue;
            bcase c;
            if (case_random(&c, &SHAPES[si], dtype_all >= 0 ? (dg_dtype)dtype_all : SHAPES[si].dt)) {
                printf("%s: %s\n", SHAPES[si].name, dg_last_error());
                dg_clear_error();
                case_free(&c);
                fails++;
                continue;
            }
            for (int oi = 0; oi < 3; oi++) {
                if ((only && strcmp(only, OPS[oi])) || (si >= 2 && oi != 0)) continue; /* S3, S4: GDN only */
                if (case_set_op(&c, OPS[oi])) {
                    fails += report_failure(&c, "allocation");
                    continue;
                }
                run_opts ro = o;
                ro.recurrent = o.recurrent && si == 0;
                fails += run_case(&c, &ro);
            }
            case_free(&c);
        }
        if (want_shape[2] && (!only || !strcmp(only, OPS[0])))
            printf("S3 (K = V = 256) runs on the generic kernels: the tensor-core kernels take K <= 128\n");
    }
    if (json && write_json(json, prop.name, prop.multiProcessorCount, drv, rtv)) fails++;
    dg_cuda_free(flush_buf);
    cudaEventDestroy(ev0), cudaEventDestroy(ev1);
    return fails ? 1 : 0;
}

#endif /* DG_HAVE_CUDA */
