/* Shared machinery of the delta_rule, gated_delta_rule and kda ops: attributes, input slots,
 * argument validation, the forward and backward that run the call on the backend table
 * (delta_backends.h), the decomposition into primitive ops and the samplers.  Each op file (delta_rule.c, gated_delta_rule.c, kda.c) holds
 * only its dg_op_def, its variants and its typed entry point.
 *
 * Inputs of every op of the family, in this order (delta_rule has no g, A_log, dt_bias slots):
 *   q, k, v, [g], beta, initial_state, [A_log, dt_bias], cu_seqlens
 * Outputs: o [B,T,HV,V], final_state [N,HV,K,V] (always computed; the typed entry point hands it
 * out only when asked).
 *
 * The fused preprocessing, when enabled in the attributes, runs inside forward and backward:
 *   use_qk_l2norm_in_kernel:  q <- l2norm(q), k <- l2norm(k) (eps 1e-6); backward through it
 *   use_gate_in_kernel:       g <- -exp(A_log) softplus(g + dt_bias); backward gives dg of the raw
 *                             a, dA_log, ddt_bias
 * What the forward keeps for the backward (node->saved; delta_common.c, SAVED_*), unless
 * opts->recompute_in_backward (then the backward makes all of it again, and nothing is kept between
 * the passes): the results of both (the normalised q, k, their 1/|x|, the gate), and on CUDA with
 * 16-bit storage the chunked kernels' own working set (W, U, states, V', the inverse;
 * dr_chunk_cuda.h). */
#ifndef DG_OPS_DELTA_COMMON_H
#define DG_OPS_DELTA_COMMON_H

#include "deltagrad_delta.h"
#include "kernels/cpu/delta/delta_call.h"
#include "ops/delta/delta_backends.h"
#include "ops/delta/delta_gate.h"
#include "ops/delta/delta_kernels.h"
#include "ops/op.h"

typedef struct dg_delta_attrs {
    dg_gate_kind gate; /* fixed by the op */
    double scale;      /* resolved: never 0 */
    int chunk;         /* 16, 32, 64 */
    int algorithm;     /* dg_delta_algorithm of the forward */
    bool l2norm_qk;
    bool gate_in_kernel;
    bool keep_forward; /* keep the forward's work for the backward (delta_common.c, SAVED_*) */
    /* the caller did not ask for the final state (output_final_state off), so nothing reads it
     * and no gradient flows into it: on the CPU the kernels neither make it nor take its (zero)
     * gradient, and skip the products of the last chunk's state.  Zero (the registry's samples)
     * makes it, as before. */
    bool no_final_state;
} dg_delta_attrs;

/* where each input lives in node->in (-1: the op has no such input) */
typedef struct dg_delta_slots {
    int q, k, v, g, beta, h0, A_log, dt_bias, cu, n_in;
} dg_delta_slots;

extern const dg_delta_slots dg_delta_slots_plain; /* delta_rule */
extern const dg_delta_slots dg_delta_slots_gated; /* gated_delta_rule, kda */

/* A backward variant of the family: the algorithm of the backward (DG_DELTA_CHUNKED or
 * DG_DELTA_RECURRENT, whatever the forward ran) and the flags of the chunked kernels. */
typedef struct dg_delta_bwd_spec {
    dg_delta_algorithm algo;
    dg_delta_bwd_flags flags;
} dg_delta_bwd_spec;

int dg_delta_forward(dg_node *n, const dg_delta_slots *sl);
int dg_delta_backward(dg_node *n, const dg_delta_slots *sl, const dg_delta_bwd_spec *spec, dg_tensor *const *gout,
                      dg_tensor **gin);

/* The typed entry points' common body: validates, fills the attributes and the input array, picks
 * the variant and applies the op.  g is NULL for delta_rule.  The variant: opts->backward, else
 * DG_BACKWARD (a misspelled name is an error either way: ops/op.h), else the recurrent one for the
 * recurrent algorithm, else bwd[0]. */
dg_tensor *dg_delta_run_op(const dg_op_def *def, const dg_delta_slots *sl, dg_gate_kind gate, dg_tensor *q,
                           dg_tensor *k, dg_tensor *v, dg_tensor *g, dg_tensor *beta, const dg_delta_opts *opts,
                           dg_tensor **final_state);

/* Validation alone (used by dg_delta_run_op; exposed for the tests).  Returns false with the error
 * set.  On success fills *at, and *N with the number of sequences. */
bool dg_delta_validate(const char *op, dg_gate_kind gate, dg_tensor *q, dg_tensor *k, dg_tensor *v, dg_tensor *g,
                       dg_tensor *beta, const dg_delta_opts *opts, dg_delta_attrs *at, int64_t *N);

/* cu_seqlens: i64 [N+1] with B = 1, 0 = c_0 <= ... <= c_N = T, where ref [B,T,...] (named
 * ref_name in messages) gives B and T.  Sets *N.  Returns false with the error set. */
bool dg_delta_check_cu(const char *op, const dg_tensor *cu, const char *ref_name, const dg_tensor *ref, int64_t *N);

/* The same function from primitive ops (token by token), for def->decompose. */
int dg_delta_decompose(const dg_delta_slots *sl, const void *attrs, dg_tensor *const *in, dg_tensor **out);

/* Samples for gradcheck and the tests: see delta_sample.c for the list. */
int dg_delta_sample(const dg_delta_slots *sl, dg_gate_kind gate, int index, dg_dtype dt, uint64_t seed, dg_sample *s);

/* Index of the "recurrent" variant of def (for algorithm = RECURRENT). */
int dg_delta_recurrent_variant(const dg_op_def *def);

/* A backward variant of an op of the family: its name (the registry's: DG_BACKWARD, opts->backward),
 * a line for the benchmarks, and its spec.  Each op file lists its variants once, as an X-macro
 * X(name, desc, spec) (bwd[0] first, the registry's default), from which DG_DELTA_VARIANTS makes
 * both its dg_op_def.bwd entries and its dg_delta_variants table (tools/bench_cuda.c times the
 * chunked ones from that table: the benchmark's rows are the ops' own variants). */
#define DG_DELTA_CHUNK_SPEC(DG_FROM_PARTIALS, DW_STORED, TRIL_SUBSTITUTION)                                      \
    {                                                                                                            \
        DG_DELTA_CHUNKED, {                                                                                      \
            .dg_from_partials = DG_FROM_PARTIALS, .dw_stored = DW_STORED, .tril_substitution = TRIL_SUBSTITUTION \
        }                                                                                                        \
    }
#define DG_DELTA_RECURRENT_SPEC   \
    {                             \
        DG_DELTA_RECURRENT, { 0 } \
    }

typedef struct dg_delta_variant {
    const char *name, *desc;
    dg_delta_bwd_spec spec;
} dg_delta_variant;

typedef struct dg_delta_variants {
    const dg_delta_variant *v;
    int n;
} dg_delta_variants;

extern const dg_delta_variants dg_delta_rule_variants, dg_gated_delta_rule_variants, dg_kda_variants;
/* the table of the op named op ("delta_rule", "gated_delta_rule", "kda"), or NULL */
const dg_delta_variants *dg_delta_variants_of(const char *op);

/* In an op file whose inputs sit at the slots SL (a macro of the file) and whose variants are the
 * X-macro LIST:
 *   DG_DELTA_VARIANTS(LIST, TABLE) defines `static int bwd_<name>(dg_node *, gout, gin)` for
 *     each variant and `const dg_delta_variants TABLE`;
 *   .bwd = {LIST(DG_DELTA_BWD_ENTRY)} fills the dg_op_def's backward entries. */
#define DG_DELTA_BWD_FN_(NAME, DESC, SPEC)                                       \
    static int bwd_##NAME(dg_node *n, dg_tensor *const *gout, dg_tensor **gin) { \
        static const dg_delta_bwd_spec spec = SPEC;                              \
        return dg_delta_backward(n, SL, &spec, gout, gin);                       \
    }
#define DG_DELTA_VARIANT_ROW_(NAME, DESC, SPEC) {#NAME, DESC, SPEC},
#define DG_DELTA_BWD_ENTRY(NAME, DESC, SPEC) {#NAME, bwd_##NAME},
#define DG_DELTA_VARIANTS(LIST, TABLE)                                                             \
    static const dg_delta_variant TABLE##_v_[] = {LIST(DG_DELTA_VARIANT_ROW_)};                    \
    const dg_delta_variants TABLE = {TABLE##_v_, (int)(sizeof TABLE##_v_ / sizeof TABLE##_v_[0])}; \
    LIST(DG_DELTA_BWD_FN_)

/* gradcheck / comparison tolerances of the family (f64: finite differences; f32: against f64) */
#define DG_DELTA_TOLERANCES .atol_f64 = 1e-7, .rtol_f64 = 1e-6, .atol_f32 = 1e-4, .rtol_f32 = 1e-3

#endif
