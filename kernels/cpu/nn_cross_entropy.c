/* cross-entropy with ignore_index on the CPU (nn_cross_entropy_impl.h). */
#include "kernels/cpu/nn.h"
#include "kernels/cpu/nn_common.h"

#define R float
#define FN(name) name##_f32
#define EXP dg_nn_expf
#include "kernels/cpu/nn_cross_entropy_impl.h"
#undef R
#undef FN
#undef EXP

#define R double
#define FN(name) name##_f64
#define EXP exp
#include "kernels/cpu/nn_cross_entropy_impl.h"
#undef R
#undef FN
#undef EXP
