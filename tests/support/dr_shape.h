/* The delta-rule kernels' problem shape (dg_dr_shape) from a test case's sizes, as the kernel
 * tests build it: cu_seqlens when ncu > 0 (ncu - 1 sequences packed in T, B = 1), else B
 * sequences; the scale 1/sqrt(K). */
#ifndef DG_TESTS_SUPPORT_DR_SHAPE_H
#define DG_TESTS_SUPPORT_DR_SHAPE_H

#include "kernels/cpu/delta/delta_rule.h"

#include <math.h>
#include <stddef.h>

static inline dg_dr_shape dg_test_dr_shape(int64_t B, int64_t T, int64_t H, int64_t HV, int64_t K, int64_t V,
                                           const int64_t *cu, int ncu, dg_gate_kind gate, int chunk) {
    return (dg_dr_shape){.B = B,
                         .T = T,
                         .H = H,
                         .HV = HV,
                         .K = K,
                         .V = V,
                         .cu_seqlens = ncu ? cu : NULL,
                         .N = ncu ? ncu - 1 : B,
                         .gate = gate,
                         .scale = 1.0 / sqrt((double)K),
                         .chunk = chunk};
}

#endif
