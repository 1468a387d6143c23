#include "autograd/autograd.h"
#include "kernels/cpu/elementwise.h"
#ifdef DG_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

#ifdef DG_HAVE_CUDA
/* dst += src on the device.  f32/f64/bf16 with dst contiguous: one broadcasting add kernel writing
 * its output over dst (each element reads dst[i] and writes dst[i] in the same thread, so in place
 * is safe; src may be strided or broadcast; bf16 adds in f32 and rounds once).  Otherwise (a
 * strided dst, f16): through an f32/f64 contiguous temporary. */
static int accumulate_device(dg_tensor *dst, const dg_tensor *src) {
    bool fl = dst->dtype == DG_F32 || dst->dtype == DG_F64;
    if ((fl || dst->dtype == DG_BF16) && dg_is_contiguous(dst))
        return dg_cuda_binary(dst->dtype, DG_BIN_ADD, dst->ndim, dst->shape, dg_data_ptr(dst), dst->stride,
                              dg_data_ptr(src), src->stride, dg_data_ptr(dst));
    if (!fl && dst->dtype != DG_BF16 && dst->dtype != DG_F16) {
        dg_error("accumulate: gradients of dtype %s are not supported", dg_dtype_name(dst->dtype));
        return -1;
    }
    dg_dtype wide = fl ? dst->dtype : DG_F32; /* bf16 / f16 add in f32, rounded once */
    int rc = -1;
    dg_scope_begin();
    dg_tensor *acc = dg_empty_on(dst->ndim, dst->shape, wide, DG_CUDA);
    dg_tensor *s = dg_empty_on(src->ndim, src->shape, wide, DG_CUDA);
    if (acc && s && dg_copy_(acc, dst) == 0 && dg_copy_(s, src) == 0 &&
        dg_cuda_binary(wide, DG_BIN_ADD, acc->ndim, acc->shape, dg_data_ptr(acc), acc->stride, dg_data_ptr(s),
                       s->stride, dg_data_ptr(acc)) == 0)
        rc = dg_copy_(dst, acc);
    dg_scope_end();
    return rc;
}
#endif

/* dst += src, same shape and dtype; src may be strided or broadcast.  Used for gradient sums. */
int dg_accumulate_(dg_tensor *dst, const dg_tensor *src) {
    if (!dg_same_shape(dst, src) || dst->dtype != src->dtype || dst->device != src->device) {
        dg_error("accumulate: gradient %s %s %s does not match %s %s %s", dg_shp(src), dg_dtype_name(src->dtype),
                 dg_device_name(src->device), dg_shp(dst), dg_dtype_name(dst->dtype), dg_device_name(dst->device));
        return -1;
    }
    if (dst->device != DG_CPU) {
#ifdef DG_HAVE_CUDA
        return accumulate_device(dst, src);
#else
        dg_error("accumulate: this build has no CUDA backend");
        return -1;
#endif
    }
    dg_strided s = {dg_data_ptr(src), {0}};
    for (int d = 0; d < src->ndim; d++) s.stride[d] = src->stride[d];
    if (dst->dtype == DG_F32) dg_cpu_accumulate_f32(dst->ndim, dst->shape, dg_data_ptr(dst), dst->stride, s);
    else if (dst->dtype == DG_F64) dg_cpu_accumulate_f64(dst->ndim, dst->shape, dg_data_ptr(dst), dst->stride, s);
    else {
        dg_error("accumulate: gradients of dtype %s are not supported", dg_dtype_name(dst->dtype));
        return -1;
    }
    return 0;
}
