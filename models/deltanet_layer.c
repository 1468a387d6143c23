/* DeltaNet layer (models/deltanet_layer.h). */
#include "models/deltanet_layer.h"

#include "core/internal.h"
#include "models/qkv_conv.h"

#include <string.h>

int dg_deltanet_layer_init(dg_deltanet_layer *l, const dg_model_config *c, const char *pre, dg_param_list *pl,
                           dg_rng *rng) {
    memset(l, 0, sizeof *l);
    l->cfg = *c;
    int64_t D = c->hidden_size, H = c->num_heads, KD = dg_model_key_dim(c);
    int64_t VD = dg_model_value_dim(c), V = dg_model_head_v_dim(c), W = c->conv_size;
    l->q_proj = dg_param_addf(pl, DG_SHAPE(KD, D), "%sq_proj.weight", pre);
    l->k_proj = dg_param_addf(pl, DG_SHAPE(KD, D), "%sk_proj.weight", pre);
    l->v_proj = dg_param_addf(pl, DG_SHAPE(VD, D), "%sv_proj.weight", pre);
    l->b_proj = dg_param_addf(pl, DG_SHAPE(H, D), "%sb_proj.weight", pre);
    if (!l->q_proj || !l->k_proj || !l->v_proj || !l->b_proj) return -1;
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
    dg_tensor *normal[] = {l->q_proj,    l->k_proj,    l->v_proj, l->b_proj, l->conv_w[0],
                           l->conv_w[1], l->conv_w[2], l->g_proj, l->o_proj};
    for (size_t i = 0; i < sizeof normal / sizeof normal[0]; i++)
        if (normal[i] && dg_init_normal(normal[i], c->initializer_range, rng)) return -1;
    return dg_init_ones(l->o_norm);
}

dg_tensor *dg_deltanet_layer_forward(const dg_deltanet_layer *l, dg_tensor *x, const dg_mixer_opts *mo,
                                     dg_mixer_cache *cache, dg_tensor *rows) {
    const dg_model_config *c = &l->cfg;
    if (!x) return NULL;
    int64_t B = x->shape[0], T = x->shape[1], H = c->num_heads, K = c->head_dim, V = dg_model_head_v_dim(c);
    dg_tensor *q, *k, *v;
    dg_tensor *proj[3] = {l->q_proj, l->k_proj, l->v_proj};
    if (dg_qkv_conv(x, proj, l->conv_w, l->conv_b, true, H, K, H, V, mo, cache, &q, &k, &v)) return NULL;
    dg_tensor *beta = dg_sigmoid(dg_linear(x, dg_mixer_weight(mo, l->b_proj), NULL));
    if (c->allow_neg_eigval) beta = dg_mul_scalar(beta, 2.0);
    dg_delta_opts o = dg_mixer_delta_opts(mo, cache);
    dg_tensor *fs = NULL;
    dg_tensor *out = dg_delta_rule(q, k, v, beta, &o, cache ? &fs : NULL);
    if (!out) return NULL;
    if (cache && dg_mixer_cache_put(&cache->state, fs)) return NULL;
    int64_t n = rows ? rows->shape[0] : B * T; /* per position from here: only the rows asked for */
    out = dg_reshape(dg_mixer_rows(out, rows), DG_SHAPE(n, H, V));
    if (c->use_gate) {
        dg_tensor *g =
            dg_reshape(dg_linear(dg_mixer_rows(x, rows), dg_mixer_weight(mo, l->g_proj), NULL), DG_SHAPE(n, H, V));
        out = dg_gated_rms_norm(out, g, dg_mixer_weight(mo, l->o_norm), c->norm_eps);
    } else {
        out = dg_rms_norm(out, dg_mixer_weight(mo, l->o_norm), c->norm_eps);
    }
    out = dg_linear(dg_reshape(out, DG_SHAPE(n, H * V)), dg_mixer_weight(mo, l->o_proj), NULL);
    return rows ? out : dg_reshape(out, DG_SHAPE(B, T, c->hidden_size));
}
