/* Body of the SwiGLU kernels (R, FN, EXP defined by nn_swiglu.c).  g, u, y: n elements.
 *   y = silu(g) u = g sigmoid(g) u */

void FN(dg_nn_swiglu_fwd)(int64_t n, const R *g, const R *u, R *y) {
#pragma omp parallel for simd schedule(static) if (n >= DG_NN_PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] = g[i] / ((R)1 + EXP(-g[i])) * u[i];
}

/* y = silu(g) u:  du = dy silu(g),  dg = dy u silu'(g),  silu'(g) = s (1 + g (1 - s)).
 * want_dg / want_du are constants after inlining, so every loop is branch-free and vectorises. */
static inline
    __attribute__((always_inline)) void FN(swiglu_bwd_loop)(int64_t i0, int64_t i1, const R *g, const R *u, const R *dy,
                                                            R *dg, R *du, const int want_dg, const int want_du) {
    for (int64_t i = i0; i < i1; i++) {
        R s = (R)1 / ((R)1 + EXP(-g[i]));
        if (want_du) du[i] = dy[i] * g[i] * s;
        if (want_dg) dg[i] = dy[i] * u[i] * s * ((R)1 + g[i] * ((R)1 - s));
    }
}

void FN(dg_nn_swiglu_bwd)(int64_t n, const R *g, const R *u, const R *dy, R *dg, R *du) {
    /* blocks of 4096 elements, so threads split the work but each inner loop is a plain one */
    int64_t nb = (n + 4095) / 4096;
#pragma omp parallel for schedule(static) if (n >= DG_NN_PAR_MIN)
    for (int64_t b = 0; b < nb; b++) {
        int64_t i0 = b * 4096, i1 = dg_nn_min64(n, i0 + 4096);
        if (dg && du) FN(swiglu_bwd_loop)(i0, i1, g, u, dy, dg, du, 1, 1);
        else if (dg) FN(swiglu_bwd_loop)(i0, i1, g, u, dy, dg, du, 1, 0);
        else if (du) FN(swiglu_bwd_loop)(i0, i1, g, u, dy, dg, du, 0, 1);
    }
}
