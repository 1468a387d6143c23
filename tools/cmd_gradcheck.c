/* deltagrad gradcheck [--device cpu|cuda] [OP ...]: every registered op (or those named), in f64,
 * against central differences; a table, and a non-zero exit on any failure.
 *
 * --device cuda runs the check on the GPU (the CPU check, dg_gradcheck_op, is unchanged).  For each
 * sample (f64), layout (contiguous inputs; every input in a storage twice as long with doubled
 * strides) and backward variant, the inputs go to the device with their layout, the op runs
 * forward and backward there with random output weights W, and the gradients of
 * L = sum_j <out_j, W_j> are compared with central differences of L evaluated by device forwards
 * (eps 1e-6, or 1e-3 for an f32 input such as to_dtype's; element by element up to 256 elements,
 * else 6 random directions; the op's f64 tolerances), exactly the scheme of autograd/gradcheck.c.
 * Where the op has no f64 kernel on the device (its f64 forward fails there), it runs in f32 on
 * the device and its output and gradients are compared with the CPU f64 run on the same inputs
 * (the op's f32 tolerances, element by element: |gpu - cpu| <= atol + rtol |cpu|); those rows say
 * "vs cpu f64". */
#include "ops/gradcheck.h"
#include "tools/commands.h"
#include "tools/parse_args.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* a row's text, cut to the field's size (long error messages are cut, on purpose) */
static void put_text(char *dst, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, n, fmt, ap);
    va_end(ap);
}

static void fail_row(dg_gradcheck_report *rep, const dg_op_def *def, const char *variant, const char *label,
                     const char *what) {
    dg_gradcheck_row row = {.ok = false, .max_abs_err = INFINITY, .max_rel_err = INFINITY};
    snprintf(row.op, sizeof row.op, "%s", def->name);
    snprintf(row.variant, sizeof row.variant, "%s", variant);
    put_text(row.input, sizeof row.input, "%s: %s: %s", label, what, dg_last_error());
    dg_clear_error();
    dg_gradcheck_add_row(rep, &row);
}

#define KEEP_DTYPE DG_NUM_DTYPES

/* A copy of t's values on dev with t's shape, strides and offset (the whole storage travels); float
 * inputs in dtype dt (KEEP_DTYPE: t's own).  Always a fresh leaf, so gradients never pile up in
 * the case's tensors. */
static dg_tensor *same_layout_on(dg_tensor *t, dg_device dev, dg_dtype dt) {
    if (!t) return NULL;
    if (!dg_dtype_is_float(t->dtype) || dt == KEEP_DTYPE) dt = t->dtype;
    int64_t n = (int64_t)(t->storage->nbytes / dg_dtype_size(t->dtype)), one = 1;
    dg_tensor *flat = dg_make_view(t, 1, &n, &one, 0);
    dg_tensor *base = flat ? dg_empty_on(1, &n, dt, dev) : NULL;
    if (!base || dg_copy_(base, flat) != 0) return NULL;
    return dg_make_view(base, t->ndim, t->shape, t->stride, t->offset);
}

typedef struct {
    const dg_op_def *def;
    const dg_sample *s;
    int n_in;
    dg_tensor *in[DG_MAX_IO]; /* host inputs in their layout (perturbed in place) */
    bool diff[DG_MAX_IO];
    dg_tensor *w[DG_MAX_IO]; /* host weights, f64 */
    int variant;
} gc_case;

/* Runs the op on dev at dtype dt from the host inputs: outputs (host, f64) into out_h, and with
 * want_grads the input gradients of L (host, f64) into grad_h.  The results live in the caller's
 * scope.  0, or -1 with dg_error set. */
static int run_on(const gc_case *c, dg_device dev, dg_dtype dt, bool want_grads, dg_tensor **out_h,
                  dg_tensor **grad_h) {
    dg_tensor *in[DG_MAX_IO] = {0}, *out[DG_MAX_IO] = {0};
    for (int k = 0; k < c->n_in; k++) {
        if (c->in[k] && !(in[k] = same_layout_on(c->in[k], dev, dt))) return -1;
        if (in[k] && want_grads && c->diff[k]) dg_set_requires_grad(in[k], true);
    }
    if (!want_grads) dg_no_grad_begin();
    int rc = dg_apply(c->def, c->s->attrs, in, out, c->variant);
    if (!want_grads) dg_no_grad_end();
    if (rc) return -1;
    dg_tensor *loss = NULL;
    for (int j = 0; j < c->def->n_out; j++) {
        if (!out[j]) continue;
        if (!(out_h[j] = dg_to_dtype(dg_to_device(out[j], DG_CPU), DG_F64))) return -1;
        if (!want_grads || !out[j]->requires_grad || !c->w[j]) continue;
        dg_tensor *w = dg_to_device(dg_to_dtype(c->w[j], out[j]->dtype), dev);
        dg_tensor *term = dg_sum_all(dg_mul(out[j], w));
        loss = loss ? dg_add(loss, term) : term;
        if (!loss) return -1;
    }
    if (loss && dg_backward(loss, NULL) != 0) return -1;
    for (int k = 0; want_grads && k < c->n_in; k++)
        if (in[k] && c->diff[k] && in[k]->grad && !(grad_h[k] = dg_to_dtype(dg_to_device(in[k]->grad, DG_CPU), DG_F64)))
            return -1;
    return 0;
}

/* L = sum_j <out_j, W_j> by a forward on the device (f64) */
static double loss_on_device(const gc_case *c, int *err) {
    double L = 0;
    dg_tensor *out[DG_MAX_IO] = {0}, *none[DG_MAX_IO] = {0};
    dg_scope_begin();
    if (run_on(c, DG_CUDA, KEEP_DTYPE, false, out, none) != 0) *err = 1;
    else
        for (int j = 0; j < c->def->n_out; j++)
            if (out[j] && c->w[j]) L += dg_dot_all(out[j], c->w[j]);
    dg_scope_end();
    return L;
}

static void set_label(dg_gradcheck_row *row, const gc_case *c, bool strided, const char *how, int k) {
    snprintf(row->op, sizeof row->op, "%s", c->def->name);
    snprintf(row->variant, sizeof row->variant, "%s", c->def->bwd[c->variant].name);
    put_text(row->input, sizeof row->input, "%s%s%s: d%s %s", c->s->label, strided ? " (strided)" : "", how,
             c->def->in_names[k] ? c->def->in_names[k] : "?", dg_shp(c->in[k]));
}

/* f64 on the device: analytic gradients against central differences of device forwards.  Inputs
 * keep the sample's dtype: f64, except where a sampler says otherwise (to_dtype's f32 input, then
 * perturbed by an f32-sized step, as autograd/gradcheck.c does). */
static double device_value(dg_tensor *const *in, void *ctx, int *err) {
    (void)in; /* the case's host inputs, perturbed in place by dg_fd_compare */
    return loss_on_device(ctx, err);
}

static int check_f64_on_device(gc_case *c, bool strided, uint64_t seed, dg_gradcheck_report *rep) {
    dg_tensor *out[DG_MAX_IO] = {0}, *grad[DG_MAX_IO] = {0};
    if (run_on(c, DG_CUDA, KEEP_DTYPE, true, out, grad) != 0) return -1;
    double ae[DG_MAX_IO], re[DG_MAX_IO];
    bool ok[DG_MAX_IO];
    if (dg_fd_compare(device_value, c, c->n_in, c->in, c->diff, grad, c->def->atol_f64, c->def->rtol_f64, seed, ae, re,
                      ok) != 0)
        return -1;
    for (int k = 0; k < c->n_in; k++) {
        if (!c->diff[k] || !c->in[k]) continue;
        dg_gradcheck_row row = {.ok = ok[k], .max_abs_err = ae[k], .max_rel_err = re[k]};
        set_label(&row, c, strided, "", k);
        dg_gradcheck_add_row(rep, &row);
    }
    return 0;
}

/* worst |a - b| and |a - b| / |b| over all elements, and whether every element is within tol */
static bool compare_to(const dg_tensor *a, const dg_tensor *b, double atol, double rtol, double *ae, double *re) {
    bool ok = true;
    int64_t idx[DG_MAX_DIMS] = {0};
    if (dg_numel(b) == 0) return true;
    do {
        double x = dg_get(a, idx), y = dg_get(b, idx), e = fabs(x - y);
        if (!(e <= atol + rtol * fabs(y))) ok = false;
        if (e > *ae || isnan(e)) *ae = isnan(e) ? INFINITY : e;
        double r = e / fmax(fabs(y), 1e-8);
        if (r > *re || isnan(r)) *re = isnan(r) ? INFINITY : r;
    } while (dg_next_index(b->ndim, b->shape, idx));
    return ok;
}

/* no f64 kernel on the device: f32 on the device against the CPU f64 run */
static int check_f32_against_cpu(gc_case *c, bool strided, dg_gradcheck_report *rep) {
    dg_tensor *out_g[DG_MAX_IO] = {0}, *grad_g[DG_MAX_IO] = {0}, *out_c[DG_MAX_IO] = {0}, *grad_c[DG_MAX_IO] = {0};
    if (run_on(c, DG_CPU, DG_F64, true, out_c, grad_c) != 0) return -1;
    if (run_on(c, DG_CUDA, DG_F32, true, out_g, grad_g) != 0) return -1;
    double atol = c->def->atol_f32, rtol = c->def->rtol_f32;
    for (int j = 0; j < c->def->n_out; j++) {
        if (!out_c[j]) continue;
        dg_gradcheck_row row = {.ok = true};
        snprintf(row.op, sizeof row.op, "%s", c->def->name);
        snprintf(row.variant, sizeof row.variant, "%s", c->def->bwd[c->variant].name);
        put_text(row.input, sizeof row.input, "%s%s f32 vs cpu f64: %s", c->s->label, strided ? " (strided)" : "",
                 c->def->out_names[j] ? c->def->out_names[j] : "?");
        row.ok = out_g[j] && compare_to(out_g[j], out_c[j], atol, rtol, &row.max_abs_err, &row.max_rel_err);
        dg_gradcheck_add_row(rep, &row);
    }
    for (int k = 0; k < c->n_in; k++) {
        if (!c->diff[k] || !c->in[k]) continue;
        dg_gradcheck_row row = {.ok = true};
        set_label(&row, c, strided, " f32 vs cpu f64", k);
        if (grad_c[k] || grad_g[k])
            row.ok = grad_c[k] && grad_g[k] &&
                     compare_to(grad_g[k], grad_c[k], atol, rtol, &row.max_abs_err, &row.max_rel_err);
        dg_gradcheck_add_row(rep, &row);
    }
    return 0;
}

static int gradcheck_op_cuda(const dg_op_def *def, uint64_t seed, dg_gradcheck_report *rep) {
    int failed_before = rep->n_failed;
    for (int i = 0;; i++) {
        dg_scope_begin();
        dg_sample s = {0};
        int more = def->sample ? def->sample(i, DG_F64, seed + (uint64_t)i, &s) : -1;
        if (more <= 0) {
            if (more < 0) fail_row(rep, def, "-", "-", "no sample");
            dg_sample_free(&s);
            dg_scope_end();
            break;
        }
        for (int layout = 0; layout < 2; layout++)
            for (int v = 0; v < dg_op_variant_count(def); v++) {
                dg_scope_begin();
                gc_case c = {.def = def, .s = &s, .n_in = def->n_in, .variant = v};
                dg_rng wrng = dg_rng_new(seed ^ 0x3E16ull);
                for (int k = 0; k < def->n_in; k++) {
                    /* a fresh copy per case: perturbing it leaves the sample intact */
                    bool fl = s.in[k] && dg_dtype_is_float(s.in[k]->dtype);
                    c.in[k] = !fl ? s.in[k] : layout ? dg_gradcheck_strided_copy(s.in[k]) : dg_clone(s.in[k]);
                    c.diff[k] = s.differentiable[k] && c.in[k];
                }
                /* output shapes from a CPU forward, then the weights */
                dg_tensor *out_c[DG_MAX_IO] = {0}, *none[DG_MAX_IO] = {0};
                if (run_on(&c, DG_CPU, KEEP_DTYPE, false, out_c, none) != 0) {
                    fail_row(rep, def, def->bwd[v].name, s.label, "cpu forward failed");
                    dg_scope_end();
                    continue;
                }
                for (int j = 0; j < def->n_out; j++)
                    if (out_c[j]) c.w[j] = dg_randn(out_c[j]->ndim, out_c[j]->shape, DG_F64, &wrng);
                if (check_f64_on_device(&c, layout == 1, seed + (uint64_t)i, rep) != 0) {
                    char first[256];
                    put_text(first, sizeof first, "%s", dg_last_error());
                    dg_clear_error();
                    if (check_f32_against_cpu(&c, layout == 1, rep) != 0) {
                        char what[512];
                        put_text(what, sizeof what, "f64 on cuda failed (%s), f32 on cuda failed too", first);
                        fail_row(rep, def, def->bwd[v].name, s.label, what);
                    }
                }
                dg_scope_end();
            }
        dg_sample_free(&s);
        dg_scope_end();
    }
    return rep->n_failed - failed_before;
}

int dg_cmd_gradcheck(int argc, char **argv) {
    static const char *const devices[] = {"cpu", "cuda"};
    uint64_t seed = 1;
    bool cuda = false;
    int n_ops = 0;
    const dg_op_def **ops = calloc((size_t)(argc + dg_op_count()) + 1, sizeof *ops);
    if (!ops) return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int k;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            printf("usage: deltagrad gradcheck [--seed N] [--device cpu|cuda] [OP ...]\n"
                   "Checks every backward variant of every registered op (or those named) in f64 against\n"
                   "central finite differences, on each op's samples with contiguous and strided inputs.\n"
                   "Prints op, backward variant, input, max abs and rel error; exits 1 on any failure.\n"
                   "--device cuda: forward, backward and the differences run on the GPU in f64; an op with no\n"
                   "f64 kernel there runs in f32 on the GPU against the CPU f64 reference (rows 'vs cpu f64').\n");
            free(ops);
            return 0;
        }
        int bad = 0;
        if (strcmp(a, "--seed") == 0)
            bad = !(v = dg_arg_value("gradcheck", argc, argv, &i)) || dg_arg_u64("gradcheck", a, v, &seed) != 0;
        else if (strcmp(a, "--device") == 0) {
            bad = !(v = dg_arg_value("gradcheck", argc, argv, &i)) ||
                  (k = dg_arg_choice("gradcheck", a, v, devices, 2)) < 0;
            if (!bad) cuda = k == 1;
        } else if (a[0] == '-') bad = dg_arg_unknown("gradcheck", a) != 0;
        else bad = !(ops[n_ops++] = dg_arg_op("gradcheck", a, false));
        if (bad) {
            free(ops);
            return 2;
        }
    }
    if (cuda && !dg_cuda_available()) {
        fprintf(stderr, "gradcheck: --device cuda: no usable CUDA device (%s)\n",
                dg_last_error()[0] ? dg_last_error() : "this build has no CUDA backend, or no GPU is present");
        free(ops);
        return 2;
    }
    if (n_ops == 0)
        for (int i = 0; i < dg_op_count(); i++) ops[n_ops++] = dg_op_at(i);
    dg_gradcheck_report rep = {0};
    for (int i = 0; i < n_ops; i++) {
        if (cuda) gradcheck_op_cuda(ops[i], seed, &rep);
        else dg_gradcheck_op(ops[i], seed, &rep);
    }
    dg_gradcheck_print(&rep, stdout);
    int bad = rep.n_failed != 0;
    dg_gradcheck_report_free(&rep);
    free(ops);
    return bad ? 1 : 0;
}
