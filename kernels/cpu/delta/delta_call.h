/* One call of a delta-rule kernel: the problem (shapes, gate, dtype, device, algorithm), the backward
 * variant, the tensors and the options, in one plain C struct.  Every backend of the family (a CPU or
 * CUDA kernel family: ops/delta/delta_backends.c) takes it whole, so no entry point of the family
 * takes more than a couple of arguments, and an option is a field of the call, not a switch of the
 * process.  Plain C: the CPU kernels, the CUDA kernels (dr_chunk_cuda.h), the ops and the tools
 * include it.
 *
 * Layouts are those of delta_rule.h (q, k [B,T,H,K]; v, o [B,T,HV,V]; beta [B,T,HV]; g absent,
 * [B,T,HV] or [B,T,HV,K] after the gate; h0, hT [N,HV,K,V]).  Pointers are on `device`; each may be
 * NULL where the call has no such tensor or does not want that gradient (dg must be NULL when g
 * is).  Storage dtypes: q, k, v, beta, o and their gradients in `dtype` (f32 / f64 on the CPU; f32,
 * bf16 or f16 bits on CUDA); g, h0, hT, dhT, dh0, dg and the L2 norm's 1/|x| in f32 with 16-bit
 * storage, else in `dtype`.  s.cu_seqlens is always a host array.
 *
 * A zero-initialised call (then the shape, pointers, dtype and device filled in) is the default
 * one: the chunked algorithm, the default backward variant, the norm fused where the kernels can,
 * the fastest kernel family that accepts the call. */
#ifndef DG_KERNELS_CPU_DELTA_CALL_H
#define DG_KERNELS_CPU_DELTA_CALL_H

#include <stdbool.h>
#include <stdint.h>

#include "deltagrad.h"
#include "kernels/cpu/delta/delta_rule.h"

/* The backward variant of the chunked kernels: each flag says what it changes, for which gate
 * (docs/ALGORITHMS.md).  All zero: the default, the fastest on both devices.  The
 * recurrent kernels ignore them. */
typedef struct dg_delta_bwd_flags {
    /* head gate (GDN) only: dg accumulated through the partial terms of every piece, instead of
     * from the final dq, dk: dg = rowsum(dq o q) - rowsum(dk o k) + the state term */
    bool dg_from_partials;
    /* every gate: the inter-chunk backward (dq, dk, dw, dg) and the WY backward as two passes with
     * dW stored between them, instead of one pass that keeps dW on chip */
    bool dw_stored;
    /* every gate: the inverse (I + A)^-1 by forward substitution, instead of merged 16x16
     * diagonal-block inverses */
    bool tril_substitution;
} dg_delta_bwd_flags;

/* the flags in the chunked kernels' own form (dg_dr_variant, delta_rule.h) */
static inline dg_dr_variant dg_delta_bwd_variant(dg_delta_bwd_flags f) {
    dg_dr_variant v = {!f.dg_from_partials, !f.dw_stored, !f.tril_substitution};
    return v;
}

/* The L2 norm of q and k inside the call (use_qk_l2norm_in_kernel), eps DG_DELTA_L2NORM_EPS.
 * Forward (on): q, k of the call receive the normalised rows of qraw, kraw and rq, rk their 1/|x|,
 * made by the forward's own kernels where they take the norm in their loads, else by the norm's
 * kernel first.  for_bwd false: nothing will read q, rq, rk after the call (a forward that does
 * not record): the fused kernels then do not write them (k is always written).
 * Backward (rq, rk given, q and k the normalised rows): where the kernels take the norm's backward
 * with them, dq and dk come back as the gradients of the raw rows and the call's l2_done is set;
 * else they are those of the normalised rows and the caller runs the norm's backward. */
#define DG_DELTA_L2NORM_EPS 1e-6
typedef struct dg_delta_l2 {
    bool on;
    const void *qraw, *kraw;
    void *rq, *rk;
    bool for_bwd;
} dg_delta_l2;

typedef struct dg_delta_call {
    const char *op; /* names the call in messages ("gated_delta_rule", "bench", ...) */
    dg_dr_shape s;  /* B, T, H, HV, K, V, cu_seqlens, N, gate, scale, chunk */
    dg_dtype dtype; /* storage dtype of q, k, v, beta, o and their gradients */
    dg_device device;
    int algorithm; /* dg_delta_algorithm: DG_DELTA_CHUNKED (0) or DG_DELTA_RECURRENT */
    dg_delta_bwd_flags bwd;

    /* forward: reads q, k, v, g, beta, h0; writes o, hT */
    const void *q, *k, *v, *g, *beta, *h0;
    void *o, *hT;
    /* backward: reads the forward's inputs and dout, dhT; writes the gradients */
    const void *dout, *dhT;
    void *dq, *dk, *dv, *dg, *dbeta, *dh0;

    /* refuse the tensor-core kernel families: the generic kernels take the call (tests and
     * benchmarks compare the two) */
    bool force_generic;

    dg_delta_l2 l2;
    /* the norm's kernel first, then the forward of the normalised rows, even where the kernels could
     * take the norm in their loads (tests and benchmarks compare the two; the bits are the same) */
    bool l2_norm_first;

    /* The forward's working set kept for the backward (kernel families that can: the CUDA
     * tensor-core ones): keep is device memory of the backend's kept_bytes(call), 16-byte aligned,
     * or NULL.  The forward sets kept when it filled keep; a backward given keep with kept set
     * reads it instead of recomputing (the same bits). */
    void *keep;
    bool kept;

    /* out, backward: the kernels applied the L2 norm's backward (see dg_delta_l2) */
    bool l2_done;
} dg_delta_call;

/* q, k, v, beta and o in 16-bit words (bf16 or f16), the gates and states f32 */
static inline bool dg_delta_call_storage16(const dg_delta_call *c) { return c->dtype == DG_BF16 || c->dtype == DG_F16; }

#endif
