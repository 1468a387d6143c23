/* linear on the CPU: the products go to CBLAS (OpenBLAS); see nn_linear_impl.h. */
#include "kernels/cpu/nn.h"
#include "kernels/cpu/nn_common.h"

#include <cblas.h>

#define R float
#define FN(name) name##_f32
#define GEMM cblas_sgemm
#include "kernels/cpu/nn_linear_impl.h"
#undef R
#undef FN
#undef GEMM

#define R double
#define FN(name) name##_f64
#define GEMM cblas_dgemm
#include "kernels/cpu/nn_linear_impl.h"
#undef R
#undef FN
#undef GEMM
