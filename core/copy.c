/* Copies between tensors of any geometry and dtype, fills, clones, host/device transfers.
 * None of these record autograd; the differentiable copies are the ops contiguous and to_dtype. */
#include "core/internal.h"

#include <string.h>

/* Same-dtype strided copy: the innermost dim runs as a typed loop, outer dims by multi-index. */
#define STRIDED_COPY(T)                                                                            \
    static void copy_##T(const dg_tensor *dst, const dg_tensor *src) {                             \
        int nd = dst->ndim;                                                                        \
        int64_t inner = nd ? dst->shape[nd - 1] : 1, ds = nd ? dst->stride[nd - 1] : 1,            \
                ss = nd ? src->stride[nd - 1] : 1;                                                 \
        int64_t idx[DG_MAX_DIMS] = {0};                                                            \
        T *dbase = (T *)dst->storage->data;                                                        \
        const T *sbase = (const T *)src->storage->data;                                            \
        do {                                                                                       \
            int64_t doff = dst->offset, soff = src->offset;                                        \
            for (int d = 0; d < nd - 1; d++) {                                                     \
                doff += idx[d] * dst->stride[d];                                                   \
                soff += idx[d] * src->stride[d];                                                   \
            }                                                                                      \
            T *dp = dbase + doff;                                                                  \
            const T *sp = sbase + soff;                                                            \
            if (ds == 1 && ss == 1) memcpy(dp, sp, (size_t)inner * sizeof(T));                    \
            else                                                                                   \
                for (int64_t i = 0; i < inner; i++) dp[i * ds] = sp[i * ss];                       \
        } while (nd > 1 && dg_next_index(nd - 1, dst->shape, idx));                               \
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
        if (dst->dtype == src->dtype && dg_is_contiguous(dst) && dg_is_contiguous(src)) {
            int kind = src->device == DG_CPU ? 0 : (dst->device == DG_CPU ? 1 : 2);
            return dg_cuda_memcpy(dg_data_ptr(dst), dg_data_ptr(src),
                                  (size_t)dg_numel(dst) * dg_dtype_size(dst->dtype), kind);
        }
        dg_error("copy_: between devices only contiguous tensors of one dtype (src %s %s %s, dst %s %s %s)",
                 dg_shp(src), dg_dtype_name(src->dtype), dg_device_name(src->device), dg_shp(dst),
                 dg_dtype_name(dst->dtype), dg_device_name(dst->device));
#else
        dg_error("copy_: this build has no CUDA backend");
#endif
        return -1;
    }
    if (dst->dtype != src->dtype) copy_convert(dst, src);
    else if (dst->dtype == DG_F32) copy_float(dst, src);
    else if (dst->dtype == DG_F64) copy_double(dst, src);
    else if (dst->dtype == DG_BF16) copy_u16(dst, src);
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
        dg_scope_begin();
        dg_tensor *h = dg_empty(t->ndim, t->shape, t->dtype);
        int rc = h ? dg_fill_(h, value) : -1;
        if (rc == 0) rc = dg_copy_(t, h);
        dg_scope_end();
        return rc;
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
    dg_tensor *src = t;
    if (!dg_is_contiguous(t)) {
        src = dg_clone(t);
        if (!src) return NULL;
    }
    dg_tensor *out = dg_empty_on(t->ndim, t->shape, t->dtype, dev);
    if (!out || dg_copy_(out, src) != 0) return NULL;
    return out;
}
