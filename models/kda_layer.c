/* Kimi Delta Attention layer (models/kda_layer.h). */
#include "models/kda_layer.h"

#include "core/internal.h"
#include "models/qkv_conv.h"

#include <string.h>

int dg_kda_layer_init(dg_kda_layer *l, const dg_model_config *c, const char *pre, dg_param_list *pl, dg_rng *rng) {
    memset(l, 0, sizeof *l);
    l->cfg = *c;
    int64_t D = c->hidden_size, HV = dg_model_num_v_heads(c), K = c->head_dim, KD = dg_model_key_dim(c);
    int64_t VD = dg_model_value_dim(c), V = dg_model_head_v_dim(c), W = c->conv_size;
    l->A_log = dg_param_addf(pl, DG_SHAPE(HV), "%sA_log", pre);
    l->dt_bias = dg_param_addf(pl, DG_SHAPE(HV * K), "%sdt_bias", pre);
    l->q_proj = dg_param_addf(pl, DG_SHAPE(KD, D), "%sq_proj.weight", pre);
    l->k_proj = dg_param_addf(pl, DG_SHAPE(KD, D), "%sk_proj.weight", pre);
    l->v_proj = dg_param_addf(pl, DG_SHAPE(VD, D), "%sv_proj.weight", pre);
    if (!l->A_log || !l->dt_bias || !l->q_proj || !l->k_proj || !l->v_proj) return -1;
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
    l->f_proj0 = dg_param_addf(pl, DG_SHAPE(V, D), "%sf_proj.0.weight", pre);
    l->f_proj1 = dg_param_addf(pl, DG_SHAPE(HV * K, V), "%sf_proj.1.weight", pre);
    l->b_proj = dg_param_addf(pl, DG_SHAPE(HV, D), "%sb_proj.weight", pre);
    l->g_proj0 = dg_param_addf(pl, DG_SHAPE(V, D), "%sg_proj.0.weight", pre);
    l->g_proj1 = dg_param_addf(pl, DG_SHAPE(VD, V), "%sg_proj.1.weight", pre);
    l->g_bias = dg_param_addf(pl, DG_SHAPE(VD), "%sg_proj.1.bias", pre);
    l->o_norm = dg_param_addf(pl, DG_SHAPE(V), "%so_norm.weight", pre);
    l->o_proj = dg_param_addf(pl, DG_SHAPE(D, VD), "%so_proj.weight", pre);
    if (!l->f_proj0 || !l->f_proj1 || !l->b_proj || !l->g_proj0 || !l->g_proj1 || !l->g_bias || !l->o_norm ||
        !l->o_proj)
        return -1;
    dg_tensor *normal[] = {l->q_proj,  l->k_proj,  l->v_proj, l->conv_w[0], l->conv_w[1], l->conv_w[2],
                           l->f_proj0, l->f_proj1, l->b_proj, l->g_proj0,   l->g_proj1,   l->o_proj};
    for (size_t i = 0; i < sizeof normal / sizeof normal[0]; i++)
        if (normal[i] && dg_init_normal(normal[i], c->initializer_range, rng)) return -1;
    if (dg_init_log_uniform_A(l->A_log, 1.0, 16.0, rng) || dg_init_dt_bias(l->dt_bias, rng) || dg_init_ones(l->o_norm))
        return -1;
    return 0;
}

dg_tensor *dg_kda_layer_forward(const dg_kda_layer *l, dg_tensor *x, const dg_mixer_opts *mo, dg_mixer_cache *cache,
                                dg_tensor *rows) {
    const dg_model_config *c = &l->cfg;
    if (!x) return NULL;
    int64_t B = x->shape[0], T = x->shape[1], H = c->num_heads, K = c->head_dim;
    int64_t HV = dg_model_num_v_heads(c), V = dg_model_head_v_dim(c);
    dg_tensor *q, *k, *v;
    dg_tensor *proj[3] = {l->q_proj, l->k_proj, l->v_proj};
    if (dg_qkv_conv(x, proj, l->conv_w, l->conv_b, true, H, K, HV, V, mo, cache, &q, &k, &v)) return NULL;
    dg_tensor *a =
        dg_linear(dg_linear(x, dg_mixer_weight(mo, l->f_proj0), NULL), dg_mixer_weight(mo, l->f_proj1), NULL);
    a = dg_mixer_f32(dg_reshape(a, DG_SHAPE(B, T, HV, K))); /* the gate stays f32 */
    dg_tensor *beta = dg_sigmoid(dg_linear(x, dg_mixer_weight(mo, l->b_proj), NULL));
    if (c->allow_neg_eigval) beta = dg_mul_scalar(beta, 2.0);
    dg_delta_opts o = dg_mixer_delta_opts(mo, cache);
    o.use_gate_in_kernel = true;
    o.A_log = l->A_log;
    o.dt_bias = l->dt_bias;
    dg_tensor *fs = NULL;
    dg_tensor *out = dg_kda(q, k, v, a, beta, &o, cache ? &fs : NULL);
    if (!out) return NULL;
    if (cache && dg_mixer_cache_put(&cache->state, fs)) return NULL;
    int64_t n = rows ? rows->shape[0] : B * T; /* per position from here: only the rows asked for */
    out = dg_reshape(dg_mixer_rows(out, rows), DG_SHAPE(n, HV, V));
    dg_tensor *g = dg_linear(dg_linear(dg_mixer_rows(x, rows), dg_mixer_weight(mo, l->g_proj0), NULL),
                             dg_mixer_weight(mo, l->g_proj1), dg_mixer_weight(mo, l->g_bias));
    g = dg_sigmoid(dg_reshape(g, DG_SHAPE(n, HV, V)));
    out = dg_mul(dg_rms_norm(out, dg_mixer_weight(mo, l->o_norm), c->norm_eps), g);
    out = dg_linear(dg_reshape(out, DG_SHAPE(n, HV * V)), dg_mixer_weight(mo, l->o_proj), NULL);
    return rows ? out : dg_reshape(out, DG_SHAPE(B, T, c->hidden_size));
}
