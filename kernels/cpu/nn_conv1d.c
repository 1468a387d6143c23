/* causal depthwise conv1d (short convolution) on the CPU (nn_conv1d_impl.h).  The backward in f32
 * with widths up to 4 and channels in groups of 8 runs the streaming form below; everything else
 * the row form of nn_conv1d_impl.h.  Both do the same operations in the same order for every
 * channel (no fused multiply-adds: -std=c11 turns GCC's contraction off), so they give the same
 * bits. */
#include "kernels/cpu/nn.h"
#include "kernels/cpu/nn_common.h"

#include <stdlib.h>

/* ---- f32, the streaming backward ----
 * One sequence and one group of 8 channels at a time, t walking forward with the last W inputs
 * and the last W values of dp in registers: x and dy are read once and dx written once, where the
 * row form reads each input row W times and goes through a buffer of dp.  (The forward gains
 * nothing from it: its row form reads rows once from the cache, and whole rows.)  W is a constant
 * in each instance (cs_bwd is instantiated for W = 1..4). */
typedef float cv8 __attribute__((vector_size(32)));
typedef uint32_t cu8 __attribute__((vector_size(32)));
#define CS_MAXW 4

static inline cv8 cv8_load(const float *p) {
    cv8 v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void cv8_store(float *p, cv8 v) { memcpy(p, &v, sizeof v); }
static inline cv8 cv8_splat(float x) { return (cv8){x, x, x, x, x, x, x, x}; }

/* dg_nn_expf (nn_common.h) on 8 lanes: the loop vectorises (the function is written for it) */
static inline cv8 cv8_exp(cv8 x) {
    cv8 y;
    for (int i = 0; i < 8; i++) y[i] = dg_nn_expf(x[i]);
    return y;
}
static inline cv8 cv8_sigmoid(cv8 p) { return 1.0f / (1.0f + cv8_exp(-p)); }

/* p[t] = bias + sum_j w_j x[t-W+1+j] over the taps whose input exists, xw[j] = x[t-W+1+j] */
static inline __attribute__((always_inline)) cv8 cs_p(const int W, int64_t t, cv8 bv, const cv8 *wv, const cv8 *xw) {
    cv8 p = bv;
    for (int j = 0; j < W; j++)
        if (t - W + 1 + j >= 0) p = p + wv[j] * xw[j];
    return p;
}

/* The backward of sequence b, channels d..d+8: dx written, dbias[d..] and acc (dw transposed,
 * row j at acc + j * lda) added to in t order. */
static inline __attribute__((always_inline)) void cs_bwd(const int W, int64_t T, int64_t D, const float *xb,
                                                         const float *wt, const float *bias, int silu, const float *dyb,
                                                         float *dxb, float *dbias, float *acc, int64_t lda, int64_t d) {
    cv8 wv[CS_MAXW], xw[CS_MAXW], dpw[CS_MAXW], aw[CS_MAXW];
    for (int j = 0; j < W; j++) {
        wv[j] = cv8_load(wt + j * D + d), xw[j] = dpw[j] = cv8_splat(0);
        aw[j] = acc ? cv8_load(acc + j * lda) : cv8_splat(0);
    }
    const cv8 bv = bias ? cv8_load(bias + d) : cv8_splat(0);
    cv8 db = dbias ? cv8_load(dbias + d) : cv8_splat(0);
    for (int64_t t = 0; t < T; t++) {
        for (int j = 0; j + 1 < W; j++) xw[j] = xw[j + 1], dpw[j] = dpw[j + 1];
        xw[W - 1] = cv8_load(xb + t * D + d);
        cv8 dp = cv8_load(dyb + t * D + d);
        if (silu) { /* y = silu(p): dp = dy s (1 + p (1 - s)) */
            const cv8 p = cs_p(W, t, bv, wv, xw), sg = cv8_sigmoid(p);
            dp = dp * sg * (1.0f + p * (1.0f - sg));
        }
        dpw[W - 1] = dp;
        if (dxb && t >= W - 1) { /* dx[t-W+1] = sum_j w_j dp[t-j]: every term is known now */
            cv8 v = cv8_splat(0);
            for (int j = 0; j < W; j++) v = v + wv[j] * dpw[W - 1 - j];
            cv8_store(dxb + (t - W + 1) * D + d, v);
        }
        if (dbias) db = db + dp;
        if (acc)
            for (int j = 0; j < W; j++)
                if (t - W + 1 + j >= 0) aw[j] = aw[j] + dp * xw[j];
    }
    /* the last W-1 rows of dx: the taps whose output lies past T have nothing to add */
    for (int64_t s = T - W + 1 > 0 ? T - W + 1 : 0; dxb && s < T; s++) {
        cv8 v = cv8_splat(0);
        for (int j = 0; j < W; j++) {
            const int64_t t = s + W - 1 - j;
            if (t < T) v = v + wv[j] * dpw[W - 1 - (T - 1 - t)];
        }
        cv8_store(dxb + s * D + d, v);
    }
    if (dbias) cv8_store(dbias + d, db);
    if (acc)
        for (int j = 0; j < W; j++) cv8_store(acc + j * lda, aw[j]);
}

/* Whether the streaming form takes a call (f32; the channel blocks of the backward are multiples
 * of 8 when D is) */
static int cs_takes(int64_t D, int64_t W) { return W >= 1 && W <= CS_MAXW && D % 8 == 0; }

static void cs_bwd_seq(int64_t W, int64_t T, int64_t D, const float *xb, const float *wt, const float *bias, int silu,
                       const float *dyb, float *dxb, float *dbias, float *acc, int64_t lda, int64_t d) {
    switch (W) {
    case 1: cs_bwd(1, T, D, xb, wt, bias, silu, dyb, dxb, dbias, acc, lda, d); break;
    case 2: cs_bwd(2, T, D, xb, wt, bias, silu, dyb, dxb, dbias, acc, lda, d); break;
    case 3: cs_bwd(3, T, D, xb, wt, bias, silu, dyb, dxb, dbias, acc, lda, d); break;
    default: cs_bwd(4, T, D, xb, wt, bias, silu, dyb, dxb, dbias, acc, lda, d); break;
    }
}

#define R float
#define FN(name) name##_f32
#define EXP dg_nn_expf
#define CONV_STREAM 1
#include "kernels/cpu/nn_conv1d_impl.h"
#undef R
#undef FN
#undef EXP
#undef CONV_STREAM

#define R double
#define FN(name) name##_f64
#define EXP exp
#define CONV_STREAM 0
#include "kernels/cpu/nn_conv1d_impl.h"
#undef R
#undef FN
#undef EXP
#undef CONV_STREAM
