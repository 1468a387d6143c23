/* The DeltaNet token mixer, as FLA's fla/layers/delta_net.py (DeltaNet with its defaults: use_beta,
 * qk_activation silu, qk_norm l2):
 *
 *   q, k, v = silu(conv(x W)) split into H heads (K = head_dim, V = head_dim * expand_v);
 *   q, k L2-normalised inside the op;  beta = sigmoid(x Wb) [B,T,H] (x2 with allow_neg_eigval)
 *   o = delta_rule(q, k, v, beta)
 *   o = RMSNorm_V(o) * w (* silu(x Wg) with use_gate);  y = o Wo
 *
 * Parameters under PREFIX in FLA's state_dict order: q_proj.weight, k_proj.weight [key_dim,D],
 * v_proj.weight [value_dim,D], b_proj.weight [H,D], q/k/v_conv1d.weight [.,1,W], g_proj.weight
 * (use_gate), o_norm.weight [V], o_proj.weight [D,value_dim].  FLA spells the sizes
 * expand_k = key_dim / D and expand_v = value_dim / D (models/model_config.h). */
#ifndef DG_MODELS_DELTANET_LAYER_H
#define DG_MODELS_DELTANET_LAYER_H

#include "models/mixer.h"
#include "models/model_config.h"
#include "models/params.h"

typedef struct dg_deltanet_layer {
    dg_model_config cfg;
    dg_tensor *q_proj, *k_proj, *v_proj, *b_proj;
    dg_tensor *conv_w[3], *conv_b[3];
    dg_tensor *g_proj, *o_norm, *o_proj;
} dg_deltanet_layer;

int dg_deltanet_layer_init(dg_deltanet_layer *l, const dg_model_config *cfg, const char *prefix, dg_param_list *pl,
                           dg_rng *rng);
/* x [B,T,D] -> y [B,T,D]; cache as dg_gdn_layer_forward (models/gdn_layer.h); rows (i64 [n] flat
 * positions, or NULL): the output only at those positions, [n,D]. */
dg_tensor *dg_deltanet_layer_forward(const dg_deltanet_layer *l, dg_tensor *x, const dg_mixer_opts *opts,
                                     dg_mixer_cache *cache, dg_tensor *rows);

#endif
