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

typedef struct dg_adamw {
    dg_adamw_config cfg;
    int n;
    dg_tensor **params; /* retained references */
    dg_tensor **m, **v; /* first and second moments, owned */
    bool *decay;        /* per parameter */
    int64_t step;       /* updates made so far */
} dg_adamw;

/* Whether a parameter of this name (and ndim, used only when name is NULL) gets weight decay. */
bool dg_param_decays(const char *name, int ndim);

/* NULL with dg_error if a parameter is not an f32 contiguous host tensor or names repeat. */
dg_adamw *dg_adamw_new(int n, dg_tensor *const *params, const dg_adamw_config *cfg);
void dg_adamw_free(dg_adamw *opt);
/* One update at learning rate lr.  0, or -1 with dg_error (bad grad: shape, dtype, device); no
 * parameter is modified when it fails. */
int dg_adamw_step(dg_adamw *opt, double lr);
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
/* Restores the moments and the step count from such a file.  Every parameter must have both
 * moments with its shape, and the file no other tensors; otherwise -1 with dg_error and the
 * optimiser is left unchanged.  The hyperparameters stay those of opt->cfg. */
int dg_adamw_load(dg_adamw *opt, const char *path);

#endif
