/* sum and mean over a set of dims (all when none are given), with or without keepdim.
 *   y = sum_{reduced dims} x        dx = expand(reshape(g, keepdim shape), x.shape)
 *   mean: the same scaled by 1 / (number of reduced elements).
 * Layout: the reduced dims are permuted last and made contiguous, so each output element is the
 * sum of one contiguous row (accumulated in double).  On the device, one dg_cuda_sum over the
 * strided input (kernels/cuda/reduce.cu; f64 accumulation, no permuted copy), for f32, f64 and
 * bf16: a bf16 sum or mean accumulates in f64 too and is rounded once to bf16.  The mean's
 * backward, g / n, is one rounding of g / n in bf16.
 *
 * dg_sum_to_shape_as, the broadcast sum of the backward passes, can change the dtype on the way:
 * f32 terms of a bf16 gradient are summed and rounded once to bf16 in the same pass. */
#include "ops/op.h"
#ifdef DG_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

#include <string.h>

typedef struct {
    bool reduce[DG_MAX_DIMS];
    bool keepdim, mean;
} reduce_attrs;

static void out_shape(const dg_tensor *x, const reduce_attrs *a, bool keepdim, int *nd, int64_t *shape) {
    *nd = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (!a->reduce[d]) shape[(*nd)++] = x->shape[d];
        else if (keepdim) shape[(*nd)++] = 1;
    }
}

#define ROW_SUMS(R)                                                                                               \
    static void row_sums_##R(const R *x, R *y, int64_t rows, int64_t len, double scale) {                         \
        _Pragma("omp parallel for if (rows * len > 65536) schedule(static)") for (int64_t r = 0; r < rows; r++) { \
            double acc = 0;                                                                                       \
            const R *p = x + r * len;                                                                             \
            for (int64_t i = 0; i < len; i++) acc += p[i];                                                        \
            y[r] = (R)(acc * scale);                                                                              \
        }                                                                                                         \
    }
ROW_SUMS(float)
ROW_SUMS(double)

static int reduce_forward(dg_node *n) {
    const reduce_attrs *a = (const reduce_attrs *)n->attrs;
    dg_tensor *x = n->in[0];
    if (x->device == DG_CUDA) {
#ifdef DG_HAVE_CUDA
        int nd;
        int64_t shape[DG_MAX_DIMS] = {0}, len = 1;
        unsigned mask = 0;
        out_shape(x, a, a->keepdim, &nd, shape);
        for (int d = 0; d < x->ndim; d++)
            if (a->reduce[d]) {
                mask |= 1u << d;
                len *= x->shape[d];
            }
        dg_tensor *y = dg_empty_on(nd, shape, x->dtype, x->device);
        double scale = a->mean ? (len ? 1.0 / (double)len : 0.0) : 1.0;
        if (!y || dg_cuda_sum(x->dtype, x->ndim, x->shape, dg_data_ptr(x), x->stride, mask, scale, dg_data_ptr(y)))
            return -1;
        n->out[0] = y;
        return 0;
#endif
    }
    if (!dg_require_cpu(n->op->name, x)) return -1;
    int perm[DG_MAX_DIMS], k = 0;
    int64_t rows = 1, len = 1;
    for (int d = 0; d < x->ndim; d++)
        if (!a->reduce[d]) {
            perm[k++] = d;
            rows *= x->shape[d];
        }
    for (int d = 0; d < x->ndim; d++)
        if (a->reduce[d]) {
            perm[k++] = d;
            len *= x->shape[d];
        }
    dg_tensor *xp = dg_contiguous(dg_permute(x, perm));
    int nd;
    int64_t shape[DG_MAX_DIMS] = {0};
    out_shape(x, a, a->keepdim, &nd, shape);
    dg_tensor *y = xp ? dg_empty_on(nd, shape, x->dtype, x->device) : NULL;
    if (!y) return -1;
    double scale = a->mean ? (len ? 1.0 / (double)len : 0.0) : 1.0;
    if (x->dtype == DG_F32) row_sums_float(dg_data_ptr(xp), dg_data_ptr(y), rows, len, scale);
    else row_sums_double(dg_data_ptr(xp), dg_data_ptr(y), rows, len, scale);
    n->out[0] = y;
    return 0;
}

static int reduce_backward(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) {
    const reduce_attrs *a = (const reduce_attrs *)n->attrs;
    dg_tensor *x = n->in[0];
    int nd;
    int64_t shape[DG_MAX_DIMS] = {0}, len = 1;
    out_shape(x, a, true, &nd, shape);
    for (int d = 0; d < x->ndim; d++)
        if (a->reduce[d]) len *= x->shape[d];
    dg_tensor *g = dg_reshape(gout[0], nd, shape);
    if (a->mean) g = dg_mul_scalar(g, len ? 1.0 / (double)len : 0.0);
    gin[0] = dg_expand(g, x->ndim, x->shape);
    return gin[0] ? 0 : -1;
}

static dg_tensor *reduce(const char *name, const dg_op_def *def, bool mean, dg_tensor *x, int ndims, const int *dims,
                         bool keepdim) {
    if (!dg_check_float_or_bf16(name, "a", x)) return NULL;
    reduce_attrs at = {.keepdim = keepdim, .mean = mean};
    if (ndims == 0 || !dims)
        for (int d = 0; d < x->ndim; d++) at.reduce[d] = true;
    for (int i = 0; i < ndims && dims; i++) {
        int d = dims[i] < 0 ? dims[i] + x->ndim : dims[i];
        if (d < 0 || d >= x->ndim) {
            dg_error("%s: dim %d out of range for a %s", name, dims[i], dg_shp(x));
            return NULL;
        }
        at.reduce[d] = true;
    }
    return dg_apply1(def, &at, &x);
}

dg_tensor *dg_sum(dg_tensor *a, int ndims, const int *dims, bool keepdim) {
    return reduce("sum", &dg_op_sum, false, a, ndims, dims, keepdim);
}
dg_tensor *dg_mean(dg_tensor *a, int ndims, const int *dims, bool keepdim) {
    return reduce("mean", &dg_op_mean, true, a, ndims, dims, keepdim);
}
dg_tensor *dg_sum_all(dg_tensor *a) { return dg_sum(a, 0, NULL, false); }
dg_tensor *dg_mean_all(dg_tensor *a) { return dg_mean(a, 0, NULL, false); }

dg_tensor *dg_sum_to_shape_as(dg_tensor *g, int ndim, const int64_t *shape, dg_dtype out_dt) {
    if (!g) return NULL;
#ifdef DG_HAVE_CUDA
    if (g->device == DG_CUDA && g->dtype != out_dt) {
        /* the dims that broadcasting added or stretched from size 1, as in dg_sum_to_shape; the
         * kept dims, in order, are `shape` */
        int lead = g->ndim - ndim;
        unsigned mask = 0;
        for (int d = 0; d < g->ndim; d++)
            if (d < lead || (shape[d - lead] == 1 && g->shape[d] != 1)) mask |= 1u << d;
        dg_tensor *s = dg_empty_on(ndim, shape, out_dt, DG_CUDA);
        if (!s || dg_cuda_sum_mixed(g->dtype, out_dt, g->ndim, g->shape, dg_data_ptr(g), g->stride, mask, 1.0,
                                    dg_data_ptr(s)))
            return NULL;
        return s;
    }
#endif
    return dg_to_dtype(dg_sum_to_shape(g, ndim, shape), out_dt);
}

static int reduce_sample(int index, dg_dtype dt, uint64_t seed, dg_sample *s, bool mean) {
    dg_rng rng = dg_rng_new(seed);
    reduce_attrs at = {.mean = mean};
    dg_tensor *x;
    if (index == 0) {
        x = DG_SAMPLE_RANDN(&rng, dt, 4, 5);
        at.reduce[0] = at.reduce[1] = true;
    } else if (index == 1) {
        x = DG_SAMPLE_RANDN(&rng, dt, 2, 3, 4);
        at.reduce[1] = true;
        at.keepdim = true;
    } else if (index == 2) {
        x = DG_SAMPLE_RANDN(&rng, dt, 2, 3, 4);
        at.reduce[0] = at.reduce[2] = true;
    } else return 0;
    snprintf(s->label, sizeof s->label, "%s%s", dg_shp(x), at.keepdim ? " keepdim" : "");
    dg_sample_set(s, 0, x, true);
    memcpy(s->attrs, &at, sizeof at);
    return 1;
}
static int sum_sample(int i, dg_dtype dt, uint64_t seed, dg_sample *s) { return reduce_sample(i, dt, seed, s, false); }
static int mean_sample(int i, dg_dtype dt, uint64_t seed, dg_sample *s) { return reduce_sample(i, dt, seed, s, true); }

const dg_op_def dg_op_sum = {.name = "sum",
                             .n_in = 1,
                             .n_out = 1,
                             .in_names = {"a"},
                             .out_names = {"out"},
                             .attrs_size = sizeof(reduce_attrs),
                             .forward = reduce_forward,
                             .bwd = {{"default", reduce_backward}},
                             .bwd_skips_in = 1u, /* the backward reads the input's shape only */
                             .sample = sum_sample,
                             .atol_f64 = 1e-7,
                             .rtol_f64 = 1e-6,
                             .atol_f32 = 1e-4,
                             .rtol_f32 = 1e-4};
const dg_op_def dg_op_mean = {.name = "mean",
                              .n_in = 1,
                              .n_out = 1,
                              .in_names = {"a"},
                              .out_names = {"out"},
                              .attrs_size = sizeof(reduce_attrs),
                              .forward = reduce_forward,
                              .bwd = {{"default", reduce_backward}},
                              .bwd_skips_in = 1u,
                              .sample = mean_sample,
                              .atol_f64 = 1e-7,
                              .rtol_f64 = 1e-6,
                              .atol_f32 = 1e-4,
                              .rtol_f32 = 1e-4};
