/* The front of every delta-rule mixer (FLA's GatedDeltaNet, KimiDeltaAttention, DeltaNet): the q, k,
 * v projections and their short convolutions with silu, split into heads. */
#ifndef DG_MODELS_QKV_CONV_H
#define DG_MODELS_QKV_CONV_H

#include "models/mixer.h"

/* x [B,T,D]; proj[3] = q, k, v weights [out,D]; conv_w[3] [out,1,W] or NULL (no short convolution:
 * silu of the projection, as FLA); conv_b[3] or NULL.  qk_silu false: no activation on q and k
 * (DeltaNet with qk_activation = identity; unused by the defaults).  Outputs q, k [B,T,H,K] and
 * v [B,T,HV,V] with the given head sizes.  cache as dg_short_conv (conv[0..2]).  mo: the weights
 * as the step uses them (dg_mixer_weight); may be NULL.  0, or -1. */
int dg_qkv_conv(dg_tensor *x, dg_tensor *const proj[3], dg_tensor *const conv_w[3], dg_tensor *const conv_b[3],
                bool qk_silu, int64_t H, int64_t K, int64_t HV, int64_t V, const dg_mixer_opts *mo,
                dg_mixer_cache *cache, dg_tensor **q, dg_tensor **k, dg_tensor **v);

#endif
