/* Argument checks of the typed entry points (each sets a message naming op, argument and shapes)
 * and the small helpers every op file uses. */
#include "ops/op.h"

#include "kernels/cpu/nn.h"
#ifdef DG_HAVE_CUDA
#include "kernels/cuda/nn_cuda.h"
#endif

#include <string.h>

int64_t dg_first_bad_index(const char *op, const dg_tensor *idx, int64_t n, bool allow_skip, int64_t skip,
                           int64_t *value) {
    int64_t bad = -1;
    *value = 0;
    if (idx->device == DG_CUDA) {
#ifdef DG_HAVE_CUDA
        if (dg_cuda_find_bad_index(dg_numel(idx), dg_data_ptr(idx), n, allow_skip, skip, &bad, value)) return -2;
#else
        return dg_require_cpu(op, idx) ? -1 : -2;
#endif
    } else {
        bad = dg_nn_find_bad_index(dg_numel(idx), dg_data_ptr(idx), n, allow_skip, skip);
        if (bad >= 0) *value = ((const int64_t *)dg_data_ptr(idx))[bad];
    }
    return bad;
}

bool dg_check_not_null(const char *op, const char *arg, const dg_tensor *t) {
    if (t) return true;
    dg_error("%s: %s is NULL", op, arg);
    return false;
}

bool dg_check_float(const char *op, const char *arg, const dg_tensor *t) {
    if (!dg_check_not_null(op, arg, t)) return false;
    if (t->dtype == DG_F32 || t->dtype == DG_F64) return true;
    dg_error("%s: %s has dtype %s (shape %s) but a float dtype (f32 or f64) is required", op, arg,
             dg_dtype_name(t->dtype), dg_shp(t));
    return false;
}

/* Ops whose device kernels take bf16 storage (f32 arithmetic inside) call this instead of
 * dg_check_float: f32 and f64 everywhere, bf16 on cuda only. */
bool dg_check_float_or_bf16(const char *op, const char *arg, const dg_tensor *t) {
    if (!dg_check_not_null(op, arg, t)) return false;
    if (t->dtype == DG_BF16 && t->device == DG_CUDA) return true;
    if (t->dtype == DG_BF16) {
        dg_error("%s: %s has dtype bf16 (shape %s) on %s; bf16 runs on cuda only (f32 or f64 here)", op, arg, dg_shp(t),
                 dg_device_name(t->device));
        return false;
    }
    return dg_check_float(op, arg, t);
}

bool dg_check_dtype(const char *op, const char *arg, const dg_tensor *t, dg_dtype dt) {
    if (!dg_check_not_null(op, arg, t)) return false;
    if (t->dtype == dt) return true;
    dg_error("%s: %s has dtype %s (shape %s) but %s is required", op, arg, dg_dtype_name(t->dtype), dg_shp(t),
             dg_dtype_name(dt));
    return false;
}

bool dg_check_ndim(const char *op, const char *arg, const dg_tensor *t, int ndim) {
    if (!dg_check_not_null(op, arg, t)) return false;
    if (t->ndim == ndim) return true;
    dg_error("%s: %s has shape %s but %d dims are required", op, arg, dg_shp(t), ndim);
    return false;
}

bool dg_check_same_dtype(const char *op, const char *arg, const dg_tensor *t, const char *ref_arg,
                         const dg_tensor *ref) {
    if (t->dtype == ref->dtype) return true;
    dg_error("%s: %s has dtype %s (shape %s) but %s has %s (shape %s)", op, arg, dg_dtype_name(t->dtype), dg_shp(t),
             ref_arg, dg_dtype_name(ref->dtype), dg_shp(ref));
    return false;
}

bool dg_check_same_device(const char *op, const char *arg, const dg_tensor *t, const char *ref_arg,
                          const dg_tensor *ref) {
    if (t->device == ref->device) return true;
    dg_error("%s: %s is on %s (shape %s) but %s is on %s (shape %s)", op, arg, dg_device_name(t->device), dg_shp(t),
             ref_arg, dg_device_name(ref->device), dg_shp(ref));
    return false;
}

void dg_sample_free(dg_sample *s) {
    for (int i = 0; i < DG_MAX_IO; i++) {
        dg_release(s->in[i]);
        s->in[i] = NULL;
    }
}

void dg_sample_set(dg_sample *s, int i, dg_tensor *t, bool differentiable) {
    dg_release(s->in[i]);
    s->in[i] = t ? dg_retain(t) : NULL;
    s->differentiable[i] = differentiable && t && dg_dtype_is_float(t->dtype);
}

/* Sum of g over the dims that broadcasting added or stretched from size 1. */
dg_tensor *dg_sum_to_shape(dg_tensor *g, int ndim, const int64_t *shape) {
    if (!g) return NULL;
    int lead = g->ndim - ndim, dims[DG_MAX_DIMS], nd = 0;
    for (int d = 0; d < g->ndim; d++)
        if (d < lead || (shape[d - lead] == 1 && g->shape[d] != 1)) dims[nd++] = d;
    dg_tensor *s = nd ? dg_sum(g, nd, dims, false) : g;
    return s ? dg_reshape(s, ndim, shape) : NULL;
}

bool dg_require_cpu(const char *op, const dg_tensor *t) {
    if (!t || t->device == DG_CPU) return true;
    dg_error("%s: tensor %s %s is on %s, which this op does not run on yet", op, dg_shp(t), dg_dtype_name(t->dtype),
             dg_device_name(t->device));
    return false;
}
