/* The arithmetic of the optimiser and of gradient clipping on tensors, on the tensors' device:
 * models/optim.c states the algorithms and calls these; the kernels are kernels/cpu/optim.c and
 * kernels/cuda/nn_optim.cu.  No autograd: they change parameters and gradients in place. */
#ifndef DG_OPS_OPTIM_STEP_H
#define DG_OPS_OPTIM_STEP_H

#include "core/internal.h"

/* The scalars of one AdamW step (models/optim.h has the update they enter). */
typedef struct dg_adamw_coefs {
    float clip;                /* the gradient is scaled by it first (1: no clipping) */
    float shrink;              /* 1 - lr * weight_decay, or 1 without decay */
    float step_size;           /* lr / (1 - b1^t) */
    float bc2_sqrt;            /* sqrt(1 - b2^t) */
    float eps, b1, b2, c1, c2; /* c1 = 1 - b1, c2 = 1 - b2 */
} dg_adamw_coefs;

/* One AdamW update of p from its gradient g (times c->clip; g itself is not written) and moments
 * m, v: all f32, contiguous, of one shape, on one device.  The result is the same bit for bit on
 * the CPU and on the GPU.  0, or -1 with dg_error. */
int dg_adamw_update_(dg_tensor *p, const dg_tensor *g, dg_tensor *m, dg_tensor *v, const dg_adamw_coefs *c);

/* *total += the squares of every element of x[0], x[1], ... x[n-1] (NULL entries skipped; f32 or
 * f64, contiguous).  A host tensor's squares are added to *total one by one, in double; each
 * device tensor is summed on the device (all of them in one launch and one synchronisation) and
 * its sum added in its turn.  0, or -1 with dg_error and *total unchanged. */
int dg_sumsq_accumulate(int n, const dg_tensor *const *x, double *total);

/* x *= c in place (contiguous; f32 multiplies by (float)c, f64 by c).  0, or -1 with dg_error. */
int dg_scale_(dg_tensor *x, double c);

/* x16 = bf16(x) elementwise (round to nearest even): x f32, x16 bf16, both contiguous on the
 * device, one shape.  The refresh of a parameter's bf16 shadow.  0, or -1 with dg_error. */
int dg_bf16_shadow_refresh_(dg_tensor *x16, const dg_tensor *x);

/* ---- the multi-tensor step on the device (kernels/cuda/optim_cuda.h has the algorithm) ---------
 * A dg_adamw_device holds the optimiser's state in device memory (step count, skipped steps, the
 * latest norm) and the device tables of the multi-tensor launches.  The tables are built on the
 * first step and rebuilt only when a tensor's data pointer changes (a gradient that appears or
 * goes, a new shadow), so a step normally queues two launches and nothing else: no allocation, no
 * host read. */
typedef struct dg_adamw_device dg_adamw_device;

/* The inputs of one step.  lr_dev (one f64 element on the device), when not NULL, replaces lr and
 * is read when the step runs; loss (one f32 or f64 element on the device), when not NULL, must be
 * finite too; norm_out (one f32 or f64 element on the device), when not NULL, receives the norm. */
typedef struct dg_adamw_device_args {
    double lr, max_norm, beta1, beta2, eps, weight_decay;
    const dg_tensor *lr_dev, *loss;
    dg_tensor *norm_out;
} dg_adamw_device_args;

/* What the device state says, read back (this synchronises). */
typedef struct dg_adamw_device_status {
    double norm;     /* of the latest step */
    int64_t step;    /* updates applied */
    int64_t skipped; /* steps skipped for a non-finite norm or loss */
    float clip;      /* factor of the latest applied step */
    bool applied;    /* whether the latest step updated the parameters */
} dg_adamw_device_status;

/* A device state with step 0 and nothing skipped.  NULL with dg_error (no CUDA). */
dg_adamw_device *dg_adamw_device_new(void);
void dg_adamw_device_free(dg_adamw_device *d);

/* One clipped AdamW step of the n parameters (f32, contiguous, on the device) that have a grad
 * (f32, contiguous, the parameter's shape, on the device; checked by the caller); m[i], v[i] are
 * their moments, decay[i] whether weight decay applies, shadow (NULL, or NULL entries) their bf16
 * shadows.  0, or -1 with dg_error and nothing queued. */
int dg_adamw_device_step(dg_adamw_device *d, int n, dg_tensor *const *params, dg_tensor *const *m, dg_tensor *const *v,
                         const bool *decay, dg_tensor *const *shadow, const dg_adamw_device_args *a);

/* Reads the state (waits for the queued work).  0, or -1 with dg_error. */
int dg_adamw_device_read(const dg_adamw_device *d, dg_adamw_device_status *s);
/* Sets the step count (waits for the queued work).  0, or -1 with dg_error. */
int dg_adamw_device_set_step(dg_adamw_device *d, int64_t step);

#endif
