/* CPU kernels of the delta-rule family on raw pointers: no tensors, no tape, no allocation policy
 * beyond scratch buffers.  All arrays are contiguous, row major, in FLA's layout:
 *
 *   q, k     [B,T,H,K]        v, o   [B,T,HV,V]       beta  [B,T,HV]
 *   g        NULL (DeltaNet) | [B,T,HV] (GDN, one log-decay per head) | [B,T,HV,K] (KDA, per channel)
 *   h0, hT   [N,HV,K,V]       N = B, or the number of sequences when cu_seqlens is given (B = 1)
 *
 * Value head hv reads query/key head hv / (HV/H) (grouped value heads, GVA).  g is the per-token
 * log decay (<= 0), not its cumulative sum.  Recurrence per sequence and value head, state S [K,V]:
 *   DeltaNet  S_t = (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T
 *   GDN       S_t = exp(g_t) (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T
 *   KDA       S_t = (I - b_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + b_t k_t v_t^T
 *   o_t = S_t^T (scale q_t)
 * Gradients: every pointer d* may be NULL when that gradient is not wanted (dg must be NULL when g
 * is); dhT NULL means no gradient flows into the final state.  Gradients are written, not
 * accumulated. */
#ifndef DG_KERNELS_CPU_DELTA_RULE_H
#define DG_KERNELS_CPU_DELTA_RULE_H

#include <stdint.h>

typedef enum { DG_GATE_NONE = 0, DG_GATE_HEAD = 1, DG_GATE_CHANNEL = 2 } dg_gate_kind;

typedef struct dg_dr_shape {
    int64_t B, T, H, HV, K, V;
    const int64_t *cu_seqlens; /* NULL, or N+1 offsets into T (B must be 1) */
    int64_t N;                 /* number of sequences: B, or len(cu_seqlens) - 1 */
    dg_gate_kind gate;
    double scale;
    int chunk; /* 16, 32 or 64 (chunked kernels only) */
} dg_dr_shape;

/* Backward variants of the chunked kernels in the kernels' own form (see ALGORITHMS.md and the
 * seeds); callers name them through dg_delta_bwd_flags (delta_call.h, dg_delta_bwd_variant), whose
 * zero is this struct's {1, 1, 1}. */
typedef struct dg_dr_variant {
    int gdn_dg_from_final;  /* head gate only: 1 = dg from the final dq, dk; 0 = accumulate partial terms */
    int dw_on_chip;         /* every gate: 1 = inter-chunk + WY backward in one pass, dw never
                             * stored; 0 = two passes, dw stored */
    int solve_tril_blocked; /* 1 = 16x16 diagonal inverses merged; 0 = forward substitution */
} dg_dr_variant;

#define DG_DR_DECLARE(R, SFX)                                                                                          \
    int dg_dr_recurrent_fwd_##SFX(const dg_dr_shape *s, const R *q, const R *k, const R *v, const R *g, const R *beta, \
                                  const R *h0, R *o, R *hT);                                                           \
    int dg_dr_recurrent_bwd_##SFX(const dg_dr_shape *s, const R *q, const R *k, const R *v, const R *g, const R *beta, \
                                  const R *h0, const R *dout, const R *dhT, R *dq, R *dk, R *dv, R *dg, R *dbeta,      \
                                  R *dh0);                                                                             \
    int dg_dr_chunk_fwd_##SFX(const dg_dr_shape *s, const R *q, const R *k, const R *v, const R *g, const R *beta,     \
                              const R *h0, R *o, R *hT);                                                               \
    int dg_dr_chunk_bwd_##SFX(const dg_dr_shape *s, const dg_dr_variant *var, const R *q, const R *k, const R *v,      \
                              const R *g, const R *beta, const R *h0, const R *dout, const R *dhT, R *dq, R *dk,       \
                              R *dv, R *dg, R *dbeta, R *dh0);

DG_DR_DECLARE(float, f32)
DG_DR_DECLARE(double, f64)

#endif
