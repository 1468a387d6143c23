/* Body of the linear_cross_entropy kernels (R, FN defined by nn_linear_cross_entropy.c).
 * x [N,D], w [C,D] (nn.Linear's layout), targets [N]; buf [CH,C] is the one chunk of logits the
 * caller provides (CH >= 1 rows; the last chunk may be shorter).  The logits of rows r0..r0+CH
 * are made in buf, used, and overwritten by the next chunk's: [N,C] is never held.  The forward
 * leaves the last chunk's logits in buf, and the backward, given them, starts there.
 *   logits_c = x_c w^T                            (GEMM into buf)
 *   lse_n, loss = (1/count) sum_{scored n} (lse_n - logits[n,t_n])   (nn_cross_entropy_impl.h) */

void FN(dg_nn_linear_cross_entropy_fwd)(int64_t N, int64_t D, int64_t C, int64_t CH, const R *x, const R *w,
                                        const int64_t *targets, int64_t ignore, R *buf, R *loss, R *lse,
                                        int64_t *count) {
    double total = 0;
    *count = 0;
    for (int64_t r0 = 0; r0 < N; r0 += CH) {
        int64_t rows = dg_nn_min64(CH, N - r0);
        FN(dg_cpu_gemm)(false, true, rows, C, D, (R)1, x + r0 * D, D, w, D, (R)0, buf, C);
        FN(dg_nn_cross_entropy_lse)(rows, C, buf, targets + r0, ignore, lse + r0);
        FN(dg_nn_cross_entropy_sum)(rows, C, buf, targets + r0, ignore, lse + r0, &total, count);
    }
    *loss = *count ? (R)(total / (double)*count) : (R)0;
}

/* Per chunk, last to first, the logits made again (but for the last chunk's when have_last: buf
 * still holds them from the forward) and turned into their gradient in place:
 *   G = dloss/count (softmax(logits_c) - onehot(t_c))  (0 on ignored rows)
 *   dx_c (+)= G w   [CH,D];    dw (+)= sum over chunks of G^T x_c   [C,D] (beta = 1 after the first)
 * dx or dw may be NULL when not wanted; acc_dx, acc_dw: add to what they hold instead of writing. */
void FN(dg_nn_linear_cross_entropy_bwd)(int64_t N, int64_t D, int64_t C, int64_t CH, const R *x, const R *w,
                                        const int64_t *targets, int64_t ignore, const R *lse, double dloss,
                                        int64_t count, R *buf, bool have_last, R *dx, R *dw, bool acc_dx, bool acc_dw) {
    if (dw && N == 0 && !acc_dw)
        for (int64_t i = 0; i < C * D; i++) dw[i] = 0;
    for (int64_t r0 = N > 0 ? (N - 1) / CH * CH : -1; r0 >= 0; r0 -= CH) {
        int64_t rows = dg_nn_min64(CH, N - r0);
        bool first = r0 + rows == N;
        if (!(first && have_last)) FN(dg_cpu_gemm)(false, true, rows, C, D, (R)1, x + r0 * D, D, w, D, (R)0, buf, C);
        FN(dg_nn_cross_entropy_bwd)(rows, C, buf, targets + r0, ignore, lse + r0, dloss, count, buf);
        if (dx) FN(dg_cpu_gemm)(false, false, rows, D, C, (R)1, buf, C, w, D, (R)acc_dx, dx + r0 * D, D);
        if (dw) FN(dg_cpu_gemm)(true, false, C, D, rows, (R)1, buf, C, x + r0 * D, D, (R)(!first || acc_dw), dw, D);
    }
}
