/* Gradient checks: of every registered op (dg_gradcheck_op: each sample, each backward variant,
 * contiguous and strided inputs, in f64) and of any scalar function of tensors (dg_gradcheck_fn).
 * They build their losses from ops, so they sit above ops. */
#ifndef DG_OPS_GRADCHECK_H
#define DG_OPS_GRADCHECK_H

#include "autograd/autograd.h"
#include "ops/op.h"

typedef struct dg_gradcheck_row {
    char op[48];
    char variant[32];
    char input[160]; /* sample label and which input */
    double max_abs_err, max_rel_err;
    bool ok;
} dg_gradcheck_row;

typedef struct dg_gradcheck_report {
    dg_gradcheck_row *rows;
    int n, cap;
    int n_failed;
} dg_gradcheck_report;

/* Gradcheck of one op (every sample, every backward variant, contiguous and non-contiguous
 * inputs) in f64; rows appended to the report.  Returns the number of failed rows. */
int dg_gradcheck_op(const dg_op_def *def, uint64_t seed, dg_gradcheck_report *rep);
/* Gradcheck of an arbitrary function of n inputs (for models and tests).  f builds a scalar
 * (one-element) output from the inputs, under autograd.  Central differences, eps 1e-6, for
 * inputs of up to max_elems elements per input; larger ones by random directional derivatives. */
typedef dg_tensor *(*dg_scalar_fn)(dg_tensor *const *in, void *ctx);
int dg_gradcheck_fn(dg_scalar_fn f, void *ctx, int n, dg_tensor *const *in, double atol, double rtol, double *max_abs,
                    double *max_rel, char *worst, size_t worst_len);
void dg_gradcheck_report_free(dg_gradcheck_report *rep);

/* The pieces gradcheck is made of, for checks that run elsewhere (gradcheck --device cuda). */
/* A scalar of inputs that live on the host (perturbed in place between calls). */
typedef double (*dg_fd_value_fn)(dg_tensor *const *in, void *ctx, int *err);
/* Central differences of f against analytic grads[k] (host, NULL = zero) for each input with
 * diff[k]: element by element up to 256 elements, else 6 random directions; eps 1e-6 (f64 inputs)
 * or 1e-3; per input the worst abs and rel error and whether |fd - an| <= atol + rtol |fd|.
 * Returns 0, or -1 when f failed. */
int dg_fd_compare(dg_fd_value_fn f, void *ctx, int n, dg_tensor *const *in, const bool *diff, dg_tensor *const *grads,
                  double atol, double rtol, uint64_t seed, double *abs_err, double *rel_err, bool *ok);
/* The same values in a storage twice as long with doubled strides (host tensors). */
dg_tensor *dg_gradcheck_strided_copy(dg_tensor *t);
void dg_gradcheck_add_row(dg_gradcheck_report *rep, const dg_gradcheck_row *row);
double dg_dot_all(const dg_tensor *a, const dg_tensor *b); /* host tensors, any float dtypes */
void dg_gradcheck_print(const dg_gradcheck_report *rep, FILE *f);

#endif
