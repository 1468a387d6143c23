/* Views and shape ops.  reshape, permute, transpose, slice and expand return views that share the
 * input's storage (no copy; reshape copies only when the strides cannot express the new shape);
 * cat copies.  Backward:
 *   reshape  dx = reshape(g, x.shape)
 *   permute  dx = permute(g, inverse perm)
 *   slice    dx = zeros(x.shape) with g written into [start, stop) of dim
 *   expand   dx = sum_to(g, x.shape)
 *   cat      dx_i = slice of g along dim */
#include "ops/op.h"

#include <string.h>

typedef struct {
    int ndim;
    int64_t shape[DG_MAX_DIMS]; /* reshape/expand: the target; */
    int perm[DG_MAX_DIMS];      /* permute */
    int dim;                    /* slice, cat */
    int64_t start, stop;        /* slice */
} shape_attrs;

/* ---- reshape ---- */

/* Strides for viewing t as `shape` without a copy, if they exist (the PyTorch "view" rule: each
 * run of merged/split dims must be contiguous in t). */
static bool view_strides(const dg_tensor *t, int ndim, const int64_t *shape, int64_t *stride) {
    int64_t numel = dg_numel(t);
    if (numel == 0 || dg_is_contiguous(t)) {
        dg_contiguous_strides(ndim, shape, stride);
        return true;
    }
    int view_d = ndim - 1;
    int64_t chunk_base_stride = t->stride[t->ndim - 1], tensor_numel = 1, view_numel = 1;
    for (int td = t->ndim - 1; td >= 0; td--) {
        tensor_numel *= t->shape[td];
        if (td == 0 || (t->shape[td - 1] != 1 && t->stride[td - 1] != tensor_numel * chunk_base_stride)) {
            while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
                stride[view_d] = view_numel * chunk_base_stride;
                view_numel *= shape[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel) return false;
            if (td > 0) {
                chunk_base_stride = t->stride[td - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    return view_d == -1;
}

static int reshape_forward(dg_node *n) {
    const shape_attrs *a = (const shape_attrs *)n->attrs;
    dg_tensor *x = n->in[0];
    int64_t stride[DG_MAX_DIMS];
    if (!view_strides(x, a->ndim, a->shape, stride)) {
        x = dg_clone(x);
        if (!x) return -1;
        dg_contiguous_strides(a->ndim, a->shape, stride);
    }
    n->out[0] = dg_make_view(x, a->ndim, a->shape, stride, x->offset);
    return n->out[0] ? 0 : -1;
}

static int reshape_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    gin[0] = dg_reshape(gout[0], n->in[0]->ndim, n->in[0]->shape);
    return gin[0] ? 0 : -1;
}

dg_tensor *dg_reshape(dg_tensor *x, int ndim, const int64_t *shape) {
    if (!dg_check_not_null("reshape", "a", x)) return NULL;
    if (ndim < 0 || ndim > DG_MAX_DIMS || !shape) {
        dg_error("reshape: target has %d dims (a %s); 0..%d allowed", ndim, dg_shp(x), DG_MAX_DIMS);
        return NULL;
    }
    shape_attrs at = {.ndim = ndim};
    int infer = -1;
    int64_t known = 1;
    for (int d = 0; d < ndim; d++) {
        at.shape[d] = shape[d];
        if (shape[d] == -1 && infer < 0) infer = d;
        else if (shape[d] < 0) {
            dg_error("reshape: target %s has an invalid size (a %s)", dg_shape_text(ndim, shape), dg_shp(x));
            return NULL;
        } else known *= shape[d];
    }
    if (infer >= 0) at.shape[infer] = known ? dg_numel(x) / known : 0;
    int64_t total = 1;
    for (int d = 0; d < ndim; d++) total *= at.shape[d];
    if (total != dg_numel(x)) {
        dg_error("reshape: a has shape %s (%lld elements) which cannot be viewed as %s", dg_shp(x),
                 (long long)dg_numel(x), dg_shape_text(ndim, shape));
        return NULL;
    }
    return dg_apply1(&dg_op_reshape, &at, &x);
}

static int sample_one(dg_sample *s, dg_tensor *x, const shape_attrs *at) {
    snprintf(s->label, sizeof s->label, "%s", dg_shp(x));
    dg_sample_set(s, 0, x, true);
    memcpy(s->attrs, at, sizeof *at);
    return 1;
}

static int reshape_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s) {
    dg_rng rng = dg_rng_new(seed);
    if (index == 0)
        return sample_one(s, DG_SAMPLE_RANDN(&rng, dt, 2, 6), &(shape_attrs){.ndim = 3, .shape = {3, 2, 2}});
    if (index == 1)
        return sample_one(s, DG_SAMPLE_RANDN(&rng, dt, 2, 3, 4), &(shape_attrs){.ndim = 2, .shape = {6, 4}});
    return 0;
}

const dg_op_def dg_op_reshape = {.name = "reshape",
                                 .n_in = 1,
                                 .n_out = 1,
                                 .in_names = {"a"},
                                 .out_names = {"out"},
                                 .attrs_size = sizeof(shape_attrs),
                                 .forward = reshape_forward,
                                 .bwd = {{"default", reshape_backward}},
                                 .sample = reshape_sample,
                                 .atol_f64 = 1e-8,
                                 .rtol_f64 = 1e-7,
                                 .atol_f32 = 1e-5,
                                 .rtol_f32 = 1e-4,
                                 .is_view = true};

/* ---- permute ---- */

static int permute_forward(dg_node *n) {
    const shape_attrs *a = (const shape_attrs *)n->attrs;
    dg_tensor *x = n->in[0];
    int64_t shape[DG_MAX_DIMS], stride[DG_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) {
        shape[d] = x->shape[a->perm[d]];
        stride[d] = x->stride[a->perm[d]];
    }
    n->out[0] = dg_make_view(x, x->ndim, shape, stride, x->offset);
    return n->out[0] ? 0 : -1;
}

static int permute_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    const shape_attrs *a = (const shape_attrs *)n->attrs;
    int inv[DG_MAX_DIMS];
    for (int d = 0; d < n->in[0]->ndim; d++) inv[a->perm[d]] = d;
    gin[0] = dg_permute(gout[0], inv);
    return gin[0] ? 0 : -1;
}

dg_tensor *dg_permute(dg_tensor *x, const int *perm) {
    if (!dg_check_not_null("permute", "a", x)) return NULL;
    shape_attrs at = {.ndim = x->ndim};
    int seen[DG_MAX_DIMS] = {0};
    for (int d = 0; d < x->ndim; d++) {
        if (!perm || perm[d] < 0 || perm[d] >= x->ndim || seen[perm[d]]++) {
            dg_error("permute: perm is not a permutation of the %d dims of a %s", x->ndim, dg_shp(x));
            return NULL;
        }
        at.perm[d] = perm[d];
    }
    return dg_apply1(&dg_op_permute, &at, &x);
}

dg_tensor *dg_transpose(dg_tensor *x, int d0, int d1) {
    if (!dg_check_not_null("transpose", "a", x)) return NULL;
    if (d0 < 0) d0 += x->ndim;
    if (d1 < 0) d1 += x->ndim;
    if (d0 < 0 || d1 < 0 || d0 >= x->ndim || d1 >= x->ndim) {
        dg_error("transpose: dims (%d, %d) out of range for a %s", d0, d1, dg_shp(x));
        return NULL;
    }
    int perm[DG_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) perm[d] = d;
    perm[d0] = d1;
    perm[d1] = d0;
    return dg_permute(x, perm);
}

static int permute_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s) {
    dg_rng rng = dg_rng_new(seed);
    if (index == 0) return sample_one(s, DG_SAMPLE_RANDN(&rng, dt, 3, 4), &(shape_attrs){.ndim = 2, .perm = {1, 0}});
    if (index == 1)
        return sample_one(s, DG_SAMPLE_RANDN(&rng, dt, 2, 3, 4, 2), &(shape_attrs){.ndim = 4, .perm = {2, 0, 3, 1}});
    return 0;
}

const dg_op_def dg_op_permute = {.name = "permute",
                                 .n_in = 1,
                                 .n_out = 1,
                                 .in_names = {"a"},
                                 .out_names = {"out"},
                                 .attrs_size = sizeof(shape_attrs),
                                 .forward = permute_forward,
                                 .bwd = {{"default", permute_backward}},
                                 .sample = permute_sample,
                                 .atol_f64 = 1e-8,
                                 .rtol_f64 = 1e-7,
                                 .atol_f32 = 1e-5,
                                 .rtol_f32 = 1e-4,
                                 .is_view = true};

/* ---- slice ---- */

static int slice_forward(dg_node *n) {
    const shape_attrs *a = (const shape_attrs *)n->attrs;
    dg_tensor *x = n->in[0];
    int64_t shape[DG_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[a->dim] = a->stop - a->start;
    n->out[0] = dg_make_view(x, x->ndim, shape, x->stride, x->offset + a->start * x->stride[a->dim]);
    return n->out[0] ? 0 : -1;
}

static int slice_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    const shape_attrs *a = (const shape_attrs *)n->attrs;
    dg_tensor *x = n->in[0];
    dg_tensor *dx = dg_zeros_on(x->ndim, x->shape, gout[0]->dtype, gout[0]->device);
    if (!dx) return -1;
    int64_t shape[DG_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[a->dim] = a->stop - a->start;
    dg_tensor *window = dg_make_view(dx, x->ndim, shape, dx->stride, a->start * dx->stride[a->dim]);
    if (!window || dg_copy_(window, gout[0]) != 0) return -1;
    gin[0] = dx;
    return 0;
}

dg_tensor *dg_slice(dg_tensor *x, int dim, int64_t start, int64_t stop) {
    if (!dg_check_not_null("slice", "a", x)) return NULL;
    if (dim < 0) dim += x->ndim;
    if (dim < 0 || dim >= x->ndim) {
        dg_error("slice: dim %d out of range for a %s", dim, dg_shp(x));
        return NULL;
    }
    if (start < 0) start += x->shape[dim];
    if (stop < 0) stop += x->shape[dim];
    if (start < 0 || stop > x->shape[dim] || start > stop) {
        dg_error("slice: [%lld, %lld) is outside dim %d of a %s", (long long)start, (long long)stop, dim, dg_shp(x));
        return NULL;
    }
    shape_attrs at = {.dim = dim, .start = start, .stop = stop};
    return dg_apply1(&dg_op_slice, &at, &x);
}

static int slice_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s) {
    dg_rng rng = dg_rng_new(seed);
    if (index == 0) return sample_one(s, DG_SAMPLE_RANDN(&rng, dt, 6), &(shape_attrs){.dim = 0, .start = 1, .stop = 4});
    if (index == 1)
        return sample_one(s, DG_SAMPLE_RANDN(&rng, dt, 3, 5, 2), &(shape_attrs){.dim = 1, .start = 2, .stop = 5});
    return 0;
}

const dg_op_def dg_op_slice = {.name = "slice",
                               .n_in = 1,
                               .n_out = 1,
                               .in_names = {"a"},
                               .out_names = {"out"},
                               .attrs_size = sizeof(shape_attrs),
                               .forward = slice_forward,
                               .bwd = {{"default", slice_backward}},
                               .sample = slice_sample,
                               .atol_f64 = 1e-8,
                               .rtol_f64 = 1e-7,
                               .atol_f32 = 1e-5,
                               .rtol_f32 = 1e-4,
                               .is_view = true};

/* ---- expand ---- */

static int expand_forward(dg_node *n) {
    const shape_attrs *a = (const shape_attrs *)n->attrs;
    dg_tensor *x = n->in[0];
    int64_t stride[DG_MAX_DIMS];
    int lead = a->ndim - x->ndim;
    for (int d = 0; d < a->ndim; d++) {
        if (d < lead) stride[d] = 0;
        else stride[d] = x->shape[d - lead] == 1 && a->shape[d] != 1 ? 0 : x->stride[d - lead];
    }
    n->out[0] = dg_make_view(x, a->ndim, a->shape, stride, x->offset);
    return n->out[0] ? 0 : -1;
}

static int expand_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    gin[0] = dg_sum_to_shape(gout[0], n->in[0]->ndim, n->in[0]->shape);
    return gin[0] ? 0 : -1;
}

dg_tensor *dg_expand(dg_tensor *x, int ndim, const int64_t *shape) {
    if (!dg_check_not_null("expand", "a", x)) return NULL;
    bool ok = ndim >= x->ndim && ndim <= DG_MAX_DIMS && shape;
    for (int d = 0; ok && d < x->ndim; d++) {
        int64_t xs = x->shape[d], ts = shape[ndim - x->ndim + d];
        ok = xs == ts || xs == 1;
    }
    if (!ok) {
        dg_error("expand: a has shape %s which cannot be broadcast to %s", dg_shp(x),
                 shape ? dg_shape_text(ndim, shape) : "(null)");
        return NULL;
    }
    shape_attrs at = {.ndim = ndim};
    memcpy(at.shape, shape, (size_t)ndim * sizeof *shape);
    return dg_apply1(&dg_op_expand, &at, &x);
}

static int expand_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s) {
    dg_rng rng = dg_rng_new(seed);
    if (index == 0) return sample_one(s, DG_SAMPLE_RANDN(&rng, dt, 3), &(shape_attrs){.ndim = 2, .shape = {4, 3}});
    if (index == 1)
        return sample_one(s, DG_SAMPLE_RANDN(&rng, dt, 2, 1, 3), &(shape_attrs){.ndim = 4, .shape = {2, 2, 4, 3}});
    return 0;
}

const dg_op_def dg_op_expand = {.name = "expand",
                                .n_in = 1,
                                .n_out = 1,
                                .in_names = {"a"},
                                .out_names = {"out"},
                                .attrs_size = sizeof(shape_attrs),
                                .forward = expand_forward,
                                .bwd = {{"default", expand_backward}},
                                .sample = expand_sample,
                                .atol_f64 = 1e-8,
                                .rtol_f64 = 1e-7,
                                .atol_f32 = 1e-5,
                                .rtol_f32 = 1e-4,
                                .is_view = true};
