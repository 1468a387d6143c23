/* CPU kernels of the network pieces (linear, embedding, norms, short convolution, SwiGLU,
 * cross-entropy) on raw pointers: no tensors, no tape.  Every array is contiguous, row major.
 * Shapes are flattened to rows: N rows of length D (N = product of the leading dims).
 *
 * Each kernel exists for float (_f32) and double (_f64); the body is written once in
 * nn_*_impl.h and instantiated twice.  Reductions of a row (norms, log-sum-exp) accumulate in
 * double for both types.  Gradients are written, not accumulated; a gradient pointer may be NULL
 * when that gradient is not wanted.  Parameter gradients (dw, db) that sum over rows are computed
 * by splitting the columns among threads, so results do not depend on the thread count. */
#ifndef DG_KERNELS_CPU_NN_H
#define DG_KERNELS_CPU_NN_H

#include <stdbool.h>
#include <stdint.h>

#define DG_NN_DECLARE(R, SFX)                                                                                          \
    /* linear: y[N,OUT] = x[N,IN] w[OUT,IN]^T + b[OUT] (b may be NULL) */                                              \
    void dg_nn_linear_fwd_##SFX(int64_t N, int64_t IN, int64_t OUT, const R *x, const R *w, const R *b, R *y);         \
    /* dx = dy w, dw = dy^T x, db = sum_n dy; acc_dx / acc_dw: add to dx / dw instead (dx += dy w) */                  \
    void dg_nn_linear_bwd_##SFX(int64_t N, int64_t IN, int64_t OUT, const R *x, const R *w, const R *dy, R *dx, R *dw, \
                                R *db, bool acc_dx, bool acc_dw);                                                      \
                                                                                                                       \
    /* embedding: y[n,:] = w[ids[n],:], w [V,D]; ids must be in [0,V) (checked by the caller) */                       \
    void dg_nn_embedding_fwd_##SFX(int64_t N, int64_t V, int64_t D, const R *w, const int64_t *ids, R *y);             \
    /* dw[v,:] = sum_{n: ids[n]=v} dy[n,:] */                                                                          \
    void dg_nn_embedding_bwd_##SFX(int64_t N, int64_t V, int64_t D, const int64_t *ids, const R *dy, R *dw);           \
                                                                                                                       \
    /* rms_norm: r_n = 1/sqrt(mean_d x[n,d]^2 + eps), y = x r w (w [D] or NULL = ones);          \
     * rstd[N] receives r (may be NULL) */                     \
    void dg_nn_rms_norm_fwd_##SFX(int64_t N, int64_t D, const R *x, const R *w, double eps, R *y, R *rstd);            \
    void dg_nn_rms_norm_bwd_##SFX(int64_t N, int64_t D, const R *x, const R *w, const R *rstd, const R *dy, R *dx,     \
                                  R *dw);                                                                              \
                                                                                                                       \
    /* gated rms_norm: y = x r w silu(z) (w may be NULL), z [N,D] */                                                   \
    void dg_nn_gated_rms_norm_fwd_##SFX(int64_t N, int64_t D, const R *x, const R *z, const R *w, double eps, R *y,    \
                                        R *rstd);                                                                      \
    void dg_nn_gated_rms_norm_bwd_##SFX(int64_t N, int64_t D, const R *x, const R *z, const R *w, const R *rstd,       \
                                        const R *dy, R *dx, R *dz, R *dw);                                             \
                                                                                                                       \
    /* add_rms_norm: r = h + y (an output too), x = rms_norm(r) w (w may be NULL); rstd [N] */                         \
    void dg_nn_add_rms_norm_fwd_##SFX(int64_t N, int64_t D, const R *h, const R *y, const R *w, double eps, R *x,      \
                                      R *r, R *rstd);                                                                  \
    /* dr_total = dr + (the gradient of x through rms_norm(r) w) = dh = dy; dw = sum_n dx r rstd */                    \
    void dg_nn_add_rms_norm_bwd_##SFX(int64_t N, int64_t D, const R *r, const R *w, const R *rstd, const R *dx,        \
                                      const R *dr, R *dr_total, R *dw);                                                \
                                                                                                                       \
    /* l2norm: r_n = 1/sqrt(sum_d x[n,d]^2 + eps), y = x r */                                                          \
    void dg_nn_l2norm_fwd_##SFX(int64_t N, int64_t D, const R *x, double eps, R *y, R *rstd);                          \
    void dg_nn_l2norm_bwd_##SFX(int64_t N, int64_t D, const R *x, const R *rstd, const R *dy, R *dx);                  \
                                                                                                                       \
    /* causal depthwise conv1d, x [B,T,D], w [D,W], bias [D] or NULL:                             \
     *   p[b,t,d] = bias[d] + sum_{j<W} w[d,j] x[b,t-W+1+j,d]  (x = 0 before t = 0)               \
     *   y = silu(p) if silu else p.  Return 0, or -1 when scratch memory is not available. */                    \
    int dg_nn_conv1d_fwd_##SFX(int64_t B, int64_t T, int64_t D, int64_t W, const R *x, const R *w, const R *bias,      \
                               int silu, R *y);                                                                        \
    int dg_nn_conv1d_bwd_##SFX(int64_t B, int64_t T, int64_t D, int64_t W, const R *x, const R *w, const R *bias,      \
                               int silu, const R *dy, R *dx, R *dw, R *dbias);                                         \
                                                                                                                       \
    /* swiglu: y = silu(g) u, n elements */                                                                            \
    void dg_nn_swiglu_fwd_##SFX(int64_t n, const R *g, const R *u, R *y);                                              \
    void dg_nn_swiglu_bwd_##SFX(int64_t n, const R *g, const R *u, const R *dy, R *dg, R *du);                         \
                                                                                                                       \
    /* cross-entropy, logits [N,C], targets [N]: rows with targets[n] == ignore are not scored;   \
     * loss = sum_scored (lse_n - logits[n,t_n]) / count (0 when count = 0).  lse[N] receives     \
     * the row log-sum-exp (unset on ignored rows).  Targets must be ignore or in [0,C). */                    \
    void dg_nn_cross_entropy_fwd_##SFX(int64_t N, int64_t C, const R *logits, const int64_t *targets, int64_t ignore,  \
                                       R *loss, R *lse, int64_t *count);                                               \
    /* dlogits[n,c] = dloss / count * (softmax[n,c] - [c == t_n]); 0 on ignored rows (dlogits may  \
     * be logits: in place) */                   \
    void dg_nn_cross_entropy_bwd_##SFX(int64_t N, int64_t C, const R *logits, const int64_t *targets, int64_t ignore,  \
                                       const R *lse, double dloss, int64_t count, R *dlogits);                         \
    /* the forward's two halves, for callers that see the rows in chunks (linear_cross_entropy):  \
     * lse on the scored rows; then *total += sum_scored (lse_n - logits[n,t_n]), *count += scored \
     * rows, in row order */                    \
    void dg_nn_cross_entropy_lse_##SFX(int64_t N, int64_t C, const R *logits, const int64_t *targets, int64_t ignore,  \
                                       R *lse);                                                                        \
    void dg_nn_cross_entropy_sum_##SFX(int64_t N, int64_t C, const R *logits, const int64_t *targets, int64_t ignore,  \
                                       const R *lse, double *total, int64_t *count);                                   \
                                                                                                                       \
    /* linear_cross_entropy, x [N,D], w [C,D], targets [N]: cross_entropy(x w^T, targets) with   \
     * the rows in chunks of CH whose logits go to buf [CH,C] (scratch, overwritten): lse [N] and  \
     * the loss, leaving the last chunk's logits in buf; the backward makes each chunk's logits    \
     * again (but the last chunk's when have_last: buf holds them) and writes dx [N,D] and dw      \
     * [C,D] (either may be NULL), or adds to them (acc_dx, acc_dw). */                     \
    void dg_nn_linear_cross_entropy_fwd_##SFX(int64_t N, int64_t D, int64_t C, int64_t CH, const R *x, const R *w,     \
                                              const int64_t *targets, int64_t ignore, R *buf, R *loss, R *lse,         \
                                              int64_t *count);                                                         \
    void dg_nn_linear_cross_entropy_bwd_##SFX(                                                                         \
        int64_t N, int64_t D, int64_t C, int64_t CH, const R *x, const R *w, const int64_t *targets, int64_t ignore,   \
        const R *lse, double dloss, int64_t count, R *buf, bool have_last, R *dx, R *dw, bool acc_dx, bool acc_dw);

DG_NN_DECLARE(float, f32)
DG_NN_DECLARE(double, f64)

/* The exp the f32 kernels use (a vectorisable polynomial; see nn_common.h), for tests. */
float dg_nn_expf_check(float x);

/* First n with ids[n] outside [0,V) (and != skip, when allow_skip), or -1 if all are valid. */
int64_t dg_nn_find_bad_index(int64_t N, const int64_t *ids, int64_t V, int allow_skip, int64_t skip);

#endif
