/* For the op files ops/nn_*.c: NN_CALL(rc, x, name, args...) runs the device kernel
 * dg_cuda_<name>(x->dtype, args...) when x is on the device (rc receives its status), else the CPU
 * kernel dg_nn_<name>_f32 or _f64 of x's dtype (they cannot fail; rc is left alone).  Any other
 * dtype on the CPU (bf16, which only the device kernels take) sets rc to -1 through
 * dg_nn_cpu_float (ops/nn_common.h), never reaching a kernel that would misread its bits.  The two
 * kernels of a name take the same arguments (kernels/cpu/nn.h, kernels/cuda/nn_cuda.h).
 * Included by builds with and without CUDA. */
#ifndef DG_KERNELS_CUDA_NN_DISPATCH_H
#define DG_KERNELS_CUDA_NN_DISPATCH_H

#include "kernels/cpu/nn.h"

#ifdef DG_HAVE_CUDA
#include "kernels/cuda/nn_cuda.h"
#define NN_CALL(rc, x, name, ...)                                                 \
    do {                                                                          \
        if ((x)->device == DG_CUDA) rc = dg_cuda_##name((x)->dtype, __VA_ARGS__); \
        else if (!dg_nn_cpu_float(#name, (x))) rc = -1;                           \
        else if ((x)->dtype == DG_F32) dg_nn_##name##_f32(__VA_ARGS__);           \
        else dg_nn_##name##_f64(__VA_ARGS__);                                     \
    } while (0)
#else
#define NN_CALL(rc, x, name, ...)                                       \
    do {                                                                \
        if (!dg_nn_cpu_float(#name, (x))) rc = -1;                      \
        else if ((x)->dtype == DG_F32) dg_nn_##name##_f32(__VA_ARGS__); \
        else dg_nn_##name##_f64(__VA_ARGS__);                           \
    } while (0)
#endif

#endif
