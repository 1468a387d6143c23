/* The op registry: one dg_op_def per op, listed once in ops/registry.c.  Gradcheck, the comparison
 * of backward paths, the benchmarks and the registry-driven tests all iterate that table, so an op
 * added to it is checked everywhere.
 *
 * Applying an op (dg_apply):
 *   1. the typed entry point (dg_mul, dg_gated_delta_rule, ...) validates its arguments and fills
 *      the op's attribute struct;
 *   2. dg_apply builds a node, runs def->forward with grad mode off (so ops used inside a forward
 *      record nothing); forward allocates the outputs into node->out and may dg_save() tensors;
 *   3. when grad mode is on and an input requires grad, the node stays alive, owned by its
 *      outputs, and dg_backward later runs one of def->bwd on it;
 *   4. outputs are autoreleased into the innermost scope; anomaly mode checks them for NaN/Inf. */
#ifndef DG_OPS_OP_H
#define DG_OPS_OP_H

#include "core/internal.h"

#define DG_MAX_IO 12
#define DG_MAX_SAVED 16
#define DG_ATTR_BYTES 256

typedef struct dg_op_def dg_op_def;

typedef struct dg_node {
    const dg_op_def *op;
    int refcount;
    uint64_t seq;                   /* creation order: a topological order of the tape */
    unsigned char attrs[DG_ATTR_BYTES]; /* the op's attribute struct, copied */
    int n_in, n_out;
    dg_tensor *in[DG_MAX_IO];       /* retained; optional inputs may be NULL */
    bool needs_grad[DG_MAX_IO];     /* which inputs the backward must produce a gradient for */
    dg_tensor *out[DG_MAX_IO];      /* during forward only: the new outputs (not owned after) */
    /* metadata of the outputs, so that absent output gradients can be made as zeros */
    int out_ndim[DG_MAX_IO];
    int64_t out_shape[DG_MAX_IO][DG_MAX_DIMS];
    dg_dtype out_dtype[DG_MAX_IO];
    dg_device out_device[DG_MAX_IO];
    dg_tensor *saved[DG_MAX_SAVED]; /* detached, retained */
    int n_saved;
    int variant;                    /* which backward variant to run */
    bool recording;                 /* set before forward: the tape keeps this node (forward may
                                     * save for the backward; otherwise saving is wasted) */
    dg_tensor *grad_acc[DG_MAX_IO]; /* during dg_backward: incoming gradient of each output */
} dg_node;

/* forward: read node->in and node->attrs, set node->out[0..n_out) (new references, owned by the
 * node until dg_apply hands them out).  Returns 0, or -1 with dg_error set. */
typedef int (*dg_forward_fn)(dg_node *n);
/* backward: gout[i] is the gradient of output i (never NULL: absent ones are zeros; always
 * contiguous); set gin[i]
 * for each input with n->needs_grad[i] (a tensor of the input's shape; NULL means zero).
 * Runs with grad mode off; the tensors it makes live in a scope the engine closes. */
typedef int (*dg_backward_fn)(dg_node *n, dg_tensor *const *gout, dg_tensor **gin);
/* decompose: the same function as the op, built from primitive ops under autograd. */
typedef int (*dg_decompose_fn)(const void *attrs, dg_tensor *const *in, dg_tensor **out);

/* A sample for gradcheck, the comparison and the tests: valid random inputs and attributes. */
typedef struct dg_sample {
    char label[96];
    dg_tensor *in[DG_MAX_IO]; /* owned by the sample (released by dg_sample_free) */
    bool differentiable[DG_MAX_IO];
    unsigned char attrs[DG_ATTR_BYTES];
} dg_sample;
/* Fills sample number `index` (0, 1, ...) at dtype dt from seed; returns 1 if it exists, 0 past
 * the last one.  Each op gives at least two sizes. */
typedef int (*dg_sample_fn)(int index, dg_dtype dt, uint64_t seed, dg_sample *s);

typedef struct dg_backward_variant {
    const char *name;
    dg_backward_fn fn;
} dg_backward_variant;

struct dg_op_def {
    const char *name;
    int n_in, n_out;
    const char *in_names[DG_MAX_IO];
    const char *out_names[DG_MAX_IO];
    size_t attrs_size;
    dg_forward_fn forward;
    dg_backward_variant bwd[6]; /* bwd[0] is the default; ends at the first {NULL} */
    dg_decompose_fn decompose;
    dg_sample_fn sample;
    double atol_f64, rtol_f64, atol_f32, rtol_f32; /* gradcheck / comparison tolerances */
    bool is_view;               /* outputs share the first input's storage */
};

/* registry: every op's definition, declared once from the list */
#define DG_OP(name) extern const dg_op_def dg_op_##name;
#include "ops/registry_list.h"
#undef DG_OP
int dg_op_count(void);
const char *dg_op_missing(void); /* names listed but not built ("" when none) */
const dg_op_def *dg_op_at(int i);
const dg_op_def *dg_op_find(const char *name);
int dg_op_variant_count(const dg_op_def *def);
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
 * (autoreleased).  variant -1 picks the default.  Returns 0 or -1. */
int dg_apply(const dg_op_def *def, const void *attrs, dg_tensor *const *in, dg_tensor **out,
             int variant);
/* Shorthand for ops with one output. */
dg_tensor *dg_apply1(const dg_op_def *def, const void *attrs, dg_tensor *const *in);

/* for forward functions */
void dg_save(dg_node *n, dg_tensor *t); /* keeps a detached reference for backward */

/* sample helpers */
void dg_sample_free(dg_sample *s);
void dg_sample_set(dg_sample *s, int i, dg_tensor *t, bool differentiable); /* takes a reference */

/* Reduces a broadcast gradient g back to `shape` by summing over the broadcast dims. */
dg_tensor *dg_sum_to_shape(dg_tensor *g, int ndim, const int64_t *shape);

/* validation helpers used by the typed entry points; each sets a message naming op and arg */
bool dg_check_not_null(const char *op, const char *arg, const dg_tensor *t);
bool dg_check_float(const char *op, const char *arg, const dg_tensor *t);
bool dg_check_dtype(const char *op, const char *arg, const dg_tensor *t, dg_dtype dt);
bool dg_check_ndim(const char *op, const char *arg, const dg_tensor *t, int ndim);
bool dg_check_same_dtype(const char *op, const char *arg, const dg_tensor *t, const char *ref_arg,
                         const dg_tensor *ref);
bool dg_check_same_device(const char *op, const char *arg, const dg_tensor *t, const char *ref_arg,
                          const dg_tensor *ref);
bool dg_require_cpu(const char *op, const dg_tensor *t); /* until the CUDA path of the op exists */

/* Sampler shorthand: a random f32/f64 tensor in [lo, hi) or N(0,1) drawn from rng. */
#define DG_SAMPLE_RAND(rng, dt, lo, hi, ...) dg_rand_range(DG_SHAPE(__VA_ARGS__), dt, lo, hi, rng)
#define DG_SAMPLE_RANDN(rng, dt, ...) dg_randn(DG_SHAPE(__VA_ARGS__), dt, rng)

#endif
