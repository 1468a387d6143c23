/* deltagrad compare OP: every backward path of an op against an f64 reference on the same inputs.
 *
 * Any registered op with more than one backward variant can be compared.  The paths are each
 * backward variant, the autograd graph of the op's decomposition into primitive ops (where the op
 * has one), and for the gated delta ops with --gate-in-kernel the gate as an op of its own in
 * front.  The inputs come from the op's sampler (every sample, the worst error over them), or for
 * delta_rule, gated_delta_rule and kda from sizes (--B --T ...), built and run through the public
 * API (tools/delta_sized.c).  The reference runs in f64 on the CPU: the variant "recurrent" where the
 * op has one, else its decomposition, else its first variant.  Every path's inputs are the
 * reference's values rounded to the path's dtype, and the reference runs on those rounded values.
 *
 * The scalar differentiated is L = sum_j <out_j, W_j> with random W_j, so gradients flow in
 * through every output.  For each output and gradient: max abs error and the relative error norm
 * ||x - ref|| / ||ref||.  A row is ok when every relative error norm is within the tolerance of
 * the run's dtype: the op's own rtol_f64 / rtol_f32 from its registry entry, and for the 16-bit
 * storage dtypes on the GPU the limits of the CUDA parity tests (bf16 1e-2, f16 1.25e-3).  The
 * exit status is 1 when any row fails, 2 for bad arguments. */
#include "autograd/autograd.h"
#include "models/memory_estimate.h"
#include "tools/commands.h"
#include "tools/delta_sized.h"
#include "tools/mem_check.h"
#include "tools/parse_args.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct cfg {
    const dg_op_def *def;
    bool sized; /* inputs at sizes (the delta ops) rather than from the sampler */
    dg_delta_size sz;
    dg_dtype dtype;
    dg_device dev;
    uint64_t seed;
    int64_t reps, warmup;
    bool json, skip_decomposition;
    const char *only; /* --paths: the comma-separated paths to run (NULL: all) */
} cfg;

enum { P_VARIANT, P_DECOMPOSE, P_GATE_SEPARATE };
typedef struct path {
    int kind, variant;
    char name[48];
} path;

/* One set of inputs (the sizes, or one sample) with the reference's results on it. */
typedef struct cmp_case {
    char label[96];
    dg_tensor *in[DG_MAX_IO]; /* f64 on the host, already rounded through the run's dtype */
    bool diff[DG_MAX_IO];
    _Alignas(16) unsigned char attrs[DG_ATTR_BYTES]; /* read as the op's attribute struct */
    bool has_attrs;                                  /* the attribute struct is known (needed by the decomposition) */
    dg_tensor *w[DG_MAX_IO];                         /* output weights W_j, f64 */
    dg_tensor *ref_out[DG_MAX_IO], *ref_grad[DG_MAX_IO];
} cmp_case;

/* error slots: outputs 0..n_out, then the gradient of input k at DG_MAX_IO + k */
#define N_ERR (2 * DG_MAX_IO)
typedef struct row {
    path p;
    double fwd_ms, bwd_ms; /* best of reps, summed over the cases */
    size_t peak;
    double abs_err[N_ERR], rel_err[N_ERR]; /* worst over the cases */
    bool has[N_ERR];
    bool ok;
    char error[256];
} row;

static bool is_16bit(dg_dtype dt) { return dt == DG_BF16 || dt == DG_F16; }

/* the tolerance on ||x - ref|| / ||ref|| at the run's dtype */
static double tolerance(const cfg *c) {
    switch (c->dtype) {
    case DG_F64: return c->def->rtol_f64;
    case DG_BF16: return 1e-2;
    case DG_F16: return 1.25e-3;
    default: return c->def->rtol_f32;
    }
}

/* the dtype input k is stored in: with 16-bit storage only q, k, v and beta are 16-bit (gates
 * and states stay f32), as on the GPU's tensor-core paths */
static dg_dtype input_dtype(const cfg *c, int k) {
    if (!is_16bit(c->dtype)) return c->dtype;
    const char *n = c->def->in_names[k] ? c->def->in_names[k] : "";
    bool storage = !strcmp(n, "q") || !strcmp(n, "k") || !strcmp(n, "v") || !strcmp(n, "beta");
    return storage ? c->dtype : DG_F32;
}

static dg_dtype state_dtype(const cfg *c) { return is_16bit(c->dtype) ? DG_F32 : c->dtype; }

/* waits for the device's queued work, so that times cover it: a copy to the host waits for the
 * stream (the public API has no other wait) */
static void sync_dev(dg_device dev) {
    if (dev != DG_CUDA) return;
    float x;
    dg_tensor *one = dg_zeros_on(DG_SHAPE(1), DG_F32, DG_CUDA);
    if (one) dg_copy_to_host(one, &x);
}

static dg_tensor *host_f64(dg_tensor *t) {
    return t ? dg_contiguous(dg_to_dtype(dg_to_device(t, DG_CPU), DG_F64)) : NULL;
}

/* Runs path p of the case at dtype dt on dev: outputs and gradients (host, f64) into out_h and
 * grad_h, times and peak memory into r.  The first run of a case (the reference) makes the output
 * weights.  Results live in the caller's scope.  0, or -1 with dg_error set. */
static int run_path(const cfg *c, cmp_case *cs, const path *p, dg_dtype dt, dg_device dev, row *r, dg_tensor **out_h,
                    dg_tensor **grad_h) {
    const dg_op_def *def = c->def;
    const dg_dtype st = dt == DG_F64 ? DG_F64 : state_dtype(c);
    dg_tensor *x[DG_MAX_IO] = {0}, *out[DG_MAX_IO] = {0};
    for (int k = 0; k < def->n_in; k++) {
        if (!cs->in[k]) continue;
        /* integer inputs (cu_seqlens) stay on the host, where the ops read them */
        if (!dg_dtype_is_float(cs->in[k]->dtype)) x[k] = cs->in[k];
        else x[k] = dg_clone(dg_to_device(dg_to_dtype(cs->in[k], dt == DG_F64 ? DG_F64 : input_dtype(c, k)), dev));
        if (!x[k]) return -1;
        if (cs->diff[k]) dg_set_requires_grad(x[k], true);
    }
    sync_dev(dev);
    dg_reset_peak_bytes(dev);
    const size_t base = dg_live_bytes(dev);
    const double t0 = 1e3 * dg_now_s();
    int rc;
    if (p->kind == P_DECOMPOSE) rc = def->decompose(cs->attrs, x, out);
    else if (c->sized)
        rc = dg_delta_sized_call(def, &c->sz, x, p->kind == P_VARIANT ? def->bwd[p->variant].name : NULL,
                                 p->kind == P_GATE_SEPARATE, out);
    else rc = dg_apply(def, cs->attrs, x, out, p->variant);
    sync_dev(dev);
    const double t1 = 1e3 * dg_now_s();
    if (rc != 0) return -1;
    dg_tensor *loss = NULL;
    for (int j = 0; j < def->n_out; j++) {
        if (!out[j]) continue;
        if (!cs->w[j]) {
            dg_rng rng = dg_rng_new(c->seed ^ (0x5EEDull + (uint64_t)j));
            if (!(cs->w[j] = dg_randn(out[j]->ndim, out[j]->shape, DG_F64, &rng))) return -1;
        }
        dg_tensor *term = dg_sum_all(dg_mul(dg_to_dtype(out[j], st), dg_to_device(dg_to_dtype(cs->w[j], st), dev)));
        loss = loss ? dg_add(loss, term) : term;
        if (!loss) return -1;
    }
    sync_dev(dev);
    const double t2 = 1e3 * dg_now_s();
    if (!loss || dg_backward(loss, NULL) != 0) return -1;
    sync_dev(dev);
    const double t3 = 1e3 * dg_now_s();
    r->fwd_ms = t1 - t0;
    r->bwd_ms = t3 - t2;
    r->peak = dg_peak_bytes(dev) - base;
    for (int j = 0; j < def->n_out; j++)
        if (out[j] && !(out_h[j] = host_f64(out[j]))) return -1;
    for (int k = 0; k < def->n_in; k++)
        if (x[k] && x[k]->grad && !(grad_h[k] = host_f64(x[k]->grad))) return -1;
    return 0;
}

/* max |x - ref| and ||x - ref|| / ||ref|| (||x - ref|| when ref is 0); a NaN counts as infinite */
static void errors(const dg_tensor *x, const dg_tensor *ref, double *abs_err, double *rel_err) {
    if (!x || dg_numel(x) != dg_numel(ref)) {
        *abs_err = *rel_err = INFINITY;
        return;
    }
    double m = 0, num = 0, den = 0;
    const double *a = dg_data_ptr(x), *b = dg_data_ptr(ref);
    for (int64_t i = 0, n = dg_numel(ref); i < n; i++) {
        double d = fabs(a[i] - b[i]);
        if (isnan(d)) d = INFINITY;
        m = fmax(m, d);
        num += d * d;
        den += b[i] * b[i];
    }
    *abs_err = m;
    *rel_err = den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Fills the case from the sizes or from sample number index; returns 1, 0 past the last sample,
 * -1 on an error.  Float inputs are rounded through the dtype each path stores them in. */
static int make_case(const cfg *c, int index, cmp_case *cs) {
    const dg_op_def *def = c->def;
    memset(cs, 0, sizeof *cs);
    if (c->sized) {
        if (index > 0) return 0;
        snprintf(cs->label, sizeof cs->label, "sizes");
        if (dg_delta_sized_inputs(def, &c->sz, DG_F64, cs->in, cs->diff) != 0) return -1;
    } else {
        dg_sample s = {0};
        int more = def->sample ? def->sample(index, DG_F64, c->seed + (uint64_t)index, &s) : -1;
        if (more <= 0) {
            dg_sample_free(&s);
            if (more < 0) dg_error("%s has no sampler", def->name);
            return more;
        }
        snprintf(cs->label, sizeof cs->label, "%s", s.label);
        memcpy(cs->attrs, s.attrs, sizeof cs->attrs);
        cs->has_attrs = true;
        for (int k = 0; k < def->n_in; k++) {
            cs->in[k] = s.in[k] ? dg_clone(s.in[k]) : NULL;
            cs->diff[k] = s.differentiable[k] && s.in[k] && dg_dtype_is_float(s.in[k]->dtype);
        }
        dg_sample_free(&s);
    }
    for (int k = 0; k < def->n_in; k++)
        if (cs->in[k] && dg_dtype_is_float(cs->in[k]->dtype) && c->dtype != DG_F64)
            cs->in[k] = dg_to_dtype(dg_to_dtype(cs->in[k], input_dtype(c, k)), DG_F64);
    if (c->sized && def->decompose) {
        /* the attribute struct the public entry point fills, read off the node it records */
        dg_scope_begin();
        dg_tensor *x[DG_MAX_IO] = {0}, *out[DG_MAX_IO] = {0};
        for (int k = 0; k < def->n_in; k++) {
            x[k] = cs->in[k] ? dg_clone(cs->in[k]) : NULL;
            if (x[k] && cs->diff[k]) dg_set_requires_grad(x[k], true);
        }
        if (dg_delta_sized_call(def, &c->sz, x, NULL, false, out) == 0 && out[0]->node && out[0]->node->op == def) {
            memcpy(cs->attrs, out[0]->node->attrs, sizeof cs->attrs);
            cs->has_attrs = true;
        }
        dg_scope_end();
        dg_clear_error();
    }
    return 1;
}

/* the f64 reference path: "recurrent" where the op has it, else the decomposition, else variant 0 */
static path reference_path(const dg_op_def *def) {
    int v = dg_op_variant_find(def, "recurrent");
    if (v >= 0) return (path){P_VARIANT, v, "recurrent"};
    if (def->decompose) return (path){P_DECOMPOSE, 0, "decomposition"};
    path p = {P_VARIANT, 0, ""};
    snprintf(p.name, sizeof p.name, "%s", def->bwd[0].name);
    return p;
}

/* whether path name is in the comma-separated list */
static bool in_list(const char *list, const char *name) {
    const size_t n = strlen(name);
    for (const char *p = list; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (strncmp(p, name, n) == 0 && (p[n] == ',' || p[n] == 0)) return true;
    return false;
}

/* The paths of the run: all, or those of --paths (-1 after a message when one is not a path). */
static int list_paths(const cfg *c, path *ps) {
    path all[DG_MAX_IO];
    int n_all = 0, n = 0;
    for (int v = 0; v < dg_op_variant_count(c->def); v++) {
        all[n_all] = (path){P_VARIANT, v, ""};
        snprintf(all[n_all++].name, sizeof all[0].name, "%s", c->def->bwd[v].name);
    }
    /* the primitive ops have no 16-bit forms */
    if (c->def->decompose && !is_16bit(c->dtype) && !c->skip_decomposition)
        all[n_all++] = (path){P_DECOMPOSE, 0, "decomposition"};
    if (c->sized && c->sz.gate_in_kernel) all[n_all++] = (path){P_GATE_SEPARATE, 0, "gate_separate"};
    for (int i = 0; i < n_all; i++)
        if (!c->only || in_list(c->only, all[i].name)) ps[n++] = all[i];
    for (const char *p = c->only; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
        const size_t len = strchr(p, ',') ? (size_t)(strchr(p, ',') - p) : strlen(p);
        bool known = false;
        for (int i = 0; i < n_all; i++) known |= strlen(all[i].name) == len && strncmp(all[i].name, p, len) == 0;
        if (!known) {
            fprintf(stderr, "compare: --paths: %s has no path '%.*s' here (paths:", c->def->name, (int)len, p);
            for (int i = 0; i < n_all; i++) fprintf(stderr, " %s", all[i].name);
            fprintf(stderr, ")\n");
            return -1;
        }
    }
    return n;
}

/* Runs every path on one case against the case's reference, folding the results into rows. */
static int compare_case(const cfg *c, cmp_case *cs, const path *ps, int n_paths, row *rows) {
    const dg_op_def *def = c->def;
    row ref_row = {0};
    const path ref = reference_path(def);
    if (ref.kind == P_DECOMPOSE && !cs->has_attrs) {
        dg_error("the reference (the decomposition) needs the op's attributes, which are unknown here");
        return -1;
    }
    if (run_path(c, cs, &ref, DG_F64, DG_CPU, &ref_row, cs->ref_out, cs->ref_grad) != 0) return -1;
    for (int p = 0; p < n_paths; p++) {
        row *r = &rows[p];
        if (r->error[0]) continue;
        if (ps[p].kind == P_DECOMPOSE && !cs->has_attrs) {
            snprintf(r->error, sizeof r->error, "the op's attributes are unknown here (its node was not recorded)");
            continue;
        }
        double best_f = INFINITY, best_b = INFINITY;
        for (int64_t rep = -c->warmup; rep < c->reps; rep++) {
            dg_scope_begin();
            dg_tensor *o[DG_MAX_IO] = {0}, *g[DG_MAX_IO] = {0};
            row timing = {0};
            dg_clear_error();
            if (run_path(c, cs, &ps[p], c->dtype, c->dev, &timing, o, g) != 0) {
                snprintf(r->error, sizeof r->error, "%s: %s", cs->label, dg_last_error());
                dg_clear_error();
                dg_scope_end();
                break;
            }
            if (rep >= 0) {
                best_f = fmin(best_f, timing.fwd_ms);
                best_b = fmin(best_b, timing.bwd_ms);
                if (timing.peak > r->peak) r->peak = timing.peak;
            }
            for (int e = 0; rep == 0 && e < N_ERR; e++) {
                const dg_tensor *want = e < DG_MAX_IO ? cs->ref_out[e] : cs->ref_grad[e - DG_MAX_IO];
                const dg_tensor *got = e < DG_MAX_IO ? o[e] : g[e - DG_MAX_IO];
                if (!want) continue;
                double ae, re;
                errors(got, want, &ae, &re);
                r->has[e] = true;
                r->abs_err[e] = fmax(r->abs_err[e], ae);
                r->rel_err[e] = fmax(r->rel_err[e], re);
            }
            dg_scope_end();
        }
        if (!r->error[0]) {
            r->fwd_ms += best_f;
            r->bwd_ms += best_b;
        }
    }
    return 0;
}

static void err_name(const dg_op_def *def, int e, char *buf, size_t n) {
    if (e < DG_MAX_IO) snprintf(buf, n, "%s", def->out_names[e] ? def->out_names[e] : "out");
    else snprintf(buf, n, "d%s", def->in_names[e - DG_MAX_IO] ? def->in_names[e - DG_MAX_IO] : "?");
}

static void print_header(const cfg *c, int n_cases) {
    if (c->sized)
        printf("compare %s  B=%lld T=%lld H=%lld HV=%lld K=%lld V=%lld chunk=%d", c->def->name, (long long)c->sz.B,
               (long long)c->sz.T, (long long)c->sz.H, (long long)c->sz.HV, (long long)c->sz.K, (long long)c->sz.V,
               c->sz.chunk);
    else printf("compare %s  the sampler's %d samples (worst error over them, times summed)", c->def->name, n_cases);
    printf(" dtype=%s device=%s seed=%llu%s%s\n", dg_dtype_name(c->dtype), dg_device_name(c->dev),
           (unsigned long long)c->seed, c->sized && c->sz.varlen ? " varlen" : "",
           c->sized && c->sz.gate_in_kernel ? " gate-in-kernel" : "");
    const path ref = reference_path(c->def);
    printf("reference: f64 on the cpu, path '%s'; errors: max abs | ||x-ref||/||ref||\n", ref.name);
    printf("tolerance: ||x-ref||/||ref|| <= %.3g for every output and gradient (%s)\n", tolerance(c),
           c->dtype == DG_F64   ? "the op's rtol_f64"
           : c->dtype == DG_F32 ? "the op's rtol_f32"
                                : "the limit of the CUDA parity tests for 16-bit storage");
    printf("times: best of %lld after %lld warm-up run%s\n\n", (long long)c->reps, (long long)c->warmup,
           c->warmup == 1 ? "" : "s");
}

static void print_table(const cfg *c, const row *r, int n, const bool *cols, int n_cases) {
    char name[40];
    print_header(c, n_cases);
    printf("%-16s %9s %9s %10s", "path", "fwd ms", "bwd ms", c->dev == DG_CUDA ? "dev MiB" : "peak MiB");
    for (int e = 0; e < N_ERR; e++)
        if (cols[e]) {
            err_name(c->def, e, name, sizeof name);
            printf(" %17.17s", name);
        }
    printf("  verdict\n");
    for (int i = 0; i < n; i++) {
        if (r[i].error[0]) {
            printf("%-16s FAIL: %s\n", r[i].p.name, r[i].error);
            continue;
        }
        printf("%-16s %9.2f %9.2f %10.2f", r[i].p.name, r[i].fwd_ms, r[i].bwd_ms, r[i].peak / 1048576.0);
        for (int e = 0; e < N_ERR; e++)
            if (cols[e]) printf(" %8.1e|%8.1e", r[i].abs_err[e], r[i].rel_err[e]);
        printf("  %s\n", r[i].ok ? "ok" : "FAIL");
    }
}

static void json_string(const char *s) {
    putchar('"');
    for (const char *p = s; *p; p++) printf(*p == '"' || *p == '\\' ? "\\%c" : "%c", *p);
    putchar('"');
}

static void print_json(const cfg *c, const row *r, int n, int n_cases) {
    char name[40];
    printf("{\"op\":\"%s\",", c->def->name);
    if (c->sized)
        printf("\"B\":%lld,\"T\":%lld,\"H\":%lld,\"HV\":%lld,\"K\":%lld,\"V\":%lld,\"chunk\":%d,\"varlen\":%s,"
               "\"gate_in_kernel\":%s,",
               (long long)c->sz.B, (long long)c->sz.T, (long long)c->sz.H, (long long)c->sz.HV, (long long)c->sz.K,
               (long long)c->sz.V, c->sz.chunk, c->sz.varlen ? "true" : "false",
               c->sz.gate_in_kernel ? "true" : "false");
    else printf("\"samples\":%d,", n_cases);
    printf("\"dtype\":\"%s\",\"device\":\"%s\",\"seed\":%llu,\"reference\":\"%s\",\"tolerance\":%.3g,\"paths\":[",
           dg_dtype_name(c->dtype), dg_device_name(c->dev), (unsigned long long)c->seed, reference_path(c->def).name,
           tolerance(c));
    for (int i = 0; i < n; i++) {
        printf("%s{\"path\":\"%s\",\"ok\":%s", i ? "," : "", r[i].p.name, r[i].ok ? "true" : "false");
        if (r[i].error[0]) {
            printf(",\"error\":");
            json_string(r[i].error);
            printf("}");
            continue;
        }
        printf(",\"fwd_ms\":%.4f,\"bwd_ms\":%.4f,\"peak_bytes\":%zu,\"errors\":{", r[i].fwd_ms, r[i].bwd_ms, r[i].peak);
        int first = 1;
        for (int e = 0; e < N_ERR; e++)
            if (r[i].has[e]) {
                err_name(c->def, e, name, sizeof name);
                printf("%s\"%s\":{\"max_abs_err\":%.3e,\"rel_err\":%.3e}", first ? "" : ",", name, r[i].abs_err[e],
                       r[i].rel_err[e]);
                first = 0;
            }
        printf("}}");
    }
    printf("]}\n");
}

static const char usage[] =
    "usage: deltagrad compare OP [--dtype f32|f64|bf16|f16] [--device cpu|cuda] [--seed 0]\n"
    "                            [--reps 1] [--warmup 2] [--paths NAME,...] [--json]\n"
    "       delta_rule, gated_delta_rule, kda also: [--B 2] [--T 128] [--H 2] [--HV 4] [--K 32] [--V 32]\n"
    "                            [--chunk 16|32|64] [--gate-in-kernel] [--varlen] [--samples]\n"
    "OP: any op with more than one backward variant (`deltagrad ops` lists them).  Runs every backward\n"
    "path of OP (each variant, the decomposition's autograd graph where the op has one, and with\n"
    "--gate-in-kernel the gate as a separate op) and reports, per output and gradient, the error\n"
    "against an f64 reference on the CPU on the same inputs, with a verdict against the dtype's\n"
    "tolerance (printed in the header); exits 1 when any path fails.  Inputs: the op's sampler (every\n"
    "sample), or for the delta ops the sizes (default; --samples takes the sampler's).  --varlen packs\n"
    "3 sequences (B = 1).  --paths runs only the paths named (variants, decomposition, gate_separate).\n"
    "Times: best of --reps after --warmup untimed runs.\n"
    "--device cuda runs every path on the GPU (f32, or for the delta ops at sizes --dtype bf16 / f16:\n"
    "16-bit q, k, v, beta with f32 gates and states) against the same CPU f64 reference.\n";

/* 0, 1 (--help printed), or -1 after a message */
static int parse(int argc, char **argv, cfg *c) {
    static const char *const dtypes[] = {"f32", "f64", "bf16", "f16"}, *const devices[] = {"cpu", "cuda"},
                             *const chunks[] = {"16", "32", "64"};
    static const dg_dtype dtype_of[] = {DG_F32, DG_F64, DG_BF16, DG_F16};
    const char *op = NULL;
    bool size_flag = false, samples = false;
    *c = (cfg){.dtype = DG_F32,
               .dev = DG_CPU,
               .reps = 1,
               .warmup = 2,
               .sz = {.B = 2,
                      .T = 128,
                      .H = 2,
                      .HV = 4,
                      .K = 32,
                      .V = 32,
                      .chunk = 64,
                      .l2norm_in_kernel = true,
                      .initial_state = true}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        static const struct {
            const char *flag;
            size_t off;
        } sizes[] = {{"--B", offsetof(dg_delta_size, B)}, {"--T", offsetof(dg_delta_size, T)},
                     {"--H", offsetof(dg_delta_size, H)}, {"--HV", offsetof(dg_delta_size, HV)},
                     {"--K", offsetof(dg_delta_size, K)}, {"--V", offsetof(dg_delta_size, V)}};
        int s = 0;
        while (s < 6 && strcmp(a, sizes[s].flag) != 0) s++;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            printf("%s", usage);
            return 1;
        } else if (s < 6) {
            if (!(v = dg_arg_value("compare", argc, argv, &i)) ||
                dg_arg_int("compare", a, v, 1, INT64_C(1) << 40, (int64_t *)((char *)&c->sz + sizes[s].off)) != 0)
                return -1;
            size_flag = true;
        } else if (strcmp(a, "--chunk") == 0) {
            int k;
            if (!(v = dg_arg_value("compare", argc, argv, &i)) || (k = dg_arg_choice("compare", a, v, chunks, 3)) < 0)
                return -1;
            c->sz.chunk = 16 << k;
            size_flag = true;
        } else if (strcmp(a, "--reps") == 0 || strcmp(a, "--warmup") == 0) {
            if (!(v = dg_arg_value("compare", argc, argv, &i)) ||
                dg_arg_int("compare", a, v, a[2] == 'r' ? 1 : 0, 1000000, a[2] == 'r' ? &c->reps : &c->warmup) != 0)
                return -1;
        } else if (strcmp(a, "--seed") == 0) {
            if (!(v = dg_arg_value("compare", argc, argv, &i)) || dg_arg_u64("compare", a, v, &c->seed) != 0) return -1;
        } else if (strcmp(a, "--dtype") == 0) {
            int k;
            if (!(v = dg_arg_value("compare", argc, argv, &i)) || (k = dg_arg_choice("compare", a, v, dtypes, 4)) < 0)
                return -1;
            c->dtype = dtype_of[k];
        } else if (strcmp(a, "--device") == 0) {
            int k;
            if (!(v = dg_arg_value("compare", argc, argv, &i)) || (k = dg_arg_choice("compare", a, v, devices, 2)) < 0)
                return -1;
            c->dev = k ? DG_CUDA : DG_CPU;
        } else if (strcmp(a, "--gate-in-kernel") == 0) c->sz.gate_in_kernel = size_flag = true;
        else if (strcmp(a, "--varlen") == 0) c->sz.varlen = size_flag = true;
        else if (strcmp(a, "--samples") == 0) samples = true;
        else if (strcmp(a, "--paths") == 0) {
            if (!(c->only = dg_arg_value("compare", argc, argv, &i))) return -1;
        } else if (strcmp(a, "--json") == 0) c->json = true;
        else if (a[0] != '-' && !op) op = a;
        else return dg_arg_unknown("compare", a);
    }
    if (!op) {
        fprintf(stderr, "compare: which op? (ops with several backward variants: ");
        dg_print_op_names(stderr, true);
        fprintf(stderr, ")\n");
        return -1;
    }
    if (!(c->def = dg_arg_op("compare", op, true))) return -1;
    c->sized = dg_delta_sized_op(c->def) && !samples;
    c->sz.seed = c->seed;
    if (size_flag && !c->sized) {
        fprintf(stderr,
                "compare: %s takes its inputs from its sampler; the size options (--B --T --H --HV --K --V "
                "--chunk --gate-in-kernel --varlen) apply to delta_rule, gated_delta_rule and kda%s\n",
                c->def->name, samples ? " without --samples" : "");
        return -1;
    }
    if (c->sz.gate_in_kernel && !dg_delta_sized_gated(c->def)) {
        fprintf(stderr, "compare: %s has no gate; --gate-in-kernel applies to gated_delta_rule and kda\n",
                c->def->name);
        return -1;
    }
    if (c->dev == DG_CUDA && c->dtype == DG_F64) {
        fprintf(stderr, "compare: --device cuda runs f32, bf16 or f16 (the delta kernels have no f64 on the device)\n");
        return -1;
    }
    if (is_16bit(c->dtype) && (c->dev != DG_CUDA || !c->sized)) {
        fprintf(stderr, "compare: --dtype %s runs on --device cuda only, for the delta ops at sizes\n",
                dg_dtype_name(c->dtype));
        return -1;
    }
    return 0;
}

/* The host memory of a run at sizes, before anything is allocated: the case (f64 inputs, weights
 * and the reference's results), the f64 reference, and each path: about four sets of the op's
 * tensors (inputs, gradients, outputs, the work of the backward), and for the decomposition's
 * graph about six states per token besides.  Refuses when even the op's own paths cannot fit;
 * leaves the decomposition out (with a note) when only it cannot. */
static int check_memory(cfg *c) {
    if (!c->sized) return 0; /* the samples are small by construction */
    const double io = dg_delta_sized_io_elems(c->def, &c->sz), states = dg_delta_sized_state_elems(&c->sz);
    const double e = c->dev == DG_CUDA ? 0 : (double)dg_dtype_size(state_dtype(c));
    const double base = 3 * io * 8 + 4 * io * 8 + 4 * io * e;
    if (dg_check_host_memory("compare", "this run", base) != 0) return -1;
    const double decomposition = 3 * io * 8 + 4 * io * 8 + 6 * states * (c->dev == DG_CUDA ? 4 : e) + 4 * io * e;
    const double avail = dg_memory_available();
    if (c->def->decompose && !is_16bit(c->dtype) && avail > 0 && decomposition > avail) {
        fprintf(stderr,
                "compare: note: the decomposition path is left out: its graph needs about %.1f GiB, %.1f GiB is "
                "available\n",
                decomposition / 1073741824.0, avail / 1073741824.0);
        c->skip_decomposition = true;
    }
    if (c->dev == DG_CUDA) dg_note_device_memory_unchecked("compare");
    return 0;
}

int dg_cmd_compare(int argc, char **argv) {
    cfg c;
    int prc = parse(argc, argv, &c);
    if (prc != 0) return prc > 0 ? 0 : 2;
    if (c.dev == DG_CUDA && !dg_cuda_available()) {
        fprintf(stderr, "compare: --device cuda: no usable CUDA device (%s)\n",
                dg_last_error()[0] ? dg_last_error() : "this build has no CUDA backend, or no GPU is present");
        return 2;
    }
    if (check_memory(&c) != 0) return 2;
    path ps[DG_MAX_IO];
    const int n_paths = list_paths(&c, ps);
    if (n_paths < 0) return 2;
    row rows[DG_MAX_IO] = {0};
    for (int p = 0; p < n_paths; p++) rows[p].p = ps[p];
    int n_cases = 0, rc = 0;
    for (int i = 0;; i++) {
        dg_scope_begin();
        cmp_case cs;
        int more = make_case(&c, i, &cs);
        if (more > 0 && compare_case(&c, &cs, ps, n_paths, rows) != 0) more = -1;
        if (more < 0) fprintf(stderr, "compare: %s: the f64 reference failed: %s\n", c.def->name, dg_last_error());
        dg_scope_end();
        if (more <= 0) {
            rc = more < 0;
            break;
        }
        n_cases++;
    }
    if (rc) return 1;
    bool cols[N_ERR] = {0};
    const double tol = tolerance(&c);
    for (int p = 0; p < n_paths; p++) {
        rows[p].ok = !rows[p].error[0];
        for (int e = 0; e < N_ERR; e++) {
            cols[e] |= rows[p].has[e];
            if (rows[p].has[e] && !(rows[p].rel_err[e] <= tol)) rows[p].ok = false;
        }
        if (!rows[p].ok) rc = 1;
    }
    if (c.json) print_json(&c, rows, n_paths, n_cases);
    else print_table(&c, rows, n_paths, cols, n_cases);
    return rc;
}
