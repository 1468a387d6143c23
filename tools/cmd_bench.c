/* deltagrad bench [OP]: times registered ops on the CPU; `--device cuda` runs the GPU benchmark of
 * tools/bench_cuda.c.
 *
 * Without OP, or for delta_rule, gated_delta_rule and kda: the ops at B x T x K sizes, f32, H = 4,
 * K = V, chunk 64, built and run through the public API (tools/delta_sized.c): chunked forward and
 * forward+backward milliseconds and GFLOP/s next to this machine's SGEMM rate measured in the same
 * run, and the recurrent form's forward+backward for the speed-up.  The backward computes the
 * gradients of q, k and v.
 *
 * Any other op (or a delta op with --samples): every sample of its sampler and every backward
 * variant, forward and forward+backward milliseconds.
 *
 * Each time is the best of --reps runs after --warmup untimed ones (2 by default: the first runs
 * pay for page faults, the thread pool's start and cold caches).
 *
 * FLOPs of the delta ops (per token and value head, chunk C, the chunked algorithm's matrix
 * products counted in full, as the kernels compute them): forward 6CK + 4CV + 6KV
 *   (K K^T, W = T K, Q K^T: 2C^2K each; U = T V, (QK^T) V': 2C^2V each; W S, state update, Q S:
 *   2KV each per token); the backward is counted as twice the forward (the usual convention;
 *   its products are about that many).  The triangular solve (C^3/3 per chunk) is left out. */
#include "core/internal.h"
#include "kernels/cpu/gemm.h"
#include "tools/bench_cuda.h"
#include "tools/commands.h"
#include "tools/delta_sized.h"
#include "tools/mem_check.h"
#include "tools/parse_args.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LIST 8

typedef struct cfg {
    const dg_op_def *def; /* NULL: the three delta ops */
    bool sized;
    int64_t B[MAX_LIST], T[MAX_LIST], K[MAX_LIST];
    int nB, nT, nK;
    int64_t reps, warmup;
    dg_dtype dtype; /* of the sampler's inputs */
    bool markdown, no_recurrent;
} cfg;

/* best of reps of a 1024^3 SGEMM (2 GFLOP), all cores: through dg_cpu_gemm, as the library's own
 * products (OpenBLAS on each OpenMP thread, a block of rows each) */
static double sgemm_gflops(int reps) {
    int n = 1024;
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n), *c = malloc(sizeof(float) * n * n);
    double best = INFINITY;
    if (a && b && c) {
        for (int i = 0; i < n * n; i++) a[i] = b[i] = (float)((i % 17) - 8) / 8.0f;
        dg_cpu_gemm_f32(false, false, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n); /* warm-up */
        for (int r = 0; r < reps; r++) {
            double t = dg_now_s();
            dg_cpu_gemm_f32(false, false, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
            best = fmin(best, dg_now_s() - t);
        }
    }
    free(a);
    free(b);
    free(c);
    return 2.0 * n * n * (double)n / best / 1e9;
}

/* One way of running the op forward: out receives its outputs.  0 or -1. */
typedef struct runner {
    const dg_op_def *def;
    const dg_delta_size *sz;  /* the delta ops at sizes, through the public API */
    const char *variant_name; /* for sz */
    const void *attrs;        /* the sampler's attributes, through dg_apply */
    int variant;
} runner;

static int run_forward(const runner *r, dg_tensor *const *x, dg_tensor **out) {
    if (r->sz) return dg_delta_sized_call(r->def, r->sz, x, r->variant_name, false, out);
    return dg_apply(r->def, r->attrs, x, out, r->variant);
}

typedef struct timing {
    double fwd;    /* seconds: the forward alone (no grad) */
    double fwdbwd; /* the forward under autograd, then the backward (NAN: nothing differentiable) */
} timing;

/* Best of reps after warmup runs.  grad[k]: input k is a leaf that requires grad; the backward
 * starts from output 0 with a random gradient.  0, or -1 with dg_error set. */
static int time_op(const runner *r, dg_tensor *const *in, const bool *grad, const cfg *c, timing *best) {
    *best = (timing){INFINITY, INFINITY};
    dg_tensor *dO = NULL;
    int rc = 0;
    for (int64_t rep = -c->warmup; rep < c->reps && rc == 0; rep++) {
        dg_scope_begin();
        dg_tensor *x[DG_MAX_IO] = {0}, *o1[DG_MAX_IO] = {0}, *o2[DG_MAX_IO] = {0};
        bool any = false;
        for (int k = 0; k < r->def->n_in; k++) {
            x[k] = in[k] && grad[k] ? dg_detach(in[k]) : in[k];
            if (in[k] && grad[k]) dg_set_requires_grad(x[k], any = true);
        }
        double t0 = dg_now_s();
        dg_no_grad_begin();
        rc = run_forward(r, in, o1);
        dg_no_grad_end();
        double t1 = dg_now_s();
        if (rc == 0) rc = run_forward(r, x, o2);
        if (rc == 0 && !dO) {
            dg_rng rng = dg_rng_new(7);
            dO = dg_keep(dg_randn(o2[0]->ndim, o2[0]->shape, o2[0]->dtype, &rng));
            rc = dO ? 0 : -1;
        }
        const bool backward = rc == 0 && any && o2[0]->requires_grad;
        if (backward) rc = dg_backward(o2[0], dO);
        double t2 = dg_now_s();
        if (rep >= 0 && rc == 0) {
            best->fwd = fmin(best->fwd, t1 - t0);
            best->fwdbwd = backward ? fmin(best->fwdbwd, t2 - t1) : NAN;
        }
        dg_scope_end();
    }
    dg_release(dO);
    return rc;
}

/* the delta ops at sizes: the table of chunked and recurrent times */
static int bench_delta(const cfg *c) {
    const dg_op_def *all[3] = {dg_op_find("gated_delta_rule"), dg_op_find("kda"), dg_op_find("delta_rule")};
    const dg_op_def *const *ops = c->def ? &c->def : all;
    const int n_ops = c->def ? 1 : 3;
    const int64_t H = 4, C = 64;
    /* the largest row: its inputs, the leaves' gradients, the outputs and the backward's work,
     * about eight sets of the op's tensors in f32 */
    double need = 0;
    for (int o = 0; o < n_ops; o++)
        for (int kb = 0; kb < c->nK; kb++)
            for (int bb = 0; bb < c->nB; bb++)
                for (int tb = 0; tb < c->nT; tb++) {
                    dg_delta_size sz = {.B = c->B[bb], .T = c->T[tb], .H = H, .HV = H, .K = c->K[kb], .V = c->K[kb]};
                    need = fmax(need, 8 * 4 * dg_delta_sized_io_elems(ops[o], &sz));
                }
    if (dg_check_host_memory("bench", "the largest size", need) != 0) return 2;
    double peak = sgemm_gflops(5);
    printf("SGEMM 1024^3 (all cores): %.1f GFLOP/s; times: best of %lld after %lld warm-up run%s\n", peak,
           (long long)c->reps, (long long)c->warmup, c->warmup == 1 ? "" : "s");
    const char *sep = c->markdown ? " | " : "  ";
    if (c->markdown)
        printf(
            "\n| op | B | T | K=V | fwd ms | fwd+bwd ms | GFLOP/s | %% of SGEMM | recurrent fwd+bwd ms | speed-up |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    else
        printf("\n%-17s %2s %5s %4s %9s %11s %8s %8s %14s %8s\n", "op", "B", "T", "K=V", "fwd ms", "fwd+bwd ms",
               "GFLOP/s", "%SGEMM", "recur fb ms", "speedup");
    int failures = 0;
    for (int o = 0; o < n_ops; o++)
        for (int kb = 0; kb < c->nK; kb++)
            for (int bb = 0; bb < c->nB; bb++)
                for (int tb = 0; tb < c->nT; tb++) {
                    const int64_t B = c->B[bb], T = c->T[tb], K = c->K[kb], V = K;
                    dg_delta_size sz = {.B = B, .T = T, .H = H, .HV = H, .K = K, .V = V, .chunk = (int)C, .seed = 1};
                    dg_scope_begin();
                    dg_tensor *in[DG_MAX_IO];
                    bool diff[DG_MAX_IO], grad[DG_MAX_IO] = {0};
                    int rc = dg_delta_sized_inputs(ops[o], &sz, DG_F32, in, diff);
                    for (int k = 0; k < ops[o]->n_in; k++) {
                        const char *n = ops[o]->in_names[k];
                        grad[k] = n && (!strcmp(n, "q") || !strcmp(n, "k") || !strcmp(n, "v"));
                    }
                    timing ch = {NAN, NAN}, re = {NAN, NAN};
                    runner chunked = {.def = ops[o], .sz = &sz},
                           recurrent = {.def = ops[o], .sz = &sz, .variant_name = "recurrent"};
                    cfg once = *c;
                    once.reps = 1; /* the recurrent form once, for the speed-up */
                    if (rc == 0) rc = time_op(&chunked, in, grad, c, &ch);
                    if (rc == 0 && !c->no_recurrent) rc = time_op(&recurrent, in, grad, &once, &re);
                    dg_scope_end();
                    if (rc != 0) {
                        printf("%s B=%lld T=%lld K=%lld failed: %s\n", ops[o]->name, (long long)B, (long long)T,
                               (long long)K, dg_last_error());
                        dg_clear_error();
                        failures++;
                        continue;
                    }
                    double fwd_flops = (double)B * T * H * (6.0 * C * K + 4.0 * C * V + 6.0 * K * V);
                    double total = ch.fwdbwd, gf = 3 * fwd_flops / total / 1e9;
                    char rms[32] = "-", rx[32] = "-"; /* the recurrent columns, "-" with --no-recurrent */
                    if (!c->no_recurrent) {
                        snprintf(rms, sizeof rms, "%.2f", re.fwdbwd * 1e3);
                        snprintf(rx, sizeof rx, "%.1fx", re.fwdbwd / total);
                    }
                    if (c->markdown)
                        printf("| %s | %lld | %lld | %lld | %.2f | %.2f | %.1f | %.0f%% | %s | %s |\n", ops[o]->name,
                               (long long)B, (long long)T, (long long)K, ch.fwd * 1e3, total * 1e3, gf, 100 * gf / peak,
                               rms, rx);
                    else
                        printf("%-17s%s%2lld%s%5lld%s%4lld%s%9.2f%s%11.2f%s%8.1f%s%7.0f%%%s%14s%s%8s\n", ops[o]->name,
                               sep, (long long)B, sep, (long long)T, sep, (long long)K, sep, ch.fwd * 1e3, sep,
                               total * 1e3, sep, gf, sep, 100 * gf / peak, sep, rms, sep, rx);
                    fflush(stdout);
                }
    return failures ? 1 : 0;
}

/* any op: every sample and backward variant */
static int bench_samples(const cfg *c) {
    const dg_op_def *def = c->def;
    printf("bench %s  the sampler's inputs in %s; times: best of %lld after %lld warm-up run%s\n\n", def->name,
           dg_dtype_name(c->dtype), (long long)c->reps, (long long)c->warmup, c->warmup == 1 ? "" : "s");
    if (c->markdown) printf("| variant | sample | fwd ms | fwd+bwd ms |\n| --- | --- | --- | --- |\n");
    else printf("%-12s %-56s %10s %11s\n", "variant", "sample", "fwd ms", "fwd+bwd ms");
    int failures = 0;
    for (int i = 0;; i++) {
        dg_scope_begin();
        dg_sample s = {0};
        int more = def->sample(i, DG_F64, 1 + (uint64_t)i, &s);
        if (more <= 0) {
            dg_sample_free(&s);
            dg_scope_end();
            if (more < 0) {
                printf("%s: the sampler failed: %s\n", def->name, dg_last_error());
                failures++;
            }
            break;
        }
        dg_tensor *in[DG_MAX_IO] = {0};
        bool grad[DG_MAX_IO] = {0};
        for (int k = 0; k < def->n_in; k++) {
            bool fl = s.in[k] && dg_dtype_is_float(s.in[k]->dtype);
            in[k] = fl ? dg_to_dtype(s.in[k], c->dtype) : s.in[k];
            grad[k] = fl && s.differentiable[k];
        }
        for (int v = 0; v < dg_op_variant_count(def); v++) {
            runner r = {.def = def, .attrs = s.attrs, .variant = v};
            timing t;
            if (time_op(&r, in, grad, c, &t) != 0) {
                printf("%-12s %-56.56s failed: %s\n", def->bwd[v].name, s.label, dg_last_error());
                dg_clear_error();
                failures++;
            } else if (c->markdown)
                printf("| %s | %s | %.4f | %.4f |\n", def->bwd[v].name, s.label, t.fwd * 1e3, t.fwdbwd * 1e3);
            else printf("%-12s %-56.56s %10.4f %11.4f\n", def->bwd[v].name, s.label, t.fwd * 1e3, t.fwdbwd * 1e3);
        }
        dg_sample_free(&s);
        dg_scope_end();
    }
    return failures ? 1 : 0;
}

static const char usage[] =
    "usage: deltagrad bench [OP] [--reps 3] [--warmup 2] [--markdown] [--device cpu|cuda]\n"
    "       no OP, delta_rule, gated_delta_rule, kda: [--B 1,4] [--T 256,1024,4096] [--K 64,128]\n"
    "                                                 [--no-recurrent] [--samples]\n"
    "       any other op: [--dtype f32|f64]\n"
    "No OP: the three delta ops.  For them: H = 4, K = V, f32, chunk 64; chunked fwd and fwd+bwd ms,\n"
    "GFLOP/s of fwd+bwd and its share of the SGEMM rate measured in the same run (1024^3, all cores),\n"
    "and the recurrent form's fwd+bwd ms and the speed-up of the chunked one.  Any other op (or a\n"
    "delta op with --samples): fwd and fwd+bwd ms of every backward variant on every sample of the\n"
    "op's sampler.  Times: best of --reps after --warmup untimed runs.\n"
    "--device cuda: the GPU benchmark (bf16, its own shapes, CUDA events; see\n"
    "`deltagrad bench --device cuda --help`).\n";

/* 0, 1 (--help printed), or -1 after a message */
static int parse(int argc, char **argv, cfg *c) {
    static const char *const devices[] = {"cpu", "cuda"}, *const dtypes[] = {"f32", "f64"};
    *c = (cfg){.B = {1, 4},
               .T = {256, 1024, 4096},
               .K = {64, 128},
               .nB = 2,
               .nT = 3,
               .nK = 2,
               .reps = 3,
               .warmup = 2,
               .dtype = DG_F32};
    const char *op = NULL;
    bool size_flag = false, samples = false, dtype_flag = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int k;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            printf("%s", usage);
            return 1;
        } else if (strcmp(a, "--B") == 0 || strcmp(a, "--T") == 0 || strcmp(a, "--K") == 0) {
            int64_t *list = a[2] == 'B' ? c->B : a[2] == 'T' ? c->T : c->K;
            int *n = a[2] == 'B' ? &c->nB : a[2] == 'T' ? &c->nT : &c->nK;
            if (!(v = dg_arg_value("bench", argc, argv, &i)) ||
                (*n = dg_arg_int_list("bench", a, v, 1, INT64_C(1) << 40, list, MAX_LIST)) < 0)
                return -1;
            size_flag = true;
        } else if (strcmp(a, "--reps") == 0 || strcmp(a, "--warmup") == 0) {
            if (!(v = dg_arg_value("bench", argc, argv, &i)) ||
                dg_arg_int("bench", a, v, a[2] == 'r' ? 1 : 0, 1000000, a[2] == 'r' ? &c->reps : &c->warmup) != 0)
                return -1;
        } else if (strcmp(a, "--dtype") == 0) {
            if (!(v = dg_arg_value("bench", argc, argv, &i)) || (k = dg_arg_choice("bench", a, v, dtypes, 2)) < 0)
                return -1;
            c->dtype = k ? DG_F64 : DG_F32;
            dtype_flag = true;
        } else if (strcmp(a, "--device") == 0) {
            if (!(v = dg_arg_value("bench", argc, argv, &i)) || dg_arg_choice("bench", a, v, devices, 2) < 0) return -1;
        } else if (strcmp(a, "--markdown") == 0) c->markdown = true;
        else if (strcmp(a, "--no-recurrent") == 0) c->no_recurrent = size_flag = true;
        else if (strcmp(a, "--samples") == 0) samples = true;
        else if (a[0] != '-' && !op) op = a;
        else return dg_arg_unknown("bench", a);
    }
    if (op && !(c->def = dg_arg_op("bench", op, false))) return -1;
    c->sized = !c->def || (dg_delta_sized_op(c->def) && !samples);
    if (samples && !c->def) {
        fprintf(stderr, "bench: --samples needs an OP\n");
        return -1;
    }
    if (size_flag && !c->sized) {
        fprintf(stderr,
                "bench: %s is timed on its sampler's inputs; --B --T --K --no-recurrent apply to "
                "delta_rule, gated_delta_rule and kda%s\n",
                c->def->name, samples ? " without --samples" : "");
        return -1;
    }
    if (dtype_flag && c->sized) {
        fprintf(stderr, "bench: the delta ops at sizes run in f32; --dtype applies to the sampler's inputs\n");
        return -1;
    }
    return 0;
}

int dg_cmd_bench(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++) /* the GPU benchmark has its own arguments (tools/bench_cuda.c) */
        if (strcmp(argv[i], "--device") == 0 && strcmp(argv[i + 1], "cuda") == 0) return dg_bench_cuda(argc, argv);
    cfg c;
    int rc = parse(argc, argv, &c);
    if (rc != 0) return rc > 0 ? 0 : 2;
    return c.sized ? bench_delta(&c) : bench_samples(&c);
}
