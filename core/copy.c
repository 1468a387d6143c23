/* Copies between tensors of any geometry and dtype, fills, clones, host/device transfers.
 * None of these record autograd; the differentiable copies are the ops contiguous and to_dtype. */
#include "core/internal.h"

#include <string.h>

#ifdef DG_HAVE_CUDA

/* ---- copies that touch the device ----
 * device -> device, one dtype: one strided copy kernel (any strides on both sides, 0 included);
 * device -> device, two dtypes: the cast kernel needs contiguous arrays, so a strided side goes
 *   through a contiguous device temporary;
 * host <-> device: one cudaMemcpy of a contiguous array of the destination's dtype; dtype changes
 *   and strides are handled on the host side (by the host copy below) and on the device side (by
 *   the strided copy kernel) with contiguous temporaries where needed. */

static int strided_d2d(dg_tensor *dst, const dg_tensor *src) {
    return dg_cuda_copy_strided(dg_dtype_size(dst->dtype), dst->ndim, dst->shape, dg_data_ptr(dst), dst->stride,
                                dg_data_ptr(src), src->stride);
}

/* a contiguous device tensor of src's values and dtype (src itself, or a copy in the scope) */
static const dg_tensor *device_contiguous(const dg_tensor *src) {
    if (dg_is_contiguous(src)) return src;
    dg_tensor *c = dg_empty_on(src->ndim, src->shape, src->dtype, DG_CUDA);
    return c && strided_d2d(c, src) == 0 ? c : NULL;
}

static int copy_involving_device(dg_tensor *dst, const dg_tensor *src) {
    size_t bytes = (size_t)dg_numel(dst) * dg_dtype_size(dst->dtype);
    bool contiguous = dg_is_contiguous(dst) && dg_is_contiguous(src);
    if (src->device == DG_CUDA && dst->device == DG_CUDA && src->dtype == dst->dtype) return strided_d2d(dst, src);
    if (src->dtype == dst->dtype && contiguous)
        return dg_cuda_memcpy(dg_data_ptr(dst), dg_data_ptr(src), bytes, src->device == DG_CPU ? 0 : 1);
    int rc = -1;
    dg_scope_begin();
    if (src->device == DG_CUDA && dst->device == DG_CUDA) { /* dtype conversion on the device */
        const dg_tensor *s = device_contiguous(src);
        dg_tensor *d = dg_is_contiguous(dst) ? dst : dg_empty_on(dst->ndim, dst->shape, dst->dtype, DG_CUDA);
        if (s && d) rc = dg_cuda_cast(dg_numel(dst), dst->dtype, dg_data_ptr(d), src->dtype, dg_data_ptr(s));
        if (rc == 0 && d != dst) rc = strided_d2d(dst, d);
    } else if (src->device == DG_CPU) { /* host -> device: convert and pack on the host */
        dg_tensor *h = dg_empty(src->ndim, src->shape, dst->dtype);
        dg_tensor *d = dg_is_contiguous(dst) ? dst : dg_empty_on(dst->ndim, dst->shape, dst->dtype, DG_CUDA);
        if (h && d && dg_copy_(h, src) == 0) rc = dg_cuda_memcpy(dg_data_ptr(d), dg_data_ptr(h), bytes, 0);
        if (rc == 0 && d != dst) rc = strided_d2d(dst, d);
    } else { /* device -> host: pack on the device, convert and scatter on the host */
        const dg_tensor *s = device_contiguous(src);
        dg_tensor *h = dg_empty(src->ndim, src->shape, src->dtype);
        if (s && h)
            rc = dg_cuda_memcpy(dg_data_ptr(h), dg_data_ptr(s), (size_t)dg_numel(src) * dg_dtype_size(src->dtype), 1);
        if (rc == 0) rc = dg_copy_(dst, h);
    }
    dg_scope_end();
    return rc;
}
#endif

/* Same-dtype strided copy: the innermost dim runs as a typed loop, outer dims by multi-index. */
#define STRIDED_COPY(T)                                                                 \
    static void copy_##T(const dg_tensor *dst, const dg_tensor *src) {                  \
        int nd = dst->ndim;                                                             \
        int64_t inner = nd ? dst->shape[nd - 1] : 1, ds = nd ? dst->stride[nd - 1] : 1, \
                ss = nd ? src->stride[nd - 1] : 1;                                      \
        int64_t idx[DG_MAX_DIMS] = {0};                                                 \
        T *dbase = (T *)dst->storage->data;                                             \
        const T *sbase = (const T *)src->storage->data;                                 \
        do {                                                                            \
            int64_t doff = dst->offset, soff = src->offset;                             \
            for (int d = 0; d < nd - 1; d++) {                                          \
                doff += idx[d] * dst->stride[d];                                        \
                soff += idx[d] * src->stride[d];                                        \
            }                                                                           \
            T *dp = dbase + doff;                                                       \
            const T *sp = sbase + soff;                                                 \
            if (ds == 1 && ss == 1) memcpy(dp, sp, (size_t)inner * sizeof(T));          \
            else                                                                        \
                for (int64_t i = 0; i < inner; i++) dp[i * ds] = sp[i * ss];            \
        } while (nd > 1 && dg_next_index(nd - 1, dst->shape, idx));                     \
    }
typedef uint16_t u16;
STRIDED_COPY(float)
STRIDED_COPY(double)
STRIDED_COPY(u16)
STRIDED_COPY(int64_t)
STRIDED_COPY(int32_t)

static void copy_convert(const dg_tensor *dst, const dg_tensor *src) {
    int64_t idx[DG_MAX_DIMS] = {0};
    do {
        dg_store_double(dg_elem_ptr(dst, idx), dst->dtype, dg_load_as_double(dg_elem_ptr(src, idx), src->dtype));
    } while (dg_next_index(dst->ndim, dst->shape, idx));
}

int dg_copy_(dg_tensor *dst, const dg_tensor *src) {
    if (!dst || !src) {
        dg_error("copy_: %s is NULL", dst ? "src" : "dst");
        return -1;
    }
    if (!dg_same_shape(dst, src)) {
        dg_error("copy_: src has shape %s but dst has %s", dg_shp(src), dg_shp(dst));
        return -1;
    }
    if (dg_numel(dst) == 0) return 0;
    if (dst->device != DG_CPU || src->device != DG_CPU) {
#ifdef DG_HAVE_CUDA
        return copy_involving_device(dst, src);
#else
        dg_error("copy_: this build has no CUDA backend");
#endif
        return -1;
    }
    if (dst->dtype != src->dtype) copy_convert(dst, src);
    else if (dst->dtype == DG_F32) copy_float(dst, src);
    else if (dst->dtype == DG_F64) copy_double(dst, src);
    else if (dst->dtype == DG_BF16 || dst->dtype == DG_F16) copy_u16(dst, src);
    else if (dst->dtype == DG_I64) copy_int64_t(dst, src);
    else copy_int32_t(dst, src);
    return 0;
}

int dg_fill_(dg_tensor *t, double value) {
    if (!t) {
        dg_error("fill_: tensor is NULL");
        return -1;
    }
    if (dg_numel(t) == 0) return 0;
    if (t->device != DG_CPU) {
#ifdef DG_HAVE_CUDA
        if (dg_is_contiguous(t)) return dg_cuda_fill(t->dtype, dg_numel(t), dg_data_ptr(t), value);
        /* a strided view: fill a contiguous temporary, scatter it */
        dg_scope_begin();
        dg_tensor *c = dg_empty_on(t->ndim, t->shape, t->dtype, t->device);
        int rc = c ? dg_cuda_fill(t->dtype, dg_numel(t), dg_data_ptr(c), value) : -1;
        if (rc == 0) rc = strided_d2d(t, c);
        dg_scope_end();
        return rc;
#else
        dg_error("fill_: this build has no CUDA backend");
        return -1;
#endif
    }
    if (t->dtype == DG_F32 && dg_is_contiguous(t)) {
        float *p = dg_data_ptr(t), v = (float)value;
        for (int64_t i = 0, n = dg_numel(t); i < n; i++) p[i] = v;
        return 0;
    }
    int64_t idx[DG_MAX_DIMS] = {0};
    do {
        dg_store_double(dg_elem_ptr(t, idx), t->dtype, value);
    } while (dg_next_index(t->ndim, t->shape, idx));
    return 0;
}

dg_tensor *dg_clone(dg_tensor *t) {
    if (!t) return NULL;
    dg_tensor *c = dg_empty_on(t->ndim, t->shape, t->dtype, t->device);
    if (c && dg_copy_(c, t) != 0) return NULL;
    return c;
}

int dg_copy_to_host(const dg_tensor *t, void *dst) {
    if (!t || !dst) {
        dg_error("copy_to_host: %s is NULL", t ? "dst" : "tensor");
        return -1;
    }
    dg_scope_begin();
    dg_tensor *h = dg_empty(t->ndim, t->shape, t->dtype);
    int rc = -1;
    if (h && dg_copy_(h, t) == 0) {
        memcpy(dst, h->storage->data, (size_t)dg_numel(h) * dg_dtype_size(h->dtype));
        rc = 0;
    }
    dg_scope_end();
    return rc;
}

dg_tensor *dg_to_device(dg_tensor *t, dg_device dev) {
    if (!t) return NULL;
    if (t->device == dev) return dg_autorelease(dg_retain(t));
    /* dg_copy_ packs a strided source on its own side of the transfer */
    dg_tensor *out = dg_empty_on(t->ndim, t->shape, t->dtype, dev);
    if (!out || dg_copy_(out, t) != 0) return NULL;
    return out;
}
