/* CUDA kernels on raw device pointers: no tensors, no tape, no allocation policy (scratch comes
 * from the stream-ordered pool and goes back to it before the call returns, in stream order).
 * This header is plain C: ops and tests include it without the CUDA headers.
 *
 * Every entry point returns 0, or -1 with dg_error set (the failing CUDA or cuBLAS call named,
 * with its error string); none aborts.  Work is queued on the library's one stream (runtime.cu)
 * and runs asynchronously: a kernel's own failure at run time surfaces at the next
 * synchronising call (dg_cuda_synchronize, a device-to-host copy).  DG_CUDA_SYNC=1 in the
 * environment synchronises after every launch, so that such a failure names its kernel.
 *
 * Strides and shapes count elements.  A stride of 0 broadcasts.  Pointers address element 0 of
 * the view (the caller adds the tensor's offset). */
#ifndef DG_KERNELS_CUDA_KERNELS_H
#define DG_KERNELS_CUDA_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "deltagrad.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "core/device.h"                  /* memory, transfers, fill, strided copy, cast */
#include "kernels/cpu/delta/delta_rule.h" /* dg_dr_shape, dg_gate_kind (C declarations) */
#include "kernels/elementwise_op.h"       /* dg_unary_op, dg_binary_op */

/* ---- runtime (runtime.cu); memory, transfers and dg_cuda_synchronize are in core/device.h ---- */
int dg_cuda_init(void);     /* lazy: device 0, the stream, the pool; 0 or -1 with dg_error */
int dg_cuda_sm_count(void); /* multiprocessors of the device (0 without one) */

/* ---- the training run's per-step log (step_log.cu; ops/step_log.h has the layout) ----
 * ring[3 * (*count mod R)] = (loss, *norm, the GPU's global timer in seconds), then *count += 1;
 * one thread, queued on the stream (capturable).  loss is a double if loss_f64, else a float. */
int dg_cuda_step_log_put(double *ring, int64_t R, int64_t *count, const void *loss, bool loss_f64, const double *norm,
                         const void *flag, bool flag_f64);

/* ---- per-kernel times (kernel_timer.cu), for benchmarks ----
 * Between dg_cuda_ktime_begin and dg_cuda_ktime_end every launch of the chunked delta-rule kernels
 * (their DRC_LAUNCH) is bracketed by CUDA events on the stream.  end waits for the stream and fills
 * out[0 .. m) with the kernels in the order of their first launch, each with its summed
 * milliseconds and launch count; returns m (at most max), or -1 with dg_error.  *dropped (if not
 * NULL): launches past the timer's 256 that were not timed.  The events cost a few microseconds a
 * launch: for kernels of many microseconds. */
typedef struct dg_cuda_ktime {
    const char *name; /* the launch's name, e.g. "dr_chunk kda qkwy" */
    double ms;
    int launches;
} dg_cuda_ktime;
int dg_cuda_ktime_begin(void);
int dg_cuda_ktime_end(dg_cuda_ktime *out, int max, int *dropped);
bool dg_cuda_ktime_on(void);                          /* for the launch helper */
void dg_cuda_ktime_mark(const char *name, int after); /* event before (0) or after (1) a launch */
/* for dg_cuda_ktime_end's implementations: ms of one launch of name into out[0 .. m) (a new entry
 * at m while m < max); returns the new m */
static inline int dg_cuda_ktime_add(dg_cuda_ktime *out, int m, int max, const char *name, double ms) {
    int j = 0;
    while (j < m && strcmp(out[j].name, name)) j++;
    if (j == m) {
        if (m == max) return m; /* more kernel names than the caller has room for */
        out[m].name = name, out[m].ms = 0.0, out[m].launches = 0, m++;
    }
    out[j].ms += ms, out[j].launches++;
    return m;
}

/* ---- the op profiler's events (kernel_timer.cu), for autograd/profiler.c ----
 * A pool of CUDA events that grows to the n asked for and is kept until dg_cuda_evpool_free.
 * record queues event i on the library's stream; elapsed waits for event j and gives the
 * milliseconds from i to j. */
/* The host's waits for the device so far (stream and event synchronisations inside the library):
 * seconds and count. */
void dg_cuda_wait_stats(double *seconds, int64_t *count);
int dg_cuda_evpool_reserve(int n);
int dg_cuda_evpool_record(int i);
int dg_cuda_evpool_elapsed(int i, int j, float *ms);
void dg_cuda_evpool_free(void);

/* ---- elementwise (elementwise.cu); dt is DG_F32, DG_F64 or DG_BF16 (f32 arithmetic, one rounding
 * of each result) unless said otherwise ---- */
/* y[i] = f(x[i]) for n contiguous elements (y may alias x). */
int dg_cuda_unary(dg_dtype dt, dg_unary_op op, int64_t n, const void *x, void *y, double a);
/* gx[i] = gy[i] f'(x[i]) (gx may alias gy).  x may be NULL where f' is a function of the output
 * y (exp, sqrt, rsqrt, sigmoid, tanh) and y is given, or where f' is constant (neg, add_scalar,
 * mul_scalar); y may always be NULL when x is given (then f is recomputed). */
int dg_cuda_unary_bwd(dg_dtype dt, dg_unary_op op, int64_t n, const void *x, const void *y, const void *gy, void *gx,
                      double a);

/* out[idx] = a[idx . astride] (op) b[idx . bstride] over the ndim-d (0..6) index space `shape`;
 * out is contiguous of that shape.  Broadcasting is a stride of 0. */
int dg_cuda_binary(dg_dtype dt, dg_binary_op op, int ndim, const int64_t *shape, const void *a, const int64_t *astride,
                   const void *b, const int64_t *bstride, void *out);
/* The same with a dtype each: f64 throughout, or any mix of f32 and bf16 (f32 arithmetic, the
 * result rounded once where it is bf16). */
int dg_cuda_binary_mixed(dg_dtype a_dt, dg_dtype b_dt, dg_dtype out_dt, dg_binary_op op, int ndim, const int64_t *shape,
                         const void *a, const int64_t *astride, const void *b, const int64_t *bstride, void *out);

/* dg_cuda_fill, dg_cuda_copy_strided and dg_cuda_cast (also here) are declared in core/device.h:
 * core's copies call them. */

/* ---- reductions (reduce.cu) ---------------------------------------------------------------- */
/* out = alpha * sum of x over the dims whose bit is set in reduce_mask (bit d: dim d).  x is the
 * ndim-d (0..6) view `shape` with strides xstride (NULL: contiguous); out is contiguous over the
 * kept dims in their order (keepdim is the caller's reshape).  f32, f64 and bf16 accumulate in
 * f64 and round once to the output; the result does not depend on the launch (no atomics). */
int dg_cuda_sum(dg_dtype dt, int ndim, const int64_t *shape, const void *x, const int64_t *xstride,
                unsigned reduce_mask, double alpha, void *out);
/* The same with x of dtype x_dt and out of out_dt: equal, or f32 and bf16 either way round. */
int dg_cuda_sum_mixed(dg_dtype x_dt, dg_dtype out_dt, int ndim, const int64_t *shape, const void *x,
                      const int64_t *xstride, unsigned reduce_mask, double alpha, void *out);

/* ---- matrix products through cuBLAS (blas.cu) ------------------------------------------------- */
/* Row-major, batched with element strides between batch members (a stride of 0 broadcasts A or
 * B):   C_b[M,N] = alpha op(A_b) op(B_b) + beta C_b,  b = 0..batch-1,
 * op(A) = A [M,K] with row stride lda, or with trans_a A stored as [K,M] (row stride lda);
 * op(B) = B [K,N] with row stride ldb, or with trans_b B stored as [N,K].
 * Types (ab_dt, c_dt): (f32, f32) strict f32 (no TF32); (f64, f64); (bf16, bf16) and (bf16, f32)
 * with f32 accumulation.  beta == 0 never reads C. */
int dg_cuda_gemm(dg_dtype ab_dt, dg_dtype c_dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                 double alpha, const void *A, int64_t lda, int64_t stride_a, const void *B, int64_t ldb,
                 int64_t stride_b, double beta, void *C, int64_t ldc, int64_t stride_c, int64_t batch);

/* ---- the delta-rule family, token-by-token recurrence (dr_recurrent.cu) ---------------------- */
/* Same semantics and layout as the CPU kernels in kernels/cpu/delta/delta_rule.h (read it first):
 * q, k [B,T,H,K]; v, o [B,T,HV,V]; beta [B,T,HV]; g NULL | [B,T,HV] | [B,T,HV,K] after s->gate;
 * h0, hT [N,HV,K,V]; value head hv reads query/key head hv / (HV/H).  Every pointer is a device
 * pointer except s->cu_seqlens, which is the same host array the CPU kernels take (it is
 * checked and copied to the device).  h0, hT, and in the backward every gradient pointer, may be
 * NULL (dg must be NULL when g is); gradients are written, not accumulated.  s->chunk is
 * ignored.  K <= 512.
 * The backward recomputes the states: a forward pass keeps one state every C tokens (C about
 * sqrt(T), 8..64), then each stretch of C tokens is recomputed and walked backwards.  Scratch,
 * f32: (T/C + N) HV K V for the checkpoints, N HV C K V for the stretch, and (V/BV) times the
 * size of dq, dk, dg, dbeta for the per-value-tile partial sums (V tiles of BV = 256 / KS
 * columns, KS the power of two >= K/16), summed by a second kernel, so that results do not depend
 * on scheduling.  With cu_seqlens, each call copies the sequence table to the device (one
 * synchronising host-to-device copy). */
int dg_cuda_dr_recurrent_fwd_f32(const dg_dr_shape *s, const float *q, const float *k, const float *v, const float *g,
                                 const float *beta, const float *h0, float *o, float *hT);
int dg_cuda_dr_recurrent_bwd_f32(const dg_dr_shape *s, const float *q, const float *k, const float *v, const float *g,
                                 const float *beta, const float *h0, const float *dout, const float *dhT, float *dq,
                                 float *dk, float *dv, float *dg, float *dbeta, float *dh0);
/* bf16 storage (raw bits, uint16_t) for q, k, v, beta, o, dout and dq, dk, dv, dbeta; f32 for
 * the gates g, dg and the states h0, hT, dhT, dh0; f32 arithmetic throughout. */
int dg_cuda_dr_recurrent_fwd_bf16(const dg_dr_shape *s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                  const float *g, const uint16_t *beta, const float *h0, uint16_t *o, float *hT);
int dg_cuda_dr_recurrent_bwd_bf16(const dg_dr_shape *s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                  const float *g, const uint16_t *beta, const float *h0, const uint16_t *dout,
                                  const float *dhT, uint16_t *dq, uint16_t *dk, uint16_t *dv, float *dg,
                                  uint16_t *dbeta, float *dh0);
/* fp16 storage: the same with IEEE binary16 bits (uint16_t) in place of bf16 bits */
int dg_cuda_dr_recurrent_fwd_f16(const dg_dr_shape *s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                 const float *g, const uint16_t *beta, const float *h0, uint16_t *o, float *hT);
int dg_cuda_dr_recurrent_bwd_f16(const dg_dr_shape *s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                 const float *g, const uint16_t *beta, const float *h0, const uint16_t *dout,
                                 const float *dhT, uint16_t *dq, uint16_t *dk, uint16_t *dv, float *dg, uint16_t *dbeta,
                                 float *dh0);

#ifdef __cplusplus
}
#endif

#endif
