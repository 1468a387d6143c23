/* The delta-rule family's small kernel calls by device and dtype (delta_kernels.h): the in-op L2
 * norm and the in-op gate, on the CPU (kernels/cpu) or on CUDA (kernels/cuda/delta/dr_pieces_cuda.h,
 * nn_cuda.h), and the dtypes the family takes: CPU f32 and f64; CUDA f32, and 16-bit storage, bf16
 * or fp16.  f64 on CUDA is refused (the device kernels have no f64), and so are bf16 and f16 on the
 * CPU. */
#include "ops/delta/delta_kernels.h"

#include "core/internal.h"
#include "kernels/cpu/delta/delta_call.h"
#include "kernels/cpu/delta/gate.h"
#include "kernels/cpu/nn.h"

#ifdef DG_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/delta/dr_pieces_cuda.h"
#include "kernels/cuda/nn_cuda.h"
#endif

bool dg_delta_dtype_ok(const char *op, dg_device dev, dg_dtype dt) {
    if (dev == DG_CPU && (dt == DG_F32 || dt == DG_F64)) return true;
    if (dev == DG_CUDA && (dt == DG_F32 || dg_delta_storage16(dt))) return true;
    if (dev == DG_CUDA && dt == DG_F64)
        dg_error("%s: f64 inputs are not supported on cuda (the device kernels take f32, or bf16 / f16 q, k, v, "
                 "beta with f32 gates and states); use f32 on cuda or f64 on the cpu",
                 op);
    else if (dg_delta_storage16(dt))
        dg_error("%s: %s inputs run on cuda only (%s storage with f32 accumulation); use f32 or f64 on the cpu", op,
                 dg_dtype_name(dt), dg_dtype_name(dt));
    else dg_error("%s: dtype %s is not supported on %s", op, dg_dtype_name(dt), dg_device_name(dev));
    return false;
}

#ifndef DG_HAVE_CUDA
static int no_cuda(const char *op) {
    dg_error("%s: this build has no CUDA backend", op);
    return -1;
}
#endif

int dg_delta_k_l2norm_fwd(const char *op, dg_device dev, dg_dtype dt, int64_t rows, int64_t K, const void *x, void *y,
                          void *r) {
    if (dev == DG_CUDA) {
#ifdef DG_HAVE_CUDA
        return dt == DG_BF16  ? dg_cuda_dr_l2norm_bf16_fwd(rows, K, x, DG_DELTA_L2NORM_EPS, y, r)
               : dt == DG_F16 ? dg_cuda_dr_l2norm_f16_fwd(rows, K, x, DG_DELTA_L2NORM_EPS, y, r)
                              : dg_cuda_l2norm_fwd(dt, rows, K, x, DG_DELTA_L2NORM_EPS, y, r);
#else
        return no_cuda(op);
#endif
    }
    if (dt == DG_F32) dg_nn_l2norm_fwd_f32(rows, K, x, DG_DELTA_L2NORM_EPS, y, r);
    else dg_nn_l2norm_fwd_f64(rows, K, x, DG_DELTA_L2NORM_EPS, y, r);
    return 0;
}

int dg_delta_k_l2norm_bwd(const char *op, dg_device dev, dg_dtype dt, int64_t rows, int64_t K, const void *x,
                          const void *r, const void *dy, void *dx) {
    if (dev == DG_CUDA) {
#ifdef DG_HAVE_CUDA
        return dt == DG_BF16  ? dg_cuda_dr_l2norm_bf16_bwd(rows, K, x, r, dy, dx)
               : dt == DG_F16 ? dg_cuda_dr_l2norm_f16_bwd(rows, K, x, r, dy, dx)
                              : dg_cuda_l2norm_bwd(dt, rows, K, x, r, dy, dx);
#else
        return no_cuda(op);
#endif
    }
    if (dt == DG_F32) dg_nn_l2norm_bwd_f32(rows, K, x, r, dy, dx);
    else dg_nn_l2norm_bwd_f64(rows, K, x, r, dy, dx);
    return 0;
}

int dg_delta_k_gate_fwd(const char *op, dg_device dev, dg_dtype dt, int64_t rows, int64_t HV, int64_t C, const void *a,
                        const void *A_log, const void *dt_bias, void *g) {
    if (dev == DG_CUDA) {
#ifdef DG_HAVE_CUDA
        return dg_cuda_dr_gate_fwd(dt, rows, HV, C, a, A_log, dt_bias, g);
#else
        return no_cuda(op);
#endif
    }
    if (dt == DG_F32) dg_gate_fwd_f32(rows, HV, C, a, A_log, dt_bias, g);
    else dg_gate_fwd_f64(rows, HV, C, a, A_log, dt_bias, g);
    return 0;
}

int dg_delta_k_gate_bwd(const char *op, dg_device dev, dg_dtype dt, int64_t rows, int64_t HV, int64_t C, const void *a,
                        const void *A_log, const void *dt_bias, const void *dg, void *da, void *dA_log,
                        void *ddt_bias) {
    if (dev == DG_CUDA) {
#ifdef DG_HAVE_CUDA
        return dg_cuda_dr_gate_bwd(dt, rows, HV, C, a, A_log, dt_bias, dg, da, dA_log, ddt_bias);
#else
        return no_cuda(op);
#endif
    }
    int rc = dt == DG_F32 ? dg_gate_bwd_f32(rows, HV, C, a, A_log, dt_bias, dg, da, dA_log, ddt_bias)
                          : dg_gate_bwd_f64(rows, HV, C, a, A_log, dt_bias, dg, da, dA_log, ddt_bias);
    if (rc) dg_error("%s: out of host memory in the gate backward", op);
    return rc;
}
