/* Shared helpers of the nn_* CPU kernels (not a public header). */
#ifndef DG_KERNELS_CPU_NN_COMMON_H
#define DG_KERNELS_CPU_NN_COMMON_H

#include <math.h>
#include <omp.h>
#include <stdint.h>

/* Below this much work (elements touched) a kernel runs on one thread: forking costs more. */
#define DG_NN_PAR_MIN 32768

/* Splits D columns into blocks for a reduction over rows (dw, db): each thread owns whole
 * columns, so the sums need no atomics and do not depend on the thread count.  Blocks hold at
 * least 16 columns (a cache line of floats) so that threads do not share lines. */
static inline int64_t dg_nn_col_blocks(int64_t D, int64_t work) {
    if (work < DG_NN_PAR_MIN || D < 32) return 1;
    int64_t nb = omp_get_max_threads();
    if (nb > D / 16) nb = D / 16;
    return nb < 1 ? 1 : nb;
}

static inline int64_t dg_nn_min64(int64_t a, int64_t b) { return a < b ? a : b; }

#endif
