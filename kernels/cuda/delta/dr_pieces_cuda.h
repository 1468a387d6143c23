/* Small CUDA kernels of the delta-rule family besides the fused recurrence / chunk kernels: the
 * in-op gate, the bf16 L2 norm of q and k, and the standalone pieces of the chunked algorithm
 * (chunk_local_cumsum, chunk_scaled_dot_kkt, solve_tril).  Plain C header: the op files include
 * it without the CUDA headers (under #ifdef DG_HAVE_CUDA).
 *
 * Semantics and layouts are those of the CPU kernels (kernels/cpu/delta/gate.h,
 * kernels/cpu/delta/chunk_pieces.h, kernels/cpu/nn.h); read those first.  dt is DG_F32 or DG_F64 and
 * names the type of every float pointer.  Every array pointer is a device pointer and contiguous;
 * cu_seqlens (s->cu_seqlens, cu_seqlens) is the HOST array the CPU kernels take (checked, and the
 * chunk table it implies copied to the device: one host-to-device copy per call).  Gradients are
 * written, not accumulated; a gradient pointer may be NULL when not wanted.
 *
 * Launches: one thread block per (chunk, head) for the pieces (the in-chunk matrices live in
 * shared memory, C <= 64); the gate and the L2 norm are element / row parallel.  Sums over rows
 * (dA_log, ddt_bias) use the fixed-order column sums of nn_util.h (no float atomics), so every
 * result is reproducible bit for bit.
 *
 * Every entry point returns 0, or -1 with dg_error set (bad argument, CUDA failure named); work is
 * queued on the library's stream (kernels/cuda/runtime.cu). */
#ifndef DG_KERNELS_CUDA_DR_PIECES_CUDA_H
#define DG_KERNELS_CUDA_DR_PIECES_CUDA_H

#include <stdint.h>

#include "deltagrad.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/cpu/delta/delta_rule.h" /* dg_dr_shape */

/* ---- the gate (dr_pieces.cu): g = -exp(A_log[h]) softplus(a + dt_bias[h*C+c]), a [rows,HV,C] ---- */
int dg_cuda_dr_gate_fwd(dg_dtype dt, int64_t rows, int64_t HV, int64_t C, const void *a, const void *A_log,
                        const void *dt_bias, void *g);
/* da = dg (-exp(A_log)) softplus'(x);  dA_log[h] = sum_{r,c} dg g;  ddt_bias[h*C+c] = sum_r da */
int dg_cuda_dr_gate_bwd(dg_dtype dt, int64_t rows, int64_t HV, int64_t C, const void *a, const void *A_log,
                        const void *dt_bias, const void *dg, void *da, void *dA_log, void *ddt_bias);

/* ---- L2 norm of bf16 rows (dr_pieces.cu): x, y, dy, dx bf16 bits [N,D]; rstd f32 [N] ----------
 * r = 1/sqrt(sum_d x^2 + eps) (sum in f32 over the bf16 values), y = bf16(x r);
 * dx = bf16(r (dy - x r^2 sum_d(dy x))).  The _f16 forms: the same on IEEE fp16 bits. */
int dg_cuda_dr_l2norm_bf16_fwd(int64_t N, int64_t D, const uint16_t *x, double eps, uint16_t *y, float *rstd);
int dg_cuda_dr_l2norm_bf16_bwd(int64_t N, int64_t D, const uint16_t *x, const float *rstd, const uint16_t *dy,
                               uint16_t *dx);
int dg_cuda_dr_l2norm_f16_fwd(int64_t N, int64_t D, const uint16_t *x, double eps, uint16_t *y, float *rstd);
int dg_cuda_dr_l2norm_f16_bwd(int64_t N, int64_t D, const uint16_t *x, const float *rstd, const uint16_t *dy,
                              uint16_t *dx);

/* ---- chunk_local_cumsum (dr_pieces.cu): x, out [B,T,H,S]; out may alias x ---------------------
 * forward (reverse 0) or reverse cumulative sum inside each chunk; the backward of one direction
 * is the other direction (dg_chunk_local_cumsum_bwd). */
int dg_cuda_chunk_local_cumsum(dg_dtype dt, int64_t B, int64_t T, int64_t H, int64_t S, const int64_t *cu_seqlens,
                               int64_t N, int chunk, int reverse, const void *x, void *out);

/* ---- chunk_scaled_dot_kkt (dr_pieces_tril.cu): k [B,T,H,K], beta [B,T,HV], g NULL | [B,T,HV] |
 * [B,T,HV,K] cumulative gate after s->gate, A [B,T,HV,C] (uses B, T, H, HV, K, cu_seqlens, N, gate,
 * chunk).  A[t,j] = beta_t sum_c k_tc k_jc exp(G_tc - G_jc) for j < i, else 0. */
int dg_cuda_chunk_scaled_dot_kkt_fwd(dg_dtype dt, const dg_dr_shape *s, const void *k, const void *beta, const void *g,
                                     void *A);
int dg_cuda_chunk_scaled_dot_kkt_bwd(dg_dtype dt, const dg_dr_shape *s, const void *k, const void *beta, const void *g,
                                     const void *dA, void *dk, void *dbeta, void *dg);

/* ---- solve_tril (dr_pieces_tril.cu): A, Ainv, dAinv, dA [B,T,HV,C] (uses B, T, HV, cu_seqlens, N,
 * chunk).  Ainv = (I + strictly_lower(A))^-1 per chunk: blocked = 1 inverts the 16 x 16 diagonal
 * blocks and merges them block row by block row, 0 runs forward substitution column by column.
 * Backward: dA = strictly_lower(-Ainv^T lower(dAinv) Ainv^T). */
int dg_cuda_solve_tril_fwd(dg_dtype dt, const dg_dr_shape *s, int blocked, const void *A, void *Ainv);
int dg_cuda_solve_tril_bwd(dg_dtype dt, const dg_dr_shape *s, const void *Ainv, const void *dAinv, void *dA);

#ifdef __cplusplus
}
#endif

#endif
