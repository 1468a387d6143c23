/* The small kernel calls of the delta-rule family by device and dtype (delta_kernels.c): the in-op
 * L2 norm of q, k and the in-op gate, on the CPU (kernels/cpu) or on CUDA (kernels/cuda).  The
 * recurrence itself runs through the backend table (delta_backends.h).
 *
 * dtypes: CPU f32 / f64; CUDA f32, or 16-bit storage, bf16 or fp16 (q, k, v, beta, o and their
 * gradients bf16 / f16; g, h0, hT, A_log, dt_bias and their gradients f32; the L2 norm's r f32).
 * Pointers are on the device given.  Each returns 0, or -1 with dg_error set. */
#ifndef DG_OPS_DELTA_KERNELS_H
#define DG_OPS_DELTA_KERNELS_H

#include "deltagrad.h"

/* false + message when the family has no kernels for dt on dev */
bool dg_delta_dtype_ok(const char *op, dg_device dev, dg_dtype dt);
/* a 16-bit storage dtype (bf16 or f16): q, k, v, beta and o in it, gates and states f32 */
static inline bool dg_delta_storage16(dg_dtype dt) { return dt == DG_BF16 || dt == DG_F16; }

/* y = x / sqrt(|x|^2 + eps) per row of K (eps DG_DELTA_L2NORM_EPS), r = the 1/sqrt(...) (dtype of
 * the gates); the backward dx = r (dy - y (dy . y)) */
int dg_delta_k_l2norm_fwd(const char *op, dg_device dev, dg_dtype dt, int64_t rows, int64_t K, const void *x, void *y,
                          void *r);
int dg_delta_k_l2norm_bwd(const char *op, dg_device dev, dg_dtype dt, int64_t rows, int64_t K, const void *x,
                          const void *r, const void *dy, void *dx);
/* the gate g = -exp(A_log) softplus(a + dt_bias) (kernels/cpu/delta/gate.h): dt is the gate's
 * dtype (f32 or f64; f32 with bf16 / f16 storage); C channels per value head (1 or K) */
int dg_delta_k_gate_fwd(const char *op, dg_device dev, dg_dtype dt, int64_t rows, int64_t HV, int64_t C, const void *a,
                        const void *A_log, const void *dt_bias, void *g);
int dg_delta_k_gate_bwd(const char *op, dg_device dev, dg_dtype dt, int64_t rows, int64_t HV, int64_t C, const void *a,
                        const void *A_log, const void *dt_bias, const void *dg, void *da, void *dA_log, void *ddt_bias);

#endif
