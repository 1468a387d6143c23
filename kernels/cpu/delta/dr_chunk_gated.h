/* Templated: the gate of one chunk and the gated products of the chunked form (included at the end
 * of dr_chunk_math.h).
 *
 *   M_ij = sum_c X_ic Y_jc Gamma_ijc,   Gamma_ijc = exp(G_ic - G_jc),  j <= i,
 * with G the chunk-local cumulative gate (per row for HEAD, per row and channel for CHANNEL).
 *
 * HEAD: Gamma_ij is a scalar; the L x L matrix E = exp(G_i - G_j) is formed once per chunk with one
 * vectorised exp and applied elementwise around plain GEMMs.
 *
 * CHANNEL (KDA): the chunk is cut into 16-row blocks; with f(I) / l(I) the first / last row of
 * block I and J(j) the block of row j, the factor table of a chunk holds
 *   Ar_i   = exp(G_i - G_f(I(i)))        <= 1     (row factor)
 *   Bc_j   = exp(G_l(J(j)) - G_j)        <= 1     (column factor)
 *   P_IJ   = exp(G_f(I) - G_l(J)), J < I <= 1     (block pair factor; P_II = exp(range of I))
 * so that Gamma_ij = Ar_i P_I(i)J(j) Bc_j for every j <= i.  Off the diagonal every factor is <= 1
 * (g <= 0): nothing overflows however negative the gates.  A diagonal block is done this way only
 * while G varies by less than DR_SAFE_EXP inside it (P_II <= exp(DR_SAFE_EXP)); otherwise element
 * by element with the exact exp(G_ic - G_jc).  The table costs 2 L K exps per chunk; every product
 * then only multiplies. */

#define DR_MAXB 4 /* blocks per chunk: C <= 64 */

typedef struct FN(ctab) {
    int nb;
    R *Ar, *Bc; /* L x K */
    R *P;       /* [bI][bJ] x K, bJ <= bI (DR_MAXB x DR_MAXB x K) */
    R *F;       /* nb x K: exp(G_f(bI)) */
    R *Lg;      /* nb x K: exp(G_last - G_l(bJ)) */
    int safe[DR_MAXB];
} FN(ctab);

typedef struct FN(cg) {
    dg_gate_kind kind;
    int L, K;
    const R *G; /* chunk-local cumulative gate; row i at G + i*ldg (HEAD: 1 value, CHANNEL: K) */
    int64_t ldg;
    const R *E;          /* HEAD, optional: E_ij = exp(G_i - G_j) (j <= i, 0 above), ld L */
    const FN(ctab) *tab; /* CHANNEL: required by every function below (FN(cg_table)) */
} FN(cg);

/* Elements of scratch the table of a chunk needs. */
DR_STATIC int64_t FN(ctab_ws)(int C, int K) {
    return 2 * (int64_t)C * K + (DR_MAXB * DR_MAXB + 2 * DR_MAXB + 2) * (int64_t)K + DR_MAXB;
}

/* Points t at a table already built in mem (by FN(cg_table) for the same chunk) and attaches it. */
DR_STATIC void FN(cg_table_attach)(FN(cg) *g, FN(ctab) *t, R *mem) {
    if (g->kind != DG_GATE_CHANNEL) return;
    int L = g->L, K = g->K;
    t->nb = (L + DR_BS - 1) / DR_BS;
    t->Ar = mem;
    t->Bc = mem + (int64_t)L * K;
    t->P = t->Bc + (int64_t)L * K;
    t->F = t->P + DR_MAXB * DR_MAXB * (int64_t)K;
    t->Lg = t->F + DR_MAXB * (int64_t)K;
    const R *sf = t->Lg + (DR_MAXB + 2) * (int64_t)K; /* the safe flags, stored as 0 / 1 */
    for (int b = 0; b < DR_MAXB; b++) t->safe[b] = b < t->nb && sf[b] != 0;
    g->tab = t;
}

/* Whether G varies by at most DR_SAFE_EXP over rows [a0, a1) in every channel (then every factor
 * of a diagonal block lies in [exp(-DR_SAFE_EXP), exp(DR_SAFE_EXP)]).  mn: K scratch. */
DR_STATIC int FN(blk_range_ok)(const FN(cg) *g, int a0, int a1, R *mn) {
    int K = g->K;
    R *mx = mn + K; /* mn: 2K scratch */
    const R *G0 = g->G + a0 * g->ldg;
    for (int c = 0; c < K; c++) mn[c] = mx[c] = G0[c];
    for (int i = a0 + 1; i < a1; i++) {
        const R *Gi = g->G + i * g->ldg;
        for (int c = 0; c < K; c++) {
            mn[c] = Gi[c] < mn[c] ? Gi[c] : mn[c];
            mx[c] = Gi[c] > mx[c] ? Gi[c] : mx[c];
        }
    }
    R worst = 0;
    for (int c = 0; c < K; c++) worst = mx[c] - mn[c] > worst ? mx[c] - mn[c] : worst;
    return worst <= DR_SAFE_EXP; /* NaN: not ok */
}

/* Builds the CHANNEL factor table of g in mem (FN(ctab_ws) elements) and attaches it; a no-op for
 * the other gate kinds. */
DR_STATIC void FN(cg_table)(FN(cg) *g, FN(ctab) *t, R *mem) {
    if (g->kind != DG_GATE_CHANNEL) return;
    int L = g->L, K = g->K, nb = (L + DR_BS - 1) / DR_BS;
    R *sf = mem + 2 * (int64_t)L * K + (DR_MAXB * DR_MAXB + 2 * DR_MAXB + 2) * (int64_t)K;
    for (int b = 0; b < DR_MAXB; b++) sf[b] = 0;
    FN(cg_table_attach)(g, t, mem);
    const R *Glast = g->G + (L - 1) * g->ldg;
    for (int bI = 0; bI < nb; bI++) {
        int f = bI * DR_BS, l = (f + DR_BS < L ? f + DR_BS : L) - 1;
        const R *Gf = g->G + f * g->ldg, *Gl = g->G + l * g->ldg;
        t->safe[bI] = FN(blk_range_ok)(g, f, l + 1, t->Lg + DR_MAXB * (int64_t)K);
        sf[bI] = (R)t->safe[bI];
        for (int i = f; i <= l; i++) {
            DR_VEXPDIFF(K, g->G + i * g->ldg, Gf, t->Ar + (int64_t)i * K);
            DR_VEXPDIFF(K, Gl, g->G + i * g->ldg, t->Bc + (int64_t)i * K);
        }
        DR_VEXP(K, Gf, t->F + (int64_t)bI * K);
        DR_VEXPDIFF(K, Glast, Gl, t->Lg + (int64_t)bI * K);
        for (int bJ = 0; bJ <= bI; bJ++) {
            int lj = (bJ * DR_BS + DR_BS < L ? bJ * DR_BS + DR_BS : L) - 1;
            DR_VEXPDIFF(K, Gf, g->G + lj * g->ldg, t->P + ((int64_t)bI * DR_MAXB + bJ) * K);
        }
    }
}

/* Workspace (elements) the gated products need, for chunk C and K channels. */
DR_STATIC int64_t FN(gated_ws)(int C, int K) {
    int64_t a = (int64_t)C * C + C, b = (int64_t)(2 * C + DR_BS + 1) * K;
    return a > b ? a : b;
}

/* HEAD: E (L x L, ld L) = exp(G_i - G_j) below and on the diagonal, 0 above; one vectorised exp
 * over the whole matrix (above the diagonal -1000 flushes to 0). */
DR_STATIC void FN(head_emat)(const FN(cg) *g, R *E) {
    int L = g->L;
    for (int i = 0; i < L; i++) {
        R gi = g->G[i * g->ldg], *e = E + (int64_t)i * L;
        for (int j = 0; j <= i; j++) e[j] = gi - g->G[j * g->ldg];
        for (int j = i + 1; j < L; j++) e[j] = -1000;
    }
    DR_VEXP((int64_t)L * L, E, E);
}

/* Y = X o exp(G) (mode 0) or X o exp(G_last - G) (mode 1), rows 0..L-1; NONE: copy.  e: L scratch. */
DR_STATIC void FN(gate_rows)(const FN(cg) *g, int mode, const R *X, int64_t ldx, R *Y, int64_t ldy, R *e) {
    int K = g->K, L = g->L;
    if (g->kind == DG_GATE_NONE) {
        FN(copy_rows)(L, K, X, ldx, Y, ldy);
        return;
    }
    if (g->kind == DG_GATE_HEAD) {
        R gl = g->G[(L - 1) * g->ldg];
        for (int i = 0; i < L; i++) e[i] = mode == 0 ? g->G[i * g->ldg] : gl - g->G[i * g->ldg];
        DR_VEXP(L, e, e);
        for (int i = 0; i < L; i++) {
            const R *x = X + i * ldx;
            R *y = Y + i * ldy, s = e[i];
            for (int c = 0; c < K; c++) y[c] = x[c] * s;
        }
        return;
    }
    const FN(ctab) *t = g->tab;
    for (int i = 0; i < L; i++) { /* exp(G_i) = Ar_i F_I;  exp(G_last - G_i) = Bc_i Lg_I */
        const R *x = X + i * ldx, *a = (mode == 0 ? t->Ar : t->Bc) + (int64_t)i * K,
                *b = (mode == 0 ? t->F : t->Lg) + (int64_t)(i / DR_BS) * K;
        R *y = Y + i * ldy;
        for (int c = 0; c < K; c++) y[c] = x[c] * a[c] * b[c];
    }
}

/* HEAD gate: M_ij *= exp(G_i - G_j) on the lower part of M. */
DR_STATIC void FN(head_decay_mul)(const FN(cg) *g, R *M, int64_t ldm, R *e) {
    for (int i = 0; i < g->L; i++) {
        R *m = M + i * ldm;
        if (g->E) {
            const R *ei = g->E + (int64_t)i * g->L;
            for (int j = 0; j <= i; j++) m[j] *= ei[j];
            continue;
        }
        R gi = g->G[i * g->ldg];
        for (int j = 0; j <= i; j++) e[j] = gi - g->G[j * g->ldg];
        DR_VEXP(i + 1, e, e);
        for (int j = 0; j <= i; j++) m[j] *= e[j];
    }
}

/* sum_c x_c y_c exp(Gi_c - Gj_c), exactly (the element-by-element fallback). */
DR_STATIC R FN(gdot)(int K, const R *x, const R *y, const R *Gi, const R *Gj, R *e) {
    DR_VEXPDIFF(K, Gi, Gj, e);
    R s = 0;
    for (int c = 0; c < K; c++) s += x[c] * y[c] * e[c];
    return s;
}

/* CHANNEL: Yr_j = Y_j o Bc_j o P_{bI,bJ(j)} for rows j < n (the column side of row block bI). */
DR_STATIC void FN(col_side)(const FN(cg) *g, int bI, int n, const R *Y, int64_t ldy, R *Yr) {
    const FN(ctab) *t = g->tab;
    int K = g->K;
    for (int j = 0; j < n; j++) {
        const R *y = Y + j * ldy, *b = t->Bc + (int64_t)j * K, *p = t->P + ((int64_t)bI * DR_MAXB + j / DR_BS) * K;
        R *o = Yr + (int64_t)j * K;
        for (int c = 0; c < K; c++) o[c] = y[c] * b[c] * p[c];
    }
}

/* M (L x L lower, ld ldm) = alpha sum_c X_ic Y_jc Gamma_ijc for j <= i (j < i if strict), zeros
 * above.  ws: FN(gated_ws). */
DR_STATIC void FN(gated_gram)(const FN(cg) *g, const R *X, int64_t ldx, const R *Y, int64_t ldy, int strict, R alpha,
                              R *M, int64_t ldm, R *ws) {
    int L = g->L, K = g->K;
    if (g->kind != DG_GATE_CHANNEL) {
        if (X == Y && ldx == ldy) FN(gram_lower)(L, K, alpha, X, ldx, M, ldm);
        else FN(gemm_lowc)(L, K, alpha, X, ldx, Y, ldy, 0, M, ldm);
        if (g->kind == DG_GATE_HEAD) FN(head_decay_mul)(g, M, ldm, ws);
        FN(mask_lower)(L, M, ldm, strict);
        return;
    }
    const FN(ctab) *t = g->tab;
    R *Xr = ws, *Yr = ws + DR_BS * K, *e = Yr + (int64_t)L * K;
    for (int i0 = 0, bI = 0; i0 < L; i0 += DR_BS, bI++) {
        int i1 = i0 + DR_BS < L ? i0 + DR_BS : L, bi = i1 - i0, safe = t->safe[bI];
        int n = safe ? i1 : i0;
        for (int i = i0; i < i1; i++) {
            const R *x = X + i * ldx, *a = t->Ar + (int64_t)i * K;
            R *o = Xr + (int64_t)(i - i0) * K;
            for (int c = 0; c < K; c++) o[c] = x[c] * a[c];
        }
        FN(col_side)(g, bI, n, Y, ldy, Yr);
        FN(gemm)(0, 1, bi, n, K, alpha, Xr, K, Yr, K, 0, M + i0 * ldm, ldm);
        for (int i = i0; i < i1; i++) {
            R *m = M + i * ldm;
            if (!safe)
                for (int j = i0; j <= i; j++)
                    m[j] = alpha * FN(gdot)(K, X + i * ldx, Y + j * ldy, g->G + i * g->ldg, g->G + j * g->ldg, e);
            int j0 = strict ? i : i + 1;
            if (j0 < L) memset(m + j0, 0, sizeof(R) * (size_t)(L - j0));
        }
    }
}

/* Z (L x K) += alpha * [ sum_j D_ij Y_jc Gamma_ijc ], D L x L lower (zeros above). */
DR_STATIC void FN(gated_rowapply)(const FN(cg) *g, const R *D, int64_t ldd, const R *Y, int64_t ldy, R alpha, R *Z,
                                  int64_t ldz, R *ws) {
    int L = g->L, K = g->K;
    if (g->kind == DG_GATE_NONE) {
        FN(gemm_tri)(0, L, K, alpha, D, ldd, Y, ldy, 1, Z, ldz);
        return;
    }
    if (g->kind == DG_GATE_HEAD) {
        R *DE = ws, *e = ws + (int64_t)L * L;
        FN(copy_rows)(L, L, D, ldd, DE, L);
        FN(head_decay_mul)(g, DE, L, e);
        FN(gemm_tri)(0, L, K, alpha, DE, L, Y, ldy, 1, Z, ldz);
        return;
    }
    const FN(ctab) *t = g->tab;
    R *tmp = ws, *Yr = ws + DR_BS * K, *e = Yr + (int64_t)L * K;
    for (int i0 = 0, bI = 0; i0 < L; i0 += DR_BS, bI++) {
        int i1 = i0 + DR_BS < L ? i0 + DR_BS : L, bi = i1 - i0, safe = t->safe[bI];
        int n = safe ? i1 : i0;
        FN(col_side)(g, bI, n, Y, ldy, Yr);
        FN(gemm)(0, 0, bi, K, n, 1, D + i0 * ldd, ldd, Yr, K, 0, tmp, K);
        for (int i = i0; i < i1; i++) {
            const R *a = t->Ar + (int64_t)i * K, *tr = tmp + (int64_t)(i - i0) * K;
            R *z = Z + i * ldz;
            for (int c = 0; c < K; c++) z[c] += alpha * a[c] * tr[c];
            if (!safe)
                for (int j = i0; j <= i; j++) {
                    R d = alpha * D[i * ldd + j];
                    if (d == 0) continue;
                    const R *y = Y + j * ldy;
                    DR_VEXPDIFF(K, g->G + i * g->ldg, g->G + j * g->ldg, e);
                    for (int c = 0; c < K; c++) z[c] += d * y[c] * e[c];
                }
        }
    }
}

/* Z (L x K) += alpha * [ Z_jc = sum_i D_ij X_ic Gamma_ijc ], D L x L lower. */
DR_STATIC void FN(gated_colapply)(const FN(cg) *g, const R *D, int64_t ldd, const R *X, int64_t ldx, R alpha, R *Z,
                                  int64_t ldz, R *ws) {
    int L = g->L, K = g->K;
    if (g->kind == DG_GATE_NONE) {
        FN(gemm_tri)(1, L, K, alpha, D, ldd, X, ldx, 1, Z, ldz);
        return;
    }
    if (g->kind == DG_GATE_HEAD) {
        R *DE = ws, *e = ws + (int64_t)L * L;
        FN(copy_rows)(L, L, D, ldd, DE, L);
        FN(head_decay_mul)(g, DE, L, e);
        FN(gemm_tri)(1, L, K, alpha, DE, L, X, ldx, 1, Z, ldz);
        return;
    }
    const FN(ctab) *t = g->tab;
    R *tmp = ws, *Xr = ws + DR_BS * K, *e = Xr + (int64_t)L * K;
    for (int j0 = 0, bJ = 0; j0 < L; j0 += DR_BS, bJ++) {
        int j1 = j0 + DR_BS < L ? j0 + DR_BS : L, bj = j1 - j0, safe = t->safe[bJ];
        int m0 = safe ? j0 : j1;
        /* row side: Xr_i = X_i o Ar_i o P_{bI(i),bJ} */
        for (int i = m0; i < L; i++) {
            const R *x = X + i * ldx, *a = t->Ar + (int64_t)i * K,
                    *p = t->P + ((int64_t)(i / DR_BS) * DR_MAXB + bJ) * K;
            R *o = Xr + (int64_t)(i - m0) * K;
            for (int c = 0; c < K; c++) o[c] = x[c] * a[c] * p[c];
        }
        FN(gemm)(1, 0, bj, K, L - m0, 1, D + m0 * ldd + j0, ldd, Xr, K, 0, tmp, K);
        for (int j = j0; j < j1; j++) {
            const R *b = t->Bc + (int64_t)j * K, *tr = tmp + (int64_t)(j - j0) * K;
            R *z = Z + j * ldz;
            for (int c = 0; c < K; c++) z[c] += alpha * b[c] * tr[c];
            if (!safe)
                for (int i = j; i < j1; i++) {
                    R d = alpha * D[i * ldd + j];
                    if (d == 0) continue;
                    const R *x = X + i * ldx;
                    DR_VEXPDIFF(K, g->G + i * g->ldg, g->G + j * g->ldg, e);
                    for (int c = 0; c < K; c++) z[c] += d * x[c] * e[c];
                }
        }
    }
}

/* Both applications of one D: Zr += alpha rowapply(D, Yr), Zc += alpha colapply(D, Xc) (HEAD: the
 * decayed D o E is formed once). */
DR_STATIC void FN(gated_apply2)(const FN(cg) *g, const R *D, int64_t ldd, const R *Yr, int64_t ldyr, const R *Xc,
                                int64_t ldxc, R alpha, R *Zr, int64_t ldzr, R *Zc, int64_t ldzc, R *ws) {
    int L = g->L, K = g->K;
    if (g->kind == DG_GATE_HEAD) {
        R *DE = ws, *e = ws + (int64_t)L * L;
        FN(copy_rows)(L, L, D, ldd, DE, L);
        FN(head_decay_mul)(g, DE, L, e);
        FN(gemm_tri)(0, L, K, alpha, DE, L, Yr, ldyr, 1, Zr, ldzr);
        FN(gemm_tri)(1, L, K, alpha, DE, L, Xc, ldxc, 1, Zc, ldzc);
        return;
    }
    FN(gated_rowapply)(g, D, ldd, Yr, ldyr, alpha, Zr, ldzr, ws);
    FN(gated_colapply)(g, D, ldd, Xc, ldxc, alpha, Zc, ldzc, ws);
}

/* For HEAD gates: out_i += sum_j D_ij M_ij (rows) - sum_j D_ji M_ji (columns), the gate gradient of
 * a gated product M (already containing exp(G_i - G_j)) with incoming gradient D. */
DR_STATIC void FN(head_rowcol_dg)(int L, const R *D, int64_t ldd, const R *M, int64_t ldm, R *out, int64_t ldo) {
    for (int i = 0; i < L; i++)
        for (int j = 0; j <= i; j++) {
            R t = D[i * ldd + j] * M[i * ldm + j];
            out[i * ldo] += t;
            out[j * ldo] -= t;
        }
}
