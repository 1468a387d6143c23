/* The arithmetic of the optimiser and of gradient clipping on tensors, on the tensors' device:
 * models/optim.c states the algorithms and calls these; the kernels are kernels/cpu/optim.c and
 * kernels/cuda/nn_optim.cu.  No autograd: they change parameters and gradients in place. */
#ifndef DG_OPS_OPTIM_STEP_H
#define DG_OPS_OPTIM_STEP_H

#include "core/internal.h"

/* The scalars of one AdamW step (models/optim.h has the update they enter). */
typedef struct dg_adamw_coefs {
    float shrink;              /* 1 - lr * weight_decay, or 1 without decay */
    float step_size;           /* lr / (1 - b1^t) */
    float bc2_sqrt;            /* sqrt(1 - b2^t) */
    float eps, b1, b2, c1, c2; /* c1 = 1 - b1, c2 = 1 - b2 */
} dg_adamw_coefs;

/* One AdamW update of p from its gradient g and moments m, v: all f32, contiguous, of one shape,
 * on one device.  The result is the same bit for bit on the CPU and on the GPU.  0, or -1 with
 * dg_error. */
int dg_adamw_update_(dg_tensor *p, const dg_tensor *g, dg_tensor *m, dg_tensor *v, const dg_adamw_coefs *c);

/* *total += the squares of every element of x[0], x[1], ... x[n-1] (NULL entries skipped; f32 or
 * f64, contiguous).  A host tensor's squares are added to *total one by one, in double; each
 * device tensor is summed on the device (all of them in one launch and one synchronisation) and
 * its sum added in its turn.  0, or -1 with dg_error and *total unchanged. */
int dg_sumsq_accumulate(int n, const dg_tensor *const *x, double *total);

/* x *= c in place (contiguous; f32 multiplies by (float)c, f64 by c).  0, or -1 with dg_error. */
int dg_scale_(dg_tensor *x, double c);

#endif
