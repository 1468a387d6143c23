/* The delta-rule family's kernel calls by device and dtype (see delta_common.h): the recurrent and
 * chunked kernels, the in-op L2 norm and the in-op gate, on the CPU (kernels/cpu) or on CUDA
 * (kernels/cuda/delta/dr_chunk_cuda.h, cuda_kernels.h, dr_pieces_cuda.h, nn_cuda.h).
 *
 * dtypes: CPU f32 and f64; CUDA f32, and 16-bit storage, bf16 or fp16 (q, k, v, beta, o and their
 * gradients as bf16 / f16; gates g, states h0 / hT, A_log, dt_bias and their gradients f32; the L2
 * norm's 1/|x| f32).  fp16 takes the tensor-core kernels where bf16 does, except KDA's (generic
 * kernels in fp16: kernels/cuda/delta/dr_chunk_cuda.h says why).  f64 on CUDA is refused (the device kernels have no
 * f64), and so are bf16 and f16 on the CPU. */
#include "ops/delta/delta_common.h"

#include "kernels/cpu/delta/gate.h"
#include "kernels/cpu/nn.h"

#ifdef DG_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/delta/dr_chunk_cuda.h"
#include "kernels/cuda/delta/dr_pieces_cuda.h"
#include "kernels/cuda/nn_cuda.h"
#endif

static int kernel_status(const char *op, const char *what, int rc, dg_device dev) {
    if (rc == 0) return 0;
    if (dev == DG_CUDA) return -1; /* the device entry points set their own message */
    if (rc == -1)
        dg_error("%s: out of host memory in the %s kernel", op, what);
    else
        dg_error("%s: the %s kernel rejected its arguments (code %d)", op, what, rc);
    return -1;
}

bool dg_delta_dtype_ok(const char *op, dg_device dev, dg_dtype dt) {
    if (dev == DG_CPU && (dt == DG_F32 || dt == DG_F64)) return true;
    if (dev == DG_CUDA && (dt == DG_F32 || dg_delta_storage16(dt))) return true;
    if (dev == DG_CUDA && dt == DG_F64)
        dg_error("%s: f64 inputs are not supported on cuda (the device kernels take f32, or bf16 / f16 q, k, v, "
                 "beta with f32 gates and states); use f32 on cuda or f64 on the cpu",
                 op);
    else if (dg_delta_storage16(dt))
        dg_error("%s: %s inputs run on cuda only (%s storage with f32 accumulation); use f32 or f64 on the cpu",
                 op, dg_dtype_name(dt), dg_dtype_name(dt));
    else
        dg_error("%s: dtype %s is not supported on %s", op, dg_dtype_name(dt), dg_device_name(dev));
    return false;
}

#ifndef DG_HAVE_CUDA
static int no_cuda(const char *op) {
    dg_error("%s: this build has no CUDA backend", op);
    return -1;
}
#endif

int64_t dg_delta_k_kept_bytes(const char *op, int algorithm, const dg_dr_shape *s, dg_device dev, dg_dtype dt) {
    (void)op;
    if (dev != DG_CUDA || !dg_delta_storage16(dt) || algorithm == DG_DELTA_RECURRENT) return 0;
#ifdef DG_HAVE_CUDA
    return dt == DG_F16 ? dg_cuda_dr_chunk_kept_bytes_f16(s) : dg_cuda_dr_chunk_kept_bytes(s);
#else
    (void)s;
    return 0;
#endif
}

int dg_delta_k_fwd(const char *op, int algorithm, const dg_dr_shape *s, dg_device dev, dg_dtype dt,
                   const void *q, const void *k, const void *v, const void *g, const void *beta,
                   const void *h0, void *o, void *hT, void *keep, int *kept) {
    const bool rec = algorithm == DG_DELTA_RECURRENT;
    const char *what = rec ? "recurrent forward" : "chunked forward";
    int rc;
    (void)keep; /* used with CUDA only */
    if (kept) *kept = 0;
    if (!dg_delta_dtype_ok(op, dev, dt)) return -1;
    if (dev == DG_CUDA) {
#ifdef DG_HAVE_CUDA
        if (dt == DG_F32)
            rc = rec ? dg_cuda_dr_recurrent_fwd_f32(s, q, k, v, g, beta, h0, o, hT)
                     : dg_cuda_dr_chunk_fwd_f32(s, q, k, v, g, beta, h0, o, hT);
        else if (dt == DG_F16)
            rc = rec    ? dg_cuda_dr_recurrent_fwd_f16(s, q, k, v, g, beta, h0, o, hT)
                 : keep ? dg_cuda_dr_chunk_fwd_f16_keep(s, q, k, v, g, beta, h0, o, hT, keep, kept)
                        : dg_cuda_dr_chunk_fwd_f16(s, q, k, v, g, beta, h0, o, hT);
        else
            rc = rec    ? dg_cuda_dr_recurrent_fwd_bf16(s, q, k, v, g, beta, h0, o, hT)
                 : keep ? dg_cuda_dr_chunk_fwd_bf16_keep(s, q, k, v, g, beta, h0, o, hT, keep, kept)
                        : dg_cuda_dr_chunk_fwd_bf16(s, q, k, v, g, beta, h0, o, hT);
#else
        return no_cuda(op);
#endif
    } else if (rec) {
        rc = dt == DG_F32 ? dg_dr_recurrent_fwd_f32(s, q, k, v, g, beta, h0, o, hT)
                          : dg_dr_recurrent_fwd_f64(s, q, k, v, g, beta, h0, o, hT);
    } else {
        rc = dt == DG_F32 ? dg_dr_chunk_fwd_f32(s, q, k, v, g, beta, h0, o, hT)
                          : dg_dr_chunk_fwd_f64(s, q, k, v, g, beta, h0, o, hT);
    }
    return kernel_status(op, what, rc, dev);
}

int dg_delta_k_fwd_l2(const char *op, int algorithm, const dg_dr_shape *s, dg_device dev, dg_dtype dt, void *q,
                      void *k, const void *v, const void *g, const void *beta, const void *h0, void *o, void *hT,
                      void *keep, int *kept, const dg_delta_l2 *l2) {
    if (!l2) return dg_delta_k_fwd(op, algorithm, s, dev, dt, q, k, v, g, beta, h0, o, hT, keep, kept);
    if (!dg_delta_dtype_ok(op, dev, dt)) return -1;
#ifdef DG_HAVE_CUDA
    if (dev == DG_CUDA && dg_delta_storage16(dt) && algorithm != DG_DELTA_RECURRENT) {
        if (kept) *kept = 0;
        const int rc = (dt == DG_F16 ? dg_cuda_dr_chunk_fwd_l2_f16 : dg_cuda_dr_chunk_fwd_l2_bf16)(
            s, l2->qraw, l2->kraw, v, g, beta, h0, o, hT, keep, kept, DG_DELTA_L2NORM_EPS, l2->for_bwd ? q : NULL, k,
            l2->for_bwd ? l2->rq : NULL, l2->for_bwd ? l2->rk : NULL);
        return kernel_status(op, "chunked forward", rc, dev);
    }
#endif
    const int64_t rows = s->B * s->T * s->H;
    if (dg_delta_k_l2norm_fwd(op, dev, dt, rows, s->K, l2->qraw, q, l2->rq) ||
        dg_delta_k_l2norm_fwd(op, dev, dt, rows, s->K, l2->kraw, k, l2->rk))
        return -1;
    return dg_delta_k_fwd(op, algorithm, s, dev, dt, q, k, v, g, beta, h0, o, hT, keep, kept);
}

int dg_delta_k_bwd(const char *op, int recurrent, const dg_dr_variant *var, const dg_dr_shape *s, dg_device dev,
                   dg_dtype dt, const void *q, const void *k, const void *v, const void *g, const void *beta,
                   const void *h0, const void *dout, const void *dhT, void *dq, void *dk, void *dv, void *dg,
                   void *dbeta, void *dh0, const void *kept, const void *rq, const void *rk, int *l2_done) {
    const char *what = recurrent ? "recurrent backward" : "chunked backward";
    int rc;
    (void)kept, (void)rq, (void)rk; /* used with CUDA only */
    if (l2_done) *l2_done = 0;
    if (!dg_delta_dtype_ok(op, dev, dt)) return -1;
    if (dev == DG_CUDA) {
#ifdef DG_HAVE_CUDA
        const bool l2 = rq && rk && dt != DG_F32 && !recurrent; /* the 16-bit chunked kernels apply the norm */
        if (dt == DG_F32)
            rc = recurrent ? dg_cuda_dr_recurrent_bwd_f32(s, q, k, v, g, beta, h0, dout, dhT, dq, dk, dv, dg, dbeta, dh0)
                           : dg_cuda_dr_chunk_bwd_f32(s, var, q, k, v, g, beta, h0, dout, dhT, dq, dk, dv, dg, dbeta,
                                                      dh0);
        else if (dt == DG_F16)
            rc = recurrent ? dg_cuda_dr_recurrent_bwd_f16(s, q, k, v, g, beta, h0, dout, dhT, dq, dk, dv, dg, dbeta, dh0)
                           : dg_cuda_dr_chunk_bwd_f16_kept(s, var, q, k, v, g, beta, h0, dout, dhT, dq, dk, dv, dg,
                                                           dbeta, dh0, kept, l2 ? rq : NULL, l2 ? rk : NULL);
        else
            rc = recurrent ? dg_cuda_dr_recurrent_bwd_bf16(s, q, k, v, g, beta, h0, dout, dhT, dq, dk, dv, dg, dbeta,
                                                           dh0)
                           : dg_cuda_dr_chunk_bwd_bf16_kept(s, var, q, k, v, g, beta, h0, dout, dhT, dq, dk, dv, dg,
                                                            dbeta, dh0, kept, l2 ? rq : NULL, l2 ? rk : NULL);
        if (l2_done) *l2_done = l2;
#else
        return no_cuda(op);
#endif
    } else if (recurrent) {
        rc = dt == DG_F32 ? dg_dr_recurrent_bwd_f32(s, q, k, v, g, beta, h0, dout, dhT, dq, dk, dv, dg, dbeta, dh0)
                          : dg_dr_recurrent_bwd_f64(s, q, k, v, g, beta, h0, dout, dhT, dq, dk, dv, dg, dbeta, dh0);
    } else {
        rc = dt == DG_F32 ? dg_dr_chunk_bwd_f32(s, var, q, k, v, g, beta, h0, dout, dhT, dq, dk, dv, dg, dbeta, dh0)
                          : dg_dr_chunk_bwd_f64(s, var, q, k, v, g, beta, h0, dout, dhT, dq, dk, dv, dg, dbeta, dh0);
    }
    return kernel_status(op, what, rc, dev);
}

int dg_delta_k_l2norm_fwd(const char *op, dg_device dev, dg_dtype dt, int64_t rows, int64_t K, const void *x,
                          void *y, void *r) {
    if (dev == DG_CUDA) {
#ifdef DG_HAVE_CUDA
        return dt == DG_BF16   ? dg_cuda_dr_l2norm_bf16_fwd(rows, K, x, DG_DELTA_L2NORM_EPS, y, r)
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
        return dt == DG_BF16   ? dg_cuda_dr_l2norm_bf16_bwd(rows, K, x, r, dy, dx)
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

int dg_delta_k_gate_fwd(const char *op, dg_device dev, dg_dtype dt, int64_t rows, int64_t HV, int64_t C,
                        const void *a, const void *A_log, const void *dt_bias, void *g) {
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

int dg_delta_k_gate_bwd(const char *op, dg_device dev, dg_dtype dt, int64_t rows, int64_t HV, int64_t C,
                        const void *a, const void *A_log, const void *dt_bias, const void *dg, void *da,
                        void *dA_log, void *ddt_bias) {
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
