/* Body of the SwiGLU kernels (R, FN, EXP defined by nn_swiglu.c).  g, u, y: n elements.
 *   y = silu(g) u = g sigmoid(g) u */

void FN(dg_nn_swiglu_fwd)(int64_t n, const R *g, const R *u, R *y) {
#pragma omp parallel for simd schedule(static) if (n >= DG_NN_PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] = g[i] / ((R)1 + EXP(-g[i])) * u[i];
}

void FN(dg_nn_swiglu_bwd)(int64_t n, const R *g, const R *u, const R *dy, R *dg, R *du) {
#pragma omp parallel for schedule(static) if (n >= DG_NN_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        R s = (R)1 / ((R)1 + EXP(-g[i]));
        /* y = silu(g) u:  du = dy silu(g),  dg = dy u silu'(g),  silu'(g) = s (1 + g (1 - s)) */
        if (du) du[i] = dy[i] * g[i] * s;
        if (dg) dg[i] = dy[i] * u[i] * s * ((R)1 + g[i] * ((R)1 - s));
    }
}
