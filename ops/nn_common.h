/* Helpers shared by the network-piece ops (ops/nn_*.c): row geometry, the argument checks they
 * have in common and sample construction.  Not a public header. */
#ifndef DG_OPS_NN_COMMON_H
#define DG_OPS_NN_COMMON_H

#include "kernels/cpu/nn.h"
#include "ops/op.h"

#include <math.h>
#include <string.h>

/* The kernels see a tensor [..., D] as N rows of D: N is the product of the leading dims. */
static inline int64_t dg_nn_rows(const dg_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim - 1; d++) n *= t->shape[d];
    return n;
}
static inline int64_t dg_nn_last(const dg_tensor *t) { return t->shape[t->ndim - 1]; }

/* x is a float tensor (f32, f64; bf16 on cuda: the network pieces' device kernels take bf16
 * storage) with at least one dim */
static inline bool dg_nn_check_x(const char *op, const char *arg, const dg_tensor *x) {
    if (!dg_check_float_or_bf16(op, arg, x)) return false;
    if (x->ndim >= 1) return true;
    dg_error("%s: %s has shape %s but needs at least 1 dim", op, arg, dg_shp(x));
    return false;
}

/* t is a vector [len] of ref's dtype and device.  `what` says where len comes from, e.g.
 * "rms_norm: w has shape [7] but x has last dim 8 (x [2,3,8])". */
static inline bool dg_nn_check_vec(const char *op, const char *arg, const dg_tensor *t, int64_t len, const char *what,
                                   const char *ref_arg, const dg_tensor *ref) {
    if (!dg_check_not_null(op, arg, t)) return false;
    if (t->ndim != 1 || t->shape[0] != len) {
        dg_error("%s: %s has shape %s but %s has %s %lld (%s %s)", op, arg, dg_shp(t), ref_arg, what, (long long)len,
                 ref_arg, dg_shp(ref));
        return false;
    }
    return dg_check_same_dtype(op, arg, t, ref_arg, ref) && dg_check_same_device(op, arg, t, ref_arg, ref);
}

/* t has exactly ref's shape, dtype and device */
static inline bool dg_nn_check_like(const char *op, const char *arg, const dg_tensor *t, const char *ref_arg,
                                    const dg_tensor *ref) {
    if (!dg_check_not_null(op, arg, t)) return false;
    if (!dg_same_shape(t, ref)) {
        dg_error("%s: %s has shape %s but %s has %s (they must match)", op, arg, dg_shp(t), ref_arg, dg_shp(ref));
        return false;
    }
    return dg_check_same_dtype(op, arg, t, ref_arg, ref) && dg_check_same_device(op, arg, t, ref_arg, ref);
}

static inline bool dg_nn_check_eps(const char *op, double eps, const dg_tensor *x) {
    if (eps >= 0 && isfinite(eps)) return true;
    dg_error("%s: eps is %g but must be finite and >= 0 (x %s)", op, eps, dg_shp(x));
    return false;
}

/* The dtype of the row statistics an op saves (rstd, lse) and of cross-entropy's loss: f32 for
 * bf16 tensors (computed in f32 and kept so), else the tensor's own. */
static inline dg_dtype dg_nn_stat_dtype(dg_dtype dt) { return dt == DG_BF16 ? DG_F32 : dt; }

/* The CPU kernels take f32 and f64 only.  A tensor of another dtype reaching one (bf16 given to
 * dg_apply directly, past the typed entry point's check) is refused here, never reinterpreted. */
static inline bool dg_nn_cpu_float(const char *kernel, const dg_tensor *x) {
    if (x->dtype == DG_F32 || x->dtype == DG_F64) return true;
    dg_error("%s: %s has dtype %s on the cpu, whose kernels take f32 or f64 (bf16 runs on cuda only)", kernel,
             dg_shp(x), dg_dtype_name(x->dtype));
    return false;
}

/* Contiguous copy of an optional input (NULL stays NULL; *fail set when a copy fails). */
static inline dg_tensor *dg_nn_contig(dg_tensor *t, bool *fail) {
    if (!t) return NULL;
    dg_tensor *c = dg_contiguous(t);
    if (!c) *fail = true;
    return c;
}

/* The dtype of the gradient of a weight w multiplied with x (linear, linear_cross_entropy): f32
 * for the bf16 cast of an f32 master weight on the device (cuBLAS writes it so,
 * dg_cast_grad_dtype), w's own otherwise.  w is the op's input as recorded (its producer tells a
 * cast). */
static inline dg_dtype dg_nn_weight_grad_dtype(const dg_tensor *x, const dg_tensor *w) {
    return x->device == DG_CUDA && x->dtype == DG_BF16 ? dg_cast_grad_dtype(w) : w->dtype;
}

/* targets is i64 on x's device with x's shape without its last dim (x [..., K]: logits, or the
 * features of linear_cross_entropy) */
static inline bool dg_nn_check_targets(const char *op, const dg_tensor *targets, const char *x_arg,
                                       const dg_tensor *x) {
    if (!dg_check_not_null(op, "targets", targets)) return false;
    if (targets->dtype != DG_I64) {
        dg_error("%s: targets has dtype %s (shape %s) but must be i64 (%s %s)", op, dg_dtype_name(targets->dtype),
                 dg_shp(targets), x_arg, dg_shp(x));
        return false;
    }
    if (!dg_check_same_device(op, "targets", targets, x_arg, x)) return false;
    bool shape_ok = targets->ndim == x->ndim - 1;
    for (int d = 0; shape_ok && d < targets->ndim; d++) shape_ok = targets->shape[d] == x->shape[d];
    if (shape_ok) return true;
    dg_error("%s: targets has shape %s but %s has %s (targets must have the shape of %s without its last dim)", op,
             dg_shp(targets), x_arg, dg_shp(x), x_arg);
    return false;
}

/* Class ids (contiguous i64, host or device) are ignore or in [0,C); else the error names the
 * first bad one and the tensor the classes come from (cross_entropy's logits, linear_cross_entropy's
 * w).  On the device this reads back (one synchronisation), except while a CUDA graph is captured. */
static inline bool dg_nn_targets_valid(const char *op, const dg_tensor *t, int64_t C, int64_t ignore,
                                       const char *from_arg, const dg_tensor *from) {
    int64_t val, bad = dg_first_bad_index(op, t, C, true, ignore, &val);
    if (bad == -1) return true;
    if (bad < 0) return false;
    dg_error("%s: target %lld (targets %s, flat position %lld) is out of range for C = %lld classes "
             "(%s %s, ignore_index %lld)",
             op, (long long)val, dg_shp(t), (long long)bad, (long long)C, from_arg, dg_shp(from), (long long)ignore);
    return false;
}

/* A random float sample N(0, scale^2) of the given shape (contiguous). */
static inline dg_tensor *dg_nn_sample_randn(dg_rng *rng, dg_dtype dt, int ndim, const int64_t *shape, double scale) {
    dg_tensor *t = dg_randn(ndim, shape, dt, rng);
    if (!t || scale == 1.0) return t;
    for (int64_t i = 0; i < dg_numel(t); i++) {
        if (dt == DG_F64) ((double *)dg_data_ptr(t))[i] *= scale;
        else ((float *)dg_data_ptr(t))[i] = (float)(((float *)dg_data_ptr(t))[i] * scale);
    }
    return t;
}

/* A non-contiguous random sample of the given shape (ndim >= 2): a view whose last two dims are
 * stored transposed, so the last dim does not have unit stride. */
static inline dg_tensor *dg_nn_sample_transposed(dg_rng *rng, dg_dtype dt, int ndim, const int64_t *shape,
                                                 double scale) {
    int64_t sw[DG_MAX_DIMS], st[DG_MAX_DIMS], vs[DG_MAX_DIMS];
    memcpy(sw, shape, sizeof(int64_t) * (size_t)ndim);
    sw[ndim - 2] = shape[ndim - 1];
    sw[ndim - 1] = shape[ndim - 2];
    dg_tensor *base = dg_nn_sample_randn(rng, dt, ndim, sw, scale);
    if (!base) return NULL;
    dg_contiguous_strides(ndim, sw, st);
    memcpy(vs, st, sizeof(int64_t) * (size_t)ndim);
    vs[ndim - 2] = st[ndim - 1];
    vs[ndim - 1] = st[ndim - 2];
    return dg_make_view(base, ndim, shape, vs, 0);
}

/* Random i64 indices in [0, hi) of the given shape. */
static inline dg_tensor *dg_nn_sample_ids(dg_rng *rng, int ndim, const int64_t *shape, int64_t hi) {
    dg_tensor *t = dg_empty(ndim, shape, DG_I64);
    if (!t) return NULL;
    int64_t *p = dg_data_ptr(t);
    for (int64_t i = 0; i < dg_numel(t); i++) p[i] = (int64_t)(dg_rng_u32(rng) % (uint32_t)hi);
    return t;
}

#endif
