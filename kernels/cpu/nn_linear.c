/* linear on the CPU: the products go to OpenBLAS through kernels/cpu/gemm.h (OpenMP's threads
 * share a large one); see nn_linear_impl.h. */
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/nn.h"
#include "kernels/cpu/nn_common.h"

#include <cblas.h>

/* fewer output features than this: the loops of nn_linear_impl.h instead of a product */
#define DG_NN_LINEAR_NARROW 8

/* the CBLAS call that nn_linear_impl.h writes, on dg_cpu_gemm */
#define LINEAR_GEMM(SFX, order, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc) \
    dg_cpu_gemm_##SFX((ta) == CblasTrans, (tb) == CblasTrans, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)

#define R float
#define FN(name) name##_f32
#define GEMM(...) LINEAR_GEMM(f32, __VA_ARGS__)
#include "kernels/cpu/nn_linear_impl.h"
#undef R
#undef FN
#undef GEMM

#define R double
#define FN(name) name##_f64
#define GEMM(...) LINEAR_GEMM(f64, __VA_ARGS__)
#include "kernels/cpu/nn_linear_impl.h"
#undef R
#undef FN
#undef GEMM
