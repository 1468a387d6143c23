/* Matrix products on the CPU with one pool of threads: OpenBLAS runs on the calling thread only,
 * and a product large enough to share is cut into one block of rows (or columns) of C per OpenMP
 * thread.  OpenBLAS's own pool (pthreads) would otherwise wake beside OpenMP's on every large
 * product and both would spin for the same cores between ops.
 *
 * Row major: C (m x n) = alpha op(A) op(B) + beta C; op(A) is m x k (ta: A is stored k x m),
 * op(B) is k x n (tb: B is stored n x k).  k = 0 gives C = beta C (beta = 0: zeros, C not read). */
#ifndef DG_KERNELS_CPU_GEMM_H
#define DG_KERNELS_CPU_GEMM_H

#include <stdbool.h>
#include <stdint.h>

void dg_cpu_gemm_f32(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *A, int64_t lda,
                     const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
void dg_cpu_gemm_f64(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double *A, int64_t lda,
                     const double *B, int64_t ldb, double beta, double *C, int64_t ldc);

/* Keeps OpenBLAS on one thread (the calling one).  Called before every product outside a parallel
 * region, since a program may have raised it (openblas_set_num_threads) since the last. */
void dg_cpu_blas_single_thread(void);

#endif
