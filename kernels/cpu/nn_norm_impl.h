/* Body of the normalisation kernels (R, FN, EXP defined by nn_norm.c).
 * Layout: x, z, y, dy [N,D] (rows are the flattened leading dims), w [D] or NULL (ones),
 * rstd [N].  Row sums accumulate in double. */

static inline R FN(silu_of)(R z) { return z / ((R)1 + EXP(-z)); }
/* d silu(z)/dz = s (1 + z (1 - s)), s = sigmoid(z) */
static inline R FN(dsilu_of)(R z) {
    R s = (R)1 / ((R)1 + EXP(-z));
    return s * ((R)1 + z * ((R)1 - s));
}

/* ---- rms_norm: r = 1/sqrt(mean(x^2) + eps), y = x r w ---------------------------------------- */
void FN(dg_nn_rms_norm_fwd)(int64_t N, int64_t D, const R *x, const R *w, double eps, R *y,
                            R *rstd) {
#pragma omp parallel for schedule(static) if (N * D >= DG_NN_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const R *xr = x + n * D;
        R *yr = y + n * D;
        double ss = 0;
        for (int64_t d = 0; d < D; d++) ss += (double)xr[d] * xr[d];
        R r = (R)(1.0 / sqrt(ss / (double)D + eps));
        if (rstd) rstd[n] = r;
        if (w)
            for (int64_t d = 0; d < D; d++) yr[d] = xr[d] * r * w[d];
        else
            for (int64_t d = 0; d < D; d++) yr[d] = xr[d] * r;
    }
}

/* dx for y = (x r) * a, given g = dy * a (a = w, or w silu(z)):
 *   xh = x r; d r / d x_j = -r^3 x_j / D, so
 *   dx_j = r (g_j - xh_j * sum_d(g_d xh_d) / D).  g is formed on the fly by G(d). */
#define DG_NN_RMS_DX(G)                                                                            \
    do {                                                                                           \
        double dot = 0;                                                                            \
        for (int64_t d = 0; d < D; d++) dot += (double)(G) * xr[d];                                \
        R c = (R)(dot * (double)r * (double)r / (double)D); /* c x_j = xh_j sum(g xh) / D */     \
        for (int64_t d = 0; d < D; d++) dxr[d] = r * ((G) - xr[d] * c);                            \
    } while (0)

void FN(dg_nn_rms_norm_bwd)(int64_t N, int64_t D, const R *x, const R *w, const R *rstd,
                            const R *dy, R *dx, R *dw) {
    if (dx) {
#pragma omp parallel for schedule(static) if (N * D >= DG_NN_PAR_MIN)
        for (int64_t n = 0; n < N; n++) {
            const R *xr = x + n * D, *dyr = dy + n * D;
            R *dxr = dx + n * D;
            R r = rstd[n];
            /* forward: y = xh w, so the gradient reaching xh is g = dy w */
            if (w)
                DG_NN_RMS_DX(dyr[d] * w[d]);
            else
                DG_NN_RMS_DX(dyr[d]);
        }
    }
    if (dw) { /* forward: y[n,d] = xh[n,d] w[d], so dw[d] = sum_n dy[n,d] x[n,d] r_n */
        int64_t nb = dg_nn_col_blocks(D, N * D), bs = (D + nb - 1) / nb;
#pragma omp parallel for schedule(static) if (nb > 1)
        for (int64_t ib = 0; ib < nb; ib++) {
            int64_t d0 = ib * bs, d1 = dg_nn_min64(D, d0 + bs);
            for (int64_t d = d0; d < d1; d++) dw[d] = 0;
            for (int64_t n = 0; n < N; n++) {
                const R *xr = x + n * D, *dyr = dy + n * D;
                R r = rstd[n];
                for (int64_t d = d0; d < d1; d++) dw[d] += dyr[d] * xr[d] * r;
            }
        }
    }
}

/* ---- gated rms_norm: y = x r w silu(z) -------------------------------------------------------- */
void FN(dg_nn_gated_rms_norm_fwd)(int64_t N, int64_t D, const R *x, const R *z, const R *w,
                                  double eps, R *y, R *rstd) {
#pragma omp parallel for schedule(static) if (N * D >= DG_NN_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const R *xr = x + n * D, *zr = z + n * D;
        R *yr = y + n * D;
        double ss = 0;
        for (int64_t d = 0; d < D; d++) ss += (double)xr[d] * xr[d];
        R r = (R)(1.0 / sqrt(ss / (double)D + eps));
        if (rstd) rstd[n] = r;
        for (int64_t d = 0; d < D; d++) yr[d] = xr[d] * r * (w ? w[d] : (R)1) * FN(silu_of)(zr[d]);
    }
}

void FN(dg_nn_gated_rms_norm_bwd)(int64_t N, int64_t D, const R *x, const R *z, const R *w,
                                  const R *rstd, const R *dy, R *dx, R *dz, R *dw) {
    if (dx || dz) {
#pragma omp parallel for schedule(static) if (N * D >= DG_NN_PAR_MIN)
        for (int64_t n = 0; n < N; n++) {
            const R *xr = x + n * D, *zr = z + n * D, *dyr = dy + n * D;
            R r = rstd[n];
            if (dz) { /* forward: y = (x r w) silu(z), so dz = dy x r w silu'(z) */
                R *dzr = dz + n * D;
                for (int64_t d = 0; d < D; d++)
                    dzr[d] = dyr[d] * xr[d] * r * (w ? w[d] : (R)1) * FN(dsilu_of)(zr[d]);
            }
            if (dx) { /* forward: y = xh (w silu(z)), so g = dy w silu(z) reaches xh */
                R *dxr = dx + n * D;
                if (w)
                    DG_NN_RMS_DX(dyr[d] * w[d] * FN(silu_of)(zr[d]));
                else
                    DG_NN_RMS_DX(dyr[d] * FN(silu_of)(zr[d]));
            }
        }
    }
    if (dw) { /* forward: y[n,d] = w[d] (xh silu(z))[n,d], so dw[d] = sum_n dy x r silu(z) */
        int64_t nb = dg_nn_col_blocks(D, N * D), bs = (D + nb - 1) / nb;
#pragma omp parallel for schedule(static) if (nb > 1)
        for (int64_t ib = 0; ib < nb; ib++) {
            int64_t d0 = ib * bs, d1 = dg_nn_min64(D, d0 + bs);
            for (int64_t d = d0; d < d1; d++) dw[d] = 0;
            for (int64_t n = 0; n < N; n++) {
                const R *xr = x + n * D, *zr = z + n * D, *dyr = dy + n * D;
                R r = rstd[n];
                for (int64_t d = d0; d < d1; d++) dw[d] += dyr[d] * xr[d] * r * FN(silu_of)(zr[d]);
            }
        }
    }
}
#undef DG_NN_RMS_DX

/* ---- l2norm: r = 1/sqrt(sum(x^2) + eps), y = x r --------------------------------------------- */
void FN(dg_nn_l2norm_fwd)(int64_t N, int64_t D, const R *x, double eps, R *y, R *rstd) {
#pragma omp parallel for schedule(static) if (N * D >= DG_NN_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const R *xr = x + n * D;
        R *yr = y + n * D;
        double ss = 0;
        for (int64_t d = 0; d < D; d++) ss += (double)xr[d] * xr[d];
        R r = (R)(1.0 / sqrt(ss + eps));
        if (rstd) rstd[n] = r;
        for (int64_t d = 0; d < D; d++) yr[d] = xr[d] * r;
    }
}

/* forward: y_j = x_j r with d r / d x_j = -r^3 x_j, so
 *   dx_j = r dy_j - r^3 x_j sum_d(dy_d x_d) = r (dy_j - y_j sum_d(dy_d y_d)). */
void FN(dg_nn_l2norm_bwd)(int64_t N, int64_t D, const R *x, const R *rstd, const R *dy, R *dx) {
#pragma omp parallel for schedule(static) if (N * D >= DG_NN_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const R *xr = x + n * D, *dyr = dy + n * D;
        R *dxr = dx + n * D;
        R r = rstd[n];
        double dot = 0;
        for (int64_t d = 0; d < D; d++) dot += (double)dyr[d] * xr[d];
        R c = (R)(dot * (double)r * (double)r); /* c x_j = y_j sum(dy y) */
        for (int64_t d = 0; d < D; d++) dxr[d] = r * (dyr[d] - xr[d] * c);
    }
}
