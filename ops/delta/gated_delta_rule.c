/* gated_delta_rule (Gated DeltaNet): S_t = exp(g_t) (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T,
 * o_t = S_t^T (scale q_t); g [B,T,HV] one log decay per token and value head.  The machinery is in
 * delta_common.c; this file names the op, its backward variants and its typed entry point.
 *
 * Backward variants:
 *   dg_final    chunked; dg from the final dq, dk: dg = rowsum(dq o q) - rowsum(dk o k) + the
 *               state term
 *   dg_partial  chunked; dg accumulated through the partial terms of every piece
 *   subst       dg_final with forward substitution instead of blocked inverses in (I + A)^-1
 *   recurrent   token by token (the default when the forward ran with algorithm = RECURRENT)
 * The chunked ones take the fused structure (dw_stored = 0: the inter-chunk and WY backward in one
 * pass, dW kept per chunk; on CUDA the fused qkwy kernel), the faster on both devices. */
#include "ops/delta/delta_common.h"

#define SL (&dg_delta_slots_gated)

static int forward(dg_node *n) { return dg_delta_forward(n, SL); }
#define VARIANTS(X)                                                           \
    X(dg_final, "dg from final dq,dk; blocked", DG_DELTA_CHUNK_SPEC(0, 0, 0)) \
    X(dg_partial, "dg from partial terms", DG_DELTA_CHUNK_SPEC(1, 0, 0))      \
    X(subst, "solve_tril substitution", DG_DELTA_CHUNK_SPEC(0, 0, 1))         \
    X(recurrent, "token by token (reference)", DG_DELTA_RECURRENT_SPEC)
DG_DELTA_VARIANTS(VARIANTS, dg_gated_delta_rule_variants)
static int decompose(const void *attrs, dg_tensor *const *in, dg_tensor **out) {
    return dg_delta_decompose(SL, attrs, in, out);
}
static int sample(int i, dg_dtype dt, uint64_t seed, dg_sample *s) {
    return dg_delta_sample(SL, DG_GATE_HEAD, i, dt, seed, s);
}

const dg_op_def dg_op_gated_delta_rule = {
    .name = "gated_delta_rule",
    .n_in = 9,
    .n_out = 2,
    .in_names = {"q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias", "cu_seqlens"},
    .out_names = {"o", "final_state"},
    .attrs_size = sizeof(dg_delta_attrs),
    .forward = forward,
    .bwd = {VARIANTS(DG_DELTA_BWD_ENTRY)},
    .decompose = decompose,
    .sample = sample,
    DG_DELTA_TOLERANCES};

dg_tensor *dg_gated_delta_rule(dg_tensor *q, dg_tensor *k, dg_tensor *v, dg_tensor *g, dg_tensor *beta,
                               const dg_delta_opts *opts, dg_tensor **final_state) {
    return dg_delta_run_op(&dg_op_gated_delta_rule, SL, DG_GATE_HEAD, q, k, v, g, beta, opts, final_state);
}
