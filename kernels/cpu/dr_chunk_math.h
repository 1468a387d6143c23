/* Templated per-chunk building blocks of the chunked delta-rule kernels.  Included once per
 * precision by dr_chunk_f32.c / dr_chunk_f64.c / chunk_pieces_f32.c / chunk_pieces_f64.c with
 *   DR_F32 = 1 (float) or 0 (double)
 * before inclusion.  Everything here is static; names carry the _f32/_f64 suffix.
 *
 * Conventions inside a chunk: L rows (1..C), matrices row major with an explicit leading dimension
 * (the row stride in elements), so chunk slices of [B,T,H,K] arrays are used in place (ld = H*K).
 * An "L x L lower" matrix is stored with explicit zeros above the diagonal (and on it when strict).
 *
 * The gate of a chunk is its chunk-local cumulative log decay G (G_i = g_{t0} + ... + g_{t0+i}),
 * one value per row (HEAD) or K values per row (CHANNEL).  The gated products of the chunked form,
 *   M_ij = sum_c X_ic Y_jc exp(G_ic - G_jc),  j <= i,
 * are computed for CHANNEL gates in 16-row sub-blocks with a reference row r between i and j, so
 * both factors exp(G_i - G_r) and exp(G_r - G_j) are <= 1 for the off-diagonal blocks (g <= 0) and
 * nothing overflows however negative the gates; on the diagonal sub-blocks the reference is the
 * block's first (row products) or last (column products) row, used only while the gate varies by
 * less than DR_SAFE_EXP inside the block, else the block is done element by element with the exact
 * exp(G_ic - G_jc). */
#include <cblas.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "kernels/cpu/dr_chunk_internal.h"

/* every header is included above: R below is a short macro */

#if DR_F32
#define R float
#define DR_SFX f32
#define DR_GEMM cblas_sgemm
#define DR_SYRK cblas_ssyrk
#define DR_VEXP dg_vexp_f32
#define DR_SAFE_EXP 40.0f
#else
#define R double
#define DR_SFX f64
#define DR_GEMM cblas_dgemm
#define DR_SYRK cblas_dsyrk
#define DR_VEXP dg_vexp_f64
#define DR_SAFE_EXP 400.0
#endif
#define FN(name) DR_CAT2(name, DR_SFX)
#define DR_BS 16 /* sub-block of the gated products and of the blocked solve_tril */

/* OpenBLAS (pthread build) runs a GEMM with m*n*k above 65536*4 on all its threads; called from
 * several OpenMP threads at once those calls serialise on its lock.  Inside a parallel region the
 * product is therefore cut into pieces below that size (each then runs on the calling thread). */
#define DR_SPLIT_MNK 262144

/* C = alpha op(A) op(B) + beta C; op(A) is m x k, op(B) is k x n; ta/tb: 1 = transposed (A stored
 * k x m).  Zero-sized products are handled here (BLAS would reject ld < 1). */
static void FN(gemm)(int ta, int tb, int m, int n, int k, R alpha, const R *A, int64_t lda,
                     const R *B, int64_t ldb, R beta, R *C, int64_t ldc) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) C[i * ldc + j] = beta == 0 ? 0 : beta * C[i * ldc + j];
        return;
    }
    if ((int64_t)m * n * k > DR_SPLIT_MNK && omp_in_parallel() && omp_get_num_threads() > 1) {
        if (n >= m && n >= 32) {
            int h = (n / 2 + 15) / 16 * 16;
            FN(gemm)(ta, tb, m, h, k, alpha, A, lda, B, ldb, beta, C, ldc);
            FN(gemm)(ta, tb, m, n - h, k, alpha, A, lda, tb ? B + h * ldb : B + h, ldb, beta, C + h, ldc);
        } else if (m >= 32) {
            int h = (m / 2 + 15) / 16 * 16;
            FN(gemm)(ta, tb, h, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
            FN(gemm)(ta, tb, m - h, n, k, alpha, ta ? A + h : A + h * lda, lda, B, ldb, beta,
                     C + h * ldc, ldc);
        } else {
            int h = k / 2;
            FN(gemm)(ta, tb, m, n, h, alpha, A, lda, B, ldb, beta, C, ldc);
            FN(gemm)(ta, tb, m, n, k - h, alpha, ta ? A + h * lda : A + h, lda,
                     tb ? B + h : B + h * ldb, ldb, 1, C, ldc);
        }
        return;
    }
    if (beta == 0) { /* OpenBLAS's beta = 0 kernel is slower than memset + accumulate */
        for (int i = 0; i < m; i++) memset(C + i * ldc, 0, sizeof(R) * (size_t)n);
        beta = 1;
    }
    DR_GEMM(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k,
            alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

/* ---- small row helpers ---- */
static void FN(copy_rows)(int m, int n, const R *X, int64_t ldx, R *Y, int64_t ldy) {
    for (int i = 0; i < m; i++) memcpy(Y + i * ldy, X + i * ldx, sizeof(R) * (size_t)n);
}
static void FN(zero_rows)(int m, int n, R *Y, int64_t ldy) {
    for (int i = 0; i < m; i++) memset(Y + i * ldy, 0, sizeof(R) * (size_t)n);
}
/* Zero the part of an L x L matrix above the diagonal (strict: also the diagonal). */
static void FN(mask_lower)(int L, R *M, int64_t ldm, int strict) {
    for (int i = 0; i < L; i++) {
        int j0 = strict ? i : i + 1;
        if (j0 < L) memset(M + i * ldm + j0, 0, sizeof(R) * (size_t)(L - j0));
    }
}

/* Chunk-local cumulative sum over rows: out_i = sum_{j<=i} x_j (reverse: sum_{j>=i}), S columns. */
static void FN(cumsum_rows)(int L, int S, const R *x, int64_t ldx, R *out, int64_t ldo, int reverse) {
    if (!reverse) {
        for (int c = 0; c < S; c++) out[c] = x[c];
        for (int i = 1; i < L; i++)
            for (int c = 0; c < S; c++) out[i * ldo + c] = out[(i - 1) * ldo + c] + x[i * ldx + c];
    } else {
        for (int c = 0; c < S; c++) out[(L - 1) * ldo + c] = x[(L - 1) * ldx + c];
        for (int i = L - 2; i >= 0; i--)
            for (int c = 0; c < S; c++) out[i * ldo + c] = out[(i + 1) * ldo + c] + x[i * ldx + c];
    }
}

/* ---- the gate of one chunk ---- */
typedef struct FN(cg) {
    dg_gate_kind kind;
    int L, K;
    const R *G;  /* chunk-local cumulative gate; row i at G + i*ldg (HEAD: 1 value, CHANNEL: K) */
    int64_t ldg;
    const R *E;  /* HEAD only, optional: E_ij = exp(G_i - G_j) (j <= i, 0 above), ld L */
} FN(cg);

/* HEAD: E (L x L, ld L) = exp(G_i - G_j) below and on the diagonal, 0 above; one vectorised exp
 * over the whole matrix (the exponents are <= 0 for g <= 0; above the diagonal -1000 flushes to 0). */
static void FN(head_emat)(const FN(cg) *g, R *E) {
    int L = g->L;
    for (int i = 0; i < L; i++) {
        R gi = g->G[i * g->ldg], *e = E + (int64_t)i * L;
        for (int j = 0; j <= i; j++) e[j] = gi - g->G[j * g->ldg];
        for (int j = i + 1; j < L; j++) e[j] = -1000;
    }
    DR_VEXP((int64_t)L * L, E, E);
}

/* Workspace (elements) the gated products need, for chunk C and K channels. */
static int64_t FN(gated_ws)(int C, int K) {
    int64_t a = (int64_t)C * C + C, b = (int64_t)(2 * C + DR_BS + 1) * K;
    return a > b ? a : b;
}

/* Y = X o exp(G - G_ref) row by row: mode 0: exp(G_i) (ref 0), mode 1: exp(G_last - G_i),
 * mode 2: exp(G_i - G_r) for a given reference row r, mode 3: exp(G_r - G_i).  NONE: copy.
 * e: K (CHANNEL) or L (HEAD) scratch. */
static void FN(gate_rows)(const FN(cg) *g, int mode, int r, int i0, int i1, const R *X, int64_t ldx,
                          R *Y, int64_t ldy, R *e) {
    int K = g->K;
    if (mode == 1) r = g->L - 1;
    if (g->kind == DG_GATE_NONE) {
        FN(copy_rows)(i1 - i0, K, X + i0 * ldx, ldx, Y, ldy);
        return;
    }
    if (g->kind == DG_GATE_HEAD) {
        R gr = mode == 0 ? 0 : g->G[r * g->ldg];
        for (int i = i0; i < i1; i++) {
            R gi = g->G[i * g->ldg];
            e[i - i0] = (mode == 0 || mode == 2) ? gi - gr : gr - gi;
        }
        DR_VEXP(i1 - i0, e, e);
        for (int i = i0; i < i1; i++) {
            const R *x = X + i * ldx;
            R *y = Y + (i - i0) * ldy, s = e[i - i0];
            for (int c = 0; c < K; c++) y[c] = x[c] * s;
        }
        return;
    }
    const R *Gr = g->G + r * g->ldg;
    for (int i = i0; i < i1; i++) {
        const R *Gi = g->G + i * g->ldg, *x = X + i * ldx;
        R *y = Y + (i - i0) * ldy;
        if (mode == 0)
            for (int c = 0; c < K; c++) e[c] = Gi[c];
        else if (mode == 2)
            for (int c = 0; c < K; c++) e[c] = Gi[c] - Gr[c];
        else
            for (int c = 0; c < K; c++) e[c] = Gr[c] - Gi[c];
        DR_VEXP(K, e, e);
        for (int c = 0; c < K; c++) y[c] = x[c] * e[c];
    }
}

/* HEAD gate: E_ij = exp(G_i - G_j) for j <= i, written over the lower part of M as M_ij *= E_ij. */
static void FN(head_decay_mul)(const FN(cg) *g, R *M, int64_t ldm, R *e) {
    if (g->E) {
        for (int i = 0; i < g->L; i++) {
            R *m = M + i * ldm;
            const R *ei = g->E + (int64_t)i * g->L;
            for (int j = 0; j <= i; j++) m[j] *= ei[j];
        }
        return;
    }
    for (int i = 0; i < g->L; i++) {
        R gi = g->G[i * g->ldg];
        for (int j = 0; j <= i; j++) e[j] = gi - g->G[j * g->ldg];
        DR_VEXP(i + 1, e, e);
        R *m = M + i * ldm;
        for (int j = 0; j <= i; j++) m[j] *= e[j];
    }
}

/* Whether rows [a0, a1) stay within DR_SAFE_EXP of row r in every channel. */
static int FN(blk_safe)(const FN(cg) *g, int a0, int a1, int r) {
    const R *Gr = g->G + r * g->ldg;
    for (int i = a0; i < a1; i++) {
        const R *Gi = g->G + i * g->ldg;
        for (int c = 0; c < g->K; c++) {
            R d = Gi[c] - Gr[c];
            if (!(d <= DR_SAFE_EXP && d >= -DR_SAFE_EXP)) return 0;
        }
    }
    return 1;
}

/* sum_c x_c y_c exp(Gi_c - Gj_c), exactly (the element-by-element fallback). */
static R FN(gdot)(int K, const R *x, const R *y, const R *Gi, const R *Gj, R *e) {
    for (int c = 0; c < K; c++) e[c] = Gi[c] - Gj[c];
    DR_VEXP(K, e, e);
    R s = 0;
    for (int c = 0; c < K; c++) s += x[c] * y[c] * e[c];
    return s;
}

/* M (L x L lower, ld ldm) = alpha sum_c X_ic Y_jc exp(G_ic - G_jc) for j <= i (j < i if strict),
 * zeros above.  ws: FN(gated_ws). */
static void FN(gated_gram)(const FN(cg) *g, const R *X, int64_t ldx, const R *Y, int64_t ldy,
                           int strict, R alpha, R *M, int64_t ldm, R *ws) {
    int L = g->L, K = g->K;
    if (g->kind != DG_GATE_CHANNEL) {
        if (X == Y && ldx == ldy)
            DR_SYRK(CblasRowMajor, CblasLower, CblasNoTrans, L, K, alpha, X, (int)ldx, 0, M, (int)ldm);
        else
            FN(gemm)(0, 1, L, L, K, alpha, X, ldx, Y, ldy, 0, M, ldm);
        if (g->kind == DG_GATE_HEAD) FN(head_decay_mul)(g, M, ldm, ws);
        FN(mask_lower)(L, M, ldm, strict);
        return;
    }
    R *Xr = ws, *Yr = ws + DR_BS * K, *e = Yr + (int64_t)L * K;
    for (int i0 = 0; i0 < L; i0 += DR_BS) {
        int i1 = i0 + DR_BS < L ? i0 + DR_BS : L, bi = i1 - i0;
        int safe = FN(blk_safe)(g, i0, i1, i0), n = safe ? i1 : i0;
        FN(gate_rows)(g, 2, i0, i0, i1, X, ldx, Xr, K, e);
        FN(gate_rows)(g, 3, i0, 0, n, Y, ldy, Yr, K, e);
        FN(gemm)(0, 1, bi, n, K, alpha, Xr, K, Yr, K, 0, M + i0 * ldm, ldm);
        for (int i = i0; i < i1; i++) {
            R *m = M + i * ldm;
            if (!safe)
                for (int j = i0; j <= i; j++)
                    m[j] = alpha * FN(gdot)(K, X + i * ldx, Y + j * ldy, g->G + i * g->ldg,
                                            g->G + j * g->ldg, e);
            int j0 = strict ? i : i + 1;
            if (j0 < L) memset(m + j0, 0, sizeof(R) * (size_t)(L - j0));
        }
    }
}

/* Z (L x K) += alpha * [ sum_j D_ij Y_jc exp(G_ic - G_jc) ], D L x L lower (zeros above). */
static void FN(gated_rowapply)(const FN(cg) *g, const R *D, int64_t ldd, const R *Y, int64_t ldy,
                               R alpha, R *Z, int64_t ldz, R *ws) {
    int L = g->L, K = g->K;
    if (g->kind == DG_GATE_NONE) {
        FN(gemm)(0, 0, L, K, L, alpha, D, ldd, Y, ldy, 1, Z, ldz);
        return;
    }
    if (g->kind == DG_GATE_HEAD) {
        R *DE = ws, *e = ws + (int64_t)L * L;
        FN(copy_rows)(L, L, D, ldd, DE, L);
        FN(head_decay_mul)(g, DE, L, e);
        FN(gemm)(0, 0, L, K, L, alpha, DE, L, Y, ldy, 1, Z, ldz);
        return;
    }
    R *tmp = ws, *Yr = ws + DR_BS * K, *e = Yr + (int64_t)L * K;
    for (int i0 = 0; i0 < L; i0 += DR_BS) {
        int i1 = i0 + DR_BS < L ? i0 + DR_BS : L, bi = i1 - i0;
        int safe = FN(blk_safe)(g, i0, i1, i0), n = safe ? i1 : i0;
        FN(gate_rows)(g, 3, i0, 0, n, Y, ldy, Yr, K, e);
        FN(gemm)(0, 0, bi, K, n, 1, D + i0 * ldd, ldd, Yr, K, 0, tmp, K);
        const R *Gr = g->G + i0 * g->ldg;
        for (int i = i0; i < i1; i++) {
            const R *Gi = g->G + i * g->ldg;
            for (int c = 0; c < K; c++) e[c] = Gi[c] - Gr[c];
            DR_VEXP(K, e, e);
            R *z = Z + i * ldz, *t = tmp + (i - i0) * K;
            for (int c = 0; c < K; c++) z[c] += alpha * e[c] * t[c];
            if (!safe)
                for (int j = i0; j <= i; j++) {
                    R d = alpha * D[i * ldd + j];
                    if (d == 0) continue;
                    const R *Gj = g->G + j * g->ldg, *y = Y + j * ldy;
                    for (int c = 0; c < K; c++) e[c] = Gi[c] - Gj[c];
                    DR_VEXP(K, e, e);
                    for (int c = 0; c < K; c++) z[c] += d * y[c] * e[c];
                }
        }
    }
}

/* Z (L x K) += alpha * [ Z_jc = sum_i D_ij X_ic exp(G_ic - G_jc) ], D L x L lower. */
static void FN(gated_colapply)(const FN(cg) *g, const R *D, int64_t ldd, const R *X, int64_t ldx,
                               R alpha, R *Z, int64_t ldz, R *ws) {
    int L = g->L, K = g->K;
    if (g->kind == DG_GATE_NONE) {
        FN(gemm)(1, 0, L, K, L, alpha, D, ldd, X, ldx, 1, Z, ldz);
        return;
    }
    if (g->kind == DG_GATE_HEAD) {
        R *DE = ws, *e = ws + (int64_t)L * L;
        FN(copy_rows)(L, L, D, ldd, DE, L);
        FN(head_decay_mul)(g, DE, L, e);
        FN(gemm)(1, 0, L, K, L, alpha, DE, L, X, ldx, 1, Z, ldz);
        return;
    }
    R *tmp = ws, *Xr = ws + DR_BS * K, *e = Xr + (int64_t)L * K;
    for (int j0 = 0; j0 < L; j0 += DR_BS) {
        int j1 = j0 + DR_BS < L ? j0 + DR_BS : L, bj = j1 - j0, r = j1 - 1;
        int safe = FN(blk_safe)(g, j0, j1, r), m0 = safe ? j0 : j1;
        FN(gate_rows)(g, 2, r, m0, L, X, ldx, Xr, K, e);
        FN(gemm)(1, 0, bj, K, L - m0, 1, D + m0 * ldd + j0, ldd, Xr, K, 0, tmp, K);
        const R *Gr = g->G + r * g->ldg;
        for (int j = j0; j < j1; j++) {
            const R *Gj = g->G + j * g->ldg;
            for (int c = 0; c < K; c++) e[c] = Gr[c] - Gj[c];
            DR_VEXP(K, e, e);
            R *z = Z + j * ldz, *t = tmp + (j - j0) * K;
            for (int c = 0; c < K; c++) z[c] += alpha * e[c] * t[c];
            if (!safe)
                for (int i = j; i < j1; i++) {
                    R d = alpha * D[i * ldd + j];
                    if (d == 0) continue;
                    const R *Gi = g->G + i * g->ldg, *x = X + i * ldx;
                    for (int c = 0; c < K; c++) e[c] = Gi[c] - Gj[c];
                    DR_VEXP(K, e, e);
                    for (int c = 0; c < K; c++) z[c] += d * x[c] * e[c];
                }
        }
    }
}

/* Both applications of one D: Zr += alpha rowapply(D, Yr), Zc += alpha colapply(D, Xc) (HEAD: the
 * decayed D o E is formed once). */
static void FN(gated_apply2)(const FN(cg) *g, const R *D, int64_t ldd, const R *Yr, int64_t ldyr,
                             const R *Xc, int64_t ldxc, R alpha, R *Zr, int64_t ldzr, R *Zc,
                             int64_t ldzc, R *ws) {
    int L = g->L, K = g->K;
    if (g->kind == DG_GATE_HEAD) {
        R *DE = ws, *e = ws + (int64_t)L * L;
        FN(copy_rows)(L, L, D, ldd, DE, L);
        FN(head_decay_mul)(g, DE, L, e);
        FN(gemm)(0, 0, L, K, L, alpha, DE, L, Yr, ldyr, 1, Zr, ldzr);
        FN(gemm)(1, 0, L, K, L, alpha, DE, L, Xc, ldxc, 1, Zc, ldzc);
        return;
    }
    FN(gated_rowapply)(g, D, ldd, Yr, ldyr, alpha, Zr, ldzr, ws);
    FN(gated_colapply)(g, D, ldd, Xc, ldxc, alpha, Zc, ldzc, ws);
}

/* For HEAD gates: out_i += sum_j D_ij M_ij (rows) - sum_j D_ji M_ji (columns), the gate gradient of
 * a gated product M (already containing exp(G_i - G_j)) with incoming gradient D. */
static void FN(head_rowcol_dg)(int L, const R *D, int64_t ldd, const R *M, int64_t ldm, R *out,
                               int64_t ldo) {
    for (int i = 0; i < L; i++)
        for (int j = 0; j <= i; j++) {
            R t = D[i * ldd + j] * M[i * ldm + j];
            out[i * ldo] += t;
            out[j * ldo] -= t;
        }
}

/* ---- (I + A)^-1 for strictly lower A (solve_tril) ----
 * Forward substitution: row i of X^-1 is e_i - sum_{j<i} A_ij (row j of X^-1). */
static void FN(tril_inv_fs)(int L, const R *A, int64_t lda, R *Y, int64_t ldy) {
    for (int i = 0; i < L; i++) {
        R *y = Y + i * ldy;
        memset(y, 0, sizeof(R) * (size_t)L);
        y[i] = 1;
        for (int j = 0; j < i; j++) {
            R a = A[i * lda + j];
            if (a == 0) continue;
            const R *yj = Y + j * ldy;
            for (int c = 0; c <= j; c++) y[c] -= a * yj[c];
        }
    }
}

/* Blocked: invert the 16 x 16 diagonal blocks by forward substitution, then fill the blocks below
 * the diagonal block row by block row (seed 004):  Y_IJ = -Y_II sum_{J<=M<I} A_IM Y_MJ.
 * ws: 16*16 elements. */
static void FN(tril_inv_blocked)(int L, const R *A, int64_t lda, R *Y, int64_t ldy, R *ws) {
    FN(zero_rows)(L, L, Y, ldy);
    for (int i0 = 0; i0 < L; i0 += DR_BS) {
        int i1 = i0 + DR_BS < L ? i0 + DR_BS : L, bi = i1 - i0;
        FN(tril_inv_fs)(bi, A + i0 * lda + i0, lda, Y + i0 * ldy + i0, ldy);
        for (int j0 = 0; j0 < i0; j0 += DR_BS) {
            /* ws = A[I, j0:i0] Y[j0:i0, J];  Y_IJ = -Y_II ws */
            FN(gemm)(0, 0, bi, DR_BS, i0 - j0, 1, A + i0 * lda + j0, lda, Y + j0 * ldy + j0, ldy, 0,
                     ws, DR_BS);
            FN(gemm)(0, 0, bi, DR_BS, bi, -1, Y + i0 * ldy + i0, ldy, ws, DR_BS, 0,
                     Y + i0 * ldy + j0, ldy);
        }
    }
}

static void FN(tril_inv)(int blocked, int L, const R *A, int64_t lda, R *Y, int64_t ldy, R *ws) {
    if (blocked)
        FN(tril_inv_blocked)(L, A, lda, Y, ldy, ws);
    else
        FN(tril_inv_fs)(L, A, lda, Y, ldy);
}

/* Backward of Y = (I + A)^-1: dA = strictly_lower( -Y^T dY Y^T ), with dY taken on its lower part
 * (incl. the diagonal; Y's upper part is identically zero).  ws: 2 L*L. */
static void FN(tril_inv_bwd)(int L, const R *Y, int64_t ldy, const R *dY, int64_t lddy, R *dA,
                             int64_t ldda, R *ws) {
    R *dm = ws, *t = ws + (int64_t)L * L;
    FN(copy_rows)(L, L, dY, lddy, dm, L);
    FN(mask_lower)(L, dm, L, 0);
    FN(gemm)(1, 0, L, L, L, 1, Y, ldy, dm, L, 0, t, L);      /* t = Y^T dY */
    FN(gemm)(0, 1, L, L, L, -1, t, L, Y, ldy, 0, dA, ldda);  /* dA = -t Y^T */
    FN(mask_lower)(L, dA, ldda, 1);
}
