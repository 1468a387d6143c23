/* linear on the CPU: the f32 products go to the register tiles of kernels/cpu/gemm_small.h
 * (dg_cpu_gemm_tiles_f32), the f64 ones to OpenBLAS through kernels/cpu/gemm.h; OpenMP's threads
 * share a large product either way.  See nn_linear_impl.h. */
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_small.h"
#include "kernels/cpu/nn.h"
#include "kernels/cpu/nn_common.h"

#include <cblas.h>

/* fewer output features than this: the loops of nn_linear_impl.h instead of a product */
#define DG_NN_LINEAR_NARROW 8

/* the CBLAS call that nn_linear_impl.h writes, on dg_cpu_gemm_tiles_f32 (f32) or dg_cpu_gemm (f64).
 * In f32 OpenBLAS spent about a third as long copying both operands (its packing) as multiplying
 * on the layers' products (8192 x 128 x 128 at the default model's batch), and ran them at 70-80
 * GFLOP/s in a training step. */
#define LINEAR_GEMM(GEMMFN, order, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc) \
    GEMMFN((ta) == CblasTrans, (tb) == CblasTrans, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)

#define R float
#define FN(name) name##_f32
#define GEMM(...) LINEAR_GEMM(dg_cpu_gemm_tiles_f32, __VA_ARGS__)
#include "kernels/cpu/nn_linear_impl.h"
#undef R
#undef FN
#undef GEMM

#define R double
#define FN(name) name##_f64
#define GEMM(...) LINEAR_GEMM(dg_cpu_gemm_f64, __VA_ARGS__)
#include "kernels/cpu/nn_linear_impl.h"
#undef R
#undef FN
#undef GEMM
