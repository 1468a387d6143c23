/* The small f32 products of the chunked delta-rule kernels (kernels/cpu/gemm_small.c):
 *  - every transposition, shapes that leave partial tiles in rows and columns, k across the
 *    256-wide k blocks, strided operands, beta 0 / 1 / other, against a product in double: each
 *    element within the rounding bound of a k-term dot product, 2 k u sum_p |a_ip b_pj| + the
 *    rounding of alpha, beta and the sum (u = 2^-24);
 *  - beta = 0 does not read C (it holds NaN);
 *  - the triangular parts: with op(A) lower (upper) triangular, DG_GEMM_A_LOWER (A_UPPER) gives the
 *    same bits as the full product; DG_GEMM_C_LOWER gives the full product's bits on and below the
 *    diagonal;
 *  - the large products (dg_cpu_gemm_tiles_f32): the bits of the one-thread tiles on any number of
 *    threads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/gemm_small.h"
#include "tests/support/test_support.h"

static uint64_t rs = 0x243F6A8885A308D3ull;
static float frand(void) { return (float)(2 * dg_test_xorshift(&rs) - 1); }

typedef struct prod {
    int ta, tb, m, n, k;
    int64_t lda, ldb, ldc;
    float *A, *B, *C;
} prod;

/* operands with leading dimensions past their widths (strided rows) */
static void prod_make(prod *p, int ta, int tb, int m, int n, int k) {
    p->ta = ta, p->tb = tb, p->m = m, p->n = n, p->k = k;
    p->lda = (ta ? m : k) + 3;
    p->ldb = (tb ? k : n) + 5;
    p->ldc = n + 2;
    const int64_t na = p->lda * (ta ? k : m), nb = p->ldb * (tb ? n : k), nc = p->ldc * m;
    p->A = malloc(sizeof(float) * (size_t)na);
    p->B = malloc(sizeof(float) * (size_t)nb);
    p->C = malloc(sizeof(float) * (size_t)nc);
    assert_non_null(p->A), assert_non_null(p->B), assert_non_null(p->C);
    for (int64_t i = 0; i < na; i++) p->A[i] = frand();
    for (int64_t i = 0; i < nb; i++) p->B[i] = frand();
    for (int64_t i = 0; i < nc; i++) p->C[i] = frand();
}
static void prod_free(prod *p) { free(p->A), free(p->B), free(p->C); }

static float a_at(const prod *p, int i, int q) { return p->ta ? p->A[q * p->lda + i] : p->A[i * p->lda + q]; }
static float b_at(const prod *p, int q, int j) { return p->tb ? p->B[j * p->ldb + q] : p->B[q * p->ldb + j]; }

static void run(const prod *p, dg_gemm_part part, float alpha, float beta, float *C) {
    dg_cpu_gemm_small_f32(part, p->ta, p->tb, p->m, p->n, p->k, alpha, p->A, p->lda, p->B, p->ldb, beta, C, p->ldc);
}

/* C (computed from C0 with alpha, beta) against the double product, element by element */
static void check_bound(const prod *p, float alpha, float beta, const float *C0, const float *C) {
    const double u = ldexp(1.0, -24);
    for (int i = 0; i < p->m; i++)
        for (int j = 0; j < p->n; j++) {
            double s = 0, mag = 0;
            for (int q = 0; q < p->k; q++) {
                s += (double)a_at(p, i, q) * b_at(p, q, j);
                mag += fabs((double)a_at(p, i, q) * b_at(p, q, j));
            }
            const double c0 = beta == 0 ? 0 : C0[i * p->ldc + j];
            const double want = alpha * s + beta * c0;
            const double bound = (2.0 * p->k + 4) * u * (fabs(alpha) * mag + fabs(beta * c0)) + 1e-30;
            const double got = C[i * p->ldc + j];
            if (!(fabs(got - want) <= bound))
                fail_msg("ta %d tb %d m %d n %d k %d alpha %g beta %g: C[%d,%d] = %.9g, want %.9g (bound %.3g)", p->ta,
                         p->tb, p->m, p->n, p->k, alpha, beta, i, j, got, want, bound);
        }
}

static void test_against_double(void **st) {
    (void)st;
    const int ms[] = {1, 5, 6, 7, 13, 64}, ns[] = {1, 8, 16, 17, 40, 128}, ks[] = {1, 3, 64, 256, 300};
    const float betas[] = {0.0f, 1.0f, -0.75f};
    int runs = 0;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int a = 0; a < 6; a++)
                for (int b = 0; b < 6; b++)
                    for (int c = 0; c < 5; c++) {
                        if ((a + b + c + ta + tb) % 3) continue; /* a third of the grid, every size in it */
                        prod p;
                        prod_make(&p, ta, tb, ms[a], ns[b], ks[c]);
                        const int64_t nc = p.ldc * p.m;
                        float *C0 = malloc(sizeof(float) * (size_t)nc), *C = malloc(sizeof(float) * (size_t)nc);
                        assert_non_null(C0), assert_non_null(C);
                        memcpy(C0, p.C, sizeof(float) * (size_t)nc);
                        for (int bi = 0; bi < 3; bi++) {
                            const float alpha = bi == 2 ? 0.5f : -1.0f;
                            memcpy(C, C0, sizeof(float) * (size_t)nc);
                            if (betas[bi] == 0) /* beta = 0 must not read C */
                                for (int i = 0; i < p.m; i++)
                                    for (int j = 0; j < p.n; j++) C[i * p.ldc + j] = NAN;
                            run(&p, DG_GEMM_FULL, alpha, betas[bi], C);
                            check_bound(&p, alpha, betas[bi], C0, C);
                            for (int i = 0; i < p.m; i++) /* the columns past n are not touched */
                                for (int64_t j = p.n; j < p.ldc && i * p.ldc + j < nc; j++)
                                    assert_true(memcmp(&C[i * p.ldc + j], &C0[i * p.ldc + j], sizeof(float)) == 0);
                            runs++;
                        }
                        free(C0), free(C);
                        prod_free(&p);
                    }
    printf("%d products within the rounding bound\n", runs);
}

/* Runs p with part and in full, from the same C: the first row i whose first `cols(i)` elements
 * differ (cols: n, or i + 1 for lower_only), or -1 */
static int row_off_full(const prod *p, dg_gemm_part part, float alpha, float beta, bool lower_only) {
    const int64_t nc = p->ldc * p->m;
    float *full = malloc(sizeof(float) * (size_t)nc), *got = malloc(sizeof(float) * (size_t)nc);
    assert_non_null(full), assert_non_null(got);
    memcpy(full, p->C, sizeof(float) * (size_t)nc);
    memcpy(got, p->C, sizeof(float) * (size_t)nc);
    run(p, DG_GEMM_FULL, alpha, beta, full);
    run(p, part, alpha, beta, got);
    int bad = -1;
    for (int i = 0; i < p->m && bad < 0; i++) {
        const int cols = lower_only ? i + 1 : p->n;
        if (memcmp(full + i * p->ldc, got + i * p->ldc, sizeof(float) * (size_t)cols) != 0) bad = i;
    }
    free(full), free(got);
    return bad;
}

/* op(A) square and triangular: the skipping parts give the full product's bits */
static void test_parts(void **st) {
    (void)st;
    const int Ls[] = {1, 6, 7, 16, 33, 64, 270}, ns[] = {16, 21, 128}; /* 270: two k blocks */
    for (int ta = 0; ta < 2; ta++)
        for (int li = 0; li < 7; li++)
            for (int ni = 0; ni < 3; ni++)
                for (int upper = 0; upper < 2; upper++) {
                    const int L = Ls[li], n = ns[ni];
                    prod p;
                    prod_make(&p, ta, 0, L, n, L);
                    for (int i = 0; i < L; i++) /* op(A)_iq = 0 above (lower) or below (upper) the diagonal */
                        for (int q = 0; q < L; q++)
                            if (upper ? q < i : q > i) p.A[ta ? q * p.lda + i : i * p.lda + q] = 0;
                    for (int bi = 0; bi < 2; bi++) {
                        const int bad =
                            row_off_full(&p, upper ? DG_GEMM_A_UPPER : DG_GEMM_A_LOWER, 0.75f, (float)bi, false);
                        if (bad >= 0)
                            fail_msg("%s ta %d L %d n %d beta %d: row %d is not the full product's bits",
                                     upper ? "A_UPPER" : "A_LOWER", ta, L, n, bi, bad);
                    }
                    prod_free(&p);
                }
    /* C_LOWER: C = A B^T, only j <= i wanted */
    for (int li = 0; li < 7; li++)
        for (int k = 1; k <= 300; k += 149) {
            const int L = Ls[li];
            prod p;
            prod_make(&p, 0, 1, L, L, k);
            for (int bi = 0; bi < 2; bi++) {
                const int bad = row_off_full(&p, DG_GEMM_C_LOWER, -1.0f, (float)bi, true);
                if (bad >= 0)
                    fail_msg("C_LOWER L %d k %d beta %d: row %d differs from the full product on or below the "
                             "diagonal",
                             L, k, bi, bad);
            }
            prod_free(&p);
        }
}

/* dg_cpu_gemm_tiles_f32 on long products (several 96-row blocks and a partial one, a B stored
 * transposed, k past one 256-wide block): within the rounding bound of the double product, and the
 * same bits as dg_cpu_gemm_small_f32 over the whole product whatever the number of threads (each
 * element's sum runs over k in order); C shorter than k goes to OpenBLAS, checked against the
 * bound. */
static void test_tiles(void **st) {
    (void)st;
    const int shapes[][3] = {{1000, 128, 128}, {389, 40, 300}, {200, 17, 3}, {64, 128, 1000}};
    const int saved = omp_get_max_threads();
    for (int s = 0; s < 4; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                prod p;
                prod_make(&p, ta, tb, shapes[s][0], shapes[s][1], shapes[s][2]);
                const int64_t nc = p.ldc * p.m;
                float *want = malloc(sizeof(float) * (size_t)nc), *got = malloc(sizeof(float) * (size_t)nc);
                assert_non_null(want), assert_non_null(got);
                const float beta = ta ? 0.0f : -0.75f;
                memcpy(want, p.C, sizeof(float) * (size_t)nc);
                run(&p, DG_GEMM_FULL, 0.5f, beta, want);
                for (int nt = 1; nt <= 2; nt++) {
                    omp_set_num_threads(nt);
                    memcpy(got, p.C, sizeof(float) * (size_t)nc);
                    dg_cpu_gemm_tiles_f32(ta, tb, p.m, p.n, p.k, 0.5f, p.A, p.lda, p.B, p.ldb, beta, got, p.ldc);
                    if (p.m >= p.k) {
                        if (memcmp(want, got, sizeof(float) * (size_t)nc) != 0)
                            fail_msg("tiles m %d n %d k %d ta %d tb %d on %d threads: not the bits of one product", p.m,
                                     p.n, p.k, ta, tb, nt);
                    } else {
                        check_bound(&p, 0.5f, beta, p.C, got);
                    }
                }
                omp_set_num_threads(saved);
                if (s == 1) check_bound(&p, 0.5f, beta, p.C, got);
                free(want), free(got);
                prod_free(&p);
            }
}

/* k = 0: C = beta C; empty m or n: nothing written */
static void test_empty(void **st) {
    (void)st;
    float A[4] = {1, 2, 3, 4}, B[4] = {1, 2, 3, 4}, C[4] = {1, 2, 3, 4};
    dg_cpu_gemm_small_f32(DG_GEMM_FULL, 0, 0, 2, 2, 0, 1, A, 1, B, 2, 0.5f, C, 2);
    assert_true(C[0] == 0.5f && C[1] == 1.0f && C[2] == 1.5f && C[3] == 2.0f);
    C[0] = NAN;
    dg_cpu_gemm_small_f32(DG_GEMM_FULL, 0, 0, 1, 1, 0, 1, A, 1, B, 1, 0, C, 1);
    assert_true(C[0] == 0);
    dg_cpu_gemm_small_f32(DG_GEMM_FULL, 0, 0, 0, 2, 2, 1, A, 2, B, 2, 0, C, 2);
    dg_cpu_gemm_small_f32(DG_GEMM_FULL, 0, 0, 2, 0, 2, 1, A, 2, B, 2, 0, C, 2);
    assert_true(C[1] == 1.0f && C[2] == 1.5f && C[3] == 2.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_double),
        cmocka_unit_test(test_parts),
        cmocka_unit_test(test_tiles),
        cmocka_unit_test(test_empty),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
