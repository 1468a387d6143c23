/* kda (Kimi Delta Attention): S_t = (I - b_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + b_t k_t v_t^T,
 * o_t = S_t^T (scale q_t); g [B,T,HV,K] one log decay per token, value head and key channel.  The
 * machinery is in delta_common.c; this file names the op, its backward variants and its entry point.
 *
 * Backward variants (the chunked default: fused (bwd[0]), the faster one on both devices,
 * docs/PERF.md):
 *   fused      chunked; inter-chunk backward (dq, dk, dw, dg) and WY backward in one pass, dw kept
 *              per chunk and never stored
 *   unfused    chunked; separate passes that store dw
 *   subst      fused with forward substitution instead of blocked inverses in (I + A)^-1
 *   recurrent  token by token (the default when the forward ran with algorithm = RECURRENT) */
#include "ops/delta/delta_common.h"

#define SL (&dg_delta_slots_gated)

static int forward(dg_node *n) { return dg_delta_forward(n, SL); }
#define VARIANTS(X)                                                          \
    X(fused, "fused (dw on chip)", DG_DELTA_CHUNK_SPEC(0, 0, 0))             \
    X(unfused, "unfused (dw stored), blocked", DG_DELTA_CHUNK_SPEC(0, 1, 0)) \
    X(subst, "solve_tril substitution", DG_DELTA_CHUNK_SPEC(0, 0, 1))        \
    X(recurrent, "token by token (reference)", DG_DELTA_RECURRENT_SPEC)
DG_DELTA_VARIANTS(VARIANTS, dg_kda_variants)
static int decompose(const void *attrs, dg_tensor *const *in, dg_tensor **out) {
    return dg_delta_decompose(SL, attrs, in, out);
}
static int sample(int i, dg_dtype dt, uint64_t seed, dg_sample *s) {
    return dg_delta_sample(SL, DG_GATE_CHANNEL, i, dt, seed, s);
}

const dg_op_def dg_op_kda = {
    .name = "kda",
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

dg_tensor *dg_kda(dg_tensor *q, dg_tensor *k, dg_tensor *v, dg_tensor *g, dg_tensor *beta, const dg_delta_opts *opts,
                  dg_tensor **final_state) {
    return dg_delta_run_op(&dg_op_kda, SL, DG_GATE_CHANNEL, q, k, v, g, beta, opts, final_state);
}
