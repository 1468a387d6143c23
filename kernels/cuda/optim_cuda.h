/* The optimiser's CUDA kernels on raw device pointers (nn_optim.cu): the AdamW update of one
 * tensor, and the multi-tensor step that clips by the global gradient norm and updates every
 * parameter in two launches, with no host read.  Plain C: ops/optim_step.c includes it under
 * #ifdef DG_HAVE_CUDA.
 *
 * The multi-tensor step, on the library's stream:
 *   launch 1  each block sums the squares of a slice of one gradient (in double) into part[];
 *             the last block to finish (an arrival counter in the state) adds the partial sums in
 *             a fixed order, takes the norm, decides the step and writes the step's scalars into
 *             the state;
 *   launch 2  each block updates a slice of one parameter, reading those scalars.
 * The slices and their tables are fixed when the plan is made, so the sums (and so the norm)
 * depend on the sizes alone, never on the timing of the blocks.  Nothing is allocated or read
 * back by a step, so a step may be captured in a CUDA graph. */
#ifndef DG_KERNELS_CUDA_OPTIM_CUDA_H
#define DG_KERNELS_CUDA_OPTIM_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One AdamW update of n f32 elements with the gradient scaled by clip (g * clip in f32; clip 1 is
 * the plain update): the same arithmetic, bit for bit, as dg_cpu_adamw_f32. */
int dg_cuda_adamw_f32(int64_t n, float *p, const float *g, float *m, float *v, float clip, float shrink,
                      float step_size, float bc2_sqrt, float eps, float b1, float b2, float c1, float c2);

/* One parameter of the multi-tensor step: device pointers of n f32 elements each; shadow, when
 * not NULL, is a bf16 copy of p that the update rewrites (shadow = bf16(p), round to nearest). */
typedef struct dg_cuda_adamw_param {
    float *p, *m, *v;
    const float *g;
    void *shadow;
    int64_t n;
    int decay; /* weight decay applies */
} dg_cuda_adamw_param;

/* The optimiser's state in device memory (one allocation of this struct). */
typedef struct dg_cuda_adamw_state {
    double norm;       /* global gradient norm of the latest step */
    int64_t step;      /* updates applied: the t of the bias corrections */
    int64_t skipped;   /* steps skipped because the norm (or the checked loss) was not finite */
    float clip;        /* factor the latest step applied to the gradients (1: no clipping) */
    float step_size;   /* lr / (1 - b1^t) of the latest applied step */
    float bc2_sqrt;    /* sqrt(1 - b2^t) */
    float shrink;      /* 1 - lr * weight_decay */
    int applied;       /* whether the latest step updated the parameters */
    unsigned arrivals; /* blocks of launch 1 done; the last resets it to 0 */
} dg_cuda_adamw_state;

/* The inputs of one step.  lr_dev, when not NULL, is a device double read when the step runs (so
 * a captured graph follows it); otherwise lr is used.  loss, when not NULL, is one device element
 * (f64 if loss_f64, else f32) that must be finite too.  norm_out, when not NULL, receives the norm
 * (f64 if norm_f64, else f32). */
typedef struct dg_cuda_adamw_args {
    double lr, max_norm, beta1, beta2, eps, weight_decay;
    const double *lr_dev;
    const void *loss;
    void *norm_out;
    bool loss_f64, norm_f64;
} dg_cuda_adamw_args;

typedef struct dg_cuda_adamw_plan dg_cuda_adamw_plan;

/* The device tables of a multi-tensor step over count parameters (copied; the caller's array may
 * go).  NULL with dg_error. */
dg_cuda_adamw_plan *dg_cuda_adamw_plan_new(int count, const dg_cuda_adamw_param *params);
void dg_cuda_adamw_plan_free(dg_cuda_adamw_plan *plan);

/* Queues one step (two launches).  The norm is the square root of the sum over every gradient
 * element of g^2 in double; when it (and *loss) is finite: step += 1, the gradients are scaled by
 * clip = min(1, max_norm / (norm + 1e-6)) (only when max_norm > 0 and norm > max_norm) and every
 * parameter gets the AdamW update; otherwise skipped += 1 and nothing else changes.  0, or -1 with
 * dg_error (a launch failed). */
int dg_cuda_adamw_plan_step(const dg_cuda_adamw_plan *plan, dg_cuda_adamw_state *state, const dg_cuda_adamw_args *a);

#ifdef __cplusplus
}
#endif

#endif
