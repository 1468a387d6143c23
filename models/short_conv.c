/* Short causal convolution with a carried input window (models/short_conv.h). */
#include "models/short_conv.h"

#include "core/internal.h"
#include "models/mixer.h"

dg_tensor *dg_short_conv(dg_tensor *x, dg_tensor *weight, dg_tensor *bias, bool silu, dg_tensor **cache) {
    if (!x || !weight) return NULL;
    if (weight->ndim != 3 || weight->shape[1] != 1 || x->ndim != 3 || weight->shape[0] != x->shape[2]) {
        dg_error("short_conv: weight has shape %s but [D,1,W] with D = %lld is required (x %s)", dg_shp(weight),
                 (long long)(x->ndim == 3 ? x->shape[2] : -1), dg_shp(x));
        return NULL;
    }
    int64_t B = x->shape[0], T = x->shape[1], D = x->shape[2], W = weight->shape[2];
    dg_tensor *w2 = dg_reshape(weight, DG_SHAPE(D, W)); /* [D,1,W] -> [D,W], a view */
    if (!cache || W == 1) return dg_conv1d(x, w2, bias, silu);
    dg_tensor *prev = *cache;
    if (prev && (prev->ndim != 3 || prev->shape[0] != B || prev->shape[1] != W - 1 || prev->shape[2] != D ||
                 prev->dtype != x->dtype)) {
        dg_error("short_conv: cache has shape %s but [B,W-1,D] = [%lld,%lld,%lld] is required", dg_shp(prev),
                 (long long)B, (long long)(W - 1), (long long)D);
        return NULL;
    }
    if (!prev) prev = dg_zeros_on(DG_SHAPE(B, W - 1, D), x->dtype, x->device);
    dg_tensor *parts[2] = {prev, x};
    dg_tensor *ext = dg_cat(2, parts, 1); /* [B, W-1+T, D] */
    dg_tensor *y = dg_slice(dg_conv1d(ext, w2, bias, silu), 1, W - 1, W - 1 + T);
    if (!y) return NULL;
    if (dg_mixer_cache_put(cache, dg_slice(ext, 1, T, T + W - 1))) return NULL;
    return y;
}
