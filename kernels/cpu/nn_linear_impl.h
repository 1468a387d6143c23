/* Body of the linear kernels, included once per type by nn_linear.c with
 * R (float/double), FN(name) (name##_f32/_f64) and GEMM (cblas_sgemm's arguments) defined.
 * Layout: x [N,IN], w [OUT,IN] (PyTorch's nn.Linear), b [OUT], y [N,OUT]; all row major. */

/* y = x w^T + b: y starts as b broadcast over rows, then GEMM adds x w^T (beta = 1). */
void FN(dg_nn_linear_fwd)(int64_t N, int64_t IN, int64_t OUT, const R *x, const R *w, const R *b, R *y) {
    if (N == 0 || OUT == 0) return;
#pragma omp parallel for schedule(static) if (N * OUT >= DG_NN_PAR_MIN)
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < OUT; o++) y[n * OUT + o] = b ? b[o] : (R)0;
    if (IN == 0) return;
    GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)OUT, (int)IN, (R)1, x, (int)IN, w, (int)IN, (R)1, y,
         (int)OUT);
}

void FN(dg_nn_linear_bwd)(int64_t N, int64_t IN, int64_t OUT, const R *x, const R *w, const R *dy, R *dx, R *dw,
                          R *db) {
    /* forward: y[n,o] = sum_i x[n,i] w[o,i] + b[o] */
    if (dx) { /* dx[n,i] = sum_o dy[n,o] w[o,i]:  dx = dy w */
        if (OUT == 0 || N == 0 || IN == 0) {
            for (int64_t i = 0; i < N * IN; i++) dx[i] = 0;
        } else {
            GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)IN, (int)OUT, (R)1, dy, (int)OUT, w, (int)IN,
                 (R)0, dx, (int)IN);
        }
    }
    if (dw) { /* dw[o,i] = sum_n dy[n,o] x[n,i]:  dw = dy^T x (summed over every leading dim) */
        if (N == 0 || OUT == 0 || IN == 0) {
            for (int64_t i = 0; i < OUT * IN; i++) dw[i] = 0;
        } else {
            GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)OUT, (int)IN, (int)N, (R)1, dy, (int)OUT, x, (int)IN,
                 (R)0, dw, (int)IN);
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
