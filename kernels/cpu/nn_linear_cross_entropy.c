/* linear_cross_entropy on the CPU (nn_linear_cross_entropy_impl.h): the products go to
 * kernels/cpu/gemm.h, the cross-entropy of each chunk to nn_cross_entropy_impl.h's kernels. */
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/nn.h"
#include "kernels/cpu/nn_common.h"

#define R float
#define FN(name) name##_f32
#include "kernels/cpu/nn_linear_cross_entropy_impl.h"
#undef R
#undef FN

#define R double
#define FN(name) name##_f64
#include "kernels/cpu/nn_linear_cross_entropy_impl.h"
#undef R
#undef FN
