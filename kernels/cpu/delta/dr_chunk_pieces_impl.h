/* Templated bodies of the standalone pieces (chunk_pieces.h): chunk_local_cumsum,
 * chunk_scaled_dot_kkt and solve_tril, forward and backward.  Included after dr_chunk_math.h by
 * chunk_pieces_f32.c / chunk_pieces_f64.c.  Each runs the same per-chunk code as the fused kernels,
 * in parallel over (chunk, value head). */
#include "kernels/cpu/delta/chunk_pieces.h"

#define DRP_PARALLEL(n, wsn, ...)                                                         \
    do {                                                                                  \
        int fail_ = 0;                                                                    \
        int64_t n_ = (n), w_ = (wsn);                                                     \
        int par_ = n_ > 1 && (double)n_ * (double)(w_ + 64) > 2e5;                        \
        _Pragma("omp parallel if (par_)") {                                               \
            R *ws = w_ > 0 ? malloc(sizeof(R) * (size_t)w_) : NULL;                       \
            if (w_ > 0 && !ws) {                                                          \
                _Pragma("omp atomic write") fail_ = 1;                                    \
            }                                                                             \
            _Pragma("omp for schedule(dynamic, 4)") for (int64_t it = 0; it < n_; it++) { \
                if (ws || w_ <= 0) {                                                      \
                    __VA_ARGS__;                                                          \
                }                                                                         \
            }                                                                             \
            free(ws);                                                                     \
        }                                                                                 \
        if (fail_) rc = -1;                                                               \
    } while (0)

/* ---- chunk_local_cumsum ---- */
int FN(dg_chunk_local_cumsum_fwd)(int64_t B, int64_t T, int64_t H, int64_t S, const int64_t *cu_seqlens, int64_t N,
                                  int chunk, int reverse, const R *x, R *out) {
    const char *what = "chunk_local_cumsum";
    if (!x || !out) {
        dg_error("%s: %s is NULL", what, !x ? "x" : "out");
        return -1;
    }
    if (H < 1 || S < 1) {
        dg_error("%s: H = %lld, S = %lld (need >= 1)", what, (long long)H, (long long)S);
        return -1;
    }
    dg_dr_shape s = {B, T, 1, H, 1, 1, cu_seqlens, N, DG_GATE_NONE, 1.0, chunk};
    dg_drc_plan pl;
    if (dg_drc_plan_init(&pl, &s, what, 0)) return -1;
    int rc = 0;
    int64_t ld = H * S;
    DRP_PARALLEL(pl.nchunks * H, 0, {
        int64_t c = it / H, h = it % H, off = (pl.row0[c] * H + h) * S;
        FN(cumsum_rows)(pl.len[c], (int)S, x + off, ld, out + off, ld, reverse);
    });
    dg_drc_plan_free(&pl);
    return rc;
}

int FN(dg_chunk_local_cumsum_bwd)(int64_t B, int64_t T, int64_t H, int64_t S, const int64_t *cu_seqlens, int64_t N,
                                  int chunk, int reverse, const R *dout, R *dx) {
    /* out = L x (lower ones) per chunk, so dx = L^T dout: the cumsum in the other direction */
    return FN(dg_chunk_local_cumsum_fwd)(B, T, H, S, cu_seqlens, N, chunk, !reverse, dout, dx);
}

/* ---- chunk_scaled_dot_kkt ---- */
static int FN(kkt_check)(const char *what, const dg_dr_shape *s, const R *k, const R *beta, const R *g,
                         dg_drc_plan *pl) {
    if (!k || !beta) {
        dg_error("%s: %s is NULL", what, !k ? "k" : "beta");
        return -1;
    }
    if (s && (s->gate == DG_GATE_NONE) != (g == NULL)) {
        dg_error("%s: g is %s but the gate kind is %d", what, g ? "given" : "NULL", (int)s->gate);
        return -1;
    }
    return dg_drc_plan_init(pl, s, what, 1);
}

/* The cg of chunk c, head hv, reading the cumulative gate g directly. */
static void FN(kkt_gate)(const dg_dr_shape *s, const dg_drc_plan *pl, int64_t c, int64_t hv, const R *g, FN(cg) *cg) {
    int gs = s->gate == DG_GATE_NONE ? 0 : s->gate == DG_GATE_HEAD ? 1 : (int)s->K;
    cg->kind = s->gate;
    cg->L = pl->len[c];
    cg->K = (int)s->K;
    cg->G = gs ? g + (pl->row0[c] * s->HV + hv) * gs : NULL;
    cg->ldg = s->HV * gs;
    cg->E = NULL;
    cg->tab = NULL;
}

int FN(dg_chunk_scaled_dot_kkt_fwd)(const dg_dr_shape *s, const R *k, const R *beta, const R *g, R *A) {
    const char *what = "chunk_scaled_dot_kkt";
    dg_drc_plan pl;
    if (FN(kkt_check)(what, s, k, beta, g, &pl)) return -1;
    if (!A) {
        dg_drc_plan_free(&pl);
        dg_error("%s: A is NULL", what);
        return -1;
    }
    int rc = 0, C = s->chunk;
    int64_t HV = s->HV, H = s->H, K = s->K, grp = HV / H;
    DRP_PARALLEL(pl.nchunks * HV, FN(gated_ws)(C, (int)K) + FN(ctab_ws)(C, (int)K), {
        int64_t c = it / HV, hv = it % HV, r0 = pl.row0[c];
        FN(cg) cg;
        FN(ctab) tab;
        FN(kkt_gate)(s, &pl, c, hv, g, &cg);
        FN(cg_table)(&cg, &tab, ws + FN(gated_ws)(C, (int)K));
        int L = cg.L;
        R *a = A + (r0 * HV + hv) * C;
        const R *kp = k + (r0 * H + hv / grp) * K;
        FN(gated_gram)(&cg, kp, H * K, kp, H * K, 1, 1, a, HV * C, ws);
        for (int i = 0; i < L; i++) {
            R b = beta[(r0 + i) * HV + hv];
            for (int j = 0; j < i; j++) a[i * HV * C + j] *= b;
            for (int j = L; j < C; j++) a[i * HV * C + j] = 0;
        }
    });
    dg_drc_plan_free(&pl);
    if (rc) dg_error("%s: out of memory", what);
    return rc;
}

int FN(dg_chunk_scaled_dot_kkt_bwd)(const dg_dr_shape *s, const R *k, const R *beta, const R *g, const R *dA, R *dk,
                                    R *dbeta, R *dg) {
    const char *what = "chunk_scaled_dot_kkt_bwd";
    dg_drc_plan pl;
    if (FN(kkt_check)(what, s, k, beta, g, &pl)) return -1;
    if (!dA || (dg && !g)) {
        dg_drc_plan_free(&pl);
        dg_error("%s: %s", what, !dA ? "dA is NULL" : "dg given but g is NULL");
        return -1;
    }
    int rc = 0, C = s->chunk, gs = s->gate == DG_GATE_NONE ? 0 : s->gate == DG_GATE_HEAD ? 1 : (int)s->K;
    int64_t HV = s->HV, H = s->H, K = s->K, grp = HV / H, rows = pl.rows;
    R *dkv = dk && grp == 1 ? dk : malloc(sizeof(R) * (size_t)(rows * HV * K + 1));
    if (!dkv) rc = -1;
    int64_t wsn =
        3 * (int64_t)C * C + 3 * (int64_t)C * K + 2 * (C + K) + FN(gated_ws)(C, (int)K) + FN(ctab_ws)(C, (int)K);
    if (rc == 0)
        DRP_PARALLEL(pl.nchunks * HV, wsn, {
            int64_t c = it / HV, hv = it % HV, r0 = pl.row0[c], off = r0 * HV + hv;
            FN(cg) cg;
            FN(ctab) tab;
            FN(kkt_gate)(s, &pl, c, hv, g, &cg);
            FN(cg_table)(&cg, &tab, ws + wsn - FN(ctab_ws)(C, (int)K));
            int L = cg.L;
            R *M = ws, *dM = M + C * C, *rp = dM + C * C, *cp = rp + C * K, *dGc = cp + C * K,
              *Eh = dGc + C * K + C + K, *gw = Eh + C * C;
            const R *kp = k + (r0 * H + hv / grp) * K;
            R *dkp = dkv + off * K;
            /* A = diag(beta) M, M = strictly_lower(K K^T o Gamma) */
            FN(gated_gram)(&cg, kp, H * K, kp, H * K, 1, 1, M, C, gw);
            for (int i = 0; i < L; i++) {
                R b = beta[(r0 + i) * HV + hv], sb = 0;
                for (int j = 0; j < i; j++) {
                    R d = dA[(off + (int64_t)i * HV) * C + j];
                    sb += d * M[i * C + j];
                    dM[i * C + j] = b * d;
                }
                for (int j = i; j < L; j++) dM[i * C + j] = 0;
                if (dbeta) dbeta[off + (int64_t)i * HV] = sb;
            }
            FN(zero_rows)(L, (int)K, dkp, HV * K);
            if (gs) FN(zero_rows)(L, gs, dGc, gs);
            if (s->gate == DG_GATE_CHANNEL) {
                FN(zero_rows)(L, (int)K, rp, K);
                FN(zero_rows)(L, (int)K, cp, K);
                FN(gated_rowapply)(&cg, dM, C, kp, H * K, 1, rp, K, gw);
                FN(gated_colapply)(&cg, dM, C, kp, H * K, 1, cp, K, gw);
                for (int i = 0; i < L; i++)
                    for (int j = 0; j < K; j++) {
                        R kk = kp[i * H * K + j];
                        dkp[i * HV * K + j] = rp[i * K + j] + cp[i * K + j];
                        dGc[i * gs + j] = kk * (rp[i * K + j] - cp[i * K + j]);
                    }
            } else {
                if (gs) { /* HEAD: the decay matrix once for both products */
                    FN(head_emat)(&cg, Eh);
                    cg.E = Eh;
                }
                FN(gated_apply2)(&cg, dM, C, kp, H * K, kp, H * K, 1, dkp, HV * K, dkp, HV * K, gw);
                if (gs) FN(head_rowcol_dg)(L, dM, C, M, C, dGc, gs);
            }
            if (dg && gs) FN(copy_rows)(L, gs, dGc, gs, dg + off * gs, HV * gs);
        });
    if (rc == 0 && dk && dkv != dk) {
#pragma omp parallel for schedule(static) if ((double)rows * HV * K > 2e5)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t h = 0; h < H; h++) {
                R *o = dk + (r * H + h) * K;
                const R *src = dkv + (r * HV + h * grp) * K;
                for (int64_t j = 0; j < K; j++) o[j] = src[j];
                for (int64_t m = 1; m < grp; m++)
                    for (int64_t j = 0; j < K; j++) o[j] += src[m * K + j];
            }
    }
    if (dkv != dk) free(dkv);
    dg_drc_plan_free(&pl);
    if (rc) dg_error("%s: out of memory", what);
    return rc;
}

/* ---- solve_tril ---- */
static int FN(tril_check)(const char *what, const dg_dr_shape *s, const R *a, const R *b, dg_drc_plan *pl) {
    if (!a || !b) {
        dg_error("%s: %s is NULL", what, !a ? "input" : "output");
        return -1;
    }
    return dg_drc_plan_init(pl, s, what, 0);
}

int FN(dg_solve_tril_fwd)(const dg_dr_shape *s, int blocked, const R *A, R *Ainv) {
    const char *what = "solve_tril";
    dg_drc_plan pl;
    if (FN(tril_check)(what, s, A, Ainv, &pl)) return -1;
    int rc = 0, C = s->chunk;
    int64_t HV = s->HV;
    DRP_PARALLEL(pl.nchunks * HV, (int64_t)C * C + DR_BS * DR_BS, {
        int64_t c = it / HV, hv = it % HV, off = pl.row0[c] * HV + hv;
        int L = pl.len[c];
        R *a = ws, *tw = ws + C * C;
        /* only the strictly lower part of A is read */
        for (int i = 0; i < L; i++)
            for (int j = 0; j < L; j++) a[i * C + j] = j < i ? A[(off + (int64_t)i * HV) * C + j] : 0;
        R *y = Ainv + off * C;
        FN(tril_inv)(blocked, L, a, C, y, HV * C, tw);
        for (int i = 0; i < L; i++)
            for (int j = L; j < C; j++) y[i * HV * C + j] = 0;
    });
    dg_drc_plan_free(&pl);
    if (rc) dg_error("%s: out of memory", what);
    return rc;
}

int FN(dg_solve_tril_bwd)(const dg_dr_shape *s, const R *Ainv, const R *dAinv, R *dA) {
    const char *what = "solve_tril_bwd";
    dg_drc_plan pl;
    if (FN(tril_check)(what, s, Ainv, dA, &pl)) return -1;
    if (!dAinv) {
        dg_drc_plan_free(&pl);
        dg_error("%s: dAinv is NULL", what);
        return -1;
    }
    int rc = 0, C = s->chunk;
    int64_t HV = s->HV;
    DRP_PARALLEL(pl.nchunks * HV, 4 * (int64_t)C * C, {
        int64_t c = it / HV, hv = it % HV, off = pl.row0[c] * HV + hv;
        int L = pl.len[c];
        R *y = ws, *tw = ws + 2 * C * C;
        /* Ainv's upper part is zero by definition: do not trust the caller's */
        for (int i = 0; i < L; i++)
            for (int j = 0; j < L; j++) y[i * C + j] = j <= i ? Ainv[(off + (int64_t)i * HV) * C + j] : 0;
        R *d = dA + off * C;
        FN(tril_inv_bwd)(L, y, C, dAinv + off * C, HV * C, d, HV * C, tw);
        for (int i = 0; i < L; i++)
            for (int j = L; j < C; j++) d[i * HV * C + j] = 0;
    });
    dg_drc_plan_free(&pl);
    if (rc) dg_error("%s: out of memory", what);
    return rc;
}
