/* Body of the causal depthwise conv1d kernels (R, FN, EXP defined by nn_conv1d.c).
 * FLA's ShortConvolution / causal_conv1d.  Layout: x, y [B,T,D] (channels contiguous), w [D,W],
 * bias [D].  Zero padding on the left: tap j of output t reads input t - W + 1 + j, so tap W-1 is
 * the current token and y at t never depends on x after t.
 *   p[b,t,d] = bias[d] + sum_{j<W} w[d,j] x[b,t-W+1+j,d],   y = silu(p) or p.
 * The kernels work on rows (b,t) of D channels, so the inner loops run over contiguous d; the
 * taps are first transposed to wt [W,D] for the same reason. */

static inline R FN(conv_sigmoid)(R p) { return (R)1 / ((R)1 + EXP(-p)); }

/* p[b,t,d] for channels d0 <= d < d1 of one row into out[d - d0] */
static inline void FN(conv_row)(int64_t D, int64_t W, const R *xb, const R *wt, const R *bias, int64_t t, int64_t d0,
                                int64_t d1, R *out) {
    for (int64_t d = d0; d < d1; d++) out[d - d0] = bias ? bias[d] : (R)0;
    for (int64_t j = 0; j < W; j++) {
        int64_t s = t - W + 1 + j;
        if (s < 0) continue;
        const R *xs = xb + s * D, *wj = wt + j * D;
        for (int64_t d = d0; d < d1; d++) out[d - d0] += wj[d] * xs[d];
    }
}

/* wt[j,d] = w[d,j]; returns NULL if out of memory */
static R *FN(conv_taps)(int64_t D, int64_t W, const R *w) {
    R *wt = malloc((size_t)(W * D > 0 ? W * D : 1) * sizeof(R));
    if (!wt) return NULL;
    for (int64_t d = 0; d < D; d++)
        for (int64_t j = 0; j < W; j++) wt[j * D + d] = w[d * W + j];
    return wt;
}

int FN(dg_nn_conv1d_fwd)(int64_t B, int64_t T, int64_t D, int64_t W, const R *x, const R *w, const R *bias, int silu,
                         R *y) {
    R *wt = FN(conv_taps)(D, W, w);
    if (!wt) return -1;
#pragma omp parallel for schedule(static) if (B * T * D * W >= DG_NN_PAR_MIN)
    for (int64_t bt = 0; bt < B * T; bt++) {
        int64_t b = bt / T, t = bt % T;
        R *yr = y + bt * D;
        FN(conv_row)(D, W, x + b * T * D, wt, bias, t, 0, D, yr);
        if (silu)
            for (int64_t d = 0; d < D; d++) yr[d] = yr[d] * FN(conv_sigmoid)(yr[d]);
    }
    free(wt);
    return 0;
}

/* Backward in one sweep per (channel block, sequence): threads own blocks of channels, so dw and
 * dbias are sums over (b, t) in order for every channel whatever the thread count, and what a
 * sequence's block needs (dp of its T rows: T x block values) stays in the thread's cache.
 *   forward: y = silu(p), so dp = dy silu'(p) = dy s (1 + p (1 - s)), p recomputed from x;
 *   p[t] += w[:,j] x[t-W+1+j], so x at s collects w[:,j] dp[s+W-1-j] for each tap j whose output
 *   s+W-1-j exists (< T), and dw[d,j] = sum_{b,t} dp[b,t,d] x[b,t-W+1+j,d], dbias[d] = sum dp. */
int FN(dg_nn_conv1d_bwd)(int64_t B, int64_t T, int64_t D, int64_t W, const R *x, const R *w, const R *bias, int silu,
                         const R *dy, R *dx, R *dw, R *dbias) {
    R *wt = FN(conv_taps)(D, W, w);
    if (!wt) return -1;
    int64_t nb = dg_nn_col_blocks(D, B * T * D * W), bsz = (D + nb - 1) / nb;
#if CONV_STREAM
    const int stream = cs_takes(D, W); /* the streaming form (nn_conv1d.c), on blocks of 8k channels */
    if (stream) bsz = (bsz + 7) / 8 * 8;
#else
    const int stream = 0;
#endif
    int fail = 0;
#pragma omp parallel for schedule(static) if (nb > 1)
    for (int64_t ib = 0; ib < nb; ib++) {
        int64_t d0 = dg_nn_min64(D, ib * bsz), d1 = dg_nn_min64(D, d0 + bsz), n = d1 - d0;
        /* dpb [T, n]: dp of one sequence's rows, channels d0..d1 (row form with silu only: else
         * dp = dy); acc [W, n]: dw transposed */
        R *dpb = silu && !stream ? malloc((size_t)(T * n > 0 ? T * n : 1) * sizeof(R)) : NULL;
        R *acc = dw ? malloc((size_t)(W * n > 0 ? W * n : 1) * sizeof(R)) : NULL;
        if ((silu && !stream && !dpb) || (dw && !acc)) {
#pragma omp atomic write
            fail = 1;
            free(dpb);
            free(acc);
            continue;
        }
        if (acc)
            for (int64_t i = 0; i < W * n; i++) acc[i] = 0;
        if (dbias)
            for (int64_t d = d0; d < d1; d++) dbias[d] = 0;
        for (int64_t b = 0; b < B; b++) {
            const R *xb = x + b * T * D, *dyb = dy + b * T * D;
#if CONV_STREAM
            if (stream) {
                for (int64_t d = d0; d < d1; d += 8)
                    cs_bwd_seq(W, T, D, xb, wt, bias, silu, dyb, dx ? dx + b * T * D : NULL, dbias,
                               acc ? acc + (d - d0) : NULL, n, d);
                continue;
            }
#endif
            if (silu)
                for (int64_t t = 0; t < T; t++) {
                    R *dpr = dpb + t * n;
                    const R *dyr = dyb + t * D + d0;
                    FN(conv_row)(D, W, xb, wt, bias, t, d0, d1, dpr); /* p */
                    for (int64_t k = 0; k < n; k++) {
                        R p = dpr[k], sg = FN(conv_sigmoid)(p);
                        dpr[k] = dyr[k] * sg * ((R)1 + p * ((R)1 - sg));
                    }
                }
                /* row t of dp (channels d0..d1) */
#define DP_ROW(t) (silu ? dpb + (t)*n : dyb + (t)*D + d0)
            if (dx)
                for (int64_t s = 0; s < T; s++) {
                    R *dxr = dx + (b * T + s) * D + d0;
                    for (int64_t k = 0; k < n; k++) dxr[k] = 0;
                    for (int64_t j = 0; j < W; j++) {
                        int64_t t = s + W - 1 - j;
                        if (t >= T) continue;
                        const R *dpt = DP_ROW(t), *wj = wt + j * D + d0;
                        for (int64_t k = 0; k < n; k++) dxr[k] += wj[k] * dpt[k];
                    }
                }
            if (dbias || acc)
                for (int64_t t = 0; t < T; t++) {
                    const R *dpt = DP_ROW(t);
                    if (dbias)
                        for (int64_t k = 0; k < n; k++) dbias[d0 + k] += dpt[k];
                    if (!acc) continue;
                    for (int64_t j = 0; j < W; j++) {
                        int64_t s = t - W + 1 + j;
                        if (s < 0) continue;
                        const R *xs = xb + s * D + d0;
                        R *a = acc + j * n;
                        for (int64_t k = 0; k < n; k++) a[k] += dpt[k] * xs[k];
                    }
                }
#undef DP_ROW
        }
        if (dw)
            for (int64_t k = 0; k < n; k++)
                for (int64_t j = 0; j < W; j++) dw[(d0 + k) * W + j] = acc[j * n + k];
        free(dpb);
        free(acc);
    }
    free(wt);
    return fail ? -1 : 0;
}
