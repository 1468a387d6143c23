/* Chunked (WY-form) delta-rule kernels on the GPU: forward and backward on raw device pointers.
 * Plain C header (the ops and tests include it without the CUDA headers).
 *
 * Semantics, layouts and arguments are those of dg_dr_chunk_fwd_f32 / dg_dr_chunk_bwd_f32
 * (kernels/cpu/delta/delta_rule.h, kernels/cpu/delta/chunk_pieces.h):
 *   q, k [B,T,H,K]; v, o [B,T,HV,V]; beta [B,T,HV]; g NULL | [B,T,HV] | [B,T,HV,K] after s->gate
 *   (the per-token log decay); h0, hT [N,HV,K,V]; value head hv reads query/key head hv/(HV/H);
 *   cu_seqlens (B = 1) is the same host array the CPU kernels take (checked, and copied to the
 *   device once per call: one synchronising copy); s->chunk is 16, 32 or 64.
 * Every pointer is a device pointer; h0, hT and every gradient may be NULL (dg must be NULL
 * when g is); gradients are written, not accumulated.  var NULL means {1, 1, 1}; every flag is
 * honoured (GDN dg from the final dq, dk or from partial terms; KDA backward with dW kept in
 * shared memory or stored to global memory between two kernels; blocked or forward-substitution
 * triangular inverse).  K <= 256; V any.
 * Return 0, or -1 with dg_error set (bad shape or pointer, CUDA failure).  Work is queued on the
 * library's stream (kernels/cuda/cuda_kernels.h).
 *
 * Two implementations behind the same entry points:
 *  - generic: f32 arithmetic, every gate kind and chunk size (all f32 calls, and 16-bit calls
 *    that the fast path does not take);
 *  - tensor cores (bf16 calls, and fp16 calls with gate NONE or HEAD; chunk 64, K in {64, 128},
 *    V a multiple of 64, q, k, v, dout 16-byte aligned and o, dv 4-byte aligned; otherwise the
 *    generic kernels; a head of V other than 64 or 128 runs as V / 128 heads of 128 columns, or
 *    V / 64 of 64, that share its key head: dr_chunk_vsplit.cu): the in-chunk products on mma.sync m16n8k16 with 16-bit operands (bf16, or fp16 for
 *    fp16 calls) and f32 accumulation; operands that are not inputs (W, U, states, the triangular
 *    inverse) are split into two 16-bit terms (hi + lo) so that the products keep about 16 bits
 *    (fp16: about 22), except W and U (and V' with the head gate), which are plain 16-bit words as
 *    in FLA (errors measured per operand: dr_chunk_mma.cuh, Plain).  Gate NONE or HEAD:
 *    dr_chunk_mma_*.cu (built twice: bf16 and fp16); CHANNEL (KDA, bf16 only): dr_chunk_kda_mma_*.cu
 *    (W, U, Kd, V', Qg plain: KPlain in dr_chunk_kda.cuh), the gated products as one tensor-core
 *    product on a per-channel reference when the chunk's gate spans <= 80 in every channel, else on
 *    16-row sub-chunk references.  Its factors reach e^{+-40}, beyond fp16's range (65504 = e^11.1):
 *    fp16 KDA calls take the generic kernels.
 * bf16 calls: q, k, v, beta, o, dout, dq, dk, dv, dbeta as bf16 bits (uint16_t); g, dg, h0, hT,
 * dhT, dh0 f32; f32 accumulation.
 * fp16 calls (dg_cuda_dr_chunk_*_f16*): the same arguments with IEEE binary16 bits (uint16_t: 1
 * sign, 5 exponent, 10 fraction bits) in place of bf16 bits, the same semantics.  On the generic
 * kernels exact up to the rounding of each output (2^-11 relative); on tensor cores the split
 * intermediates are fp16 words too, with fp16's range: a value beyond 65504 overflows to inf and
 * the lo word of a value below about 2^-3 loses bits to fp16's subnormal floor (2^-24); FLA's fp16
 * kernels round the same intermediates to plain fp16. */
#ifndef DG_KERNELS_CUDA_DR_CHUNK_CUDA_H
#define DG_KERNELS_CUDA_DR_CHUNK_CUDA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/cpu/delta/delta_rule.h"

int dg_cuda_dr_chunk_fwd_f32(const dg_dr_shape *s, const float *q, const float *k, const float *v,
                             const float *g, const float *beta, const float *h0, float *o,
                             float *hT);
int dg_cuda_dr_chunk_bwd_f32(const dg_dr_shape *s, const dg_dr_variant *var, const float *q,
                             const float *k, const float *v, const float *g, const float *beta,
                             const float *h0, const float *dout, const float *dhT, float *dq,
                             float *dk, float *dv, float *dg, float *dbeta, float *dh0);
int dg_cuda_dr_chunk_fwd_bf16(const dg_dr_shape *s, const uint16_t *q, const uint16_t *k,
                              const uint16_t *v, const float *g, const uint16_t *beta,
                              const float *h0, uint16_t *o, float *hT);
int dg_cuda_dr_chunk_bwd_bf16(const dg_dr_shape *s, const dg_dr_variant *var, const uint16_t *q,
                              const uint16_t *k, const uint16_t *v, const float *g,
                              const uint16_t *beta, const float *h0, const uint16_t *dout,
                              const float *dhT, uint16_t *dq, uint16_t *dk, uint16_t *dv,
                              float *dg, uint16_t *dbeta, float *dh0);
int dg_cuda_dr_chunk_fwd_f16(const dg_dr_shape *s, const uint16_t *q, const uint16_t *k,
                             const uint16_t *v, const float *g, const uint16_t *beta,
                             const float *h0, uint16_t *o, float *hT);
int dg_cuda_dr_chunk_bwd_f16(const dg_dr_shape *s, const dg_dr_variant *var, const uint16_t *q,
                             const uint16_t *k, const uint16_t *v, const float *g,
                             const uint16_t *beta, const float *h0, const uint16_t *dout,
                             const float *dhT, uint16_t *dq, uint16_t *dk, uint16_t *dv,
                             float *dg, uint16_t *dbeta, float *dh0);

/* The forward's working set, kept for the backward (16-bit calls on the tensor-core paths).
 * The backward otherwise recomputes from q, k, v, beta, g what the forward made: the gate's
 * cumulative sum, the WY factors W = Ai diag(beta e^G) K and U = Ai diag(beta) V, the inverse
 * Ai = (I + A)^-1, the states entering each chunk and V' (KDA also its gated key copies, P and Qg)
 * -- the prep and state passes, a third of GDN's fwd+bwd at S1.  A caller with the memory keeps
 * them instead (FLA recomputes; this trades memory for time):
 *   dg_cuda_dr_chunk_kept_bytes(s): bytes of device memory to keep for this shape; 0 when bf16
 *     calls of this shape take the generic kernels (they keep nothing); -1 with dg_error on a bad
 *     shape.  B8 T2048 H16 K=V=128: GDN 0.54 GB, delta_rule 0.60 GB, KDA 0.81 GB (the inputs q, k, v are
 *     67 MB each).
 *   dg_cuda_dr_chunk_fwd_bf16_keep(..., keep, kept): the forward of dg_cuda_dr_chunk_fwd_bf16;
 *     keep is device memory of kept_bytes(s) bytes, 16-byte aligned; *kept = 1 when it now holds
 *     the working set, 0 when the call took the generic kernels (pointer alignment).
 *   dg_cuda_dr_chunk_bwd_bf16_kept(..., kept): dg_cuda_dr_chunk_bwd_bf16 from the working set that
 *     a kept forward made on the same shape, inputs and h0 (NULL: recompute).  The GDN/delta_rule
 *     substitution variant recomputes anyway (the kept inverse is the blocked one).  The results
 *     equal the recomputing backward's bit for bit (the same kernels make the same values).
 *     rq, rk (NULL, or both): q and k are L2-normalised rows (q = x / sqrt(|x|^2 + eps)) and rq, rk
 *     their f32 1/sqrt(|x|^2 + eps) [B*T*H]; dq and dk are then the gradients of the raw rows x,
 *     r (dy - xn (dy . xn)) with dy the gradient of the normalised ones: the head-gate tensor-core
 *     kernels do it as they store dq, dk (GDN, delta_rule: no separate pass over q, k, dq, dk),
 *     the other paths after (docs/PERF_KERNELS.md). */
int64_t dg_cuda_dr_chunk_kept_bytes(const dg_dr_shape *s);
/* the fp16 forms: the same for fp16 calls (kept_bytes_f16 is 0 for KDA, which keeps nothing in fp16) */
int64_t dg_cuda_dr_chunk_kept_bytes_f16(const dg_dr_shape *s);
int dg_cuda_dr_chunk_fwd_f16_keep(const dg_dr_shape *s, const uint16_t *q, const uint16_t *k,
                                  const uint16_t *v, const float *g, const uint16_t *beta,
                                  const float *h0, uint16_t *o, float *hT, void *keep, int *kept);
int dg_cuda_dr_chunk_bwd_f16_kept(const dg_dr_shape *s, const dg_dr_variant *var, const uint16_t *q,
                                  const uint16_t *k, const uint16_t *v, const float *g,
                                  const uint16_t *beta, const float *h0, const uint16_t *dout,
                                  const float *dhT, uint16_t *dq, uint16_t *dk, uint16_t *dv,
                                  float *dg, uint16_t *dbeta, float *dh0, const void *kept, const float *rq,
                                  const float *rk);
int dg_cuda_dr_chunk_fwd_bf16_keep(const dg_dr_shape *s, const uint16_t *q, const uint16_t *k,
                                   const uint16_t *v, const float *g, const uint16_t *beta,
                                   const float *h0, uint16_t *o, float *hT, void *keep, int *kept);
int dg_cuda_dr_chunk_bwd_bf16_kept(const dg_dr_shape *s, const dg_dr_variant *var, const uint16_t *q,
                                   const uint16_t *k, const uint16_t *v, const float *g,
                                   const uint16_t *beta, const float *h0, const uint16_t *dout,
                                   const float *dhT, uint16_t *dq, uint16_t *dk, uint16_t *dv,
                                   float *dg, uint16_t *dbeta, float *dh0, const void *kept, const float *rq,
                                   const float *rk);

/* Path selection for 16-bit calls (tests and benchmarks): 0 = automatic (default), 1 = always the
 * generic kernels.  Returns the previous setting.  Not thread-safe; set it between calls. */
int dg_cuda_dr_chunk_force_generic(int on);

/* The forward with the L2 norm of q and k in it (use_qk_l2norm_in_kernel): q, k are the raw rows
 * [B, T, H, K]; the forward runs on their L2-normalised rows x / sqrt(|x|^2 + eps), writes those of
 * k to kn (required) and of q to qn, and their f32 1/sqrt(|x|^2 + eps) [B*T*H] to rk, rq (qn, rq,
 * rk may be NULL: not wanted) -- what the backward (_kept with rq, rk) takes.  keep / kept as
 * _keep's, or NULL (nothing kept).  The results are bit for bit those of
 * dg_cuda_dr_l2norm_bf16_fwd (f16) on q and k followed by the forward (_keep) of the normalised
 * rows: the tensor-core kernels of gate NONE and HEAD normalise k and q as they load them (no pass
 * of its own over q, k: at S1 on the H100, fwd+bwd ~0.045 ms less, the forward alone ~0.06), the other paths run the norm's kernel
 * first.  qn, kn must not be q or k. */
int dg_cuda_dr_chunk_fwd_l2_bf16(const dg_dr_shape *s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                 const float *g, const uint16_t *beta, const float *h0, uint16_t *o, float *hT,
                                 void *keep, int *kept, double eps, uint16_t *qn, uint16_t *kn, float *rq, float *rk);
int dg_cuda_dr_chunk_fwd_l2_f16(const dg_dr_shape *s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                const float *g, const uint16_t *beta, const float *h0, uint16_t *o, float *hT,
                                void *keep, int *kept, double eps, uint16_t *qn, uint16_t *kn, float *rq, float *rk);
/* Whether those fuse the norm where they can (1, the default) or always run its kernel first (0;
 * tests and benchmarks compare the two).  Returns the previous setting; set it between calls. */
int dg_cuda_dr_chunk_l2_fuse(int on);

#ifdef __cplusplus
}
#endif

#endif
