/* Templated per-chunk building blocks of the chunked delta-rule kernels.  Included once per
 * precision by dr_chunk_f32.c / dr_chunk_f64.c / chunk_pieces_f32.c / chunk_pieces_f64.c with
 *   DR_F32 = 1 (float) or 0 (double)
 * before inclusion.  Everything here is static; names carry the _f32/_f64 suffix.
 *
 * Conventions inside a chunk: L rows (1..C), matrices row major with an explicit leading dimension
 * (the row stride in elements), so chunk slices of [B,T,H,K] arrays are used in place (ld = H*K).
 * An "L x L lower" matrix is stored with explicit zeros above the diagonal (and on it when strict).
 *
 * The gate of a chunk and the gated products: dr_chunk_gated.h (included at the end). */
#include <cblas.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "kernels/cpu/delta/dr_chunk_internal.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_small.h"

/* every header is included above: R below is a short macro */

#if DR_F32
#define R float
#define DR_SFX f32
#define DR_GEMM dg_cpu_gemm_f32
#define DR_VEXP dg_vexp_f32
#define DR_VEXPDIFF dg_vexpdiff_f32
#define DR_SAFE_EXP 40.0f
#else
#define R double
#define DR_SFX f64
#define DR_GEMM dg_cpu_gemm_f64
#define DR_SYRK cblas_dsyrk
#define DR_VEXP dg_vexp_f64
#define DR_VEXPDIFF dg_vexpdiff_f64
#define DR_SAFE_EXP 400.0
#endif
#define FN(name) DR_CAT2(name, DR_SFX)
/* helpers: not every instantiation uses every one */
#define DR_STATIC static __attribute__((unused))
#define DR_BS 16 /* sub-block of the gated products and of the blocked solve_tril */

/* The three products of the chunk kernels:
 *   gemm       C = alpha op(A) op(B) + beta C; op(A) is m x k, op(B) is k x n; ta/tb: 1 = transposed
 *              (A stored k x m).  Zero-sized products are handled here (BLAS would reject ld < 1).
 *   gemm_tri   C (L x n) = alpha op(T) B + beta C, T L x L lower triangular (ta = 0: T, ta = 1: T^T)
 *              with zeros stored above the diagonal, B L x n: T's zero block is skipped.
 *   gemm_lowc  the lower part (incl. the diagonal) of C (L x L) = alpha A B^T + beta C, A and B L x k;
 *              some of C above the diagonal is left as it was, some written (callers mask it).
 *   gram_lower the lower part of M (L x L) = alpha X X^T (X L x k), the rest as gemm_lowc leaves it.
 * The products of one chunk are small (64 x 128 x 128 and below at C = 64, K = V = 128). */
#if DR_F32
/* f32: register tiles on the calling thread without OpenBLAS's copies of both operands
 * (kernels/cpu/gemm_small.h); the triangular products skip the zero or unwanted part tile by tile
 * (about half of the full product's work at L = 64). */
DR_STATIC void FN(gemm)(int ta, int tb, int m, int n, int k, R alpha, const R *A, int64_t lda, const R *B, int64_t ldb,
                        R beta, R *C, int64_t ldc) {
    dg_cpu_gemm_small_f32(DG_GEMM_FULL, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}
DR_STATIC void FN(gemm_tri)(int ta, int L, int n, R alpha, const R *T, int64_t ldt, const R *B, int64_t ldb, R beta,
                            R *C, int64_t ldc) {
    dg_cpu_gemm_small_f32(ta ? DG_GEMM_A_UPPER : DG_GEMM_A_LOWER, ta, 0, L, n, L, alpha, T, ldt, B, ldb, beta, C, ldc);
}
DR_STATIC void FN(gemm_lowc)(int L, int k, R alpha, const R *A, int64_t lda, const R *B, int64_t ldb, R beta, R *C,
                             int64_t ldc) {
    dg_cpu_gemm_small_f32(DG_GEMM_C_LOWER, 0, 1, L, L, k, alpha, A, lda, B, ldb, beta, C, ldc);
}
DR_STATIC void FN(gram_lower)(int L, int k, R alpha, const R *X, int64_t ldx, R *M, int64_t ldm) {
    FN(gemm_lowc)(L, k, alpha, X, ldx, X, ldx, 0, M, ldm);
}
#else
/* f64 (the precision of the tests against the f64 reference): dg_cpu_gemm (kernels/cpu/gemm.h),
 * OpenBLAS on the calling thread, a product outside a parallel region shared among OpenMP's
 * threads.  Should a program have put OpenBLAS (pthread build) on several threads, it runs a GEMM
 * with m*n*k above 65536*4 on all of them, and such calls from several OpenMP threads at once
 * serialise on its lock: inside a parallel region the product is therefore cut into pieces below
 * that size. */
#define DR_SPLIT_MNK 262144

DR_STATIC void FN(gemm)(int ta, int tb, int m, int n, int k, R alpha, const R *A, int64_t lda, const R *B, int64_t ldb,
                        R beta, R *C, int64_t ldc) {
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
            FN(gemm)(ta, tb, m - h, n, k, alpha, ta ? A + h : A + h * lda, lda, B, ldb, beta, C + h * ldc, ldc);
        } else {
            int h = k / 2;
            FN(gemm)(ta, tb, m, n, h, alpha, A, lda, B, ldb, beta, C, ldc);
            FN(gemm)(ta, tb, m, n, k - h, alpha, ta ? A + h * lda : A + h, lda, tb ? B + h : B + h * ldb, ldb, 1, C,
                     ldc);
        }
        return;
    }
    if (beta == 0) { /* OpenBLAS's beta = 0 kernel is slower than memset + accumulate */
        for (int i = 0; i < m; i++) memset(C + i * ldc, 0, sizeof(R) * (size_t)n);
        beta = 1;
    }
    DR_GEMM(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* The triangular products skip the zero (or unwanted) upper-right block: for L > 32 the rows are
 * cut at h = 32 (3/4 of the full product's work, one more call). */
#define DR_TRI_SPLIT 32

DR_STATIC void FN(gemm_tri)(int ta, int L, int n, R alpha, const R *T, int64_t ldt, const R *B, int64_t ldb, R beta,
                            R *C, int64_t ldc) {
    if (L <= DR_TRI_SPLIT) {
        FN(gemm)(ta, 0, L, n, L, alpha, T, ldt, B, ldb, beta, C, ldc);
        return;
    }
    int h = DR_TRI_SPLIT;
    if (!ta) { /* rows < h only see columns < h */
        FN(gemm)(0, 0, h, n, h, alpha, T, ldt, B, ldb, beta, C, ldc);
        FN(gemm)(0, 0, L - h, n, L, alpha, T + h * ldt, ldt, B, ldb, beta, C + h * ldc, ldc);
    } else { /* (T^T)_ij = T_ji is zero for j < i: rows >= h only see rows >= h of B */
        FN(gemm)(1, 0, h, n, L, alpha, T, ldt, B, ldb, beta, C, ldc);
        FN(gemm)(1, 0, L - h, n, L - h, alpha, T + h * ldt + h, ldt, B + h * ldb, ldb, beta, C + h * ldc, ldc);
    }
}

DR_STATIC void FN(gemm_lowc)(int L, int k, R alpha, const R *A, int64_t lda, const R *B, int64_t ldb, R beta, R *C,
                             int64_t ldc) {
    if (L <= DR_TRI_SPLIT) {
        FN(gemm)(0, 1, L, L, k, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    int h = DR_TRI_SPLIT;
    FN(gemm)(0, 1, h, h, k, alpha, A, lda, B, ldb, beta, C, ldc);
    FN(gemm)(0, 1, L - h, L, k, alpha, A + h * lda, lda, B, ldb, beta, C + h * ldc, ldc);
}
DR_STATIC void FN(gram_lower)(int L, int k, R alpha, const R *X, int64_t ldx, R *M, int64_t ldm) {
    DR_SYRK(CblasRowMajor, CblasLower, CblasNoTrans, L, k, alpha, X, (int)ldx, 0, M, (int)ldm);
}
#endif

/* ---- small row helpers ---- */
/* sum_i x_i y_i over i < n, in vector lanes (OpenMP simd: partial sums, not one sequential chain) */
DR_STATIC R FN(dot)(int n, const R *x, const R *y) {
    R s = 0;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += x[i] * y[i];
    return s;
}
DR_STATIC void FN(copy_rows)(int m, int n, const R *X, int64_t ldx, R *Y, int64_t ldy) {
    for (int i = 0; i < m; i++) memcpy(Y + i * ldy, X + i * ldx, sizeof(R) * (size_t)n);
}
DR_STATIC void FN(zero_rows)(int m, int n, R *Y, int64_t ldy) {
    for (int i = 0; i < m; i++) memset(Y + i * ldy, 0, sizeof(R) * (size_t)n);
}
/* Zero the part of an L x L matrix above the diagonal (strict: also the diagonal). */
DR_STATIC void FN(mask_lower)(int L, R *M, int64_t ldm, int strict) {
    for (int i = 0; i < L; i++) {
        int j0 = strict ? i : i + 1;
        if (j0 < L) memset(M + i * ldm + j0, 0, sizeof(R) * (size_t)(L - j0));
    }
}

/* Chunk-local cumulative sum over rows: out_i = sum_{j<=i} x_j (reverse: sum_{j>=i}), S columns. */
DR_STATIC void FN(cumsum_rows)(int L, int S, const R *x, int64_t ldx, R *out, int64_t ldo, int reverse) {
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

/* ---- (I + A)^-1 for strictly lower A (solve_tril) ----
 * Forward substitution: row i of X^-1 is e_i - sum_{j<i} A_ij (row j of X^-1). */
DR_STATIC void FN(tril_inv_fs)(int L, const R *A, int64_t lda, R *Y, int64_t ldy) {
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
 * the diagonal block row by block row:  Y_IJ = -Y_II sum_{J<=M<I} A_IM Y_MJ.
 * ws: 16*16 elements. */
DR_STATIC void FN(tril_inv_blocked)(int L, const R *A, int64_t lda, R *Y, int64_t ldy, R *ws) {
    FN(zero_rows)(L, L, Y, ldy);
    for (int i0 = 0; i0 < L; i0 += DR_BS) {
        int i1 = i0 + DR_BS < L ? i0 + DR_BS : L, bi = i1 - i0;
        FN(tril_inv_fs)(bi, A + i0 * lda + i0, lda, Y + i0 * ldy + i0, ldy);
        for (int j0 = 0; j0 < i0; j0 += DR_BS) {
            /* ws = A[I, j0:i0] Y[j0:i0, J];  Y_IJ = -Y_II ws */
            FN(gemm)(0, 0, bi, DR_BS, i0 - j0, 1, A + i0 * lda + j0, lda, Y + j0 * ldy + j0, ldy, 0, ws, DR_BS);
            FN(gemm)(0, 0, bi, DR_BS, bi, -1, Y + i0 * ldy + i0, ldy, ws, DR_BS, 0, Y + i0 * ldy + j0, ldy);
        }
    }
}

DR_STATIC void FN(tril_inv)(int blocked, int L, const R *A, int64_t lda, R *Y, int64_t ldy, R *ws) {
    if (blocked) FN(tril_inv_blocked)(L, A, lda, Y, ldy, ws);
    else FN(tril_inv_fs)(L, A, lda, Y, ldy);
}

/* Backward of Y = (I + A)^-1: dA = strictly_lower( -Y^T dY Y^T ), with dY taken on its lower part
 * (incl. the diagonal; Y's upper part is identically zero).  ws: 2 L*L. */
DR_STATIC void FN(tril_inv_bwd)(int L, const R *Y, int64_t ldy, const R *dY, int64_t lddy, R *dA, int64_t ldda, R *ws) {
    R *dm = ws, *t = ws + (int64_t)L * L;
    FN(copy_rows)(L, L, dY, lddy, dm, L);
    FN(mask_lower)(L, dm, L, 0);
    FN(gemm_tri)(1, L, L, 1, Y, ldy, dm, L, 0, t, L);   /* t = Y^T dY */
    FN(gemm_lowc)(L, L, -1, t, L, Y, ldy, 0, dA, ldda); /* dA = -t Y^T (lower part) */
    FN(mask_lower)(L, dA, ldda, 1);
}

#include "kernels/cpu/delta/dr_chunk_gated.h"
