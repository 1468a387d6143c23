/* FLA's ShortConvolution: a causal depthwise convolution over time with an optional silu, whose
 * weight is stored as nn.Conv1d's [D, 1, W]; with a cache it carries the last W-1 inputs from one
 * call to the next, so decoding one token at a time never re-reads the prefix. */
#ifndef DG_MODELS_SHORT_CONV_H
#define DG_MODELS_SHORT_CONV_H

#include "deltagrad.h"

/* x [B,T,D], weight [D,1,W], bias [D] or NULL.  y[b,t] = act(bias + sum_j w[:,j] x[b,t-W+1+j]).
 * cache NULL: zero padding on the left (training).  cache non-NULL: *cache [B,W-1,D] (NULL = zeros)
 * holds the inputs before x; on return it holds the last W-1 inputs of [cache, x] (a kept,
 * detached tensor owned by the caller's cache).  Returns y [B,T,D] or NULL with dg_error. */
dg_tensor *dg_short_conv(dg_tensor *x, dg_tensor *weight, dg_tensor *bias, bool silu, dg_tensor **cache);

#endif
