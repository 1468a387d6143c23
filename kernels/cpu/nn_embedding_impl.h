/* Body of the embedding kernels (R, FN defined by nn_embedding.c).
 * Layout: w [V,D], ids [N] (the flattened index tensor), y [N,D]. */

/* y[n,:] = w[ids[n],:] */
void FN(dg_nn_embedding_fwd)(int64_t N, int64_t V, int64_t D, const R *w, const int64_t *ids, R *y) {
    (void)V;
#pragma omp parallel for schedule(static) if (N * D >= DG_NN_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const R *src = w + ids[n] * D;
        R *dst = y + n * D;
        for (int64_t d = 0; d < D; d++) dst[d] = src[d];
    }
}

/* forward: y[n,:] = w[ids[n],:], so dw[v,:] = sum over the n with ids[n] = v of dy[n,:].
 * Repeated ids make this a scatter-add; threads own column blocks of dw, so no two threads write
 * one element and the order of the sums is fixed. */
void FN(dg_nn_embedding_bwd)(int64_t N, int64_t V, int64_t D, const int64_t *ids, const R *dy, R *dw) {
    int64_t nb = dg_nn_col_blocks(D, N * D + V * D), bs = (D + nb - 1) / nb;
#pragma omp parallel for schedule(static) if (nb > 1)
    for (int64_t ib = 0; ib < nb; ib++) {
        int64_t d0 = ib * bs, d1 = dg_nn_min64(D, d0 + bs);
        for (int64_t v = 0; v < V; v++)
            for (int64_t d = d0; d < d1; d++) dw[v * D + d] = 0;
        for (int64_t n = 0; n < N; n++) {
            R *dst = dw + ids[n] * D;
            const R *src = dy + n * D;
            for (int64_t d = d0; d < d1; d++) dst[d] += src[d];
        }
    }
}
