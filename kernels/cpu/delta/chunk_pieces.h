/* The pieces of the chunked delta-rule kernels as standalone CPU kernels, forward and backward,
 * f32 and f64 (bodies in dr_chunk_pieces_impl.h, written once).  They compute exactly what the
 * fused kernels of delta_rule.h compute inside (same per-chunk code), so ops built on them can be
 * checked against those kernels piece by piece.
 *
 * Chunks: every sequence is cut into chunks of C = s->chunk rows (16, 32 or 64) starting at the
 * sequence start; the last chunk of a sequence may be partial (L < C rows).  Sequences: without
 * cu_seqlens, batch b is a sequence of T tokens (N = B); with cu_seqlens (B = 1, N + 1 offsets,
 * cu[0] = 0, cu[N] = T, non-decreasing), sequence n is tokens cu[n] .. cu[n+1]-1.  A token's
 * "position" i is its index within its chunk (0 .. L-1); "key j of t's chunk" is the token at
 * position j of the chunk that holds t.
 *
 * All arrays are contiguous row major.  Return value: 0, or -1 after dg_error() (bad shape: the
 * message names the argument; NULL required pointer; out of memory).  Outputs are written, never
 * accumulated.  A gradient pointer may be NULL when that gradient is not wanted. */
#ifndef DG_KERNELS_CPU_CHUNK_PIECES_H
#define DG_KERNELS_CPU_CHUNK_PIECES_H

#include <stdint.h>

#include "kernels/cpu/delta/delta_rule.h"

/* ---- chunk_local_cumsum ----
 * x, out: [B,T,H,S] (S = 1 for a per-head gate [B,T,H]).
 *   forward (reverse = 0):  out[t] = sum of x[t'] over t' in t's chunk with position(t') <= position(t)
 *   reverse (reverse = 1):  out[t] = sum over t' in t's chunk with position(t') >= position(t)
 * per (b, h, s) independently.  The backward of one direction is the other direction applied to the
 * incoming gradient: dg_chunk_local_cumsum_bwd(reverse, dout) = fwd(!reverse, dout).  Uses B, T,
 * cu_seqlens, N (N = B without cu_seqlens) and chunk.  out may alias x.
 *
 * ---- chunk_scaled_dot_kkt ----
 * k [B,T,H,K], beta [B,T,HV], g: NULL (s->gate NONE) | [B,T,HV] (HEAD) | [B,T,HV,K] (CHANNEL), the
 * CUMULATIVE chunk-local gate (chunk_local_cumsum of the per-token log decay).
 * A [B,T,HV,C]: for token t (value head hv, key head h = hv/(HV/H)) at position i, and j < i:
 *   A[t,hv,j] = beta[t,hv] * sum_c k[t,h,c] k[tj,h,c] exp(G[t,hv,c] - G[tj,hv,c])
 * (tj = key j of t's chunk; HEAD: exponent G[t,hv] - G[tj,hv] for every c; NONE: no exp);
 * A[t,hv,j] = 0 for j >= i (the diagonal, above it, and past the end of a partial chunk).
 * Backward: dA is read only where A can be nonzero (j < i); dk [B,T,H,K] (summed over the value
 * heads of each key head), dbeta [B,T,HV], dg shaped like g (gradient w.r.t. the cumulative gate).
 * Uses s->B, T, H, HV, K, cu_seqlens, N, gate, chunk (V and scale are ignored).
 *
 * ---- solve_tril ----
 * A [B,T,HV,C] holds per chunk and value head an L x L strictly lower matrix (row = position i of
 * token t, column j; only j < i is read).  Ainv [B,T,HV,C] = (I + A)^-1 in the same layout: lower
 * triangular with unit diagonal, Ainv[t,hv,j] = 0 for j > i.  blocked = 1: invert the 16 x 16
 * diagonal blocks and merge them into 32 x 32 / 64 x 64; 0: forward substitution.
 * Backward: dA = strictly_lower( -Ainv^T dAinv Ainv^T ) per chunk, where only the lower part
 * (j <= i) of dAinv is read (the upper part of Ainv is identically zero); dA is 0 for j >= i.
 * Uses s->B, T, HV, cu_seqlens, N, chunk (H, K, V, gate and scale are ignored). */
#define DG_CHUNK_PIECES_DECLARE(R, SFX)                                                                             \
    int dg_chunk_local_cumsum_fwd_##SFX(int64_t B, int64_t T, int64_t H, int64_t S, const int64_t *cu_seqlens,      \
                                        int64_t N, int chunk, int reverse, const R *x, R *out);                     \
    int dg_chunk_local_cumsum_bwd_##SFX(int64_t B, int64_t T, int64_t H, int64_t S, const int64_t *cu_seqlens,      \
                                        int64_t N, int chunk, int reverse, const R *dout, R *dx);                   \
    int dg_chunk_scaled_dot_kkt_fwd_##SFX(const dg_dr_shape *s, const R *k, const R *beta, const R *g, R *A);       \
    int dg_chunk_scaled_dot_kkt_bwd_##SFX(const dg_dr_shape *s, const R *k, const R *beta, const R *g, const R *dA, \
                                          R *dk, R *dbeta, R *dg);                                                  \
    int dg_solve_tril_fwd_##SFX(const dg_dr_shape *s, int blocked, const R *A, R *Ainv);                            \
    int dg_solve_tril_bwd_##SFX(const dg_dr_shape *s, const R *Ainv, const R *dAinv, R *dA);

DG_CHUNK_PIECES_DECLARE(float, f32)
DG_CHUNK_PIECES_DECLARE(double, f64)

#endif
