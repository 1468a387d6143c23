/* deltagrad bench [OP]: delta-rule ops at B x T x K sizes, f32, H = 4: chunked forward and
 * forward+backward milliseconds and GFLOP/s next to this machine's SGEMM rate measured in the same
 * run, and the recurrent form's forward+backward for the speed-up.
 *
 * FLOPs (per token and value head, chunk C, the chunked algorithm's matrix products counted in
 * full, as the kernels compute them): forward 6CK + 4CV + 6KV
 *   (K K^T, W = T K, Q K^T: 2C^2K each; U = T V, (QK^T) V': 2C^2V each; W S, state update, Q S:
 *   2KV each per token); the backward is counted as twice the forward (the usual convention;
 *   its products are about that many).  The triangular solve (C^3/3 per chunk) is left out. */
#include <cblas.h>

#include "deltagrad.h"
#include "tools/bench_cuda.h"
#include "tools/commands.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* best of reps of a 1024^3 SGEMM (2 GFLOP), all cores */
static double sgemm_gflops(int reps) {
    int n = 1024;
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n), *c = malloc(sizeof(float) * n * n);
    if (!a || !b || !c) return NAN;
    for (int i = 0; i < n * n; i++) a[i] = b[i] = (float)((i % 17) - 8) / 8.0f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n); /* warm-up */
    double best = INFINITY;
    for (int r = 0; r < reps; r++) {
        double t = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        best = fmin(best, now_s() - t);
    }
    free(a);
    free(b);
    free(c);
    return 2.0 * n * n * (double)n / best / 1e9;
}

typedef struct timing {
    double fwd;    /* seconds, best of reps: forward alone (no grad) */
    double fwdbwd; /* forward under autograd, then backward */
} timing;

static timing time_op(const char *op, int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, bool recurrent,
                      int reps, bool *ok) {
    timing best = {INFINITY, INFINITY};
    dg_scope_begin();
    dg_rng r = dg_rng_new(1);
    dg_tensor *q = dg_l2norm(dg_randn(DG_SHAPE(B, T, H, K), DG_F32, &r), 1e-6);
    dg_tensor *k = dg_l2norm(dg_randn(DG_SHAPE(B, T, H, K), DG_F32, &r), 1e-6);
    dg_tensor *v = dg_randn(DG_SHAPE(B, T, H, V), DG_F32, &r);
    dg_tensor *beta = dg_sigmoid(dg_randn(DG_SHAPE(B, T, H), DG_F32, &r));
    bool kda = strcmp(op, "kda") == 0, gdn = strcmp(op, "gated_delta_rule") == 0;
    dg_tensor *g = kda ? dg_logsigmoid(dg_add_scalar(dg_randn(DG_SHAPE(B, T, H, K), DG_F32, &r), 4.0))
                       : dg_logsigmoid(dg_add_scalar(dg_randn(DG_SHAPE(B, T, H), DG_F32, &r), 4.0));
    dg_tensor *dO = dg_randn(DG_SHAPE(B, T, H, V), DG_F32, &r);
    dg_delta_opts o = {.algorithm = recurrent ? DG_DELTA_RECURRENT : DG_DELTA_CHUNKED, .chunk_size = 64};
    *ok = true;
    for (int rep = 0; rep < reps + 1 && *ok; rep++) { /* the first round warms up */
        dg_scope_begin();
        dg_tensor *x[3] = {q, k, v};
        dg_tensor *leaves[3];
        for (int i = 0; i < 3; i++) {
            leaves[i] = dg_detach(x[i]);
            dg_set_requires_grad(leaves[i], true);
        }
        double t0 = now_s();
        dg_no_grad_begin();
        dg_tensor *o1 = kda ? dg_kda(q, k, v, g, beta, &o, NULL)
                            : gdn ? dg_gated_delta_rule(q, k, v, g, beta, &o, NULL) : dg_delta_rule(q, k, v, beta, &o, NULL);
        dg_no_grad_end();
        double t1 = now_s();
        dg_tensor *o2 = kda ? dg_kda(leaves[0], leaves[1], leaves[2], g, beta, &o, NULL)
                            : gdn ? dg_gated_delta_rule(leaves[0], leaves[1], leaves[2], g, beta, &o, NULL)
                                  : dg_delta_rule(leaves[0], leaves[1], leaves[2], beta, &o, NULL);
        int rc = o2 ? dg_backward(o2, dO) : -1;
        double t2 = now_s();
        if (!o1 || rc != 0) *ok = false;
        if (rep > 0) {
            best.fwd = fmin(best.fwd, t1 - t0);
            best.fwdbwd = fmin(best.fwdbwd, t2 - t1);
        }
        dg_scope_end();
    }
    dg_scope_end();
    return best;
}

static int parse_list(const char *s, int64_t *out, int max) {
    int n = 0;
    for (const char *p = s; *p && n < max;) {
        out[n++] = strtoll(p, (char **)&p, 10);
        if (*p == ',') p++;
        else break;
    }
    return n;
}

int dg_cmd_bench(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++) /* the GPU benchmark has its own arguments (tools/bench_cuda.c) */
        if (strcmp(argv[i], "--device") == 0 && strcmp(argv[i + 1], "cuda") == 0) return dg_bench_cuda(argc, argv);
    const char *ops[3] = {"gated_delta_rule", "kda", "delta_rule"};
    int n_ops = 3, reps = 3;
    int64_t Bs[8] = {1, 4}, Ts[8] = {256, 1024, 4096}, Ks[8] = {64, 128};
    int nB = 2, nT = 3, nK = 2;
    bool markdown = false, no_recurrent = false;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            printf("usage: deltagrad bench [OP] [--B 1,4] [--T 256,1024,4096] [--K 64,128] [--reps 3]\n"
                   "                      [--no-recurrent] [--markdown] [--device cpu|cuda]\n"
                   "OP: gated_delta_rule | kda | delta_rule (default: all).  H = 4, K = V, f32, chunk 64.\n"
                   "Prints chunked fwd and fwd+bwd ms (best of reps), GFLOP/s of fwd+bwd and its share of\n"
                   "the SGEMM rate measured in the same run (1024^3, all cores), and the recurrent form's\n"
                   "fwd+bwd ms and the speed-up of the chunked one.\n"
                   "--device cuda: the GPU benchmark of issue 6 (bf16, its shapes, CUDA events; see\n"
                   "`deltagrad bench --device cuda --help`).\n");
            return 0;
        } else if (strcmp(a, "--B") == 0 && v) nB = parse_list(argv[++i], Bs, 8);
        else if (strcmp(a, "--T") == 0 && v) nT = parse_list(argv[++i], Ts, 8);
        else if (strcmp(a, "--K") == 0 && v) nK = parse_list(argv[++i], Ks, 8);
        else if (strcmp(a, "--reps") == 0 && v) reps = atoi(argv[++i]);
        else if (strcmp(a, "--markdown") == 0) markdown = true;
        else if (strcmp(a, "--no-recurrent") == 0) no_recurrent = true;
        else if (strcmp(a, "--device") == 0 && v) {
            if (strcmp(argv[++i], "cpu") != 0) {
                fprintf(stderr, "bench: --device %s: the devices are cpu and cuda\n", argv[i]);
                return 2;
            }
        } else if (a[0] != '-' && !only) only = a;
        else {
            fprintf(stderr, "bench: unknown argument '%s' (--help)\n", a);
            return 2;
        }
    }
    if (only) {
        if (strcmp(only, "gated_delta_rule") && strcmp(only, "kda") && strcmp(only, "delta_rule")) {
            fprintf(stderr, "bench: OP must be gated_delta_rule, kda or delta_rule (got %s)\n", only);
            return 2;
        }
        ops[0] = only;
        n_ops = 1;
    }
    if (reps < 1) reps = 1;
    double peak = sgemm_gflops(5);
    const int64_t H = 4, C = 64;
    printf("SGEMM 1024^3 (all cores): %.1f GFLOP/s\n", peak);
    const char *sep = markdown ? " | " : "  ";
    if (markdown)
        printf("\n| op | B | T | K=V | fwd ms | fwd+bwd ms | GFLOP/s | %% of SGEMM | recurrent fwd+bwd ms | speed-up |\n"
               "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    else
        printf("\n%-17s %2s %5s %4s %9s %11s %8s %8s %14s %8s\n", "op", "B", "T", "K=V", "fwd ms", "fwd+bwd ms",
               "GFLOP/s", "%SGEMM", "recur fb ms", "speedup");
    int failures = 0;
    for (int o = 0; o < n_ops; o++)
        for (int kb = 0; kb < nK; kb++)
            for (int bb = 0; bb < nB; bb++)
                for (int tb = 0; tb < nT; tb++) {
                    int64_t B = Bs[bb], T = Ts[tb], K = Ks[kb], V = K;
                    bool ok1 = true, ok2 = true;
                    timing ch = time_op(ops[o], B, T, H, K, V, false, reps, &ok1);
                    timing rc = {NAN, NAN};
                    if (!no_recurrent) rc = time_op(ops[o], B, T, H, K, V, true, 1, &ok2);
                    if (!ok1 || !ok2) {
                        printf("%s B=%lld T=%lld K=%lld failed: %s\n", ops[o], (long long)B, (long long)T, (long long)K,
                               dg_last_error());
                        dg_clear_error();
                        failures++;
                        continue;
                    }
                    double fwd_flops = (double)B * T * H * (6.0 * C * K + 4.0 * C * V + 6.0 * K * V);
                    double total = ch.fwdbwd, gf = 3 * fwd_flops / total / 1e9;
                    if (markdown)
                        printf("| %s | %lld | %lld | %lld | %.2f | %.2f | %.1f | %.0f%% | %.2f | %.1fx |\n", ops[o],
                               (long long)B, (long long)T, (long long)K, ch.fwd * 1e3, total * 1e3, gf,
                               100 * gf / peak, rc.fwdbwd * 1e3, rc.fwdbwd / total);
                    else
                        printf("%-17s%s%2lld%s%5lld%s%4lld%s%9.2f%s%11.2f%s%8.1f%s%7.0f%%%s%14.2f%s%7.1fx\n", ops[o], sep,
                               (long long)B, sep, (long long)T, sep, (long long)K, sep, ch.fwd * 1e3, sep, total * 1e3, sep,
                               gf, sep, 100 * gf / peak, sep, rc.fwdbwd * 1e3, sep,
                               rc.fwdbwd / total);
                    fflush(stdout);
                }
    return failures ? 1 : 0;
}
