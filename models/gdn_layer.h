/* The Gated DeltaNet token mixer, as FLA's fla/layers/gated_deltanet.py (GatedDeltaNet):
 *
 *   q = silu(conv_q(x Wq)), k = silu(conv_k(x Wk)), v = silu(conv_v(x Wv))   [B,T,key_dim|value_dim]
 *       (without short convolutions: q = silu(x Wq), ...)
 *   split heads: q, k [B,T,H,K], v [B,T,HV,V]; q, k L2-normalised inside the op
 *   beta = sigmoid(x Wb) [B,T,HV]  (x2 with allow_neg_eigval)
 *   g = -exp(A_log) softplus(x Wa + dt_bias)  [B,T,HV]  (the gate inside the op)
 *   o = gated_delta_rule(q, k, v, g, beta)  [B,T,HV,V]
 *   o = RMSNorm_V(o) * w * silu(x Wg)   (use_gate; else RMSNorm_V(o) * w)
 *   y = o Wo  [B,T,D]
 *
 * Parameters, under PREFIX (e.g. "model.layers.0.attn."), in FLA's state_dict order and shapes:
 *   A_log [HV], dt_bias [HV], q_proj.weight [key_dim,D], k_proj.weight [key_dim,D],
 *   v_proj.weight [value_dim,D], a_proj.weight [HV,D], b_proj.weight [HV,D],
 *   q_conv1d.weight [key_dim,1,W], k_conv1d.weight [key_dim,1,W], v_conv1d.weight [value_dim,1,W]
 *   (+ .bias with conv_bias), g_proj.weight [value_dim,D] (use_gate), o_norm.weight [V],
 *   o_proj.weight [D,value_dim].
 * Initialisation (FLA's _init_weights): linear and conv weights N(0, initializer_range^2),
 * A = U(0, 16), A_log = log A, dt_bias = softplus^-1(dt), dt = exp(U(log 1e-3, log 1e-1)) >= 1e-4,
 * norm weight 1, biases 0. */
#ifndef DG_MODELS_GDN_LAYER_H
#define DG_MODELS_GDN_LAYER_H

#include "models/mixer.h"
#include "models/model_config.h"
#include "models/params.h"

typedef struct dg_gdn_layer {
    dg_model_config cfg;
    dg_tensor *A_log, *dt_bias;
    dg_tensor *q_proj, *k_proj, *v_proj, *a_proj, *b_proj;
    dg_tensor *conv_w[3], *conv_b[3]; /* q, k, v (NULL without short convolutions / bias) */
    dg_tensor *g_proj, *o_norm, *o_proj;
} dg_gdn_layer;

/* Registers the parameters under prefix in pl and initialises them from rng.  0, or -1. */
int dg_gdn_layer_init(dg_gdn_layer *l, const dg_model_config *cfg, const char *prefix, dg_param_list *pl, dg_rng *rng);
/* x [B,T,D] -> y [B,T,D].  cache NULL: a whole sequence from a zero state (training, scoring);
 * otherwise decoding continues from the cache, which is updated.
 * rows (i64 [n] flat positions b*T + t, or NULL): the output only at those positions, [n,D] (the
 * recurrence still runs over every position). */
dg_tensor *dg_gdn_layer_forward(const dg_gdn_layer *l, dg_tensor *x, const dg_mixer_opts *opts, dg_mixer_cache *cache,
                                dg_tensor *rows);

#endif
