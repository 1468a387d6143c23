/* AdamW, global-norm gradient clipping and the learning-rate schedule.
 *
 * AdamW (Loshchilov & Hutter; the update of PyTorch's torch.optim.AdamW), step t = 1, 2, ...:
 *     p <- p * (1 - lr * wd)                      (decoupled weight decay; only where decay is on)
 *     m <- b1 m + (1 - b1) g
 *     v <- b2 v + (1 - b2) g^2
 *     p <- p - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
 * Parameters: f32 contiguous host tensors with ->grad (same shape, f32, contiguous) and ->name.
 * A parameter whose grad is NULL is skipped for that step (neither decayed nor moved, as PyTorch
 * does); the step count t is one for the whole optimiser.  The moments m, v are f32 tensors owned
 * by the optimiser, outside every scope.  The update is elementwise (threads split the elements,
 * each element's arithmetic is fixed), so results are bit-identical for any thread count.
 *
 * Weight decay: on by default, off for parameters whose name says they are gates, biases or
 * norms (dg_param_decays): last component "A_log", "dt_bias" or "bias", or any component ending in
 * "norm" (attn_norm, mlp_norm, o_norm, norm, ...).  Embeddings, projections, the LM head and the
 * short-convolution weights decay.  For FLA's GatedDeltaNet/KDA this is exactly "decay the
 * tensors of 2 or more dimensions", which is also the rule for unnamed parameters. */
#ifndef DG_MODELS_OPTIM_H
#define DG_MODELS_OPTIM_H

#include "deltagrad.h"

typedef struct dg_adamw_config {
    double beta1, beta2, eps, weight_decay;
} dg_adamw_config;

/* PyTorch's defaults: betas (0.9, 0.999), eps 1e-8, weight decay 0.01. */
dg_adamw_config dg_adamw_default_config(void);

struct dg_adamw_device; /* ops/optim_step.h */

typedef struct dg_adamw {
    dg_adamw_config cfg;
    int n;
    dg_tensor **params; /* retained references */
    dg_tensor **m, **v; /* first and second moments, owned */
    bool *decay;        /* per parameter */
    dg_tensor **shadow; /* per parameter: its bf16 shadow (retained) or NULL */
    /* Updates made so far.  After a device step the count lives on the device (step_on_device)
     * and this copy is stale: read it with dg_adamw_step_count. */
    int64_t step;
    bool step_on_device;
    int64_t skipped;             /* host steps of dg_adamw_step_fused skipped (device ones: on the device) */
    double last_norm;            /* norm of the latest host step of dg_adamw_step_fused */
    bool last_on_device;         /* the latest dg_adamw_step_fused ran on the device */
    struct dg_adamw_device *dev; /* device state and tables, made by the first device step */
} dg_adamw;

/* Whether a parameter of this name (and ndim, used only when name is NULL) gets weight decay. */
bool dg_param_decays(const char *name, int ndim);

/* NULL with dg_error if a parameter is not an f32 contiguous host tensor or names repeat. */
dg_adamw *dg_adamw_new(int n, dg_tensor *const *params, const dg_adamw_config *cfg);
void dg_adamw_free(dg_adamw *opt);
/* One update at learning rate lr.  0, or -1 with dg_error (bad grad: shape, dtype, device); no
 * parameter is modified when it fails. */
int dg_adamw_step(dg_adamw *opt, double lr);
/* ---- the fused step: clip and update with no host read ----------------------------------------
 * One call clips by the global gradient norm and updates every parameter:
 *     norm = sqrt(sum over all grads of g^2)          (NULL grads count as zero)
 *     clip = max_norm / (norm + 1e-6) if max_norm > 0 and norm > max_norm, else 1
 *     if norm (and the loss, when given) is finite: AdamW with the gradients g * clip
 *     else: no parameter or moment changes, the step count stays, and the step counts as skipped
 * The gradients themselves are left as they are (dg_clip_grad_norm scales them in place; the
 * result of the update is the same bit for bit).  All parameters must be on one device.
 *
 * On CUDA the whole step is queued on the stream as two launches (kernels/cuda/optim_cuda.h): a
 * multi-tensor sum of squares whose last block computes the norm, the decision and the step's
 * scalars into a small device state, then a multi-tensor update that reads them.  The host reads
 * nothing; the norm, the step count and the skipped count stay on the device until asked for.
 * The bias corrections come from the device step count, so a skipped step needs no host decision.
 * The launch tables are built by the first step and kept (rebuilt only when a gradient, moment or
 * shadow buffer changes address), so from the second step on a step allocates nothing and may be
 * captured in a CUDA graph.  The learning rate is either a kernel argument (lr; a captured graph
 * keeps the value of its capture) or read on the device from lr_dev at run time (for graphs:
 * write the next rate there before each replay, in stream order).
 * On the host, the same decisions are made in the same order with dg_grad_norm's norm, so a
 * host fused step equals dg_clip_grad_norm then dg_adamw_step bit for bit.  On the device the
 * norm is the same as dg_grad_norm's bit for bit and the update the same as dg_adamw_step's given
 * the same scalars; the bias corrections use the device's pow (within 2 ulp in double of the
 * host's), which changes the f32 scalars only in the rare case of a double within that distance
 * of an f32 rounding boundary. */
typedef struct dg_adamw_fused_args {
    double lr;               /* >= 0, finite; ignored when lr_dev is given */
    double max_norm;         /* <= 0: no clipping */
    const dg_tensor *lr_dev; /* optional, device only: one f64 element read when the step runs */
    const dg_tensor *loss;   /* optional: one f32/f64 element on the parameters' device; must be finite */
    dg_tensor *norm_out;     /* optional: one f32/f64 element on the parameters' device, gets the norm */
} dg_adamw_fused_args;

/* One fused step.  0, or -1 with dg_error (bad grad, mixed devices, bad scalar tensors; nothing
 * is modified then).  A skipped step is not an error. */
int dg_adamw_step_fused(dg_adamw *opt, const dg_adamw_fused_args *a);
/* The common form: dg_adamw_step_fused with lr, max_norm and norm_out (NULL: not written). */
int dg_adamw_step_clipped(dg_adamw *opt, double lr, double max_norm, dg_tensor *norm_out);

/* Read-backs (each waits for the queued device work): the steps dg_adamw_step_fused skipped;
 * the norm of its latest step (NAN before any); the updates made (what opt->step holds on the
 * host path).  -1 / NAN with dg_error when the read fails. */
int64_t dg_adamw_skipped(const dg_adamw *opt);
double dg_adamw_last_norm(const dg_adamw *opt);
int64_t dg_adamw_step_count(const dg_adamw *opt);

/* bf16 shadows (device parameters only): a bf16 tensor of the parameter's shape that every
 * update, fused or not, rewrites as bf16(p) (round to nearest even), so a bf16 forward reads it
 * with no cast of its own.  The master weights and the moments stay f32.
 * dg_adamw_set_shadow attaches t16 to parameter i (retained; NULL detaches) and fills it with
 * bf16(p) at once.  dg_adamw_make_shadows gives every device parameter a shadow of its own
 * (owned by the optimiser).  dg_adamw_shadow returns parameter i's (NULL if none).  0 or -1. */
int dg_adamw_set_shadow(dg_adamw *opt, int i, dg_tensor *t16);
int dg_adamw_make_shadows(dg_adamw *opt);
dg_tensor *dg_adamw_shadow(const dg_adamw *opt, int i);

/* Sets every existing grad to zero (keeps the buffers). */
void dg_adamw_zero_grad(dg_adamw *opt);

/* sqrt(sum of g^2) over all elements of all grads (NULL grads count as zero), summed in double
 * in a fixed order (parameter order, then element order), so it is bit-reproducible. */
double dg_grad_norm(int n, dg_tensor *const *params);
/* Computes the norm as above; if max_norm > 0 and norm > max_norm, scales every grad by
 * max_norm / (norm + 1e-6) (PyTorch's clip_grad_norm_).  Returns the norm before clipping; a
 * non-finite norm is returned and the grads are left alone (the caller should skip the step). */
double dg_clip_grad_norm(int n, dg_tensor *const *params, double max_norm);

/* Linear warmup then cosine decay to min_lr_ratio * peak_lr.  step is the 0-based index of the
 * update about to be made: lr = peak * (step + 1) / warmup for step < warmup (so the first update
 * is not wasted at lr 0), then peak * (r + (1 - r) * (1 + cos(pi * p)) / 2) with
 * p = (step - warmup) / (total - warmup) clamped to [0, 1] and r = min_lr_ratio. */
typedef struct dg_lr_schedule {
    double peak_lr;
    int64_t warmup_steps;
    int64_t total_steps;
    double min_lr_ratio;
} dg_lr_schedule;
double dg_lr_at(const dg_lr_schedule *s, int64_t step);

/* Optimiser state as safetensors: "exp_avg.NAME" and "exp_avg_sq.NAME" for each parameter, and
 * metadata "format" = "deltagrad.adamw.v1", "step", "beta1", "beta2", "eps", "weight_decay" plus
 * n_meta extra pairs.  Written atomically.  0 or -1. */
int dg_adamw_save(const dg_adamw *opt, const char *path, int n_meta, const char *const *keys,
                  const char *const *values);
/* Restores the moments and the step count from such a file (the bf16 shadows are not touched:
 * the parameters are not).  Every parameter must have both
 * moments with its shape, and the file no other tensors; otherwise -1 with dg_error and the
 * optimiser is left unchanged.  The hyperparameters stay those of opt->cfg. */
int dg_adamw_load(dg_adamw *opt, const char *path);

#endif
