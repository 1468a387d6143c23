/* What the three token mixers (GatedDeltaNet, KDA, DeltaNet layers) share: the decoding cache
 * carried between calls and the run-time choice of the delta-rule algorithm. */
#ifndef DG_MODELS_MIXER_H
#define DG_MODELS_MIXER_H

#include "deltagrad.h"
#include "deltagrad_delta.h"

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

/* The rows of t [B,T,...] at the flat positions rows (i64 [n], b*T + t), as [n,...]; t itself when
 * rows is NULL.  A gather (an embedding lookup into t) whose backward scatters into t's gradient:
 * the layers use it to compute their output only where the model's output is read (the last
 * block of an MQAR model: the 16 query positions of 128). */
static inline dg_tensor *dg_mixer_rows(dg_tensor *t, dg_tensor *rows) {
    if (!rows || !t) return t;
    int64_t N = t->shape[0] * t->shape[1], C = dg_numel(t) / (N ? N : 1);
    dg_tensor *g = dg_embedding(dg_reshape(t, 2, (int64_t[]){N, C}), rows);
    if (!g || t->ndim == 2) return g;
    int64_t shape[DG_MAX_DIMS];
    shape[0] = rows->shape[0];
    for (int d = 2; d < t->ndim; d++) shape[d - 1] = t->shape[d];
    return dg_reshape(g, t->ndim - 1, shape);
}

typedef struct dg_mixer_opts {
    dg_delta_algorithm algorithm; /* chunked (default) or token by token */
    int chunk_size;               /* chunked: 16, 32 or 64 (0: the op's default, 64) */
    const char *backward;         /* backward variant by name, NULL: the op's default */
    bool bf16;                    /* mixed precision (models/lm.h): bf16 weights and activations */
    /* the delta op keeps its forward's working set for the backward (faster backward, about 8
     * times v's bytes a layer more memory: dg_delta_opts.recompute_in_backward); off, FLA's way */
    bool keep_delta_work;
} dg_mixer_opts;

/* The delta op's options that follow from the mixer options and the decoding cache: the algorithm,
 * the backward, the chunk, what the backward recomputes, the state carried in and out; the L2 norm
 * of q, k in the kernel.  A layer adds its gate. */
static inline dg_delta_opts dg_mixer_delta_opts(const dg_mixer_opts *mo, const dg_mixer_cache *cache) {
    return (dg_delta_opts){
        .algorithm = mo ? mo->algorithm : DG_DELTA_CHUNKED,
        .backward = mo ? mo->backward : NULL,
        .chunk_size = mo ? mo->chunk_size : 0,
        .recompute_in_backward = !(mo && mo->keep_delta_work),
        .use_qk_l2norm_in_kernel = true,
        .initial_state = cache ? cache->state : NULL,
        .output_final_state = cache != NULL,
    };
}

/* The weight w as the step uses it: under mixed precision a bf16 copy of the f32 parameter, made by
 * the differentiable cast (its gradient comes back through the cast into the f32 parameter's
 * .grad), else w itself.  NULL stays NULL. */
static inline dg_tensor *dg_mixer_weight(const dg_mixer_opts *mo, dg_tensor *w) {
    return mo && mo->bf16 && w && w->dtype != DG_BF16 ? dg_to_dtype(w, DG_BF16) : w;
}

/* t in f32 when it is a bf16 activation (the raw gate input a: the gates and the states of the delta
 * rule stay f32, as FLA keeps them), else t itself. */
static inline dg_tensor *dg_mixer_f32(dg_tensor *t) { return t && t->dtype == DG_BF16 ? dg_to_dtype(t, DG_F32) : t; }

#endif
