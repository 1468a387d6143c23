/* Ops that copy: contiguous (dx = g), to_dtype (dx = g converted back), cat (dx_i = slice of g). */
#include "ops/op.h"

#include <string.h>

typedef struct {
    int dtype;
    int dim, n;
} copy_attrs;

static int sample_x(int index, dg_dtype dt, uint64_t seed, dg_sample *s, copy_attrs at) {
    dg_rng rng = dg_rng_new(seed);
    dg_tensor *x;
    if (index == 0) x = DG_SAMPLE_RANDN(&rng, dt, 5);
    else if (index == 1) x = dg_transpose(DG_SAMPLE_RANDN(&rng, dt, 3, 4), 0, 1);
    else return 0;
    snprintf(s->label, sizeof s->label, "%s", dg_shp(x));
    dg_sample_set(s, 0, x, true);
    memcpy(s->attrs, &at, sizeof at);
    return 1;
}

/* ---- contiguous ---- */

static int contiguous_forward(dg_node *n) {
    n->out[0] = dg_clone(n->in[0]);
    return n->out[0] ? 0 : -1;
}

static int pass_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    gin[0] = gout[0];
    return 0;
}

dg_tensor *dg_contiguous(dg_tensor *t) {
    if (!dg_check_not_null("contiguous", "a", t)) return NULL;
    if (dg_is_contiguous(t)) return dg_autorelease(dg_retain(t));
    return dg_apply1(&dg_op_contiguous, NULL, &t);
}

static int contiguous_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s) {
    return sample_x(index, dt, seed, s, (copy_attrs){0});
}

const dg_op_def dg_op_contiguous = {.name = "contiguous",
                                    .n_in = 1,
                                    .n_out = 1,
                                    .in_names = {"a"},
                                    .out_names = {"out"},
                                    .forward = contiguous_forward,
                                    .bwd = {{"default", pass_backward}},
                                    .sample = contiguous_sample,
                                    .atol_f64 = 1e-8,
                                    .rtol_f64 = 1e-7,
                                    .atol_f32 = 1e-5,
                                    .rtol_f32 = 1e-4};

/* ---- to_dtype ---- */

static int to_dtype_forward(dg_node *n) {
    const copy_attrs *a = (const copy_attrs *)n->attrs;
    dg_tensor *x = n->in[0], *y = dg_empty_on(x->ndim, x->shape, (dg_dtype)a->dtype, x->device);
    if (!y || dg_copy_(y, x) != 0) return -1;
    n->out[0] = y;
    return 0;
}

static int to_dtype_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    gin[0] = dg_to_dtype(gout[0], n->in[0]->dtype);
    return gin[0] ? 0 : -1;
}

dg_dtype dg_cast_grad_dtype(const dg_tensor *t) {
    const dg_node *p = t->node;
    bool master = t->dtype == DG_BF16 && p && p->op == &dg_op_to_dtype && p->in[0] && p->in[0]->dtype == DG_F32;
    return master ? DG_F32 : t->dtype;
}

dg_tensor *dg_to_dtype(dg_tensor *t, dg_dtype dt) {
    if (!dg_check_not_null("to_dtype", "a", t)) return NULL;
    if (dt >= DG_NUM_DTYPES) {
        dg_error("to_dtype: unknown dtype %d for a %s", (int)dt, dg_shp(t));
        return NULL;
    }
    if (t->dtype == dt) return dg_autorelease(dg_retain(t));
    copy_attrs at = {.dtype = dt};
    return dg_apply1(&dg_op_to_dtype, &at, &t);
}

/* The sample converts f32 to f64 whatever dtype is asked: a conversion to the same dtype is no op,
 * and f64 -> f32 would round away gradcheck's perturbation.  The input being f32, gradcheck
 * perturbs it in f32 (the op is linear, so central differences are exact up to f32 rounding of
 * the perturbed input): hence the f32-sized tolerances below. */
static int to_dtype_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s) {
    (void)dt;
    return sample_x(index, DG_F32, seed, s, (copy_attrs){.dtype = DG_F64});
}

const dg_op_def dg_op_to_dtype = {.name = "to_dtype",
                                  .n_in = 1,
                                  .n_out = 1,
                                  .in_names = {"a"},
                                  .out_names = {"out"},
                                  .attrs_size = sizeof(copy_attrs),
                                  .forward = to_dtype_forward,
                                  .bwd = {{"default", to_dtype_backward}},
                                  .bwd_skips_in = 1u, /* the backward reads the source's dtype only */
                                  .grad_passes_through = true,
                                  .sample = to_dtype_sample,
                                  .atol_f64 = 1e-5,
                                  .rtol_f64 = 1e-4,
                                  .atol_f32 = 1e-5,
                                  .rtol_f32 = 1e-4};

/* ---- cat ---- */

static int cat_forward(dg_node *n) {
    const copy_attrs *a = (const copy_attrs *)n->attrs;
    dg_tensor *first = n->in[0];
    int64_t shape[DG_MAX_DIMS];
    memcpy(shape, first->shape, sizeof shape);
    shape[a->dim] = 0;
    for (int i = 0; i < a->n; i++) shape[a->dim] += n->in[i]->shape[a->dim];
    dg_tensor *out = dg_empty_on(first->ndim, shape, first->dtype, first->device);
    if (!out) return -1;
    int64_t at = 0;
    for (int i = 0; i < a->n; i++) {
        dg_tensor *piece = n->in[i];
        int64_t ps[DG_MAX_DIMS];
        memcpy(ps, shape, sizeof ps);
        ps[a->dim] = piece->shape[a->dim];
        dg_tensor *window = dg_make_view(out, out->ndim, ps, out->stride, at * out->stride[a->dim]);
        if (!window || dg_copy_(window, piece) != 0) return -1;
        at += ps[a->dim];
    }
    n->out[0] = out;
    return 0;
}

static int cat_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    const copy_attrs *a = (const copy_attrs *)n->attrs;
    int64_t at = 0;
    for (int i = 0; i < a->n; i++) {
        int64_t len = n->in[i]->shape[a->dim];
        if (n->needs_grad[i] && !(gin[i] = dg_slice(gout[0], a->dim, at, at + len))) return -1;
        at += len;
    }
    return 0;
}

dg_tensor *dg_cat(int n, dg_tensor *const *ts, int dim) {
    if (n <= 0 || !ts) {
        dg_error("cat: needs at least one tensor (n = %d)", n);
        return NULL;
    }
    if (n > DG_MAX_IO) { /* cat in groups; the tape gets one node per group */
        dg_tensor *head = dg_cat(DG_MAX_IO, ts, dim), *rest = dg_cat(n - DG_MAX_IO, ts + DG_MAX_IO, dim);
        if (!head || !rest) return NULL;
        return dg_cat(2, (dg_tensor *[]){head, rest}, dim);
    }
    char arg[32];
    for (int i = 0; i < n; i++) {
        snprintf(arg, sizeof arg, "tensors[%d]", i);
        if (!dg_check_not_null("cat", arg, ts[i])) return NULL;
    }
    dg_tensor *first = ts[0];
    if (dim < 0) dim += first->ndim;
    if (dim < 0 || dim >= first->ndim) {
        dg_error("cat: dim %d out of range for tensors[0] %s", dim, dg_shp(first));
        return NULL;
    }
    for (int i = 1; i < n; i++) {
        snprintf(arg, sizeof arg, "tensors[%d]", i);
        bool ok = ts[i]->ndim == first->ndim;
        for (int d = 0; ok && d < first->ndim; d++) ok = d == dim || ts[i]->shape[d] == first->shape[d];
        if (!ok) {
            dg_error("cat: %s has shape %s but tensors[0] has %s (cat along dim %d)", arg, dg_shp(ts[i]), dg_shp(first),
                     dim);
            return NULL;
        }
        if (!dg_check_same_dtype("cat", arg, ts[i], "tensors[0]", first) ||
            !dg_check_same_device("cat", arg, ts[i], "tensors[0]", first))
            return NULL;
    }
    copy_attrs at = {.dim = dim, .n = n};
    dg_tensor *in[DG_MAX_IO] = {0};
    for (int i = 0; i < n; i++) in[i] = ts[i];
    return dg_apply1(&dg_op_cat, &at, in);
}

static int cat_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s) {
    dg_rng rng = dg_rng_new(seed);
    copy_attrs at;
    if (index == 0) {
        at = (copy_attrs){.dim = 0, .n = 2};
        dg_sample_set(s, 0, DG_SAMPLE_RANDN(&rng, dt, 2, 3), true);
        dg_sample_set(s, 1, DG_SAMPLE_RANDN(&rng, dt, 4, 3), true);
    } else if (index == 1) {
        at = (copy_attrs){.dim = 1, .n = 3};
        dg_sample_set(s, 0, DG_SAMPLE_RANDN(&rng, dt, 2, 1, 3), true);
        dg_sample_set(s, 1, DG_SAMPLE_RANDN(&rng, dt, 2, 2, 3), true);
        dg_sample_set(s, 2, DG_SAMPLE_RANDN(&rng, dt, 2, 3, 3), true);
    } else return 0;
    snprintf(s->label, sizeof s->label, "%d tensors along dim %d", at.n, at.dim);
    memcpy(s->attrs, &at, sizeof at);
    return 1;
}

const dg_op_def dg_op_cat = {.name = "cat",
                             .n_in = DG_MAX_IO,
                             .n_out = 1,
                             .in_names = {"t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8", "t9", "t10", "t11"},
                             .out_names = {"out"},
                             .attrs_size = sizeof(copy_attrs),
                             .forward = cat_forward,
                             .bwd = {{"default", cat_backward}},
                             .sample = cat_sample,
                             .atol_f64 = 1e-8,
                             .rtol_f64 = 1e-7,
                             .atol_f32 = 1e-5,
                             .rtol_f32 = 1e-4};
