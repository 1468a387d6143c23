/* CUDA kernels of the network pieces (the device twins of kernels/cpu/nn.h) and of the optimiser,
 * on raw device pointers: no tensors, no tape.  Plain C: the op files include it without the
 * CUDA headers (under #ifdef DG_HAVE_CUDA).
 *
 * Same layouts and semantics as the CPU kernels (kernels/cpu/nn.h): every array contiguous, row
 * major; [..., D] is N rows of D.  dt is DG_F32, DG_F64 or DG_BF16 and names the type of every
 * float pointer, except where a comment says otherwise (the saved row statistics rstd and lse and
 * the loss of cross-entropy are f32 when dt is bf16).  Row reductions (norms, log-sum-exp) and
 * sums over rows (dw, dbias, the embedding's scatter-add, the loss) accumulate in double for f32
 * and f64, in f32 for bf16 (bf16 is storage only: values are loaded to f32, computed in f32, and
 * each output and gradient is rounded once to bf16), in an order fixed by the shape alone: no
 * atomics on floats, so every result is reproducible bit for bit on a given device.
 * Gradients are written, not accumulated; a gradient pointer may be NULL when not wanted.
 *
 * Every entry point returns 0, or -1 with dg_error set (the failing CUDA call or kernel named);
 * work is queued on the library's stream (kernels/cuda/runtime.cu).  Only the index checks and
 * dg_cuda_sumsq_many synchronise (they return values to the host). */
#ifndef DG_KERNELS_CUDA_NN_CUDA_H
#define DG_KERNELS_CUDA_NN_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#include "deltagrad.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- normalisations over the last dim (nn_norm.cu) -------------------------------------------- */
/* rms_norm: r_n = 1/sqrt(mean_d x[n,d]^2 + eps), y = x r w (w [D] or NULL = ones); rstd [N] or NULL */
int dg_cuda_rms_norm_fwd(dg_dtype dt, int64_t N, int64_t D, const void *x, const void *w, double eps, void *y,
                         void *rstd);
/* dx = r (g - x r^2 mean(g x)), g = dy w;  dw = sum_n dy x r */
int dg_cuda_rms_norm_bwd(dg_dtype dt, int64_t N, int64_t D, const void *x, const void *w, const void *rstd,
                         const void *dy, void *dx, void *dw);
/* gated: y = x r w silu(z), z [N,D] */
int dg_cuda_gated_rms_norm_fwd(dg_dtype dt, int64_t N, int64_t D, const void *x, const void *z, const void *w,
                               double eps, void *y, void *rstd);
int dg_cuda_gated_rms_norm_bwd(dg_dtype dt, int64_t N, int64_t D, const void *x, const void *z, const void *w,
                               const void *rstd, const void *dy, void *dx, void *dz, void *dw);
/* add_rms_norm: r = h + y, x = r q w, q = 1/sqrt(mean(r^2) + eps) (rstd receives q);  x, r [N,D]
 * outputs, h, y [N,D] inputs */
int dg_cuda_add_rms_norm_fwd(dg_dtype dt, int64_t N, int64_t D, const void *h, const void *y, const void *w, double eps,
                             void *x, void *r, void *rstd);
/* dr_total = dr + q (g - r q^2 mean(g r)), g = dx w: the gradient of h and of y (one array);
 * dw = sum_n dx r q.  r is the forward's stored sum (the forward normalises it as stored). */
int dg_cuda_add_rms_norm_bwd(dg_dtype dt, int64_t N, int64_t D, const void *r, const void *w, const void *rstd,
                             const void *dx, const void *dr, void *dr_total, void *dw);
/* l2norm: r_n = 1/sqrt(sum_d x^2 + eps), y = x r;  dx = r (dy - y sum(dy y)) */
int dg_cuda_l2norm_fwd(dg_dtype dt, int64_t N, int64_t D, const void *x, double eps, void *y, void *rstd);
int dg_cuda_l2norm_bwd(dg_dtype dt, int64_t N, int64_t D, const void *x, const void *rstd, const void *dy, void *dx);

/* ---- causal depthwise conv1d (nn_conv1d.cu), x [B,T,D], w [D,W], bias [D] or NULL ------------- */
/* p[b,t,d] = bias[d] + sum_{j<W} w[d,j] x[b,t-W+1+j,d] (zero before t = 0); y = silu(p) or p */
int dg_cuda_conv1d_fwd(dg_dtype dt, int64_t B, int64_t T, int64_t D, int64_t W, const void *x, const void *w,
                       const void *bias, bool silu, void *y);
int dg_cuda_conv1d_bwd(dg_dtype dt, int64_t B, int64_t T, int64_t D, int64_t W, const void *x, const void *w,
                       const void *bias, bool silu, const void *dy, void *dx, void *dw, void *dbias);

/* ---- sums over rows (nn_util.cu) -------------------------------------------------------------- */
/* out[m] = sum_n x[n,m], x [N,M] contiguous (a bias gradient) */
int dg_cuda_nn_sum_rows(dg_dtype dt, int64_t N, int64_t M, const void *x, void *out);

/* ---- swiglu (nn_swiglu.cu): y = silu(g) u over n elements ------------------------------------- */
int dg_cuda_swiglu_fwd(dg_dtype dt, int64_t n, const void *g, const void *u, void *y);
int dg_cuda_swiglu_bwd(dg_dtype dt, int64_t n, const void *g, const void *u, const void *dy, void *dg, void *du);

/* ---- indices (nn_util.cu) ---------------------------------------------------------------------- */
/* The first n (in order) with ids[n] outside [0,V) and, when allow_skip, != skip: *bad_pos = n and
 * *bad_val = ids[n], or *bad_pos = -1 when every id is valid.  ids is a device array of N i64.
 * Synchronises (the answer is copied to the host); inside a CUDA graph capture it checks nothing
 * and reports every id valid: the capture's owner checks them on the host (graph.cu). */
int dg_cuda_find_bad_index(int64_t N, const int64_t *ids, int64_t V, bool allow_skip, int64_t skip, int64_t *bad_pos,
                           int64_t *bad_val);

/* ---- embedding (nn_embedding.cu), w [V,D], ids [N] in [0,V) (checked by the caller) ----------- */
int dg_cuda_embedding_fwd(dg_dtype dt, int64_t N, int64_t V, int64_t D, const void *w, const int64_t *ids, void *y);
/* dw[v,:] = sum_{n: ids[n] = v} dy[n,:], summed in increasing n: the positions are sorted by id
 * with a stable radix sort, then each (v, d) sums its run.  N < 2^31. */
int dg_cuda_embedding_bwd(dg_dtype dt, int64_t N, int64_t V, int64_t D, const int64_t *ids, const void *dy, void *dw);

/* ---- cross-entropy (nn_cross_entropy.cu), logits [N,C], targets [N] --------------------------- */
/* lse[n] = log sum_c exp(logits[n,c]) on scored rows (ignored rows: 0); loss[0] = mean over
 * scored rows of lse - logits[n,t_n] (0 when none); count[0] (device i64) = scored rows. */
int dg_cuda_cross_entropy_fwd(dg_dtype dt, int64_t N, int64_t C, const void *logits, const int64_t *targets,
                              int64_t ignore, void *loss, void *lse, int64_t *count);
/* dlogits = dloss[0] / count[0] (softmax - onehot(t)), 0 on ignored rows; dloss and count are
 * device scalars (no synchronisation). */
int dg_cuda_cross_entropy_bwd(dg_dtype dt, int64_t N, int64_t C, const void *logits, const int64_t *targets,
                              int64_t ignore, const void *lse, const void *dloss, const int64_t *count, void *dlogits);
/* The same with dlogits of dtype out_dt: dt itself, or bf16 for f32 logits.  With out_dt == dt,
 * dlogits may be logits (in place). */
int dg_cuda_cross_entropy_grad(dg_dtype dt, dg_dtype out_dt, int64_t N, int64_t C, const void *logits,
                               const int64_t *targets, int64_t ignore, const void *lse, const void *dloss,
                               const int64_t *count, void *dlogits);
/* The forward's two passes, for rows seen in chunks (linear_cross_entropy), f32 or f64 logits:
 * rows writes lse [N] (0 on ignored rows) and term[n] = lse_n - logits[n,t_n] (0 on ignored rows),
 * in f64; loss then adds the scored terms of all N rows in a fixed order: loss[0] = their sum /
 * count (0 when none), count[0] (device i64) = scored rows.  Nothing is read back. */
int dg_cuda_cross_entropy_rows(dg_dtype dt, int64_t N, int64_t C, const void *logits, const int64_t *targets,
                               int64_t ignore, void *lse, double *term);
int dg_cuda_cross_entropy_loss(dg_dtype dt, int64_t N, const int64_t *targets, int64_t ignore, const double *term,
                               void *loss, int64_t *count);

/* ---- optimiser (nn_optim.cu) ------------------------------------------------------------------ */
/* The AdamW update and the multi-tensor step: kernels/cuda/optim_cuda.h. */
/* out[t] = sum_i x[t][i]^2 in double for the count tensors x[t] of n[t] elements of dtype dt[t]
 * (f32 or f64): every sum is queued on the stream, then one copy brings them all to the host
 * (one synchronisation for all, not one per tensor: the gradient norm of a model). */
int dg_cuda_sumsq_many(int count, const dg_dtype *dt, const int64_t *n, const void *const *x, double *out);

#ifdef __cplusplus
}
#endif

#endif
