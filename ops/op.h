/* The op registry: one dg_op_def (autograd/node.h) per op, listed once in ops/registry_list.h.
 * Gradcheck, the comparison of backward paths, the benchmarks and the registry-driven tests all
 * iterate that table, so an op added to it is checked everywhere.
 *
 * Applying an op: the typed entry point (dg_mul, dg_gated_delta_rule, ...) validates its
 * arguments, fills the op's attribute struct and calls dg_apply, which picks the backward variant
 * (the call's own, else DG_BACKWARD's, else 0) and hands the op to the autograd engine
 * (dg_apply_variant; autograd/node.h says what the engine does with it). */
#ifndef DG_OPS_OP_H
#define DG_OPS_OP_H

#include "autograd/node.h"

/* registry: every op's definition, declared once from the list */
#define DG_OP(name) extern const dg_op_def dg_op_##name;
#include "ops/registry_list.h"
#undef DG_OP
int dg_op_count(void);
const dg_op_def *dg_op_at(int i);
const dg_op_def *dg_op_find(const char *name);
int dg_op_variant_find(const dg_op_def *def, const char *name); /* -1 if absent */
/* The index of def's variant called name, or -1 with the error "<who>: backward variant '<name>'
 * does not exist (variants: ...)". */
int dg_op_variant_lookup(const dg_op_def *def, const char *name, const char *who);
/* What DG_BACKWARD ("op:variant,op2:variant") says for def: the variant's index when it names
 * def, -1 when it does not, -2 with the error set when any of its entries is malformed or names an
 * op or a variant that does not exist (the message lists the valid names). */
int dg_op_env_variant(const dg_op_def *def);
/* The variant to run when the call names none: DG_BACKWARD's for this op, else 0; -1 with the
 * error set when DG_BACKWARD is wrong.  A per-call choice (variant >= 0) wins. */
int dg_op_default_variant(const dg_op_def *def);

/* Runs the op.  in has def->n_in entries (optional ones NULL), out receives def->n_out tensors
 * (autoreleased).  variant -1 picks the default (dg_op_default_variant).  Returns 0 or -1. */
int dg_apply(const dg_op_def *def, const void *attrs, dg_tensor *const *in, dg_tensor **out, int variant);
/* Shorthand for ops with one output. */
dg_tensor *dg_apply1(const dg_op_def *def, const void *attrs, dg_tensor *const *in);

/* sample helpers */
void dg_sample_free(dg_sample *s);
void dg_sample_set(dg_sample *s, int i, dg_tensor *t, bool differentiable); /* takes a reference */

/* Reduces a broadcast gradient g back to `shape` by summing over the broadcast dims. */
dg_tensor *dg_sum_to_shape(dg_tensor *g, int ndim, const int64_t *shape);
/* The same, as dtype out_dt, for backward passes (no autograd): on the device one pass that sums
 * in f64 and rounds once to out_dt (f32 terms of a bf16 gradient); elsewhere a sum then a cast. */
dg_tensor *dg_sum_to_shape_as(dg_tensor *g, int ndim, const int64_t *shape, dg_dtype out_dt);

/* The dtype a product's backward gives the gradient of its bf16 operand t: f32 when t is the bf16
 * cast of an f32 tensor (dg_to_dtype of an f32 master weight under mixed precision), so that the
 * master's gradient is the GEMM's f32 accumulator itself, passed through the cast's backward
 * unchanged; t's own dtype otherwise (ops/copy.c). */
dg_dtype dg_cast_grad_dtype(const dg_tensor *t);

/* validation helpers used by the typed entry points; each sets a message naming op and arg */
bool dg_check_not_null(const char *op, const char *arg, const dg_tensor *t);
bool dg_check_float(const char *op, const char *arg, const dg_tensor *t);
bool dg_check_float_or_bf16(const char *op, const char *arg, const dg_tensor *t); /* bf16 on cuda too */
bool dg_check_dtype(const char *op, const char *arg, const dg_tensor *t, dg_dtype dt);
bool dg_check_ndim(const char *op, const char *arg, const dg_tensor *t, int ndim);
bool dg_check_same_dtype(const char *op, const char *arg, const dg_tensor *t, const char *ref_arg,
                         const dg_tensor *ref);
bool dg_check_same_device(const char *op, const char *arg, const dg_tensor *t, const char *ref_arg,
                          const dg_tensor *ref);
bool dg_require_cpu(const char *op, const dg_tensor *t); /* until the CUDA path of the op exists */
/* The first entry of idx (i64, contiguous, on the host or the device: the device's check reads
 * back, one synchronisation) outside [0, n) that is not `skip` (when allow_skip): its flat
 * position, and its value in *value; -1 when every entry is in range; -2 with dg_error when the
 * check itself failed (op names the caller). */
int64_t dg_first_bad_index(const char *op, const dg_tensor *idx, int64_t n, bool allow_skip, int64_t skip,
                           int64_t *value);

/* Sampler shorthand: a random f32/f64 tensor in [lo, hi) or N(0,1) drawn from rng. */
#define DG_SAMPLE_RAND(rng, dt, lo, hi, ...) dg_rand_range(DG_SHAPE(__VA_ARGS__), dt, lo, hi, rng)
#define DG_SAMPLE_RANDN(rng, dt, ...) dg_randn(DG_SHAPE(__VA_ARGS__), dt, rng)

#endif
