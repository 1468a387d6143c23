/* kernels/cuda/cuda_kernels.h for C files that also use the CPU elementwise kernels.
 *
 * Both headers name their op enums dg_unary_op / dg_binary_op with DG_UN_* / DG_BIN_* members, in
 * different orders, so they cannot meet in one file as they are.  This header includes the CUDA
 * one with its enums renamed (dg_cuda_unary_op, DG_CUDA_UN_EXP, ...; the functions keep their
 * names, which is all the linker sees), then the CPU one, and maps a CPU op code to the CUDA one.
 * Include it instead of cuda_kernels.h (only under DG_HAVE_CUDA). */
#ifndef DG_KERNELS_CUDA_OPS_H
#define DG_KERNELS_CUDA_OPS_H

#ifdef DG_KERNELS_CUDA_KERNELS_H
#error "kernels/cuda/cuda_ops.h must come before any include of kernels/cuda/cuda_kernels.h"
#endif

#define dg_unary_op dg_cuda_unary_op
#define dg_binary_op dg_cuda_binary_op
#define DG_UN_EXP DG_CUDA_UN_EXP
#define DG_UN_LOG DG_CUDA_UN_LOG
#define DG_UN_SQRT DG_CUDA_UN_SQRT
#define DG_UN_RSQRT DG_CUDA_UN_RSQRT
#define DG_UN_SIGMOID DG_CUDA_UN_SIGMOID
#define DG_UN_LOGSIGMOID DG_CUDA_UN_LOGSIGMOID
#define DG_UN_SILU DG_CUDA_UN_SILU
#define DG_UN_SOFTPLUS DG_CUDA_UN_SOFTPLUS
#define DG_UN_TANH DG_CUDA_UN_TANH
#define DG_UN_NEG DG_CUDA_UN_NEG
#define DG_UN_ADD_SCALAR DG_CUDA_UN_ADD_SCALAR
#define DG_UN_MUL_SCALAR DG_CUDA_UN_MUL_SCALAR
#define DG_UN_POW_SCALAR DG_CUDA_UN_POW_SCALAR
#define DG_UN_COUNT DG_CUDA_UN_COUNT
#define DG_BIN_ADD DG_CUDA_BIN_ADD
#define DG_BIN_SUB DG_CUDA_BIN_SUB
#define DG_BIN_MUL DG_CUDA_BIN_MUL
#define DG_BIN_DIV DG_CUDA_BIN_DIV
#define DG_BIN_COUNT DG_CUDA_BIN_COUNT
#include "kernels/cuda/cuda_kernels.h"
#undef dg_unary_op
#undef dg_binary_op
#undef DG_UN_EXP
#undef DG_UN_LOG
#undef DG_UN_SQRT
#undef DG_UN_RSQRT
#undef DG_UN_SIGMOID
#undef DG_UN_LOGSIGMOID
#undef DG_UN_SILU
#undef DG_UN_SOFTPLUS
#undef DG_UN_TANH
#undef DG_UN_NEG
#undef DG_UN_ADD_SCALAR
#undef DG_UN_MUL_SCALAR
#undef DG_UN_POW_SCALAR
#undef DG_UN_COUNT
#undef DG_BIN_ADD
#undef DG_BIN_SUB
#undef DG_BIN_MUL
#undef DG_BIN_DIV
#undef DG_BIN_COUNT

#include "kernels/cpu/elementwise.h"

/* The CUDA code of a CPU unary op code (DG_CUDA_UN_COUNT for none). */
static inline dg_cuda_unary_op dg_cuda_unary_of(dg_unary_op op) {
    switch (op) {
    case DG_UN_NEG: return DG_CUDA_UN_NEG;
    case DG_UN_ADD_SCALAR: return DG_CUDA_UN_ADD_SCALAR;
    case DG_UN_MUL_SCALAR: return DG_CUDA_UN_MUL_SCALAR;
    case DG_UN_POW_SCALAR: return DG_CUDA_UN_POW_SCALAR;
    case DG_UN_EXP: return DG_CUDA_UN_EXP;
    case DG_UN_LOG: return DG_CUDA_UN_LOG;
    case DG_UN_SQRT: return DG_CUDA_UN_SQRT;
    case DG_UN_RSQRT: return DG_CUDA_UN_RSQRT;
    case DG_UN_SIGMOID: return DG_CUDA_UN_SIGMOID;
    case DG_UN_LOGSIGMOID: return DG_CUDA_UN_LOGSIGMOID;
    case DG_UN_SILU: return DG_CUDA_UN_SILU;
    case DG_UN_SOFTPLUS: return DG_CUDA_UN_SOFTPLUS;
    case DG_UN_TANH: return DG_CUDA_UN_TANH;
    }
    return DG_CUDA_UN_COUNT;
}

static inline dg_cuda_binary_op dg_cuda_binary_of(dg_binary_op op) {
    switch (op) {
    case DG_BIN_ADD: return DG_CUDA_BIN_ADD;
    case DG_BIN_SUB: return DG_CUDA_BIN_SUB;
    case DG_BIN_MUL: return DG_CUDA_BIN_MUL;
    case DG_BIN_DIV: return DG_CUDA_BIN_DIV;
    }
    return DG_CUDA_BIN_COUNT;
}

#endif
