/* q, k, v projections + short convolutions + heads (models/qkv_conv.h). */
#include "models/qkv_conv.h"

#include "core/internal.h"
#include "models/short_conv.h"

int dg_qkv_conv(dg_tensor *x, dg_tensor *const proj[3], dg_tensor *const conv_w[3], dg_tensor *const conv_b[3],
                bool qk_silu, int64_t H, int64_t K, int64_t HV, int64_t V, const dg_mixer_opts *mo,
                dg_mixer_cache *cache, dg_tensor **q, dg_tensor **k, dg_tensor **v) {
    if (!x) return -1;
    int64_t B = x->shape[0], T = x->shape[1];
    dg_tensor *out[3];
    for (int i = 0; i < 3; i++) {
        bool act = i == 2 || qk_silu;
        dg_tensor *p = dg_linear(x, dg_mixer_weight(mo, proj[i]), NULL);
        if (conv_w[i])
            out[i] = dg_short_conv(p, dg_mixer_weight(mo, conv_w[i]), dg_mixer_weight(mo, conv_b[i]), act,
                                   cache ? &cache->conv[i] : NULL);
        else out[i] = act ? dg_silu(p) : p;
    }
    *q = dg_reshape(out[0], DG_SHAPE(B, T, H, K));
    *k = dg_reshape(out[1], DG_SHAPE(B, T, H, K));
    *v = dg_reshape(out[2], DG_SHAPE(B, T, HV, V));
    return *q && *k && *v ? 0 : -1;
}
