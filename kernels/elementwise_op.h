/* The elementwise op codes shared by the CPU kernels (kernels/cpu/elementwise.h) and the CUDA
 * kernels (kernels/cuda/cuda_kernels.h): one enum, so an op code chosen by ops/elementwise.c means
 * the same function on either device. */
#ifndef DG_KERNELS_ELEMENTWISE_OP_H
#define DG_KERNELS_ELEMENTWISE_OP_H

typedef enum {
    DG_UN_EXP,        /* y = exp(x) */
    DG_UN_LOG,        /* y = log(x) */
    DG_UN_SQRT,       /* y = sqrt(x) */
    DG_UN_RSQRT,      /* y = 1 / sqrt(x) */
    DG_UN_SIGMOID,    /* y = 1 / (1 + exp(-x)) */
    DG_UN_LOGSIGMOID, /* y = log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)) */
    DG_UN_SILU,       /* y = x sigmoid(x) */
    DG_UN_SOFTPLUS,   /* y = log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)) */
    DG_UN_TANH,       /* y = tanh(x) */
    DG_UN_NEG,        /* y = -x */
    DG_UN_ADD_SCALAR, /* y = x + a */
    DG_UN_MUL_SCALAR, /* y = a x */
    DG_UN_POW_SCALAR, /* y = x^a */
    DG_UN_COUNT
} dg_unary_op;

typedef enum { DG_BIN_ADD, DG_BIN_SUB, DG_BIN_MUL, DG_BIN_DIV, DG_BIN_COUNT } dg_binary_op;

#endif
