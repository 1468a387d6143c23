/* What the autograd engine runs: the definition of a differentiable op (dg_op_def) and the tape's
 * node (dg_node).  The ops fill in definitions (ops/op.h lists them in the registry and gives each
 * a typed entry point); the engine (engine.c) applies a definition to tensors, records a node when
 * a gradient is wanted, and walks the nodes back in dg_backward.  Nothing here knows any op.
 *
 * Applying a definition (dg_apply_variant; ops call it through dg_apply, which picks the variant):
 *   1. the typed entry point (dg_mul, dg_gated_delta_rule, ...) validates its arguments and fills
 *      the op's attribute struct;
 *   2. the engine builds a node, runs def->forward with grad mode off (so ops used inside a forward
 *      record nothing); forward allocates the outputs into node->out and may dg_save() tensors;
 *   3. when grad mode is on and an input requires grad, the node stays alive, owned by its
 *      outputs, and dg_backward later runs one of def->bwd on it;
 *   4. outputs are autoreleased into the innermost scope; anomaly mode checks them for NaN/Inf. */
#ifndef DG_AUTOGRAD_NODE_H
#define DG_AUTOGRAD_NODE_H

#include "core/internal.h"

#define DG_MAX_IO 12
#define DG_MAX_SAVED 16
#define DG_ATTR_BYTES 256
#define DG_MAX_VARIANTS 6

typedef struct dg_op_def dg_op_def;

typedef struct dg_node {
    const dg_op_def *op;
    int refcount;
    uint64_t seq;                       /* creation order: a topological order of the tape */
    unsigned char attrs[DG_ATTR_BYTES]; /* the op's attribute struct, copied */
    int n_in, n_out;
    dg_tensor *in[DG_MAX_IO];   /* retained; optional inputs may be NULL */
    bool needs_grad[DG_MAX_IO]; /* which inputs the backward must produce a gradient for */
    dg_tensor *out[DG_MAX_IO];  /* during forward only: the new outputs (not owned after) */
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
 * node until dg_apply_variant hands them out).  Returns 0, or -1 with dg_error set. */
typedef int (*dg_forward_fn)(dg_node *n);
/* backward: gout[i] is the gradient of output i (never NULL: absent ones are zeros; always
 * contiguous); set gin[i] for each input with n->needs_grad[i] (a tensor of the input's shape;
 * NULL means zero).
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
    dg_backward_variant bwd[DG_MAX_VARIANTS]; /* bwd[0] is the default; ends at the first {NULL} */
    dg_decompose_fn decompose;
    dg_sample_fn sample;
    double atol_f64, rtol_f64, atol_f32, rtol_f32; /* gradcheck / comparison tolerances */
    bool is_view;                                  /* outputs share the first input's storage */
    /* bit i set: the backward reads only the shape, dtype and device of input i, never its data.
     * The tape then keeps a shell of that input (engine.c) and its memory goes as soon as nothing
     * else holds it (add_rms_norm's terms, whose sum it saves; a cast's source). */
    unsigned bwd_skips_in;
    /* The backward hands its output's gradient to input 0 unchanged but for the dtype (a cast).
     * dg_grad_target then looks through the op to that input's own gradient. */
    bool grad_passes_through;
};

/* The number of backward variants of def (its bwd entries before the first {NULL}). */
int dg_op_variant_count(const dg_op_def *def);

/* Runs def on in (def->n_in entries, optional ones NULL) with backward variant `variant`
 * (0 <= variant < dg_op_variant_count(def)); out receives def->n_out tensors (autoreleased).
 * Records a node when grad mode is on and an input requires grad.  Returns 0 or -1. */
int dg_apply_variant(const dg_op_def *def, const void *attrs, dg_tensor *const *in, dg_tensor **out, int variant);

/* for forward functions */
void dg_save(dg_node *n, dg_tensor *t); /* keeps a detached reference for backward */

/* For backward functions: the tensor that input i's gradient ends up in, when the backward may
 * write or add its gradient there itself (a GEMM with beta = 1, say) instead of returning it in
 * gin[i]; NULL when it may not, and then gin[i] is the way.  dt is the dtype the backward would
 * produce.  The target is input i's gradient slot (its producer's pending gradient, or a leaf's
 * .grad), or, through an op with grad_passes_through whose input is a leaf of dtype dt (the bf16
 * cast of an f32 master weight), that leaf's .grad.  It is given only when it is contiguous, of
 * dtype dt and held by nothing else, and never in anomaly mode (which checks every gin).
 * *fresh true: the target was just made and holds garbage, so the backward must write all of it
 * (beta = 0); false: it holds a sum so far, and the backward must add to it.  Ask right before the
 * write: two inputs may share one slot.  A backward that used the target leaves gin[i] NULL. */
dg_tensor *dg_grad_target(dg_node *n, int i, dg_dtype dt, bool *fresh);

#endif
