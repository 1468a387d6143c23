/* deltagrad bench --device cuda: the chunked delta-rule kernels (gated_delta_rule, kda, delta_rule)
 * on the GPU at the benchmark shapes, 16-bit q, k, v, beta, dout; f32 gates; chunk 64:
 *   S1  B8  T2048 H16 K=V=128   bf16
 *   S2  B2  T8192 H16 K=V=128   bf16
 *   S3  B16 T4096 H8  K=V=256   fp16, gated_delta_rule (the K = 256 kernels on 16-bit tensor
 *                               cores: docs/PERF_KERNELS.md, "K = 256")
 *   S4  B8  T2048 H16 K=128 V=256 bf16, gated_delta_rule and kda, with --shapes S4 only (FLA's
 *                               layer default V = 2K: the tensor-core kernels as two heads of V =
 *                               128 that share the work that does not depend on V)
 *   L1  B4  T4096 H6  K=256 V=512 bf16, gated_delta_rule, with --shapes L1 only (FLA's
 *                               GatedDeltaNet layer as it comes: head_dim 256, expand_v 2)
 *   Q1  B4  T4096 H16 HV32 K=V=128 bf16, gated_delta_rule, with --shapes Q1 only (Qwen3-Next's
 *                               grouped value heads: 16 key heads, 32 value heads)
 *   O1  B8  T2048 H16 K=V=96    bf16, every op, with --shapes O1 only (a head size the kernels do
 *                               not take as it is: K, V padded to 128, dr_chunk_pad.cu)
 *   R1  T16384 H16 K=V=128      bf16, every op, with --shapes R1 only: S1's tokens as 12 packed
 *                               sequences of mixed lengths (cu_seqlens; bench_cuda_case.c)
 *   K1  B8  T2048 H16 K=V=64    bf16, every op, with --shapes K1 only (small heads)
 * (delta_rule and kda also at S3 and L1 where named: the K = 256 kernels with no gate; kda's TF32 family)
 * (--dtype bf16|f16 puts every shape in one dtype)
 * or at the shapes of safetensors files (--inputs FILE, written by bench/fla_side_by_side.py, so
 * that FLA and these kernels run on the same numbers; where a file has an initial state h0 or a
 * final state's gradient dht, every call takes them, the forward writes the final state hT and the
 * backward, given h0, its gradient dh0).
 *
 * What one timed call is.  The kernels are called through the family's backend table
 * (ops/delta/delta_backends.c: the first row that accepts the call) the way the ops call them with
 * use_qk_l2norm_in_kernel, so every time below includes the L2 norm of the raw q and k: the
 * tensor-core forward of gate NONE and HEAD takes it in its loads, the other paths run the norm's
 * kernel first (the row "as default, norm kernel first" times that for the tensor-core paths too,
 * the call's l2_norm_first):
 *   fwd     = chunk forward with the norm (o; no final state)
 *   fwd+bwd = fwd, then chunk backward (dq, dk, dv, dbeta, dg), given 1/|q|, 1/|k|, so that its
 *             dq, dk are those of the raw q, k: the head-gate tensor-core kernels apply the norm's
 *             backward as they store dq, dk, the others run its kernel after.  As the ops do when they
 *             record for autograd, the forward keeps its working set (W, U, the states, V', the
 *             inverse; dr_chunk_cuda.h) for the backward, which then does not recompute it; the
 *             row "recompute in bwd" times the other way (FLA's: the backward recomputes)
 * The norm's own fwd+bwd time (ops/delta/delta_kernels.c: the 16-bit row kernel of the norm) is
 * printed beside each case.  The cases, their data and the counting are in bench_cuda_case.c.
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
 *   (every product counted dense).  Bytes: the compulsory traffic, each input read once
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

#include "core/internal.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tools/bench_cuda_case.h"

cudaStream_t dg_cuda_stream(void); /* kernels/cuda/runtime.cu */

#define FLUSH_BYTES ((size_t)256 << 20)
#define MAX_REPS 200

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
static double timed_once(bcase *c, bench_what w, const dg_delta_bwd_flags *var, bool recurrent) {
    if (dg_cuda_memset0(flush_buf, FLUSH_BYTES)) return NAN;
    if (cu_check(cudaEventRecord(ev0, dg_cuda_stream()), "cudaEventRecord")) return NAN;
    if (bench_body(c, w, var, recurrent)) return NAN;
    if (cu_check(cudaEventRecord(ev1, dg_cuda_stream()), "cudaEventRecord")) return NAN;
    if (cu_check(cudaEventSynchronize(ev1), "the timed kernels (cudaEventSynchronize)")) return NAN;
    float ms = 0;
    if (cu_check(cudaEventElapsedTime(&ms, ev0, ev1), "cudaEventElapsedTime")) return NAN;
    return ms;
}
/* median of the timed calls after 2 warm-ups; *n gets their number */
static double time_median(bcase *c, bench_what w, const dg_delta_bwd_flags *var, bool recurrent, int max_reps, int *n) {
    *n = 0;
    for (int i = 0; i < 2; i++)
        if (bench_body(c, w, var, recurrent)) return NAN;
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


/* ---- ceilings -------------------------------------------------------------------------------------- */
static double gemm_tflops(void) {
    const int64_t n = 8192;
    void *a = bench_dev_random(n * n, DG_BF16, R_NORMAL), *b = bench_dev_random(n * n, DG_BF16, R_NORMAL);
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
 * entries run the same specs): the default (bwd[0]), and the other chunked ones */
static const dg_delta_variant *default_variant(const char *op) {
    const dg_delta_variants *t = dg_delta_variants_of(op);
    return t ? &t->v[0] : NULL;
}
/* the token-by-token variant (its row times the recurrent kernels, forward and backward) */
static const dg_delta_variant *recurrent_variant(const char *op) {
    const dg_delta_variants *t = dg_delta_variants_of(op);
    for (int i = 0; t && i < t->n; i++)
        if (t->v[i].spec.algo == DG_DELTA_RECURRENT) return &t->v[i];
    return NULL;
}
static int other_variants(const char *op, const dg_delta_variant **out) {
    const dg_delta_variants *t = dg_delta_variants_of(op);
    int n = 0;
    for (int i = 0; t && i < t->n; i++)
        if (i != 0 && t->v[i].spec.algo == DG_DELTA_CHUNKED) out[n++] = &t->v[i];
    return n;
}

static void print_header(void) {
    printf("%-16s %-5s %-5s %-9s %-29s %8s %9s %7s %7s %7s %7s %8s %7s %8s\n", "op", "shape", "dtype", "kernel",
           "bwd variant", "fwd ms", "f+b ms", "TF/s f", "TF/s fb", "GB/s f", "GB/s fb", "floor fb", "x floor",
           "norm ms");
}
static void print_rec(const rec *r) {
    double floor_ms = fmax(r->flops_fb / (ceil_tflops * 1e12), r->bytes_fb / (ceil_gbs * 1e9)) * 1e3;
    bool cnt = strcmp(r->kernel, "chunk") == 0; /* the counting is the chunked algorithm's */
    printf("%-16s %-5s %-5s %-9s %-29s %8.3f %9.3f %7.1f %7.1f %7.0f %7.0f %8.3f %7.1f %8.3f%s\n", r->op, r->shape,
           dg_dtype_name(r->dt), r->kernel, r->desc, r->fwd_ms, r->fb_ms, cnt ? r->flops_f / r->fwd_ms / 1e9 : NAN,
           cnt ? r->flops_fb / r->fb_ms / 1e9 : NAN, r->bytes_f / r->fwd_ms / 1e6, r->bytes_fb / r->fb_ms / 1e6,
           cnt ? floor_ms : NAN, cnt ? r->fb_ms / floor_ms : NAN, r->norm_ms,
           r->nonfinite > 0     ? "  NON-FINITE OUTPUT"
           : r->nonfinite == -1 ? "  (output check failed)"
                                : "");
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
    fprintf(f, "{\"device\": \"%s\", \"sm_count\": %d, \"cuda_driver\": %d, \"cuda_runtime\": %d, ", device, sms, drv,
            rt);
    fprintf(f, "\"l2norm\": \"%s\", \"timing\": \"CUDA events, 2 warm-ups, median, L2 flushed (256 MiB written)\", ",
            "dg_cuda_dr_l2norm_bf16 / _f16");
    jnum(f, "gemm_bf16_8192_tflops", ceil_tflops, true);
    jnum(f, "copy_gbs", ceil_gbs, true);
    fprintf(f, "\"results\": [\n");
    for (int i = 0; i < n_recs; i++) {
        const rec *r = &recs[i];
        fprintf(
            f,
            "  {\"op\": \"%s\", \"shape\": \"%s\", \"kernel\": \"%s\", \"variant\": \"%s\", \"variant_desc\": \"%s\", ",
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
    r->flops_f = bench_flops_fwd(&c->s), r->flops_fb = r->flops_f + bench_flops_bwd(&c->s);
    r->bytes_f = bench_bytes_fwd(c), r->bytes_fb = r->bytes_f + bench_bytes_bwd(c);
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
 * (kda: qkwy against the dqkwg + wy pair it replaces).  Returns the number of failures. */
enum { KT_CALLS = 5, KT_NAMES = 16 };
static int print_kernels(bcase *c, const dg_delta_bwd_flags *var, double fb_ms) {
    if (fb_ms > 200.0) return 0; /* not for shapes as slow as the generic kernels' (S3: 560 ms a call) */
    dg_cuda_ktime kt[KT_NAMES];
    int dropped = 0, rc = dg_cuda_ktime_begin();
    for (int i = 0; i < KT_CALLS && !rc; i++) rc = bench_body(c, W_FWDBWD, var, false);
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
    const dg_delta_bwd_flags dflt = dv->spec.flags;
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
    if (bench_body(c, W_FWDBWD, &dflt, false) || dg_cuda_synchronize()) return report_failure(c, "chunk default");
    r->nonfinite = bench_nonfinite(c);
    if (o->dump && bench_dump_outputs(c, o->dump)) fails += report_failure(c, "writing the outputs");
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
    if (o->variants && c->keep && !dg_delta_gate_of(c->s.gate)->per_channel) { /* the default variant, the norm's kernel
                                                                    * first (KDA always runs it first) */
        rec *rn = new_rec(c, "chunk", "norm_first", "as default, norm kernel first");
        if (!rn) return fails + 1;
        c->norm_first = true;
        rn->fwd_ms = time_median(c, W_FWD, &dflt, false, o->max_reps, &rn->fwd_n);
        rn->fb_ms = time_median(c, W_FWDBWD, &dflt, false, o->max_reps, &rn->fb_n);
        c->norm_first = false;
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
        rv->fb_ms = time_median(c, W_FWDBWD, &vs[i]->spec.flags, false, o->max_reps, &rv->fb_n);
        if (isnan(rv->fb_ms)) {
            n_recs--;
            fails += report_failure(c, vs[i]->name);
            continue;
        }
        print_rec(rv);
        fails += print_kernels(c, &vs[i]->spec.flags, rv->fb_ms);
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

/* whether op oi runs at shape d: the shape's ops when no OP is named; the named one where it is one of
 * them, and any named op at K = 256 (delta_rule: the K = 256 kernels with no gate; kda: the TF32
 * family; timed when asked, out of the default run's time) */
static bool op_runs(const shape_def *d, int oi, const char *only) {
    if (only && strcmp(only, BENCH_OPS[oi])) return false;
    return (d->ops >> oi & 1u) || (only && d->K == 256);
}

static int usage(void) {
    printf(
        "usage: deltagrad bench --device cuda [OP] [--shapes S1,S2,S3,S4,L1,Q1,O1,R1,K1] [--dtype bf16|f16] [--inputs "
        "FILE]...\n"
        "                       [--dump] [--json PATH|-] [--reps N] [--no-variants] [--no-recurrent] [--no-ceilings]\n"
        "OP: gated_delta_rule | kda | delta_rule (default: all; S3, S4, L1, Q1 run gated_delta_rule, and\n"
        "delta_rule and kda at S3 and L1 where OP names it).\n"
        "Shapes: S1 B8 T2048 H16 K=V=128 bf16, S2 B2 T8192 H16 K=V=128 bf16, S3 B16 T4096 H8 K=V=256 fp16\n"
        "(default: those three); S4 B8 T2048 H16 K=128 V=256 bf16 (FLA's layer default V = 2K); L1 B4 T4096 H6\n"
        "K=256 V=512 bf16 (FLA's GatedDeltaNet layer as it comes); Q1 B4 T4096 H16, 32 value heads, K=V=128 bf16\n"
        "(Qwen3-Next's grouped heads); O1 B8 T2048 H16 K=V=96 bf16, every op (padded to K=V=128); R1 T16384\n"
        "H16 K=V=128 bf16 as 12 packed sequences of mixed lengths (cu_seqlens), every op; K1 B8 T2048 H16 K=V=64\n"
        "bf16, every op\n"
        "(--dtype: every shape in that dtype).  Times include the L2 norm of q, k (forward and backward) as the\n"
        "ops apply it.  --inputs FILE: time the op and shape of a safetensors file (q, k, v, do, beta bf16 or f16;\n"
        "g f32; optional h0, dht f32 [N,HV,K,V]: the initial state and the final state's gradient; optional\n"
        "cu_seqlens i64 [N+1] with B = 1: packed sequences; as written by\n"
        "bench/fla_side_by_side.py) instead; --dump writes the default variant's o, dq, dk, dv, dbeta, dg\n"
        "(and hT with h0 or dht, dh0 with h0) to FILE.ours.safetensors.  The recurrent kernels run at S1\n"
        "(reference).\n");
    return 0;
}

int dg_bench_cuda(int argc, char **argv) {
    const char *only = NULL, *json = NULL, *inputs[32];
    int n_inputs = 0;
    bool want_shape[BENCH_NSHAPES], dump = false, ceilings = true;
    for (int s = 0; s < BENCH_NSHAPES; s++) want_shape[s] = BENCH_SHAPES[s].by_default;
    int dtype_all = -1; /* --dtype: every shape in it */
    run_opts o = {.max_reps = 50, .variants = true, .recurrent = true, .dump = NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage();
        else if (!strcmp(a, "--device") && v) i++;
        else if (!strcmp(a, "--shapes") && v) {
            for (int s = 0; s < BENCH_NSHAPES; s++) want_shape[s] = strstr(v, BENCH_SHAPES[s].name) != NULL;
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
    if (only && strcmp(only, BENCH_OPS[0]) && strcmp(only, BENCH_OPS[1]) && strcmp(only, BENCH_OPS[2])) {
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
            if (bench_case_from_file(&c, inputs[i])) {
                printf("--inputs %s: %s\n", inputs[i], dg_last_error());
                dg_clear_error();
                bench_case_free(&c);
                fails++;
                continue;
            }
            char dpath[4096];
            snprintf(dpath, sizeof dpath, "%s.ours.safetensors", inputs[i]);
            run_opts oi = o;
            oi.dump = dump ? dpath : NULL;
            oi.recurrent = false;
            if (!only || !strcmp(only, c.op)) fails += run_case(&c, &oi);
            bench_case_free(&c);
        }
    } else {
        for (int si = 0; si < BENCH_NSHAPES; si++) {
            if (!want_shape[si]) continue;
            bcase c;
            if (bench_case_random(&c, &BENCH_SHAPES[si], dtype_all >= 0 ? (dg_dtype)dtype_all : BENCH_SHAPES[si].dt)) {
                printf("%s: %s\n", BENCH_SHAPES[si].name, dg_last_error());
                dg_clear_error();
                bench_case_free(&c);
                fails++;
                continue;
            }
            for (int oi = 0; oi < 3; oi++) {
                if (!op_runs(&BENCH_SHAPES[si], oi, only)) continue;
                if (bench_case_set_op(&c, BENCH_OPS[oi])) {
                    fails += report_failure(&c, "allocation");
                    continue;
                }
                run_opts ro = o;
                ro.recurrent = o.recurrent && si == 0;
                fails += run_case(&c, &ro);
            }
            bench_case_free(&c);
        }
        bool k256 = false; /* a K = 256 shape ran */
        for (int si = 0; si < BENCH_NSHAPES; si++)
            for (int oi = 0; oi < 3; oi++)
                k256 |= want_shape[si] && BENCH_SHAPES[si].K == 256 && op_runs(&BENCH_SHAPES[si], oi, only);
        if (k256)
            printf("S3 and L1 (K = 256) run on the K = 256 kernels on 16-bit tensor cores (DG_DRC_K256_OFF=1: the "
                   "TF32 family)\n");
    }
    if (json && write_json(json, prop.name, prop.multiProcessorCount, drv, rtv)) fails++;
    dg_cuda_free(flush_buf);
    cudaEventDestroy(ev0), cudaEventDestroy(ev1);
    return fails ? 1 : 0;
}

#endif /* DG_HAVE_CUDA */
