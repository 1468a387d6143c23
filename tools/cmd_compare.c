/* deltagrad compare OP: every backward path of a delta-rule op against the f64 recurrent reference.
 *
 * --device cuda: every path runs on the GPU (inputs copied there; --dtype f32, or bf16 / f16 storage
 * for q, k, v, beta with f32 gates and states), the reference stays the CPU f64 recurrent run on the
 * same values.  Times then include a synchronisation at the end of each pass; peak memory is the
 * device's.
 *
 * Paths: each registered backward variant of OP (the chunked ones run after a chunked forward, the
 * "recurrent" one after a recurrent forward), the autograd graph of OP's decomposition into
 * primitive ops, and with --gate-in-kernel the gate as a separate op (gdn_gate / kda_gate) in
 * front of the op.  The scalar differentiated is L = <o, dO> + <hT, dhT> with random dO, dhT, so
 * gradients flow in through both outputs.  For each gradient: max abs error and relative error
 * norm ||x - ref|| / ||ref||; per path: forward and backward milliseconds and peak host memory. */
#include "autograd/autograd.h"
#include "ops/delta/delta_common.h"
#include "tools/commands.h"

#ifdef DG_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct cfg {
    const char *op;
    int64_t B, T, H, HV, K, V;
    dg_dtype dtype;
    dg_device dev;
    uint64_t seed;
    int chunk, reps;
    bool gate_in_kernel, varlen, json;
} cfg;

enum { G_Q, G_K, G_V, G_G, G_BETA, G_H0, G_ALOG, G_DTB, N_GRADS };
static const char *const grad_names[N_GRADS] = {"dq", "dk", "dv", "dg", "dbeta", "dh0", "dA_log", "ddt_bias"};

typedef struct inputs {
    dg_tensor *t[N_GRADS]; /* q k v g beta h0 A_log dt_bias (g is the raw a with gate in kernel) */
    dg_tensor *cu, *dO, *dhT;
} inputs;

typedef struct result {
    char name[48];
    double fwd_ms, bwd_ms;
    size_t peak;
    double abs_err[N_GRADS], rel_err[N_GRADS];
    bool has[N_GRADS];
    double out_rel_err;
    char error[256];
} result;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static dg_gate_kind gate_of(const char *op) {
    return strcmp(op, "kda") == 0 ? DG_GATE_CHANNEL : (strcmp(op, "gated_delta_rule") == 0 ? DG_GATE_HEAD : DG_GATE_NONE);
}

/* f64 inputs; every path converts them to its dtype */
static void make_inputs(const cfg *c, inputs *in) {
    dg_rng r = dg_rng_new(c->seed);
    dg_gate_kind gate = gate_of(c->op);
    int64_t N = c->varlen ? 3 : c->B, B = c->varlen ? 1 : c->B, T = c->varlen ? c->B * c->T : c->T;
    memset(in, 0, sizeof *in);
    in->t[G_Q] = dg_randn(DG_SHAPE(B, T, c->H, c->K), DG_F64, &r);
    in->t[G_K] = dg_randn(DG_SHAPE(B, T, c->H, c->K), DG_F64, &r);
    in->t[G_V] = dg_randn(DG_SHAPE(B, T, c->HV, c->V), DG_F64, &r);
    in->t[G_BETA] = dg_sigmoid(dg_randn(DG_SHAPE(B, T, c->HV), DG_F64, &r));
    if (gate == DG_GATE_HEAD)
        in->t[G_G] = c->gate_in_kernel ? dg_randn(DG_SHAPE(B, T, c->HV), DG_F64, &r)
                                       : dg_logsigmoid(dg_add_scalar(dg_randn(DG_SHAPE(B, T, c->HV), DG_F64, &r), 3.0));
    if (gate == DG_GATE_CHANNEL)
        in->t[G_G] = c->gate_in_kernel ? dg_randn(DG_SHAPE(B, T, c->HV, c->K), DG_F64, &r)
                                       : dg_logsigmoid(dg_add_scalar(dg_randn(DG_SHAPE(B, T, c->HV, c->K), DG_F64, &r), 3.0));
    if (gate != DG_GATE_NONE && c->gate_in_kernel) {
        in->t[G_ALOG] = dg_log(dg_rand_range(DG_SHAPE(c->HV), DG_F64, 1.0, 16.0, &r));
        in->t[G_DTB] = dg_mul_scalar(dg_randn(DG_SHAPE(gate == DG_GATE_CHANNEL ? c->HV * c->K : c->HV), DG_F64, &r), 0.5);
    }
    in->t[G_H0] = dg_mul_scalar(dg_randn(DG_SHAPE(N, c->HV, c->K, c->V), DG_F64, &r), 0.1);
    in->dO = dg_randn(DG_SHAPE(B, T, c->HV, c->V), DG_F64, &r);
    in->dhT = dg_randn(DG_SHAPE(N, c->HV, c->K, c->V), DG_F64, &r);
    if (c->varlen) { /* three sequences of uneven length, the middle one not a multiple of a chunk */
        int64_t a = T / 4, b = a + T / 2 + 1;
        in->cu = dg_from_data(DG_SHAPE(4), DG_I64, (int64_t[]){0, a, b, T});
    }
}

static dg_tensor *as(dg_tensor *t, dg_dtype dt) { return t ? dg_to_dtype(t, dt) : NULL; }

/* waits for the device's queued work (no-op on the CPU), so that times cover the work */
static void sync_dev(dg_device dev) {
#ifdef DG_HAVE_CUDA
    if (dev == DG_CUDA) dg_cuda_synchronize();
#else
    (void)dev;
#endif
}

/* input i of a path at dtype dt on dev: with 16-bit storage (bf16, f16) only q, k, v, beta are in it */
static dg_tensor *path_input(dg_tensor *t, int i, dg_dtype dt, dg_device dev) {
    if (!t) return NULL;
    bool storage = i == G_Q || i == G_K || i == G_V || i == G_BETA;
    dg_dtype want = (dt == DG_BF16 || dt == DG_F16) && !storage ? DG_F32 : dt;
    return dg_clone(dg_to_device(as(t, want), dev));
}

/* path kinds */
enum { P_VARIANT, P_DECOMPOSE, P_GATE_SEPARATE };

/* Runs one path; grads[i] (f64) receives each gradient.  Returns 0 or -1. */
static int run_path(const cfg *c, const dg_op_def *def, const inputs *in, int kind, const char *variant,
                    dg_dtype dt, dg_device dev, result *res, dg_tensor **o_out, dg_tensor **grads) {
    dg_gate_kind gate = gate_of(c->op);
    dg_tensor *x[N_GRADS] = {0};
    for (int i = 0; i < N_GRADS; i++) {
        x[i] = path_input(in->t[i], i, dt, dev);
        if (in->t[i] && !x[i]) return -1;
        if (x[i]) dg_set_requires_grad(x[i], true);
    }
    const dg_dtype st = dt == DG_BF16 || dt == DG_F16 ? DG_F32 : dt; /* gates and states */
    dg_delta_opts o = {.initial_state = x[G_H0], .output_final_state = true, .chunk_size = c->chunk,
                       .use_qk_l2norm_in_kernel = true, .cu_seqlens = in->cu};
    bool recurrent = variant && strcmp(variant, "recurrent") == 0;
    o.algorithm = recurrent ? DG_DELTA_RECURRENT : DG_DELTA_CHUNKED;
    o.backward = kind == P_VARIANT ? variant : NULL;
    dg_tensor *g = x[G_G];
    if (c->gate_in_kernel && gate != DG_GATE_NONE) {
        if (kind == P_GATE_SEPARATE) {
            /* the gate as an op of its own in front */
            g = gate == DG_GATE_HEAD ? dg_gdn_gate(x[G_G], x[G_ALOG], x[G_DTB]) : dg_kda_gate(x[G_G], x[G_ALOG], x[G_DTB]);
        } else {
            o.use_gate_in_kernel = true;
            o.A_log = x[G_ALOG];
            o.dt_bias = x[G_DTB];
        }
    }
    sync_dev(dev);
    dg_reset_peak_bytes(dev);
    size_t base = dg_live_bytes(dev);
    double t0 = now_ms();
    dg_tensor *out = NULL, *hT = NULL;
    if (kind == P_DECOMPOSE) {
        const dg_delta_slots *sl = gate == DG_GATE_NONE ? &dg_delta_slots_plain : &dg_delta_slots_gated;
        dg_delta_attrs at;
        int64_t N;
        if (!dg_delta_validate(c->op, gate, x[G_Q], x[G_K], x[G_V], g, x[G_BETA], &o, &at, &N)) return -1;
        dg_tensor *ins[DG_MAX_IO] = {0}, *outs[DG_MAX_IO] = {0};
        ins[sl->q] = x[G_Q];
        ins[sl->k] = x[G_K];
        ins[sl->v] = x[G_V];
        ins[sl->beta] = x[G_BETA];
        ins[sl->h0] = x[G_H0];
        ins[sl->cu] = in->cu;
        if (sl->g >= 0) ins[sl->g] = g;
        if (sl->A_log >= 0) ins[sl->A_log] = o.use_gate_in_kernel ? x[G_ALOG] : NULL;
        if (sl->dt_bias >= 0) ins[sl->dt_bias] = o.use_gate_in_kernel ? x[G_DTB] : NULL;
        if (def->decompose(&at, ins, outs) != 0) return -1;
        out = outs[0];
        hT = outs[1];
    } else if (gate == DG_GATE_NONE)
        out = dg_delta_rule(x[G_Q], x[G_K], x[G_V], x[G_BETA], &o, &hT);
    else if (gate == DG_GATE_HEAD)
        out = dg_gated_delta_rule(x[G_Q], x[G_K], x[G_V], g, x[G_BETA], &o, &hT);
    else
        out = dg_kda(x[G_Q], x[G_K], x[G_V], g, x[G_BETA], &o, &hT);
    sync_dev(dev);
    double t1 = now_ms();
    if (!out || !hT) return -1;
    dg_tensor *dO = dg_to_device(as(in->dO, st), dev), *dhT = dg_to_device(as(in->dhT, st), dev);
    dg_tensor *loss = dg_add(dg_sum_all(dg_mul(as(out, st), dO)), dg_sum_all(dg_mul(hT, dhT)));
    sync_dev(dev);
    double t2 = now_ms();
    if (!loss || dg_backward(loss, NULL) != 0) return -1;
    sync_dev(dev);
    double t3 = now_ms();
    res->fwd_ms = t1 - t0;
    res->bwd_ms = t3 - t2;
    res->peak = dg_peak_bytes(dev) - base;
    *o_out = dg_to_dtype(dg_to_device(out, DG_CPU), DG_F64);
    for (int i = 0; i < N_GRADS; i++)
        grads[i] = x[i] && x[i]->grad ? dg_to_dtype(dg_to_device(x[i]->grad, DG_CPU), DG_F64) : NULL;
    return *o_out ? 0 : -1;
}

static void errors(const dg_tensor *x, const dg_tensor *ref, double *abs_err, double *rel_err) {
    double m = 0, num = 0, den = 0;
    const double *a = dg_data_ptr(x), *b = dg_data_ptr(ref);
    for (int64_t i = 0, n = dg_numel(ref); i < n; i++) {
        double d = fabs(a[i] - b[i]);
        m = d > m || isnan(d) ? (isnan(d) ? INFINITY : d) : m;
        num += d * d;
        den += b[i] * b[i];
    }
    *abs_err = m;
    *rel_err = den > 0 ? sqrt(num / den) : sqrt(num);
}

static int parse(int argc, char **argv, cfg *c) {
    *c = (cfg){.B = 2, .T = 128, .H = 2, .HV = 4, .K = 32, .V = 32, .dtype = DG_F32, .dev = DG_CPU, .seed = 0,
               .chunk = 64, .reps = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define INT_FLAG(flag, field)                                                                        \
    if (strcmp(a, flag) == 0 && v) {                                                                 \
        c->field = strtoll(v, NULL, 10);                                                             \
        i++;                                                                                         \
        continue;                                                                                    \
    }
        INT_FLAG("--B", B) INT_FLAG("--T", T) INT_FLAG("--H", H) INT_FLAG("--HV", HV) INT_FLAG("--K", K)
        INT_FLAG("--V", V) INT_FLAG("--seed", seed) INT_FLAG("--chunk", chunk) INT_FLAG("--reps", reps)
#undef INT_FLAG
        if (strcmp(a, "--dtype") == 0 && v) {
            if (strcmp(v, "f32") && strcmp(v, "f64") && strcmp(v, "bf16") && strcmp(v, "f16")) {
                fprintf(stderr, "compare: --dtype must be f32, f64, bf16 or f16 (got %s)\n", v);
                return -1;
            }
            c->dtype = strcmp(v, "f64") == 0    ? DG_F64
                       : strcmp(v, "bf16") == 0 ? DG_BF16
                       : strcmp(v, "f16") == 0  ? DG_F16
                                                : DG_F32;
            i++;
        } else if (strcmp(a, "--device") == 0 && v) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda")) {
                fprintf(stderr, "compare: --device must be cpu or cuda (got %s)\n", v);
                return -1;
            }
            c->dev = strcmp(v, "cuda") == 0 ? DG_CUDA : DG_CPU;
            i++;
        } else if (strcmp(a, "--gate-in-kernel") == 0) c->gate_in_kernel = true;
        else if (strcmp(a, "--varlen") == 0) c->varlen = true;
        else if (strcmp(a, "--json") == 0) c->json = true;
        else if (a[0] != '-' && !c->op) c->op = a;
        else {
            fprintf(stderr, "compare: unknown argument '%s' (--help)\n", a);
            return -1;
        }
    }
    return 0;
}

static void print_table(const cfg *c, const result *r, int n) {
    printf("compare %s  B=%lld T=%lld H=%lld HV=%lld K=%lld V=%lld chunk=%d dtype=%s device=%s seed=%llu%s%s\n", c->op,
           (long long)c->B, (long long)c->T, (long long)c->H, (long long)c->HV, (long long)c->K, (long long)c->V,
           c->chunk, dg_dtype_name(c->dtype), dg_device_name(c->dev), (unsigned long long)c->seed,
           c->varlen ? " varlen" : "", c->gate_in_kernel ? " gate-in-kernel" : "");
    printf("reference: f64 on the cpu, recurrent forward and backward; errors: max abs | ||x-ref||/||ref||\n\n");
    printf("%-22s %9s %9s %10s %11s", "path", "fwd ms", "bwd ms", c->dev == DG_CUDA ? "dev MiB" : "peak MiB", "o rel");
    for (int g = 0; g < N_GRADS; g++)
        if (r[0].has[g]) printf(" %19s", grad_names[g]);
    printf("\n");
    for (int i = 0; i < n; i++) {
        if (r[i].error[0]) {
            printf("%-22s failed: %s\n", r[i].name, r[i].error);
            continue;
        }
        printf("%-22s %9.2f %9.2f %10.2f %11.2e", r[i].name, r[i].fwd_ms, r[i].bwd_ms, r[i].peak / 1048576.0,
               r[i].out_rel_err);
        for (int g = 0; g < N_GRADS; g++)
            if (r[0].has[g]) printf("  %8.1e|%8.1e", r[i].abs_err[g], r[i].rel_err[g]);
        printf("\n");
    }
}

static void print_json(const cfg *c, const result *r, int n) {
    printf("{\"op\":\"%s\",\"B\":%lld,\"T\":%lld,\"H\":%lld,\"HV\":%lld,\"K\":%lld,\"V\":%lld,\"chunk\":%d,"
           "\"dtype\":\"%s\",\"device\":\"%s\",\"seed\":%llu,\"varlen\":%s,\"gate_in_kernel\":%s,\"paths\":[",
           c->op, (long long)c->B, (long long)c->T, (long long)c->H, (long long)c->HV, (long long)c->K,
           (long long)c->V, c->chunk, dg_dtype_name(c->dtype), dg_device_name(c->dev), (unsigned long long)c->seed,
           c->varlen ? "true" : "false",
           c->gate_in_kernel ? "true" : "false");
    for (int i = 0; i < n; i++) {
        printf("%s{\"path\":\"%s\"", i ? "," : "", r[i].name);
        if (r[i].error[0]) {
            printf(",\"error\":\"");
            for (const char *p = r[i].error; *p; p++) printf(*p == '"' || *p == '\\' ? "\\%c" : "%c", *p);
            printf("\"}");
            continue;
        }
        printf(",\"fwd_ms\":%.4f,\"bwd_ms\":%.4f,\"peak_bytes\":%zu,\"o_rel_err\":%.3e,\"grads\":{", r[i].fwd_ms,
               r[i].bwd_ms, r[i].peak, r[i].out_rel_err);
        int first = 1;
        for (int g = 0; g < N_GRADS; g++)
            if (r[i].has[g]) {
                printf("%s\"%s\":{\"max_abs_err\":%.3e,\"rel_err\":%.3e}", first ? "" : ",", grad_names[g],
                       r[i].abs_err[g], r[i].rel_err[g]);
                first = 0;
            }
        printf("}}");
    }
    printf("]}\n");
}

int dg_cmd_compare(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: deltagrad compare OP [--B 2] [--T 128] [--H 2] [--HV 4] [--K 32] [--V 32]\n"
                   "                        [--dtype f32|f64|bf16|f16] [--device cpu|cuda] [--seed 0] [--chunk 64]\n"
                   "                        [--reps 1]\n"
                   "                        [--gate-in-kernel] [--varlen] [--json]\n"
                   "OP: delta_rule | gated_delta_rule | kda.  Runs every backward path of OP (each registered\n"
                   "variant, the decomposition's autograd graph, and with --gate-in-kernel the gate as a separate\n"
                   "op) and reports, per gradient, the error against the f64 recurrent reference, with forward and\n"
                   "backward ms (best of --reps) and peak memory.  --varlen packs 3 sequences (B = 1).\n"
                   "--device cuda runs every path on the GPU (f32, or --dtype bf16 / f16: 16-bit q, k, v, beta with\n"
                   "f32 gates and states) against the same CPU f64 reference.\n");
            return 0;
        }
    cfg c;
    if (parse(argc, argv, &c) != 0) return 2;
    const dg_op_def *def = c.op ? dg_op_find(c.op) : NULL;
    if (!def || (strcmp(c.op, "delta_rule") && strcmp(c.op, "gated_delta_rule") && strcmp(c.op, "kda"))) {
        fprintf(stderr, "compare: OP must be delta_rule, gated_delta_rule or kda (got %s)\n", c.op ? c.op : "none");
        return 2;
    }
    if (c.gate_in_kernel && gate_of(c.op) == DG_GATE_NONE) {
        fprintf(stderr, "compare: delta_rule has no gate; --gate-in-kernel applies to gated_delta_rule and kda\n");
        return 2;
    }
    if (c.reps < 1) c.reps = 1;
    if (c.dev == DG_CUDA && c.dtype == DG_F64) {
        fprintf(stderr, "compare: --device cuda runs f32, bf16 or f16 (the device kernels have no f64)\n");
        return 2;
    }
    if (c.dev == DG_CPU && (c.dtype == DG_BF16 || c.dtype == DG_F16)) {
        fprintf(stderr, "compare: --dtype %s runs on --device cuda only\n", dg_dtype_name(c.dtype));
        return 2;
    }
    if (c.dev == DG_CUDA && !dg_cuda_available()) {
        fprintf(stderr, "compare: --device cuda: no usable CUDA device (%s)\n",
                dg_last_error()[0] ? dg_last_error() : "this build has no CUDA backend, or no GPU is present");
        return 2;
    }
    result res[16];
    int n = 0, rc = 0;
    dg_scope_begin();
    inputs in;
    make_inputs(&c, &in);
    /* reference */
    dg_tensor *ref_o = NULL, *ref_g[N_GRADS] = {0};
    result ref = {0};
    if (run_path(&c, def, &in, P_VARIANT, "recurrent", DG_F64, DG_CPU, &ref, &ref_o, ref_g) != 0) {
        fprintf(stderr, "compare: the f64 reference failed: %s\n", dg_last_error());
        dg_scope_end();
        return 1;
    }
    int nv = dg_op_variant_count(def);
    int n_paths = nv + 1 + (c.gate_in_kernel ? 1 : 0);
    for (int p = 0; p < n_paths && n < 16; p++) {
        int kind = p < nv ? P_VARIANT : (p == nv ? P_DECOMPOSE : P_GATE_SEPARATE);
        if (kind == P_DECOMPOSE && (c.dtype == DG_BF16 || c.dtype == DG_F16)) continue; /* the primitive ops have no 16-bit forms */
        const char *vname = kind == P_VARIANT ? def->bwd[p].name : NULL;
        result *r = &res[n++];
        memset(r, 0, sizeof *r);
        snprintf(r->name, sizeof r->name, "%s", kind == P_VARIANT ? vname : (kind == P_DECOMPOSE ? "decomposition" : "gate_separate"));
        double best_f = INFINITY, best_b = INFINITY;
        for (int rep = 0; rep < c.reps; rep++) {
            dg_scope_begin();
            dg_tensor *o = NULL, *g[N_GRADS] = {0};
            dg_clear_error();
            if (run_path(&c, def, &in, kind, vname, c.dtype, c.dev, r, &o, g) != 0) {
                snprintf(r->error, sizeof r->error, "%s", dg_last_error());
                dg_clear_error();
                rc = 1;
                dg_scope_end();
                break;
            }
            best_f = fmin(best_f, r->fwd_ms);
            best_b = fmin(best_b, r->bwd_ms);
            if (rep == 0) {
                double dummy;
                errors(o, ref_o, &dummy, &r->out_rel_err);
                for (int k = 0; k < N_GRADS; k++) {
                    r->has[k] = ref_g[k] != NULL;
                    if (ref_g[k] && g[k]) errors(g[k], ref_g[k], &r->abs_err[k], &r->rel_err[k]);
                    else if (ref_g[k]) r->abs_err[k] = r->rel_err[k] = INFINITY;
                }
            }
            dg_scope_end();
        }
        if (!r->error[0]) {
            r->fwd_ms = best_f;
            r->bwd_ms = best_b;
        }
    }
    if (c.json) print_json(&c, res, n);
    else print_table(&c, res, n);
    dg_scope_end();
    return rc;
}
