/* Body of the CPU products (kernels/cpu/gemm.h), included once per type by gemm.c with R
 * (float/double), FN(name) (name##_f32/_f64) and CBLAS_GEMM (cblas_sgemm/dgemm) defined. */

/* One product on the calling thread.  OpenBLAS rejects ld < 1 on empty products: handled here. */
static void FN(one)(bool ta, bool tb, int64_t m, int64_t n, int64_t k, R alpha, const R *A, int64_t lda, const R *B,
                    int64_t ldb, R beta, R *C, int64_t ldc) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) {
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) C[i * ldc + j] = beta == 0 ? (R)0 : beta * C[i * ldc + j];
        return;
    }
    CBLAS_GEMM(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k,
               alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

void FN(dg_cpu_gemm)(bool ta, bool tb, int64_t m, int64_t n, int64_t k, R alpha, const R *A, int64_t lda, const R *B,
                     int64_t ldb, R beta, R *C, int64_t ldc) {
    int nt = m > 0 && n > 0 && k > 0 ? share_threads(m, n, k) : 1;
    if (nt <= 1) {
        FN(one)(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    const bool by_rows = m >= n;
#pragma omp parallel num_threads(nt)
    {
        int64_t lo, hi;
        share(by_rows ? m : n, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        if (by_rows) /* rows lo..hi of C: rows lo..hi of op(A) */
            FN(one)(ta, tb, hi - lo, n, k, alpha, ta ? A + lo : A + lo * lda, lda, B, ldb, beta, C + lo * ldc, ldc);
        else /* columns lo..hi of C: columns lo..hi of op(B) */
            FN(one)(ta, tb, m, hi - lo, k, alpha, A, lda, tb ? B + lo * ldb : B + lo, ldb, beta, C + lo, ldc);
    }
}
