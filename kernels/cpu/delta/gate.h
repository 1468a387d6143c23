/* The in-kernel gate of Gated DeltaNet and KDA (flash-linear-attention's use_gate_in_kernel):
 *
 *   g[r,h,c] = -exp(A_log[h]) * softplus(a[r,h,c] + dt_bias[h*C + c])
 *
 * a, g, da, dg: [R, HV, C] contiguous, R = B*T rows (tokens), C channels: C = 1 for GDN
 * (a [B,T,HV]), C = K for KDA (a [B,T,HV,K]).  A_log [HV] is broadcast over rows and channels;
 * dt_bias [HV*C] over rows, or NULL (no bias).  softplus(x) = log(1 + exp(x)), taken as x above
 * x = 20 (FLA's threshold), computed without overflow below it.
 *
 * Backward (written, not accumulated; each output pointer may be NULL):
 *   da[r,h,c]       = dg * (-exp(A_log[h])) * softplus'(a + dt_bias)   (sigmoid, 1 above 20)
 *   dA_log[h]       = sum_{r,c} dg * g            (d/dA_log of -exp(A_log) s is g itself)
 *   ddt_bias[h*C+c] = sum_r da[r,h,c]
 * Reductions are summed in double. */
#ifndef DG_KERNELS_CPU_GATE_H
#define DG_KERNELS_CPU_GATE_H

#include <stdint.h>

/* dg_gate_bwd returns 0, or -1 when out of memory */
#define DG_GATE_DECLARE(R, SFX)                                                                                      \
    void dg_gate_fwd_##SFX(int64_t rows, int64_t HV, int64_t C, const R *a, const R *A_log, const R *dt_bias, R *g); \
    int dg_gate_bwd_##SFX(int64_t rows, int64_t HV, int64_t C, const R *a, const R *A_log, const R *dt_bias,         \
                          const R *dg, R *da, R *dA_log, R *ddt_bias);

DG_GATE_DECLARE(float, f32)
DG_GATE_DECLARE(double, f64)

/* softplus (with the threshold above), its derivative (1 above the threshold, sigmoid below) and
 * sigmoid, in double, stable for any x */
double dg_softplus_d(double x);
double dg_softplus_grad_d(double x);
double dg_sigmoid_d(double x);

#endif
