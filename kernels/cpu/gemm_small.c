/* Small f32 products with AVX2 register tiles (kernels/cpu/gemm_small.h). */
#include "kernels/cpu/gemm_small.h"

#include "kernels/cpu/gemm.h"

#include <limits.h>
#include <omp.h>
#include <stdlib.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#define MR 6   /* rows of C a tile */
#define NR 16  /* columns of C a tile: two vectors */
#define KC 256 /* the k block: a packed panel (KC x NR floats, 16 KB) stays in L1 */
/* a product of fewer multiply-adds runs on the calling thread (as kernels/cpu/gemm.c decides) */
#define PAR_MIN_MACS ((int64_t)1 << 21)

/* GCC's scheduling before register allocation, pressure-aware: without it GCC keeps one of the two
 * vectors of B's row on the stack at mr = 6 (a store and six loads more a step), and the tiles ran
 * at 47-56 GFLOP/s on one core on operands in L1 against 61-88 with it. */
#pragma GCC push_options
#pragma GCC optimize("schedule-insns", "sched-pressure")

/* C (mr x 16) = alpha sum_p a(i, p) Bp[p, 0:16] + beta C over p < kc, where a(i, p) =
 * A[i sa + p sp] (sa = lda, sp = 1 for A as stored; sa = 1, sp = lda for A^T) and row p of the
 * panel is at Bp + p ldp; beta = 0 does not read C.  mr is a constant at every call: the
 * accumulators live in registers (12 of the 16 ymm at mr = 6, with two for the row of B and one
 * for the broadcast). */
static inline __attribute__((always_inline)) void tile(const int mr, int kc, const float *A, int64_t sa, int64_t sp,
                                                       const float *Bp, int64_t ldp, float alpha, float beta, float *C,
                                                       int64_t ldc) {
    __m256 acc0[MR], acc1[MR];
    for (int i = 0; i < mr; i++) acc0[i] = acc1[i] = _mm256_setzero_ps();
    for (int p = 0; p < kc; p++) {
        const __m256 b0 = _mm256_loadu_ps(Bp + p * ldp), b1 = _mm256_loadu_ps(Bp + p * ldp + 8);
        for (int i = 0; i < mr; i++) {
            const __m256 a = _mm256_broadcast_ss(A + i * sa + p * sp);
            acc0[i] = _mm256_fmadd_ps(a, b0, acc0[i]);
            acc1[i] = _mm256_fmadd_ps(a, b1, acc1[i]);
        }
    }
    const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
    for (int i = 0; i < mr; i++) {
        __m256 r0 = _mm256_mul_ps(va, acc0[i]), r1 = _mm256_mul_ps(va, acc1[i]);
        if (beta != 0) {
            r0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(C + i * ldc), r0);
            r1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(C + i * ldc + 8), r1);
        }
        _mm256_storeu_ps(C + i * ldc, r0);
        _mm256_storeu_ps(C + i * ldc + 8, r1);
    }
}

/* Rows [0, m) of C's block of nc <= 16 columns (starting at column j0 of C) over the k block
 * [p0, p0 + kc): tiles of MR rows, the last one shorter.  A block narrower than 16 goes through a
 * 16-wide copy (t) of its rows.  first: the k block that applies beta. */
static void rows(dg_gemm_part part, int m, int j0, int nc, int p0, int kc, const float *A, int64_t sa, int64_t sp,
                 const float *Bp, int64_t ldp, float alpha, float beta, bool first, float *C, int64_t ldc) {
    float t[MR * NR];
    const int i0 = part == DG_GEMM_C_LOWER ? j0 / MR * MR : 0; /* tiles above it are wholly above the diagonal */
    for (int i = i0; i < m; i += MR) {
        const int mr = m - i < MR ? m - i : MR;
        int lo = 0, hi = kc; /* the p of this k block that the tile needs, relative to p0 */
        if (part == DG_GEMM_A_LOWER && hi > i + mr - p0) hi = i + mr - p0;
        if (part == DG_GEMM_A_UPPER && lo < i - p0) lo = i - p0 < kc ? i - p0 : kc;
        if (hi <= lo && !first) continue; /* nothing to add (the first block still applies beta) */
        if (hi < lo) hi = lo;
        const float *a = A + i * sa + lo * sp, *b = Bp + lo * ldp;
        const int kt = hi - lo;
        const float bt = first ? beta : 1.0f;
        float *c = C + i * ldc, *ct = c;
        int64_t ldt = ldc;
        if (nc < NR) {
            ct = t;
            ldt = NR;
            for (int r = 0; r < mr; r++)
                for (int j = 0; j < NR; j++) t[r * NR + j] = j < nc && bt != 0 ? c[r * ldc + j] : 0.0f;
        }
        switch (mr) { /* constant row counts: the accumulators stay in registers */
        case 6: tile(6, kt, a, sa, sp, b, ldp, alpha, bt, ct, ldt); break;
        case 5: tile(5, kt, a, sa, sp, b, ldp, alpha, bt, ct, ldt); break;
        case 4: tile(4, kt, a, sa, sp, b, ldp, alpha, bt, ct, ldt); break;
        case 3: tile(3, kt, a, sa, sp, b, ldp, alpha, bt, ct, ldt); break;
        case 2: tile(2, kt, a, sa, sp, b, ldp, alpha, bt, ct, ldt); break;
        default: tile(1, kt, a, sa, sp, b, ldp, alpha, bt, ct, ldt); break;
        }
        if (nc < NR)
            for (int r = 0; r < mr; r++)
                for (int j = 0; j < nc; j++) c[r * ldc + j] = t[r * NR + j];
    }
}

#pragma GCC pop_options

/* dst (8 x 8, row stride ldd) = the transpose of src (8 x 8, row stride lds) */
static inline void transpose8(const float *src, int64_t lds, float *dst, int64_t ldd) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + i * lds);
    for (int i = 0; i < 8; i += 2) { /* pairs of rows interleaved */
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) { /* then pairs of pairs */
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) { /* and the 128-bit halves of rows i and i + 4 */
        _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
}

/* The panel of op(B) for columns [j, j + nc) and k block [p0, p0 + kc): B's rows in place where B
 * is not transposed and the block is 16 wide (one 64-byte line a row), else a copy padded with
 * zeros in panel (KC x NR).  Returns it, its row stride in *ldp. */
static const float *bpanel(bool tb, int j, int nc, int p0, int kc, const float *B, int64_t ldb, float *panel,
                           int64_t *ldp) {
    *ldp = NR;
    if (!tb && nc == NR) {
        *ldp = ldb;
        return B + p0 * ldb + j;
    }
    if (!tb) { /* the last columns, padded with zeros */
        for (int p = 0; p < kc; p++)
            for (int c = 0; c < NR; c++) panel[p * NR + c] = c < nc ? B[(p0 + p) * ldb + j + c] : 0.0f;
    } else { /* B stored n x k: column c of the panel is row j + c of B */
        int p = 0;
        if (nc == NR) /* 8 x 8 blocks transposed in registers */
            for (; p + 8 <= kc; p += 8)
                for (int h = 0; h < NR; h += 8) transpose8(B + (j + h) * ldb + p0 + p, ldb, panel + p * NR + h, NR);
        for (int c = 0; c < NR; c++)
            for (int q = p; q < kc; q++) panel[q * NR + c] = c < nc ? B[(j + c) * ldb + p0 + q] : 0.0f;
    }
    return panel;
}

void dg_cpu_gemm_small_f32(dg_gemm_part part, bool ta, bool tb, int m, int n, int k, float alpha, const float *A,
                           int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) { /* C = beta C, as dg_cpu_gemm_f32 makes it */
        dg_cpu_gemm_f32(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    float panel[KC * NR] __attribute__((aligned(32)));
    const int64_t sa = ta ? 1 : lda, sp = ta ? lda : 1;
    for (int j = 0; j < n; j += NR) {
        const int nc = n - j < NR ? n - j : NR;
        for (int p0 = 0; p0 < k; p0 += KC) {
            const int kc = k - p0 < KC ? k - p0 : KC;
            int64_t ldp;
            const float *Bp = bpanel(tb, j, nc, p0, kc, B, ldb, panel, &ldp);
            rows(part, m, j, nc, p0, kc, A + p0 * sp, sa, sp, Bp, ldp, alpha, beta, p0 == 0, C + j, ldc);
        }
    }
}

/* ---- the large products (dg_cpu_gemm_tiles_f32) ---- */

/* rows of C a block when threads own blocks of rows: the block of op(A) (MB x k, k <= 512) stays in
 * the core's L2 while every column panel of op(B) passes over it */
#define MB 96
/* (the blocks are handed out two at a time as threads come free: a thread that the OS runs late,
 * on a machine shared with other work, does not hold up the product) */

void dg_cpu_gemm_tiles_f32(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *A, int64_t lda,
                           const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (m <= 0 || n <= 0 || k <= 0 || m > INT_MAX || n > INT_MAX || k > INT_MAX) {
        dg_cpu_gemm_f32(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    if (m < 2 * MB || m < k) { /* short C with a long k (a weight's gradient, dy^T x): OpenBLAS's
                                * packing pays there (94-99 GFLOP/s against 79-89 for the tiles) */
        dg_cpu_gemm_f32(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    /* a transposed B (n x k, a layer's weight) is transposed once so that every block reads its
     * rows in place */
    float *Bt = tb ? malloc(sizeof(float) * (size_t)(n * k)) : NULL;
    if (Bt) { /* (without room for the copy the panels copy B block by block) */
        for (int64_t c = 0; c < n; c++)
            for (int64_t p = 0; p < k; p++) Bt[p * n + c] = B[c * ldb + p];
        B = Bt, ldb = n, tb = false;
    }
    const int nt = omp_in_parallel() || m * n * k < PAR_MIN_MACS ? 1 : omp_get_max_threads();
    const int64_t nblk = (m + MB - 1) / MB;
#pragma omp parallel for schedule(dynamic, 2) num_threads(nt) if (nt > 1)
    for (int64_t b = 0; b < nblk; b++) {
        const int64_t r0 = b * MB, mb = m - r0 < MB ? m - r0 : MB;
        dg_cpu_gemm_small_f32(DG_GEMM_FULL, ta, tb, (int)mb, (int)n, (int)k, alpha, ta ? A + r0 : A + r0 * lda, lda, B,
                              ldb, beta, C + r0 * ldc, ldc);
    }
    free(Bt);
}

#else

void dg_cpu_gemm_small_f32(dg_gemm_part part, bool ta, bool tb, int m, int n, int k, float alpha, const float *A,
                           int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    (void)part; /* the parts skipped are zeros or not wanted: the whole product is as good */
    dg_cpu_gemm_f32(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

void dg_cpu_gemm_tiles_f32(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *A, int64_t lda,
                           const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    dg_cpu_gemm_f32(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

#endif
