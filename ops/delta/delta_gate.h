/* The gate of a delta-rule op as a trait, defined once per gate kind (delta_gates.c): what the op
 * is called, the shape of its g, the recurrence, the in-op gate that makes g from a raw projection,
 * and the op's backward variants.  The ops' validation, preparation, decomposition and samplers,
 * the benchmark and the tests ask the trait instead of branching on the gate kind.
 *
 * The gate's kernel forms live with the kernels: the CPU kernels and the CUDA kernels take
 * s.gate (dg_gate_kind, kernels/cpu/delta/delta_rule.h) and specialise on it (the CUDA kernels as a
 * template parameter GATE); the gate's primitive-op form, for the decomposition, is decay() below.
 * A new gate variant is: a dg_gate_kind value and its kernels (kernels/cpu/delta/, kernels/cuda/delta/),
 * a trait row in delta_gates.c, an op file beside kda.c, and its line in ops/registry_list.h
 * (ops/delta/README.md). */
#ifndef DG_OPS_DELTA_GATE_H
#define DG_OPS_DELTA_GATE_H

#include "deltagrad.h"
#include "kernels/cpu/delta/delta_rule.h"

struct dg_delta_variants;

typedef struct dg_delta_gate {
    dg_gate_kind kind;
    const char *name;                         /* "none", "head", "channel" */
    const char *op;                           /* the op of the family with this gate: "delta_rule", ... */
    const char *recurrence;                   /* the state update, for listings */
    bool gated;                               /* the op takes g (and A_log, dt_bias with use_gate_in_kernel) */
    bool per_channel;                         /* g [B,T,HV,K], one log decay per key channel; else [B,T,HV] */
    const char *gate_op;                      /* the op that makes g from the raw a (use_gate_in_kernel), or NULL */
    const struct dg_delta_variants *variants; /* the op's backward variants (delta_common.h) */
} dg_delta_gate;

/* every trait, in dg_gate_kind order */
int dg_delta_gate_count(void);
const dg_delta_gate *dg_delta_gate_at(int i);
/* the trait of a kind, or NULL */
const dg_delta_gate *dg_delta_gate_of(dg_gate_kind kind);
/* the trait of the op named op, or NULL when op is not of the family */
const dg_delta_gate *dg_delta_gate_of_op(const char *op);

/* gate values per token and value head: 0 (no gate), 1 or K */
static inline int64_t dg_delta_gate_width(const dg_delta_gate *gt, int64_t K) {
    return !gt->gated ? 0 : gt->per_channel ? K : 1;
}
/* dims of g (0: no g) and its shape as text, "[B,T,HV]" or "[B,T,HV,K]" */
static inline int dg_delta_gate_ndim(const dg_delta_gate *gt) { return !gt->gated ? 0 : gt->per_channel ? 4 : 3; }
static inline const char *dg_delta_gate_shape_text(const dg_delta_gate *gt) {
    return !gt->gated ? "none" : gt->per_channel ? "[B,T,HV,K]" : "[B,T,HV]";
}

/* The decay of the state before token t's update, in primitive ops (the decomposition):
 * S [Bn,HV,K,V] times exp(g_t), g_t the token's gate [Bn,1,HV] or [Bn,1,HV,K]; S itself when the
 * op has no gate. */
dg_tensor *dg_delta_gate_decay(const dg_delta_gate *gt, dg_tensor *S, dg_tensor *g_t);

#endif
