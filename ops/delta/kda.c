/* kda (Kimi Delta Attention): S_t = (I - b_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + b_t k_t v_t^T,
 * o_t = S_t^T (scale q_t); g [B,T,HV,K] one log decay per token, value head and key channel.  The
 * machinery is in delta_common.c; this file names the op, its backward variants and its entry point.
 *
 * Backward variants (the chunked default: fused (bwd[0]), the faster one on both devices,
 * docs/DESIGN.md):
 *   fused      chunked; inter-chunk backward (dq, dk, dw, dg) and WY backward in one pass, dw kept
 *              per chunk and never stored (seeds 000, 003).  CPU: 6 % faster than unfused (fwd+bwd
 *              87.6 vs 94.2 ms at B4 T1024 H4 K=V=64, 2 cores); H200: 9 % (4.04 vs 4.45 ms fwd+bwd
 *              at B8 T2048 H16 K=V=128; its kernel 20 % faster than the unfused pair)
 *   unfused    chunked; separate passes that store dw
 *   subst      fused with forward substitution instead of blocked inverses in (I + A)^-1
 *   recurrent  token by token (the default when the forward ran with algorithm = RECURRENT) */
#include "ops/delta/delta_common.h"

#define SL (&dg_delta_slots_gated)

static int forward(dg_node *n) { return dg_delta_forward(n, SL); }
static const dg_delta_variant variants[] = {
    {"fused", "fused (dw on chip)", DG_DELTA_CHUNK_SPEC(1, 1, 1)},
    {"unfused", "unfused (dw stored), blocked", DG_DELTA_CHUNK_SPEC(1, 0, 1)},
    {"subst", "solve_tril substitution", DG_DELTA_CHUNK_SPEC(1, 1, 0)},
    {"recurrent", "token by token (reference)", DG_DELTA_RECURRENT_SPEC},
};
const dg_delta_variants dg_kda_variants = {variants, 4, 0};
DG_DELTA_BWD_VARIANT(bwd_fused, SL, variants, 0)
DG_DELTA_BWD_VARIANT(bwd_unfused, SL, variants, 1)
DG_DELTA_BWD_VARIANT(bwd_subst, SL, variants, 2)
DG_DELTA_BWD_VARIANT(bwd_recurrent, SL, variants, 3)
static int decompose(const void *attrs, dg_tensor *const *in, dg_tensor **out) {
    return dg_delta_decompose(SL, attrs, in, out);
}
static int sample(int i, dg_dtype dt, uint64_t seed, dg_sample *s) {
    return dg_delta_sample(SL, DG_GATE_CHANNEL, i, dt, seed, s);
}

const dg_op_def dg_op_kda = {
    .name = "kda", .n_in = 9, .n_out = 2,
    .in_names = {"q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias", "cu_seqlens"},
    .out_names = {"o", "final_state"},
    .attrs_size = sizeof(dg_delta_attrs), .forward = forward,
    .bwd = {{"fused", bwd_fused}, {"unfused", bwd_unfused}, {"subst", bwd_subst},
            {"recurrent", bwd_recurrent}},
    .decompose = decompose, .sample = sample, DG_DELTA_TOLERANCES};

dg_tensor *dg_kda(dg_tensor *q, dg_tensor *k, dg_tensor *v, dg_tensor *g, dg_tensor *beta,
                  const dg_delta_opts *opts, dg_tensor **final_state) {
    return dg_delta_call(&dg_op_kda, SL, DG_GATE_CHANNEL, variants[dg_kda_variants.cuda_default].name, q, k, v, g,
                         beta, opts, final_state);
}
