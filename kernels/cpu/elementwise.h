/* Elementwise CPU kernels on raw pointers (f32 and f64 from one body, elementwise_impl.h). */
#ifndef DG_KERNELS_CPU_ELEMENTWISE_H
#define DG_KERNELS_CPU_ELEMENTWISE_H

#include <stdint.h>

#include "kernels/elementwise_op.h"

/* Strided n-d operand: element i (multi-index) at p[sum idx[d] * stride[d]]. */
typedef struct dg_strided {
    const void *p;
    int64_t stride[6];
} dg_strided;

#define DG_EW_DECLARE(R, SFX)                                                                                      \
    /* y = f(x) over n contiguous elements; s is the scalar of the scalar ops */                                   \
    void dg_cpu_unary_##SFX(dg_unary_op op, double s, int64_t n, const R *x, R *y);                                \
    /* dx = dy * f'(x), with y = f(x) given too (some derivatives are cheaper from y) */                           \
    void dg_cpu_unary_bwd_##SFX(dg_unary_op op, double s, int64_t n, const R *x, const R *y, const R *dy, R *dx);  \
    /* out (contiguous, shape) = a op b, with a and b strided (stride 0 broadcasts) */                             \
    void dg_cpu_binary_##SFX(dg_binary_op op, int ndim, const int64_t *shape, dg_strided a, dg_strided b, R *out); \
    /* dst (strided) += src (strided), same shape */                                                               \
    void dg_cpu_accumulate_##SFX(int ndim, const int64_t *shape, R *dst, const int64_t *dst_stride, dg_strided src);

DG_EW_DECLARE(float, f32)
DG_EW_DECLARE(double, f64)

#endif
