/* The delta-rule family: DeltaNet (delta_rule), Gated DeltaNet (gated_delta_rule), Kimi Delta
 * Attention (kda), their gates, and the pieces of the chunked algorithm.  Included by deltagrad.h.
 *
 * Shapes follow flash-linear-attention:
 *   q, k   [B,T,H,K]            v, o    [B,T,HV,V]          beta   [B,T,HV]   (in (0,1), or (0,2))
 *   g      [B,T,HV]  (GDN, per-token log decay <= 0)  or  [B,T,HV,K]  (KDA, per channel)
 *   states [N,HV,K,V]  N = B, or the number of sequences with cu_seqlens (then B = 1)
 * HV is a multiple of H; value head hv reads q/k head hv / (HV/H) (grouped value heads).
 * Recurrences (per sequence and value head, S [K,V]):
 *   delta_rule        S_t = (I - b k k^T) S_{t-1} + b k v^T
 *   gated_delta_rule  S_t = exp(g_t) (I - b k k^T) S_{t-1} + b k v^T
 *   kda               S_t = (I - b k k^T) Diag(exp(g_t)) S_{t-1} + b k v^T
 *   o_t = S_t^T (scale q_t)
 * Every input, the initial state and (with use_gate_in_kernel) A_log and dt_bias take gradients; the
 * final state is an output that gradients can flow into.
 * dtypes: f32 or f64 on the CPU; on CUDA f32, or 16-bit storage -- q, k, v, beta (and o and their
 * gradients) bf16 or f16, all four the same, with g, the states, A_log and dt_bias f32 (f32
 * arithmetic inside; tensor cores with 16-bit operands where the shape allows, f32 accumulation).
 * kda in f16 runs the generic kernels (kernels/cuda/delta/dr_chunk_cuda.h says why). */
#ifndef DELTAGRAD_DELTA_H
#define DELTAGRAD_DELTA_H

#include "deltagrad.h" /* dg_tensor (a no-op when deltagrad.h includes this file) */

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    DG_DELTA_CHUNKED = 0,   /* the WY / chunked form (default) */
    DG_DELTA_RECURRENT = 1, /* token by token */
} dg_delta_algorithm;

/* Options of delta_rule, gated_delta_rule and kda.  Zero-initialised = the defaults. */
typedef struct dg_delta_opts {
    double scale;             /* 0: 1/sqrt(K) */
    dg_tensor *initial_state; /* [N,HV,K,V] or NULL (zeros) */
    bool output_final_state;  /* return the final state through *final_state */
    int chunk_size;           /* 16, 32 or 64; 0 = 64 */
    dg_delta_algorithm algorithm;
    bool use_qk_l2norm_in_kernel; /* q, k <- q/sqrt(|q|^2+1e-6), k likewise, inside the op */
    /* The gate inside the op (FLA's use_gate_in_kernel): g is then the raw `a` and the decay is
     * -exp(A_log) * softplus(a + dt_bias); gated_delta_rule and kda only.
     * A_log [HV]; dt_bias [HV] (GDN) or [HV*K] (KDA), or NULL. */
    bool use_gate_in_kernel;
    dg_tensor *A_log, *dt_bias;
    dg_tensor *cu_seqlens; /* i64 [N+1]: 0 = c_0 <= c_1 <= ... <= c_N = T, with B = 1 */
    /* Backward variant by name for this call (NULL: DG_BACKWARD=op:variant, else the algorithm's
     * default).  delta_rule: "chunk", "subst", "recurrent".  gated_delta_rule: "dg_final" (dg from
     * the final dq, dk), "dg_partial" (dg accumulated through partial terms), "subst" (dg_final with
     * forward substitution in the WY inverse), "recurrent".  kda: "fused" (dw never
     * stored; the chunked default), "unfused" (dw stored between two passes), "subst",
     * "recurrent".  With algorithm = RECURRENT the default is "recurrent".  A name that is not
     * one of these is an error that lists them. */
    const char *backward;
    /* CUDA, bf16 or fp16, chunked (on the tensor-core paths): the forward keeps its working set (the WY factors, the states entering
     * each chunk, V', the inverse; about 8 times the bytes of v for GDN at K=V=128) for the
     * backward, which then skips recomputing it (a third of GDN's fwd+bwd time at B8 T2048 H16).
     * On every device the forward also keeps the results of the fused L2 norm (the normalised q, k
     * and their 1/|x|) and of the fused gate, which the backward would otherwise make again.
     * Set this to recompute instead (FLA's way: less memory, slower backward).  Kept only when the
     * call records for autograd; the results are the same either way. */
    bool recompute_in_backward;
} dg_delta_opts;

/* Each returns o [B,T,HV,V] (NULL on error, with dg_last_error() naming op, argument and shapes)
 * and, when opts->output_final_state and final_state is not NULL, the final state [N,HV,K,V] in
 * *final_state (same ownership as o: the innermost scope).  opts may be NULL. */
dg_tensor *dg_delta_rule(dg_tensor *q, dg_tensor *k, dg_tensor *v, dg_tensor *beta, const dg_delta_opts *opts,
                         dg_tensor **final_state);
dg_tensor *dg_gated_delta_rule(dg_tensor *q, dg_tensor *k, dg_tensor *v, dg_tensor *g, dg_tensor *beta,
                               const dg_delta_opts *opts, dg_tensor **final_state);
dg_tensor *dg_kda(dg_tensor *q, dg_tensor *k, dg_tensor *v, dg_tensor *g, dg_tensor *beta, const dg_delta_opts *opts,
                  dg_tensor **final_state);

/* Gates: g = -exp(A_log) * softplus(a + dt_bias) (softplus(x) = x above 20).
 * gdn_gate: a [B,T,HV], A_log [HV], dt_bias [HV] or NULL -> g [B,T,HV].
 * kda_gate: a [B,T,HV,K], A_log [HV] (broadcast over K), dt_bias [HV*K] or NULL -> [B,T,HV,K]. */
dg_tensor *dg_gdn_gate(dg_tensor *a, dg_tensor *A_log, dg_tensor *dt_bias);
dg_tensor *dg_kda_gate(dg_tensor *a, dg_tensor *A_log, dg_tensor *dt_bias);

/* Pieces of the chunked algorithm, as ops of their own (chunk_size 16, 32 or 64; chunks restart at
 * every sequence start; cu_seqlens NULL or i64 [N+1] with B = 1).
 * chunk_local_cumsum: g [B,T,H] or [B,T,H,S] -> the cumulative sum inside each chunk (from the
 *   chunk start to t; reverse: from t to the chunk end).
 * chunk_scaled_dot_kkt: k [B,T,H,K], beta [B,T,HV], g_cumsum NULL | [B,T,HV] | [B,T,HV,K] (a
 *   chunk_local_cumsum of the log decay) -> A [B,T,HV,C] with, for token t at chunk position i and
 *   j < i, A[t,hv,j] = beta[t,hv] sum_c k[t,c] k[t_j,c] exp(G[t,c] - G[t_j,c]); 0 for j >= i.
 * solve_tril: A [B,T,HV,C] (only j < i read) -> (I + A)^-1 per chunk, same layout.  blocked: 16x16
 *   diagonal-block inverses merged to 32/64 (else forward substitution); the backward recomputes the
 *   inverse the same way (backward variants "blocked", "subst"). */
dg_tensor *dg_chunk_local_cumsum(dg_tensor *g, int chunk_size, bool reverse, dg_tensor *cu_seqlens);
dg_tensor *dg_chunk_scaled_dot_kkt(dg_tensor *k, dg_tensor *beta, dg_tensor *g_cumsum, int chunk_size,
                                   dg_tensor *cu_seqlens);
dg_tensor *dg_solve_tril(dg_tensor *A, int chunk_size, dg_tensor *cu_seqlens, bool blocked);

#ifdef __cplusplus
}
#endif

#endif
