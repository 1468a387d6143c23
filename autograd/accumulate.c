#include "autograd/autograd.h"
#include "kernels/cpu/elementwise.h"

/* dst += src, same shape and dtype; src may be strided or broadcast.  Used for gradient sums. */
int dg_accumulate_(dg_tensor *dst, const dg_tensor *src) {
    if (!dg_same_shape(dst, src) || dst->dtype != src->dtype || dst->device != src->device) {
        dg_error("accumulate: gradient %s %s %s does not match %s %s %s", dg_shp(src), dg_dtype_name(src->dtype),
                 dg_device_name(src->device), dg_shp(dst), dg_dtype_name(dst->dtype), dg_device_name(dst->device));
        return -1;
    }
    if (dst->device != DG_CPU) {
        dg_scope_begin();
        dg_tensor *sum = dg_add(dst, (dg_tensor *)src);
        int rc = sum ? dg_copy_(dst, sum) : -1;
        dg_scope_end();
        return rc;
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
