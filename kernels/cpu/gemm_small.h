/* f32 matrix products on AVX2 register tiles of 6 x 16, without OpenBLAS: the small ones on the
 * calling thread (dg_cpu_gemm_small_f32) over B read in place, or from a panel of 16 columns packed
 * on the stack where B is transposed (8 x 8 blocks transposed in registers) or the columns run out,
 * for the products inside the chunked delta-rule kernels (64 x 128 x 128 and smaller, one per chunk
 * and head, many threads at once), where OpenBLAS's copies of both operands cost about as much as
 * its arithmetic; and the large ones with a long C on OpenMP's threads (dg_cpu_gemm_tiles_f32, the
 * layers' products).  Without AVX2 and FMA at compile time the calls go to dg_cpu_gemm_f32.
 *
 * Row major, the contract of dg_cpu_gemm_f32 (kernels/cpu/gemm.h): C (m x n) = alpha op(A) op(B)
 * + beta C; op(A) is m x k (ta: A is stored k x m), op(B) is k x n (tb: B is stored n x k); beta = 0
 * does not read C; k = 0 gives C = beta C.  The sums run over k in order, in blocks of 256. */
#ifndef DG_KERNELS_CPU_GEMM_SMALL_H
#define DG_KERNELS_CPU_GEMM_SMALL_H

#include <stdbool.h>
#include <stdint.h>

/* The part of a product that is known to be zero or not wanted, skipped tile by tile (a tile of
 * 6 rows sums over the p that any of its rows needs; the zeros it still reads add exact zeros):
 *   DG_GEMM_FULL     everything
 *   DG_GEMM_A_LOWER  op(A) is lower triangular (row i of op(A) is zero past column i)
 *   DG_GEMM_A_UPPER  op(A) is upper triangular (row i of op(A) is zero before column i)
 *   DG_GEMM_C_LOWER  only C's lower part (j <= i) is wanted: tiles wholly above the diagonal are
 *                    not written, the rest of them above it are (callers mask it) */
typedef enum { DG_GEMM_FULL, DG_GEMM_A_LOWER, DG_GEMM_A_UPPER, DG_GEMM_C_LOWER } dg_gemm_part;

void dg_cpu_gemm_small_f32(dg_gemm_part part, bool ta, bool tb, int m, int n, int k, float alpha, const float *A,
                           int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

/* The same contract for a large product with a long C (the CPU layers': linear's 8192 x 128 x 128
 * and its input gradient), shared among OpenMP's threads (outside a parallel region, above about
 * 2M multiply-adds) on the same tiles: threads take blocks of 96 rows of C two at a time as they
 * come free, so that a block of op(A) stays in the core's L2 while every panel of op(B) passes over
 * it; a B stored transposed (a layer's weight) is transposed once into a copy whose rows the blocks
 * read in place.  Each element's sum runs over k in order: the bits of dg_cpu_gemm_small_f32,
 * whatever the number of threads.  Other shapes (C shorter than 192 rows or than k: a weight's
 * gradient dy^T x) go to dg_cpu_gemm_f32, where OpenBLAS's packing pays for itself. */
void dg_cpu_gemm_tiles_f32(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *A, int64_t lda,
                           const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

#endif
