/* Chunked (WY-form) delta-rule kernels on the GPU: forward and backward of one call descriptor
 * (dg_delta_call, kernels/cpu/delta/delta_call.h) on device pointers, by kernel family.  Plain C
 * header (the ops and tests include it without the CUDA headers).  The backend table
 * (ops/delta/delta_backends.c) has one row per family and runs the first that accepts a call.
 *
 * Semantics and layouts are those of dg_dr_chunk_fwd_f32 / dg_dr_chunk_bwd_f32
 * (kernels/cpu/delta/delta_rule.h, kernels/cpu/delta/chunk_pieces.h):
 *   q, k [B,T,H,K]; v, o [B,T,HV,V]; beta [B,T,HV]; g NULL | [B,T,HV] | [B,T,HV,K] after s->gate
 *   (the per-token log decay); h0, hT [N,HV,K,V]; value head hv reads query/key head hv/(HV/H);
 *   cu_seqlens (B = 1) is the same host array the CPU kernels take (checked, and copied to the
 *   device once per call: one synchronising copy); s->chunk is 16, 32 or 64.
 * Every pointer is a device pointer; h0, hT and every gradient may be NULL (dg must be NULL
 * when g is); gradients are written, not accumulated.  Every backward flag of the call is honoured
 * (dg_delta_bwd_flags: GDN dg from the final dq, dk or from partial terms; dW kept on chip or
 * stored between two kernels; blocked or forward-substitution triangular inverse).  K <= 256; V any.
 * Return 0, or -1 with dg_error set (bad shape or pointer, CUDA failure).  Work is queued on the
 * library's stream (kernels/cuda/cuda_kernels.h).
 *
 * Four kernel families (dg_drc_family):
 *  - DG_DRC_GENERIC: f32 arithmetic, every dtype, gate kind and chunk size;
 *  - DG_DRC_TF32: the generic kernels with their products on TF32 tensor cores (mma.sync m16n8k8:
 *    every product operand rounded to 10 mantissa bits, f32 accumulation; the triangular inverse
 *    stays f32, the per-channel gate's gated products are 3xTF32 or f32): 16-bit calls with
 *    128 < K <= 256, every gate, chunk and V (dr_chunk_blk_mm.cuh); at K = 256 with chunk 64 and
 *    V a multiple of 64 (every gate), its prep, state passes, output pass and the backward's dqkwg
 *    and wy run on mma.sync m16n8k16 instead, with split 16-bit operands as the kernels below but
 *    the states plain (dr_chunk_k256*.cu); a chunk-64 call of 128 < K < 256 or of another V runs
 *    on those, zero-padded to K = 256 and V a multiple of 64 (dr_chunk_pad.cu: exact), and so
 *    does one whose q, k, v, dout (16 bytes) or dv (4) are not aligned (aligned copies);
 *  - DG_DRC_MMA and DG_DRC_KDA_MMA, tensor cores (bf16 and fp16 calls; chunk 64, K <= 128, any V;
 *    force_generic not set: accepts() says whether a call qualifies.  The kernels take K in {64,
 *    128} and V a multiple of 64 with q, k, v, dout and the norm's rows 16-byte aligned and o, dv
 *    4-byte aligned; other K and V, and unaligned rows, run zero-padded to such a shape in aligned
 *    copies (dr_chunk_pad.cu: exact); a head of V other than 64 or 128 runs as V / 128 heads of
 *    128 columns, or V / 64 of 64, that share its key head: dr_chunk_vsplit.cu): the in-chunk
 *    products on mma.sync m16n8k16 with 16-bit operands (bf16, or fp16 for
 *    fp16 calls) and f32 accumulation; operands that are not inputs (W, U, states, the triangular
 *    inverse) are split into two 16-bit terms (hi + lo) so that the products keep about 16 bits
 *    (fp16: about 22), except W and U (and V' with the head gate), which are plain 16-bit words as
 *    in FLA (errors measured per operand: dr_chunk_mma.cuh, Plain).  Gate NONE or HEAD:
 *    dr_chunk_mma_*.cu (built twice: bf16 and fp16); CHANNEL (KDA): dr_chunk_kda_mma_*.cu (built
 *    twice too; W, U, Kd, V', Qg plain: KPlain in dr_chunk_kda.cuh), the gated products as one
 *    tensor-core product on a per-channel reference when the chunk's gate spans <= 80 in every
 *    channel (bf16; factors up to e^{+-40}), <= 12 (fp16, whose largest value is 65504 = e^11.1),
 *    else on 16-row sub-chunk references, whose factors are <= 1.
 * bf16 calls: q, k, v, beta, o, dout, dq, dk, dv, dbeta as bf16 bits (uint16_t); g, dg, h0, hT,
 * dhT, dh0 f32; f32 accumulation.
 * fp16 calls: the same arguments with IEEE binary16 bits (uint16_t: 1 sign, 5 exponent, 10
 * fraction bits) in place of bf16 bits, the same semantics.  On the generic
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

#include "kernels/cpu/delta/delta_call.h"

typedef enum {
    DG_DRC_GENERIC = 0, /* dr_chunk_generic.cu: f32 arithmetic, every call */
    DG_DRC_MMA = 1,     /* dr_chunk_mma_*.cu: tensor cores, gate none or head, bf16 and fp16 */
    DG_DRC_KDA_MMA = 2, /* dr_chunk_kda_mma_*.cu: tensor cores, per-channel gate, bf16 and fp16 */
    DG_DRC_TF32 = 3,    /* dr_chunk_generic_*.cu on TF32 tensor cores: 16-bit, 128 < K <= 256 */
} dg_drc_family;

/* Whether family fam takes call c: a CUDA chunked call of its dtypes, gates and shapes, padded
 * where its kernels need (no error set either way; a shape that no kernel takes is accepted by the
 * generic family and refused with its message by the call). */
bool dg_cuda_dr_chunk_accepts(dg_drc_family fam, const dg_delta_call *c);

/* The forward's working set, kept for the backward (16-bit calls on the tensor-core families, and
 * on the TF32 family at K = 256 where its 16-bit kernels take the whole call).
 * The backward otherwise recomputes from q, k, v, beta, g what the forward made: the gate's
 * cumulative sum, the WY factors W = Ai diag(beta e^G) K and U = Ai diag(beta) V, the inverse
 * Ai = (I + A)^-1, the states entering each chunk and V' (KDA also its gated key copies, P and Qg)
 * -- the prep and state passes, a third of GDN's fwd+bwd at S1, a fifth at S3 (K = V = 256).  A
 * caller with the memory keeps them instead (FLA recomputes; this trades memory for time):
 *   dg_cuda_dr_chunk_kept_bytes: bytes of device memory to keep for c's shape on family fam; 0
 *     when it keeps nothing (the generic kernels, f32); -1 with dg_error on a bad shape.
 *     B8 T2048 H16 K=V=128: GDN 0.54 GB, delta_rule 0.60 GB, KDA 0.81 GB (q, k, v are 67 MB each);
 *     B16 T4096 H8 K=V=256 (S3): 2.0 GB, half of it the states (a 16-bit word an element).  The
 *     forward may still keep nothing (c->kept false: at K = 256 where the 16-bit kernels do not
 *     take the call's pointers); the backward then recomputes.
 *   the forward given c->keep (that many bytes, 16-byte aligned) sets c->kept when it now holds the
 *     working set; the backward given c->keep with c->kept set reads it instead of recomputing
 *     (same shape, inputs and h0 as the forward that kept it).  The GDN/delta_rule substitution
 *     variant recomputes anyway (the kept inverse is the blocked one).  The results equal the
 *     recomputing backward's bit for bit (the same kernels make the same values).
 * The L2 norm (c->l2, 16-bit calls): in the forward, the head-gate and KDA tensor-core kernels
 * normalise k and q as they load them (no pass of its own over q, k), unless c->l2_norm_first; the
 * other paths run the norm's kernel (dg_cuda_dr_l2norm_bf16_fwd / f16) first.  The bits are the
 * same either way.  In the backward (c->l2.rq, rk given) dq and dk come back as the gradients of
 * the raw rows x, r (dy - xn (dy . xn)) with dy the gradient of the normalised ones, and
 * c->l2_done is set: the head-gate tensor-core kernels do it as they store dq, dk, the other paths
 * after.  f32 calls take no L2 norm (l2.on is an error: the caller runs the norm first). */
int64_t dg_cuda_dr_chunk_kept_bytes(dg_drc_family fam, const dg_delta_call *c);

/* The forward (o, hT) and the backward (the gradients) of c on family fam.  Return 0, or -1 with
 * dg_error set (a call the family does not accept, bad shape or pointer, CUDA failure).  Work is
 * queued on the library's stream (kernels/cuda/cuda_kernels.h). */
int dg_cuda_dr_chunk_fwd(dg_drc_family fam, dg_delta_call *c);
int dg_cuda_dr_chunk_bwd(dg_drc_family fam, dg_delta_call *c);

#ifdef __cplusplus
}
#endif

#endif
