/* Body of the normalisation kernels (R, FN, EXP defined by nn_norm.c).
 * Layout: x, z, y, dy [N,D] (rows are the flattened leading dims), w [D] or NULL (ones),
 * rstd [N].  Row sums accumulate in double; `omp simd reduction` lets them vectorise (the order
 * of the partial sums is fixed, so results are reproducible). */

static inline R FN(sigmoid_of)(R z) { return (R)1 / ((R)1 + EXP(-z)); }

/* sum_d x[d]^2 */
static inline double FN(sumsq)(int64_t D, const R *x) {
    double ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t d = 0; d < D; d++) ss += (double)x[d] * x[d];
    return ss;
}

/* The weight gradient of the three RMS norms, a column sum over the N rows,
 *   dw[d] = sum_n g[n,d] u[n,d] r_n,
 * where u is what the weight multiplied: x (rms_norm, and add_rms_norm with x its sum r) or
 * x silu(z) (gated: u = x z sigmoid(z), kind DW_GATED, b = z).  The columns are cut into blocks
 * that threads own, so each dw[d] is summed by one thread in row order (reproducible).  kind is a
 * constant after inlining, so each call site gets its own branch-free loop. */
#ifndef DG_NN_DW_KINDS /* the body is included once per type */
#define DG_NN_DW_KINDS
enum { DW_PLAIN, DW_GATED };
#endif
static inline __attribute__((always_inline)) void FN(rms_dw)(int64_t N, int64_t D, const R *g, const R *a, const R *b,
                                                             const R *rstd, R *dw, const int kind) {
    int64_t nb = dg_nn_col_blocks(D, N * D), bs = (D + nb - 1) / nb;
#pragma omp parallel for schedule(static) if (nb > 1)
    for (int64_t ib = 0; ib < nb; ib++) {
        int64_t d0 = ib * bs, d1 = dg_nn_min64(D, d0 + bs);
        for (int64_t d = d0; d < d1; d++) dw[d] = 0;
        for (int64_t n = 0; n < N; n++) {
            const R *gr = g + n * D, *ar = a + n * D, *br = b ? b + n * D : NULL;
            R r = rstd[n];
            if (kind == DW_GATED)
                for (int64_t d = d0; d < d1; d++) dw[d] += gr[d] * ar[d] * r * br[d] * FN(sigmoid_of)(br[d]);
            else
                for (int64_t d = d0; d < d1; d++) dw[d] += gr[d] * ar[d] * r;
        }
    }
}

/* ---- rms_norm: r = 1/sqrt(mean(x^2) + eps), y = x r w ---------------------------------------- */
void FN(dg_nn_rms_norm_fwd)(int64_t N, int64_t D, const R *x, const R *w, double eps, R *y, R *rstd) {
#pragma omp parallel for schedule(static) if (N * D >= DG_NN_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const R *xr = x + n * D;
        R *yr = y + n * D;
        R r = (R)(1.0 / sqrt(FN(sumsq)(D, xr) / (double)D + eps));
        if (rstd) rstd[n] = r;
        if (w)
            for (int64_t d = 0; d < D; d++) yr[d] = xr[d] * r * w[d];
        else
            for (int64_t d = 0; d < D; d++) yr[d] = xr[d] * r;
    }
}

/* The gradient of x through xh = x r, r = 1/sqrt(mean(x^2) + eps), given g = dL/dxh in dxr:
 *   d r / d x_j = -r^3 x_j / D, so dx_j = r (g_j - xh_j sum_d(g_d xh_d) / D) = r (g_j - x_j c)
 *   with c = r^2 sum_d(g_d x_d) / D.  Overwrites dxr (which holds g) with dx. */
static inline void FN(rms_dx_from_g)(int64_t D, const R *xr, R r, R *dxr) {
    double dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t d = 0; d < D; d++) dot += (double)dxr[d] * xr[d];
    R c = (R)(dot * (double)r * (double)r / (double)D);
    for (int64_t d = 0; d < D; d++) dxr[d] = r * (dxr[d] - xr[d] * c);
}

void FN(dg_nn_rms_norm_bwd)(int64_t N, int64_t D, const R *x, const R *w, const R *rstd, const R *dy, R *dx, R *dw) {
    if (dx) {
#pragma omp parallel for schedule(static) if (N * D >= DG_NN_PAR_MIN)
        for (int64_t n = 0; n < N; n++) {
            const R *xr = x + n * D, *dyr = dy + n * D;
            R *dxr = dx + n * D;
            /* forward: y = xh w, so the gradient reaching xh is g = dy w */
            if (w)
                for (int64_t d = 0; d < D; d++) dxr[d] = dyr[d] * w[d];
            else
                for (int64_t d = 0; d < D; d++) dxr[d] = dyr[d];
            FN(rms_dx_from_g)(D, xr, rstd[n], dxr);
        }
    }
    /* forward: y[n,d] = xh[n,d] w[d], so dw[d] = sum_n dy[n,d] x[n,d] r_n */
    if (dw) FN(rms_dw)(N, D, dy, x, NULL, rstd, dw, DW_PLAIN);
}

/* ---- gated rms_norm: y = x r w silu(z) -------------------------------------------------------- */
/* The row loops take has_w / want_dx / want_dz as constants after inlining, so each call site
 * gets a branch-free loop that vectorises (a test of w or dz inside the loop would not). */
static inline __attribute__((always_inline)) void FN(grms_fwd_row)(int64_t D, const R *xr, const R *zr, const R *w, R r,
                                                                   R *yr, const int has_w) {
    for (int64_t d = 0; d < D; d++) yr[d] = xr[d] * r * (has_w ? w[d] : (R)1) * zr[d] * FN(sigmoid_of)(zr[d]);
}

void FN(dg_nn_gated_rms_norm_fwd)(int64_t N, int64_t D, const R *x, const R *z, const R *w, double eps, R *y, R *rstd) {
#pragma omp parallel for schedule(static) if (N * D >= DG_NN_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const R *xr = x + n * D, *zr = z + n * D;
        R r = (R)(1.0 / sqrt(FN(sumsq)(D, xr) / (double)D + eps));
        if (rstd) rstd[n] = r;
        if (w) FN(grms_fwd_row)(D, xr, zr, w, r, y + n * D, 1);
        else FN(grms_fwd_row)(D, xr, zr, w, r, y + n * D, 0);
    }
}

/* One sigmoid per element serves both gradients:
 *   forward y = (x r w) silu(z):  dz = dy x r w silu'(z),  silu'(z) = s (1 + z (1 - s))
 *   forward y = xh (w silu(z)):   g = dy w silu(z) reaches xh; it is held in dx, then turned into
 *                                 dx by rms_dx_from_g */
static inline __attribute__((always_inline)) void FN(grms_bwd_row)(int64_t D, const R *xr, const R *zr, const R *w,
                                                                   const R *dyr, R r, R *dxr, R *dzr, const int has_w,
                                                                   const int want_dx, const int want_dz) {
    for (int64_t d = 0; d < D; d++) {
        R s = FN(sigmoid_of)(zr[d]), wd = has_w ? w[d] : (R)1;
        if (want_dz) dzr[d] = dyr[d] * xr[d] * r * wd * s * ((R)1 + zr[d] * ((R)1 - s));
        if (want_dx) dxr[d] = dyr[d] * wd * zr[d] * s;
    }
    if (want_dx) FN(rms_dx_from_g)(D, xr, r, dxr);
}

void FN(dg_nn_gated_rms_norm_bwd)(int64_t N, int64_t D, const R *x, const R *z, const R *w, const R *rstd, const R *dy,
                                  R *dx, R *dz, R *dw) {
    if (dx || dz) {
#pragma omp parallel for schedule(static) if (N * D >= DG_NN_PAR_MIN)
        for (int64_t n = 0; n < N; n++) {
            const R *xr = x + n * D, *zr = z + n * D, *dyr = dy + n * D;
            R r = rstd[n], *dxr = dx ? dx + n * D : NULL, *dzr = dz ? dz + n * D : NULL;
#define DG_NN_GRMS_ROW(HW, WX, WZ) FN(grms_bwd_row)(D, xr, zr, w, dyr, r, dxr, dzr, HW, WX, WZ)
            if (w) {
                if (dx && dz) DG_NN_GRMS_ROW(1, 1, 1);
                else if (dx) DG_NN_GRMS_ROW(1, 1, 0);
                else DG_NN_GRMS_ROW(1, 0, 1);
            } else {
                if (dx && dz) DG_NN_GRMS_ROW(0, 1, 1);
                else if (dx) DG_NN_GRMS_ROW(0, 1, 0);
                else DG_NN_GRMS_ROW(0, 0, 1);
            }
#undef DG_NN_GRMS_ROW
        }
    }
    /* forward: y[n,d] = w[d] (xh silu(z))[n,d], so dw[d] = sum_n dy x r silu(z) */
    if (dw) FN(rms_dw)(N, D, dy, x, z, rstd, dw, DW_GATED);
}

/* ---- add_rms_norm: r = h + y, x = r q w, q = 1/sqrt(mean(r^2) + eps) ------------------------- */
void FN(dg_nn_add_rms_norm_fwd)(int64_t N, int64_t D, const R *h, const R *y, const R *w, double eps, R *x, R *r,
                                R *rstd) {
#pragma omp parallel for schedule(static) if (N * D >= DG_NN_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const R *hr = h + n * D, *yr = y + n * D;
        R *rr = r + n * D, *xr = x + n * D;
        for (int64_t d = 0; d < D; d++) rr[d] = hr[d] + yr[d];
        R q = (R)(1.0 / sqrt(FN(sumsq)(D, rr) / (double)D + eps));
        if (rstd) rstd[n] = q;
        if (w)
            for (int64_t d = 0; d < D; d++) xr[d] = rr[d] * q * w[d];
        else
            for (int64_t d = 0; d < D; d++) xr[d] = rr[d] * q;
    }
}

/* forward: r = h + y feeds both the output r and x = rms_norm(r) w, so the gradient reaching r is
 *   dr_total = dr + (the gradient of r through rms_norm(r) w: rms_norm's backward with x = r)
 * and dh = dy = dr_total (one array); dw is rms_norm's.  r is the forward's output. */
void FN(dg_nn_add_rms_norm_bwd)(int64_t N, int64_t D, const R *r, const R *w, const R *rstd, const R *dx, const R *dr,
                                R *dr_total, R *dw) {
    FN(dg_nn_rms_norm_bwd)(N, D, r, w, rstd, dx, dr_total, dw);
    if (dr_total) {
#pragma omp parallel for schedule(static) if (N * D >= DG_NN_PAR_MIN)
        for (int64_t i = 0; i < N * D; i++) dr_total[i] += dr[i];
    }
}

/* ---- l2norm: r = 1/sqrt(sum(x^2) + eps), y = x r --------------------------------------------- */
void FN(dg_nn_l2norm_fwd)(int64_t N, int64_t D, const R *x, double eps, R *y, R *rstd) {
#pragma omp parallel for schedule(static) if (N * D >= DG_NN_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const R *xr = x + n * D;
        R *yr = y + n * D;
        R r = (R)(1.0 / sqrt(FN(sumsq)(D, xr) + eps));
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
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < D; d++) dot += (double)dyr[d] * xr[d];
        R c = (R)(dot * (double)r * (double)r); /* c x_j = y_j sum(dy y) */
        for (int64_t d = 0; d < D; d++) dxr[d] = r * (dyr[d] - xr[d] * c);
    }
}
