/* CPU matrix products on OpenMP's threads, OpenBLAS on one thread (kernels/cpu/gemm.h). */
#include "kernels/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

/* A product of at least this many multiply-adds is shared among the threads: below it (about 0.1 ms
 * on one core) waking the other threads costs more than they save. */
#define PAR_MIN_MACS ((int64_t)1 << 21)
/* blocks of C are multiples of this many rows or columns (OpenBLAS's register tiles) */
#define BLOCK_ALIGN 16

void dg_cpu_blas_single_thread(void) {
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

/* The number of threads to share a product among: 1 inside a parallel region (the caller's loop
 * is the parallel one) or when the product is small. */
static int share_threads(int64_t m, int64_t n, int64_t k) {
    if (omp_in_parallel()) return 1;
    dg_cpu_blas_single_thread();
    int64_t along = m >= n ? m : n;
    if (m * n * k < PAR_MIN_MACS || along < 2 * BLOCK_ALIGN) return 1;
    int nt = omp_get_max_threads();
    int64_t most = along / BLOCK_ALIGN;
    return nt < most ? nt : (int)most;
}

/* [lo, hi) of the part of `along` that thread t of nt computes: blocks aligned to BLOCK_ALIGN */
static void share(int64_t along, int t, int nt, int64_t *lo, int64_t *hi) {
    int64_t per = (along + nt - 1) / nt;
    per = (per + BLOCK_ALIGN - 1) / BLOCK_ALIGN * BLOCK_ALIGN;
    *lo = (int64_t)t * per < along ? (int64_t)t * per : along;
    *hi = *lo + per < along ? *lo + per : along;
}

#define R float
#define FN(name) name##_f32
#define CBLAS_GEMM cblas_sgemm
#include "kernels/cpu/gemm_impl.h"
#undef R
#undef FN
#undef CBLAS_GEMM

#define R double
#define FN(name) name##_f64
#define CBLAS_GEMM cblas_dgemm
#include "kernels/cpu/gemm_impl.h"
#undef R
#undef FN
#undef CBLAS_GEMM
