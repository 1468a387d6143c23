/* Finite-difference gradient checks.
 *
 * For an op: every sample of its sampler, in f64, with contiguous and then non-contiguous inputs
 * (the same values in a storage twice as long, every other element), under every backward
 * variant.  The scalar checked is L = sum_j <out_j, W_j> with fixed random weights W_j, so every
 * output (o and the final state of the delta-rule ops) carries gradient.  dL/dx from dg_backward
 * is compared with central differences (L(x + e) - L(x - e)) / 2e: element by element for inputs
 * of up to 256 elements, along 6 random directions u (dL/dx . u) for larger ones.  A row fails
 * when |fd - analytic| > atol + rtol |fd| (the op's f64 tolerances). */
#include "ops/gradcheck.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ELEMENTWISE_LIMIT 256
#define N_DIRECTIONS 6

static double eps_for(dg_dtype dt) { return dt == DG_F64 ? 1e-6 : 1e-3; }

double dg_dot_all(const dg_tensor *a, const dg_tensor *b) {
    double s = 0;
    int64_t idx[DG_MAX_DIMS] = {0};
    if (dg_numel(a) == 0) return 0;
    do {
        s += dg_get(a, idx) * dg_get(b, idx);
    } while (dg_next_index(a->ndim, a->shape, idx));
    return s;
}

/* x += alpha * u elementwise (u may be NULL: then only element `flat` moves) */
static void perturb(dg_tensor *x, const dg_tensor *u, int64_t flat, double alpha) {
    int64_t idx[DG_MAX_DIMS] = {0}, k = 0;
    do {
        if (u) dg_set(x, idx, dg_get(x, idx) + alpha * dg_get(u, idx));
        else if (k == flat) {
            dg_set(x, idx, dg_get(x, idx) + alpha);
            return;
        }
        k++;
    } while (dg_next_index(x->ndim, x->shape, idx));
}

/* ---- the generic engine: a scalar function of inputs ---- */

/* Compares analytic gradients grads[k] (NULL = zero) with central differences of f for each
 * differentiable input; writes per-input max errors.  Returns 0, or -1 if f failed. */
int dg_fd_compare(dg_fd_value_fn f, void *ctx, int n, dg_tensor *const *in, const bool *diff, dg_tensor *const *grads,
                  double atol, double rtol, uint64_t seed, double *abs_err, double *rel_err, bool *ok) {
    dg_rng rng = dg_rng_new(seed ^ 0xD1FFull);
    for (int k = 0; k < n; k++) {
        abs_err[k] = rel_err[k] = 0;
        ok[k] = true;
        if (!diff[k] || !in[k]) continue;
        dg_tensor *x = in[k];
        double e = eps_for(x->dtype);
        int64_t numel = dg_numel(x);
        bool elementwise = numel <= ELEMENTWISE_LIMIT;
        int64_t count = elementwise ? numel : N_DIRECTIONS;
        for (int64_t j = 0; j < count; j++) {
            dg_scope_begin();
            dg_tensor *u = elementwise ? NULL : dg_randn(x->ndim, x->shape, DG_F64, &rng);
            int err = 0;
            perturb(x, u, j, e);
            double fp = f(in, ctx, &err);
            perturb(x, u, j, -2 * e);
            double fm = f(in, ctx, &err);
            perturb(x, u, j, e);
            double fd = (fp - fm) / (2 * e), an = 0;
            if (grads[k]) {
                if (u) an = dg_dot_all(grads[k], u);
                else {
                    int64_t idx[DG_MAX_DIMS] = {0}, r = j;
                    for (int d = x->ndim - 1; d >= 0; d--) {
                        idx[d] = r % x->shape[d];
                        r /= x->shape[d];
                    }
                    an = dg_get(grads[k], idx);
                }
            }
            dg_scope_end();
            if (err) return -1;
            double ae = fabs(fd - an), re = ae / fmax(fabs(fd), 1e-8);
            if (!(ae <= atol + rtol * fabs(fd))) ok[k] = false; /* NaN fails too */
            if (ae > abs_err[k] || isnan(ae)) abs_err[k] = isnan(ae) ? INFINITY : ae;
            if (re > rel_err[k] || isnan(re)) rel_err[k] = isnan(re) ? INFINITY : re;
        }
    }
    return 0;
}

/* ---- ops ---- */

typedef struct op_ctx {
    const dg_op_def *def;
    const void *attrs;
    dg_tensor *weights[DG_MAX_IO];
} op_ctx;

static double op_value(dg_tensor *const *in, void *vctx, int *err) {
    op_ctx *c = vctx;
    double L = 0;
    dg_tensor *out[DG_MAX_IO] = {0};
    dg_no_grad_begin();
    dg_scope_begin();
    if (dg_apply(c->def, c->attrs, in, out, -1) != 0) *err = 1;
    else
        for (int j = 0; j < c->def->n_out; j++)
            if (c->weights[j]) L += dg_dot_all(out[j], c->weights[j]);
    dg_scope_end();
    dg_no_grad_end();
    return L;
}

/* Same values, strides twice the contiguous ones: every input arrives non-contiguous. */
dg_tensor *dg_gradcheck_strided_copy(dg_tensor *t) {
    if (!t || dg_numel(t) <= 1) return t;
    int64_t n = dg_numel(t);
    dg_tensor *big = dg_empty_on(DG_SHAPE(2 * n), t->dtype, t->device);
    int64_t stride[DG_MAX_DIMS];
    dg_contiguous_strides(t->ndim, t->shape, stride);
    for (int d = 0; d < t->ndim; d++) stride[d] *= 2;
    dg_tensor *v = big ? dg_make_view(big, t->ndim, t->shape, stride, 0) : NULL;
    if (v) dg_copy_(v, t);
    return v;
}

void dg_gradcheck_add_row(dg_gradcheck_report *rep, const dg_gradcheck_row *row) {
    if (rep->n == rep->cap) {
        int cap = rep->cap ? rep->cap * 2 : 64;
        dg_gradcheck_row *r = realloc(rep->rows, (size_t)cap * sizeof *r);
        if (!r) return;
        rep->rows = r;
        rep->cap = cap;
    }
    rep->rows[rep->n++] = *row;
    if (!row->ok) rep->n_failed++;
}

static void fail_row(dg_gradcheck_report *rep, const dg_op_def *def, const char *variant, const char *what) {
    dg_gradcheck_row row = {.ok = false, .max_abs_err = INFINITY, .max_rel_err = INFINITY};
    snprintf(row.op, sizeof row.op, "%s", def->name);
    snprintf(row.variant, sizeof row.variant, "%s", variant);
    snprintf(row.input, sizeof row.input, "%s: %s", what, dg_last_error());
    dg_clear_error();
    dg_gradcheck_add_row(rep, &row);
}

/* One (sample, layout, variant): backward once, then differences per input. */
static void check_case(const dg_op_def *def, dg_sample *s, bool noncontig, int variant, uint64_t seed,
                       dg_gradcheck_report *rep) {
    const char *vname = def->bwd[variant].name;
    dg_scope_begin();
    dg_tensor *in[DG_MAX_IO] = {0};
    bool diff[DG_MAX_IO] = {0};
    for (int k = 0; k < def->n_in; k++) {
        /* a fresh copy per case: .grad starts empty, and perturbing it leaves the sample intact */
        bool is_float = s->in[k] && dg_dtype_is_float(s->in[k]->dtype);
        in[k] = !is_float ? s->in[k] : (noncontig ? dg_gradcheck_strided_copy(s->in[k]) : dg_clone(s->in[k]));
        if (in[k] && s->differentiable[k]) {
            dg_set_requires_grad(in[k], true);
            diff[k] = true;
        }
    }
    op_ctx ctx = {.def = def, .attrs = s->attrs};
    dg_tensor *out[DG_MAX_IO] = {0};
    dg_rng wrng = dg_rng_new(seed ^ 0x3E16ull);
    dg_tensor *loss = NULL;
    if (dg_apply(def, s->attrs, in, out, variant) != 0) {
        fail_row(rep, def, vname, "forward failed");
        dg_scope_end();
        return;
    }
    for (int j = 0; j < def->n_out; j++) {
        if (!out[j] || !dg_dtype_is_float(out[j]->dtype)) continue;
        ctx.weights[j] = dg_randn(out[j]->ndim, out[j]->shape, out[j]->dtype, &wrng);
        if (!out[j]->requires_grad) continue;
        dg_tensor *term = dg_sum_all(dg_mul(out[j], ctx.weights[j]));
        loss = loss ? dg_add(loss, term) : term;
    }
    if (loss && dg_backward(loss, NULL) != 0) {
        fail_row(rep, def, vname, "backward failed");
        dg_scope_end();
        return;
    }
    dg_tensor *grads[DG_MAX_IO] = {0};
    for (int k = 0; k < def->n_in; k++) grads[k] = in[k] && diff[k] ? in[k]->grad : NULL;
    double ae[DG_MAX_IO], re[DG_MAX_IO];
    bool ok[DG_MAX_IO];
    double atol = def->atol_f64, rtol = def->rtol_f64;
    if (dg_fd_compare(op_value, &ctx, def->n_in, in, diff, grads, atol, rtol, seed, ae, re, ok) != 0) {
        fail_row(rep, def, vname, "forward failed under perturbation");
        dg_scope_end();
        return;
    }
    for (int k = 0; k < def->n_in; k++) {
        if (!diff[k]) continue;
        dg_gradcheck_row row = {.max_abs_err = ae[k], .max_rel_err = re[k], .ok = ok[k]};
        snprintf(row.op, sizeof row.op, "%s", def->name);
        snprintf(row.variant, sizeof row.variant, "%s", vname);
        snprintf(row.input, sizeof row.input, "%s%s: d%s %s", s->label, noncontig ? " (strided)" : "",
                 def->in_names[k] ? def->in_names[k] : "?", dg_shp(in[k]));
        dg_gradcheck_add_row(rep, &row);
    }
    dg_scope_end();
}

int dg_gradcheck_op(const dg_op_def *def, uint64_t seed, dg_gradcheck_report *rep) {
    int failed_before = rep->n_failed;
    if (!def->sample) {
        dg_error("gradcheck: op %s has no sampler", def->name);
        fail_row(rep, def, "-", "no sampler");
        return rep->n_failed - failed_before;
    }
    for (int i = 0;; i++) {
        dg_scope_begin();
        dg_sample s = {0};
        int more = def->sample(i, DG_F64, seed + (uint64_t)i, &s);
        if (more <= 0) {
            dg_sample_free(&s);
            dg_scope_end();
            if (more < 0) fail_row(rep, def, "-", "sampler failed");
            break;
        }
        for (int layout = 0; layout < 2; layout++)
            for (int v = 0; v < dg_op_variant_count(def); v++)
                check_case(def, &s, layout == 1, v, seed + (uint64_t)i, rep);
        dg_sample_free(&s);
        dg_scope_end();
    }
    return rep->n_failed - failed_before;
}

/* ---- arbitrary scalar functions (models, tests) ---- */

typedef struct fn_ctx {
    dg_scalar_fn f;
    void *ctx;
} fn_ctx;

static double fn_value(dg_tensor *const *in, void *vctx, int *err) {
    fn_ctx *c = vctx;
    dg_no_grad_begin();
    dg_scope_begin();
    dg_tensor *y = c->f(in, c->ctx);
    double v = y ? dg_item(y) : NAN;
    if (!y) *err = 1;
    dg_scope_end();
    dg_no_grad_end();
    return v;
}

int dg_gradcheck_fn(dg_scalar_fn f, void *ctx, int n, dg_tensor *const *in, double atol, double rtol, double *max_abs,
                    double *max_rel, char *worst, size_t worst_len) {
    if (n > 64) {
        dg_error("gradcheck: at most 64 inputs (%d given)", n);
        return -1;
    }
    bool diff[64] = {0}, ok[64];
    dg_tensor *grads[64] = {0};
    double ae[64], re[64];
    for (int k = 0; k < n; k++) {
        diff[k] = in[k] && in[k]->requires_grad;
        dg_zero_grad(in[k]);
    }
    dg_scope_begin();
    dg_tensor *y = f(in, ctx);
    int rc = y && dg_backward(y, NULL) == 0 ? 0 : -1;
    dg_scope_end();
    if (rc != 0) return -1;
    for (int k = 0; k < n; k++) grads[k] = diff[k] ? in[k]->grad : NULL;
    fn_ctx c = {f, ctx};
    if (dg_fd_compare(fn_value, &c, n, in, diff, grads, atol, rtol, 1234, ae, re, ok) != 0) return -1;
    int failed = 0;
    *max_abs = *max_rel = 0;
    if (worst && worst_len) worst[0] = 0;
    for (int k = 0; k < n; k++) {
        if (!diff[k]) continue;
        if (!ok[k]) {
            failed++;
            if (worst && worst_len)
                snprintf(worst, worst_len, "input %d %s%s%s: abs err %.3g rel err %.3g", k,
                         in[k]->name ? in[k]->name : "", in[k]->name ? " " : "", dg_shp(in[k]), ae[k], re[k]);
        }
        if (ae[k] > *max_abs) *max_abs = ae[k];
        if (re[k] > *max_rel) *max_rel = re[k];
    }
    return failed;
}

void dg_gradcheck_report_free(dg_gradcheck_report *rep) {
    free(rep->rows);
    memset(rep, 0, sizeof *rep);
}

void dg_gradcheck_print(const dg_gradcheck_report *rep, FILE *f) {
    fprintf(f, "%-22s %-14s %-58s %12s %12s  %s\n", "op", "backward", "input", "max abs err", "max rel err", "ok");
    for (int i = 0; i < rep->n; i++) {
        const dg_gradcheck_row *r = &rep->rows[i];
        fprintf(f, "%-22s %-14s %-58.58s %12.3e %12.3e  %s\n", r->op, r->variant, r->input, r->max_abs_err,
                r->max_rel_err, r->ok ? "ok" : "FAIL");
        if (!r->ok && strlen(r->input) > 58) fprintf(f, "    %s\n", r->input);
    }
    fprintf(f, "%d checks, %d failed\n", rep->n, rep->n_failed);
}
