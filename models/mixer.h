/* What the three token mixers (GatedDeltaNet, KDA, DeltaNet layers) share: the decoding cache
 * carried between calls and the run-time choice of the delta-rule algorithm. */
#ifndef DG_MODELS_MIXER_H
#define DG_MODELS_MIXER_H

#include "deltagrad.h"

/* The state of one mixer layer between calls (generation): the last conv_size-1 inputs of the q, k
 * and v short convolutions, [B, W-1, D] each, and the delta rule's state S [B, HV, K, V].  NULL
 * means zeros (a fresh sequence).  The tensors are kept references owned by the cache. */
typedef struct dg_mixer_cache {
    dg_tensor *conv[3];
    dg_tensor *state;
} dg_mixer_cache;

static inline void dg_mixer_cache_clear(dg_mixer_cache *c) {
    for (int i = 0; i < 3; i++) {
        if (c->conv[i]) dg_release(c->conv[i]);
        c->conv[i] = NULL;
    }
    if (c->state) dg_release(c->state);
    c->state = NULL;
}

/* Replaces *slot by a detached contiguous copy of t that outlives the scope. */
static inline int dg_mixer_cache_put(dg_tensor **slot, dg_tensor *t) {
    dg_tensor *c = dg_clone(t);
    if (!c) return -1;
    dg_keep(c);
    if (*slot) dg_release(*slot);
    *slot = c;
    return 0;
}

typedef struct dg_mixer_opts {
    dg_delta_algorithm algorithm; /* chunked (default) or token by token */
    const char *backward;         /* backward variant by name, NULL: the op's default */
} dg_mixer_opts;

#endif
