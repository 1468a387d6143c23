/* Body of the causal depthwise conv1d kernels (R, FN, EXP defined by nn_conv1d.c).
 * FLA's ShortConvolution / causal_conv1d.  Layout: x, y [B,T,D] (channels contiguous), w [D,W],
 * bias [D].  Zero padding on the left: tap j of output t reads input t - W + 1 + j, so tap W-1 is
 * the current token and y at t never depends on x after t.
 *   p[b,t,d] = bias[d] + sum_{j<W} w[d,j] x[b,t-W+1+j,d],   y = silu(p) or p.
 * The kernels work on rows (b,t) of D channels, so the inner loops run over contiguous d; the
 * taps are first transposed to wt [W,D] for the same reason. */

static inline R FN(conv_sigmoid)(R p) { return (R)1 / ((R)1 + EXP(-p)); }

/* p[b,t,:] for one row into out (length D) */
static inline void FN(conv_row)(int64_t T, int64_t D, int64_t W, const R *xb, const R *wt, const R *bias, int64_t t,
                                R *out) {
    for (int64_t d = 0; d < D; d++) out[d] = bias ? bias[d] : (R)0;
    for (int64_t j = 0; j < W; j++) {
        int64_t s = t - W + 1 + j;
        if (s < 0) continue;
        const R *xs = xb + s * D, *wj = wt + j * D;
        for (int64_t d = 0; d < D; d++) out[d] += wj[d] * xs[d];
    }
    (void)T;
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
        FN(conv_row)(T, D, W, x + b * T * D, wt, bias, t, yr);
        if (silu)
            for (int64_t d = 0; d < D; d++) yr[d] = yr[d] * FN(conv_sigmoid)(yr[d]);
    }
    free(wt);
    return 0;
}

int FN(dg_nn_conv1d_bwd)(int64_t B, int64_t T, int64_t D, int64_t W, const R *x, const R *w, const R *bias, int silu,
                         const R *dy, R *dx, R *dw, R *dbias) {
    int64_t BTD = B * T * D;
    R *wt = FN(conv_taps)(D, W, w);
    R *dpbuf = silu ? malloc((size_t)(BTD > 0 ? BTD : 1) * sizeof(R)) : NULL;
    R *dwt = dw ? malloc((size_t)(W * D > 0 ? W * D : 1) * sizeof(R)) : NULL;
    if (!wt || (silu && !dpbuf) || (dw && !dwt)) {
        free(wt);
        free(dpbuf);
        free(dwt);
        return -1;
    }
    /* forward: y = silu(p), so dp = dy silu'(p) = dy s (1 + p (1 - s)); p is recomputed */
    const R *dp = dy;
    if (silu) {
#pragma omp parallel for schedule(static) if (BTD * W >= DG_NN_PAR_MIN)
        for (int64_t bt = 0; bt < B * T; bt++) {
            int64_t b = bt / T, t = bt % T;
            R *dpr = dpbuf + bt * D;
            const R *dyr = dy + bt * D;
            FN(conv_row)(T, D, W, x + b * T * D, wt, bias, t, dpr); /* p */
            for (int64_t d = 0; d < D; d++) {
                R p = dpr[d], s = FN(conv_sigmoid)(p);
                dpr[d] = dyr[d] * s * ((R)1 + p * ((R)1 - s));
            }
        }
        dp = dpbuf;
    }
    /* forward: p[t] += w[:,j] x[t-W+1+j], so x at s collects w[:,j] dp[s+W-1-j] for each tap j
     * whose output s+W-1-j exists (< T) */
    if (dx) {
#pragma omp parallel for schedule(static) if (BTD * W >= DG_NN_PAR_MIN)
        for (int64_t bs = 0; bs < B * T; bs++) {
            int64_t b = bs / T, s = bs % T;
            R *dxr = dx + bs * D;
            for (int64_t d = 0; d < D; d++) dxr[d] = 0;
            for (int64_t j = 0; j < W; j++) {
                int64_t t = s + W - 1 - j;
                if (t >= T) continue;
                const R *dpt = dp + (b * T + t) * D, *wj = wt + j * D;
                for (int64_t d = 0; d < D; d++) dxr[d] += wj[d] * dpt[d];
            }
        }
    }
    /* forward: p[b,t,d] = bias[d] + sum_j w[d,j] x[b,t-W+1+j,d], so
     *   dw[d,j] = sum_{b,t} dp[b,t,d] x[b,t-W+1+j,d],  dbias[d] = sum_{b,t} dp[b,t,d].
     * Threads own channel blocks; dwt [W,D] is the transposed accumulator. */
    if (dw || dbias) {
        int64_t nb = dg_nn_col_blocks(D, BTD * W), bsz = (D + nb - 1) / nb;
#pragma omp parallel for schedule(static) if (nb > 1)
        for (int64_t ib = 0; ib < nb; ib++) {
            int64_t d0 = ib * bsz, d1 = dg_nn_min64(D, d0 + bsz);
            if (dwt)
                for (int64_t j = 0; j < W; j++)
                    for (int64_t d = d0; d < d1; d++) dwt[j * D + d] = 0;
            if (dbias)
                for (int64_t d = d0; d < d1; d++) dbias[d] = 0;
            for (int64_t b = 0; b < B; b++) {
                for (int64_t t = 0; t < T; t++) {
                    const R *dpt = dp + (b * T + t) * D;
                    if (dbias)
                        for (int64_t d = d0; d < d1; d++) dbias[d] += dpt[d];
                    if (!dwt) continue;
                    for (int64_t j = 0; j < W; j++) {
                        int64_t s = t - W + 1 + j;
                        if (s < 0) continue;
                        const R *xs = x + (b * T + s) * D;
                        R *acc = dwt + j * D;
                        for (int64_t d = d0; d < d1; d++) acc[d] += dpt[d] * xs[d];
                    }
                }
            }
            if (dw)
                for (int64_t d = d0; d < d1; d++)
                    for (int64_t j = 0; j < W; j++) dw[d * W + j] = dwt[j * D + d];
        }
    }
    free(wt);
    free(dpbuf);
    free(dwt);
    return 0;
}
