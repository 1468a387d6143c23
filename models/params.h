/* A model's parameters: a list of named f32 leaf tensors (requires_grad), owned by the list and
 * kept outside every scope, in registration order (the order of FLA's state_dict), and FLA's
 * initialisers for them. */
#ifndef DG_MODELS_PARAMS_H
#define DG_MODELS_PARAMS_H

#include "deltagrad.h"

typedef struct dg_param_list {
    dg_dtype dtype; /* of new parameters: DG_F32 (zero-initialised list), DG_F64 for gradchecks */
    int n, cap;
    dg_tensor **t; /* each carries its checkpoint name in ->name */
} dg_param_list;

/* A new zero host parameter (dtype pl->dtype) named name (requires_grad) appended to the list; it stays owned by
 * the list.  NULL with dg_error on failure (out of memory, repeated name). */
dg_tensor *dg_param_add(dg_param_list *pl, const char *name, int ndim, const int64_t *shape);
/* "model.layers.3.attn.q_proj.weight" from a printf format. */
dg_tensor *dg_param_addf(dg_param_list *pl, int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
dg_tensor *dg_param_find(const dg_param_list *pl, const char *name);
void dg_param_list_free(dg_param_list *pl);
int64_t dg_param_count(const dg_param_list *pl); /* elements in all parameters */
/* Moves every parameter to dev in place, as PyTorch's module.to(device) swaps param.data: each
 * tensor keeps its header (so the layers' pointers to it stay valid), its name and requires_grad,
 * and gets a copy of its values in a storage on dev (the old storage is freed); a gradient is
 * dropped (the next backward makes one on dev).  Parameters must be contiguous at offset 0 (as
 * dg_param_add makes them).  Nothing moves unless every copy succeeds.  0, or -1 with dg_error. */
int dg_param_list_to_device(dg_param_list *pl, dg_device dev);

/* Initialisers (in place, no autograd).  normal: N(0, std^2) (nn.init.normal_ as FLA's
 * _init_weights for Linear, Conv1d and Embedding); ones (RMSNorm weights); zeros (biases);
 * log_uniform_A: log(U(lo, hi)) (A_log); dt_bias: dt = exp(U(log 1e-3, log 0.1)) clamped at 1e-4,
 * then the inverse softplus dt + log(-expm1(-dt)). */
int dg_init_normal(dg_tensor *p, double std, dg_rng *rng);
int dg_init_ones(dg_tensor *p);
int dg_init_log_uniform_A(dg_tensor *p, double lo, double hi, dg_rng *rng);
int dg_init_dt_bias(dg_tensor *p, dg_rng *rng);

#endif
