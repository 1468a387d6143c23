/* delta_rule (DeltaNet): S_t = (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T, o_t = S_t^T (scale q_t).
 * No gate.  The machinery is in delta_common.c; this file names the op, its backward variants and
 * its typed entry point.
 *
 * Backward variants:
 *   chunk      chunked (WY form), blocked inverses in (I + A)^-1
 *   subst      chunked with forward substitution
 *   recurrent  token by token (the default when the forward ran with algorithm = RECURRENT)
 * The chunked ones keep dW on chip (dw_stored = 0), as gated_delta_rule's. */
#include "ops/delta/delta_common.h"

#define SL (&dg_delta_slots_plain)

static int forward(dg_node *n) { return dg_delta_forward(n, SL); }
#define VARIANTS(X)                                                   \
    X(chunk, "solve_tril blocked", DG_DELTA_CHUNK_SPEC(0, 0, 0))      \
    X(subst, "solve_tril substitution", DG_DELTA_CHUNK_SPEC(0, 0, 1)) \
    X(recurrent, "token by token (reference)", DG_DELTA_RECURRENT_SPEC)
DG_DELTA_VARIANTS(VARIANTS, dg_delta_rule_variants)
static int decompose(const void *attrs, dg_tensor *const *in, dg_tensor **out) {
    return dg_delta_decompose(SL, attrs, in, out);
}
static int sample(int i, dg_dtype dt, uint64_t seed, dg_sample *s) {
    return dg_delta_sample(SL, DG_GATE_NONE, i, dt, seed, s);
}

const dg_op_def dg_op_delta_rule = {.name = "delta_rule",
                                    .n_in = 6,
                                    .n_out = 2,
                                    .in_names = {"q", "k", "v", "beta", "initial_state", "cu_seqlens"},
                                    .out_names = {"o", "final_state"},
                                    .attrs_size = sizeof(dg_delta_attrs),
                                    .forward = forward,
                                    .bwd = {VARIANTS(DG_DELTA_BWD_ENTRY)},
                                    .decompose = decompose,
                                    .sample = sample,
                                    DG_DELTA_TOLERANCES};

dg_tensor *dg_delta_rule(dg_tensor *q, dg_tensor *k, dg_tensor *v, dg_tensor *beta, const dg_delta_opts *opts,
                         dg_tensor **final_state) {
    return dg_delta_run_op(&dg_op_delta_rule, SL, DG_GATE_NONE, q, k, v, NULL, beta, opts, final_state);
}
