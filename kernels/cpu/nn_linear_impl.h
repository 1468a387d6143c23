/* Body of the linear kernels, included once per type by nn_linear.c with
 * R (float/double), FN(name) (name##_f32/_f64) and GEMM (cblas_sgemm's arguments) defined.
 * Layout: x [N,IN], w [OUT,IN] (PyTorch's nn.Linear), b [OUT], y [N,OUT]; all row major. */

/* ---- a few output features (OUT < DG_NN_LINEAR_NARROW: GDN's a and b projections, one per head) ----
 * A BLAS product with n = 1..7 runs at a few GB/s on these shapes (it packs x for a matrix that is
 * one column wide); these loops read x once at memory speed instead. */

/* sum_i a[i] b[i] in 8 lanes (lane l takes i = l mod 8), then the lanes in order: a fixed order,
 * written so that the compiler keeps the lanes in one vector register */
static inline R FN(lin_dot)(int64_t n, const R *a, const R *b) {
    R s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) s[l] += a[i + l] * b[i + l];
    for (; i < n; i++) s[i % 8] += a[i] * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* y[n,o] = b[o] + x[n,:] . w[o,:]; threads own rows */
static void FN(lin_fwd_narrow)(int64_t N, int64_t IN, int64_t OUT, const R *x, const R *w, const R *b, R *y) {
#pragma omp parallel for schedule(static) if (N * IN >= DG_NN_PAR_MIN)
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < OUT; o++) y[n * OUT + o] = (b ? b[o] : (R)0) + FN(lin_dot)(IN, x + n * IN, w + o * IN);
}

/* dx[n,:] = sum_o dy[n,o] w[o,:] (rows, threads own rows);  dw[o,i] = sum_n dy[n,o] x[n,i] over n in
 * order (threads own column blocks of w, so the sums do not depend on the thread count).  With
 * acc_dx / acc_dw the sums start from what dx / dw hold. */
static void FN(lin_bwd_narrow)(int64_t N, int64_t IN, int64_t OUT, const R *x, const R *w, const R *dy, R *dx, R *dw,
                               bool acc_dx, bool acc_dw) {
    if (dx) {
#pragma omp parallel for schedule(static) if (N * IN >= DG_NN_PAR_MIN)
        for (int64_t n = 0; n < N; n++) {
            R *r = dx + n * IN;
            const R *g = dy + n * OUT;
            for (int64_t i = 0; i < IN; i++) r[i] = (acc_dx ? r[i] : (R)0) + g[0] * w[i];
            for (int64_t o = 1; o < OUT; o++)
                for (int64_t i = 0; i < IN; i++) r[i] += g[o] * w[o * IN + i];
        }
    }
    if (dw) {
        int64_t nb = dg_nn_col_blocks(IN, N * IN), bs = (IN + nb - 1) / nb;
#pragma omp parallel for schedule(static) if (nb > 1)
        for (int64_t ib = 0; ib < nb; ib++) {
            int64_t i0 = ib * bs, i1 = dg_nn_min64(IN, i0 + bs);
            for (int64_t o = 0; o < OUT; o++) /* row 0's terms start the sums */
                for (int64_t i = i0; i < i1; i++) dw[o * IN + i] = (acc_dw ? dw[o * IN + i] : (R)0) + dy[o] * x[i];
            for (int64_t n = 1; n < N; n++) {
                const R *xr = x + n * IN;
                for (int64_t o = 0; o < OUT; o++) {
                    R g = dy[n * OUT + o];
                    R *acc = dw + o * IN;
                    for (int64_t i = i0; i < i1; i++) acc[i] += g * xr[i];
                }
            }
        }
    }
}

/* y = x w^T + b: with a bias y starts as b broadcast over rows and the GEMM adds x w^T (beta = 1);
 * without one the GEMM writes y (beta = 0). */
void FN(dg_nn_linear_fwd)(int64_t N, int64_t IN, int64_t OUT, const R *x, const R *w, const R *b, R *y) {
    if (N == 0 || OUT == 0) return;
    if (OUT < DG_NN_LINEAR_NARROW && IN > 0) {
        FN(lin_fwd_narrow)(N, IN, OUT, x, w, b, y);
        return;
    }
    if (b || IN == 0) {
#pragma omp parallel for schedule(static) if (N * OUT >= DG_NN_PAR_MIN)
        for (int64_t n = 0; n < N; n++)
            for (int64_t o = 0; o < OUT; o++) y[n * OUT + o] = b ? b[o] : (R)0;
    }
    if (IN == 0) return;
    GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)OUT, (int)IN, (R)1, x, (int)IN, w, (int)IN,
         (R)(b != NULL), y, (int)OUT);
}

void FN(dg_nn_linear_bwd)(int64_t N, int64_t IN, int64_t OUT, const R *x, const R *w, const R *dy, R *dx, R *dw, R *db,
                          bool acc_dx, bool acc_dw) {
    /* forward: y[n,o] = sum_i x[n,i] w[o,i] + b[o] */
    if (OUT < DG_NN_LINEAR_NARROW && OUT > 0 && N > 0 && IN > 0) {
        FN(lin_bwd_narrow)(N, IN, OUT, x, w, dy, dx, dw, acc_dx, acc_dw);
        dx = dw = NULL; /* done */
    }
    if (dx) { /* dx[n,i] (+)= sum_o dy[n,o] w[o,i]:  dx (+)= dy w */
        if (OUT == 0 || N == 0 || IN == 0) {
            for (int64_t i = 0; !acc_dx && i < N * IN; i++) dx[i] = 0;
        } else {
            GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)IN, (int)OUT, (R)1, dy, (int)OUT, w, (int)IN,
                 (R)acc_dx, dx, (int)IN);
        }
    }
    if (dw) { /* dw[o,i] (+)= sum_n dy[n,o] x[n,i]:  dw (+)= dy^T x (summed over every leading dim) */
        if (N == 0 || OUT == 0 || IN == 0) {
            for (int64_t i = 0; !acc_dw && i < OUT * IN; i++) dw[i] = 0;
        } else {
            GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)OUT, (int)IN, (int)N, (R)1, dy, (int)OUT, x, (int)IN,
                 (R)acc_dw, dw, (int)IN);
        }
    }
    if (db) { /* db[o] = sum_n dy[n,o]; threads own column blocks */
        int64_t nb = dg_nn_col_blocks(OUT, N * OUT), bs = (OUT + nb - 1) / nb;
#pragma omp parallel for schedule(static) if (nb > 1)
        for (int64_t ib = 0; ib < nb; ib++) {
            int64_t o0 = ib * bs, o1 = dg_nn_min64(OUT, o0 + bs);
            for (int64_t o = o0; o < o1; o++) db[o] = 0;
            for (int64_t n = 0; n < N; n++) {
                const R *row = dy + n * OUT;
                for (int64_t o = o0; o < o1; o++) db[o] += row[o];
            }
        }
    }
}
