/* Gated DeltaNet layer (models/gdn_layer.h). */
#include "models/gdn_layer.h"

#include "core/internal.h"
#include "models/qkv_conv.h"

#include <string.h>

int dg_gdn_layer_init(dg_gdn_layer *l, const dg_model_config *c, const char *pre, dg_param_list *pl, dg_rng *rng) {
    memset(l, 0, sizeof *l);
    l->cfg = *c;
    int64_t D = c->hidden_size, HV = dg_model_num_v_heads(c), KD = dg_model_key_dim(c);
    int64_t VD = dg_model_value_dim(c), V = dg_model_head_v_dim(c), W = c->conv_size;
    double std = c->initializer_range;
    /* FLA's state_dict order: the module's own parameters, then its submodules in creation order */
    l->A_log = dg_param_addf(pl, DG_SHAPE(HV), "%sA_log", pre);
    l->dt_bias = dg_param_addf(pl, DG_SHAPE(HV), "%sdt_bias", pre);
    l->q_proj = dg_param_addf(pl, DG_SHAPE(KD, D), "%sq_proj.weight", pre);
    l->k_proj = dg_param_addf(pl, DG_SHAPE(KD, D), "%sk_proj.weight", pre);
    l->v_proj = dg_param_addf(pl, DG_SHAPE(VD, D), "%sv_proj.weight", pre);
    l->a_proj = dg_param_addf(pl, DG_SHAPE(HV, D), "%sa_proj.weight", pre);
    l->b_proj = dg_param_addf(pl, DG_SHAPE(HV, D), "%sb_proj.weight", pre);
    if (!l->A_log || !l->dt_bias || !l->q_proj || !l->k_proj || !l->v_proj || !l->a_proj || !l->b_proj) return -1;
    if (c->use_short_conv) {
        const char *nm[3] = {"q", "k", "v"};
        int64_t dims[3] = {KD, KD, VD};
        for (int i = 0; i < 3; i++) {
            l->conv_w[i] = dg_param_addf(pl, DG_SHAPE(dims[i], 1, W), "%s%s_conv1d.weight", pre, nm[i]);
            if (!l->conv_w[i]) return -1;
            if (c->conv_bias && !(l->conv_b[i] = dg_param_addf(pl, DG_SHAPE(dims[i]), "%s%s_conv1d.bias", pre, nm[i])))
                return -1;
        }
    }
    if (c->use_gate && !(l->g_proj = dg_param_addf(pl, DG_SHAPE(VD, D), "%sg_proj.weight", pre))) return -1;
    l->o_norm = dg_param_addf(pl, DG_SHAPE(V), "%so_norm.weight", pre);
    l->o_proj = dg_param_addf(pl, DG_SHAPE(D, VD), "%so_proj.weight", pre);
    if (!l->o_norm || !l->o_proj) return -1;

    dg_tensor *normal[] = {l->q_proj,    l->k_proj,    l->v_proj,    l->a_proj, l->b_proj,
                           l->conv_w[0], l->conv_w[1], l->conv_w[2], l->g_proj, l->o_proj};
    for (size_t i = 0; i < sizeof normal / sizeof normal[0]; i++)
        if (normal[i] && dg_init_normal(normal[i], std, rng)) return -1;
    if (dg_init_log_uniform_A(l->A_log, 0.0, 16.0, rng) || dg_init_dt_bias(l->dt_bias, rng) || dg_init_ones(l->o_norm))
        return -1;
    return 0;
}

dg_tensor *dg_gdn_layer_forward(const dg_gdn_layer *l, dg_tensor *x, const dg_mixer_opts *mo, dg_mixer_cache *cache,
                                dg_tensor *rows) {
    const dg_model_config *c = &l->cfg;
    if (!x) return NULL;
    int64_t B = x->shape[0], T = x->shape[1], H = c->num_heads, K = c->head_dim;
    int64_t HV = dg_model_num_v_heads(c), V = dg_model_head_v_dim(c);
    dg_tensor *q, *k, *v;
    dg_tensor *proj[3] = {l->q_proj, l->k_proj, l->v_proj};
    if (dg_qkv_conv(x, proj, l->conv_w, l->conv_b, true, H, K, HV, V, mo, cache, &q, &k, &v)) return NULL;
    dg_tensor *beta = dg_sigmoid(dg_linear(x, dg_mixer_weight(mo, l->b_proj), NULL)); /* [B,T,HV] */
    if (c->allow_neg_eigval) beta = dg_mul_scalar(beta, 2.0);
    dg_tensor *a = dg_mixer_f32(dg_linear(x, dg_mixer_weight(mo, l->a_proj), NULL)); /* [B,T,HV], f32 */
    dg_delta_opts o = dg_mixer_delta_opts(mo, cache);
    o.use_gate_in_kernel = true;
    o.A_log = l->A_log;
    o.dt_bias = l->dt_bias;
    dg_tensor *fs = NULL;
    dg_tensor *out = dg_gated_delta_rule(q, k, v, a, beta, &o, cache ? &fs : NULL); /* [B,T,HV,V] */
    if (!out) return NULL;
    if (cache && dg_mixer_cache_put(&cache->state, fs)) return NULL;
    /* from here on per position: only the rows asked for (all when rows is NULL) */
    int64_t n = rows ? rows->shape[0] : B * T;
    out = dg_reshape(dg_mixer_rows(out, rows), DG_SHAPE(n, HV, V));
    dg_tensor *xr = dg_mixer_rows(x, rows);
    if (c->use_gate) {
        dg_tensor *g = dg_reshape(dg_linear(xr, dg_mixer_weight(mo, l->g_proj), NULL), DG_SHAPE(n, HV, V));
        out = dg_gated_rms_norm(out, g, dg_mixer_weight(mo, l->o_norm), c->norm_eps);
    } else {
        out = dg_rms_norm(out, dg_mixer_weight(mo, l->o_norm), c->norm_eps);
    }
    out = dg_linear(dg_reshape(out, DG_SHAPE(n, HV * V)), dg_mixer_weight(mo, l->o_proj), NULL);
    return rows ? out : dg_reshape(out, DG_SHAPE(B, T, c->hidden_size));
}
