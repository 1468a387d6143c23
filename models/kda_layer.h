/* The Kimi Delta Attention token mixer, as FLA's fla/layers/kda.py (KimiDeltaAttention):
 *
 *   q, k, v as GatedDeltaNet (projections, short convolutions with silu, heads; q, k L2-normalised
 *   inside the op)
 *   a = (x F0^T) F1^T  [B,T,HV,K]   (f_proj: a low-rank pair hidden -> head_v_dim -> HV*K)
 *   g = -exp(A_log) softplus(a + dt_bias)  per channel (the gate inside the op)
 *   beta = sigmoid(x Wb) [B,T,HV]  (x2 with allow_neg_eigval)
 *   o = kda(q, k, v, g, beta)  [B,T,HV,V]
 *   o = RMSNorm_V(o) * w * sigmoid((x G0^T) G1^T + g_bias)  (FusedRMSNormGated, activation sigmoid)
 *   y = o Wo
 *
 * Parameters under PREFIX in FLA's state_dict order: A_log [HV], dt_bias [HV*K], q_proj.weight,
 * k_proj.weight [key_dim,D], v_proj.weight [value_dim,D], q/k/v_conv1d.weight [.,1,W],
 * f_proj.0.weight [V,D], f_proj.1.weight [HV*K,V], b_proj.weight [HV,D], g_proj.0.weight [V,D],
 * g_proj.1.weight [value_dim,V], g_proj.1.bias [value_dim], o_norm.weight [V], o_proj.weight
 * [D,value_dim].  Initialisation: FLA's (A = U(1, 16), A_log = log A; dt_bias as GDN per channel;
 * linear/conv weights N(0, initializer_range^2); the g_proj bias 0; norm weight 1). */
#ifndef DG_MODELS_KDA_LAYER_H
#define DG_MODELS_KDA_LAYER_H

#include "models/mixer.h"
#include "models/model_config.h"
#include "models/params.h"

typedef struct dg_kda_layer {
    dg_model_config cfg;
    dg_tensor *A_log, *dt_bias;
    dg_tensor *q_proj, *k_proj, *v_proj;
    dg_tensor *conv_w[3], *conv_b[3];
    dg_tensor *f_proj0, *f_proj1, *b_proj, *g_proj0, *g_proj1, *g_bias;
    dg_tensor *o_norm, *o_proj;
} dg_kda_layer;

int dg_kda_layer_init(dg_kda_layer *l, const dg_model_config *cfg, const char *prefix, dg_param_list *pl, dg_rng *rng);
/* x [B,T,D] -> y [B,T,D]; cache as dg_gdn_layer_forward (models/gdn_layer.h); rows (i64 [n] flat
 * positions, or NULL): the output only at those positions, [n,D]. */
dg_tensor *dg_kda_layer_forward(const dg_kda_layer *l, dg_tensor *x, const dg_mixer_opts *opts, dg_mixer_cache *cache,
                                dg_tensor *rows);

#endif
