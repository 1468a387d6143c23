/* The delta-rule ops (delta_rule, gated_delta_rule, kda) at sizes given on the command line, built
 * and run through the public API (include/deltagrad_delta.h), for `compare` and `bench`.  Every
 * other op takes its inputs from its sampler (def->sample). */
#ifndef DG_TOOLS_DELTA_SIZED_H
#define DG_TOOLS_DELTA_SIZED_H

#include "ops/op.h"

typedef struct dg_delta_size {
    int64_t B, T, H, HV, K, V;
    int chunk;
    bool gate_in_kernel;   /* the gate inside the op: g is the raw a, with A_log and dt_bias */
    bool varlen;           /* three packed sequences of uneven length (B becomes 1, T becomes B*T) */
    bool l2norm_in_kernel; /* q, k normalised inside the op; else they are normalised here */
    bool initial_state;    /* an initial state h0, and the final state returned */
    uint64_t seed;
} dg_delta_size;

/* Whether def is built at sizes here, and whether it has a gate. */
bool dg_delta_sized_op(const dg_op_def *def);
bool dg_delta_sized_gated(const dg_op_def *def);

/* Random inputs of def at the sizes, in def's input order (in[k] is def->in_names[k]; absent
 * optional inputs NULL), dtype dt for the float ones; diff[k] says which are differentiable.  The
 * tensors live in the caller's scope.  0, or -1 with dg_error set. */
int dg_delta_sized_inputs(const dg_op_def *def, const dg_delta_size *sz, dg_dtype dt, dg_tensor **in, bool *diff);

/* Runs def through its public entry point on x (def's input order).  variant: the backward
 * variant by name (NULL: the default); "recurrent" also runs the recurrent forward.  With
 * gate_separate (and sz->gate_in_kernel) the gate runs as its own op (gdn_gate, kda_gate) in front
 * of the op.  out[0] = o, out[1] = the final state (NULL without sz->initial_state).  0 or -1. */
int dg_delta_sized_call(const dg_op_def *def, const dg_delta_size *sz, dg_tensor *const *x, const char *variant,
                        bool gate_separate, dg_tensor **out);

/* Elements of one set of the op's tensors (every input and output once), and of one state per
 * token (the decomposition's graph keeps about that many several times over). */
double dg_delta_sized_io_elems(const dg_op_def *def, const dg_delta_size *sz);
double dg_delta_sized_state_elems(const dg_delta_size *sz);

#endif
