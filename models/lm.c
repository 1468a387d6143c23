/* The causal LM: embedding, blocks of [RMSNorm, mixer, residual, RMSNorm, SwiGLU MLP, residual],
 * final RMSNorm, LM head (models/lm.h). */
#include "models/lm.h"

#include "core/internal.h"

#include <stdlib.h>
#include <string.h>

static int block_init(dg_lm *lm, int L, dg_rng *rng) {
    const dg_model_config *c = &lm->cfg;
    dg_param_list *pl = &lm->params;
    dg_lm_block *b = &lm->blocks[L];
    int64_t D = c->hidden_size, I = dg_model_intermediate_size(c);
    char pre[64];
    snprintf(pre, sizeof pre, "model.layers.%d.attn.", L);
    /* FLA's block creates attn_norm, attn, mlp_norm, mlp in this order */
    if (!(b->attn_norm = dg_param_addf(pl, DG_SHAPE(D), "model.layers.%d.attn_norm.weight", L))) return -1;
    int rc = c->mixer == DG_MIXER_GDN   ? dg_gdn_layer_init(&b->attn.gdn, c, pre, pl, rng)
             : c->mixer == DG_MIXER_KDA ? dg_kda_layer_init(&b->attn.kda, c, pre, pl, rng)
                                        : dg_deltanet_layer_init(&b->attn.deltanet, c, pre, pl, rng);
    if (rc) return -1;
    b->mlp_norm = dg_param_addf(pl, DG_SHAPE(D), "model.layers.%d.mlp_norm.weight", L);
    b->gate_proj = dg_param_addf(pl, DG_SHAPE(I, D), "model.layers.%d.mlp.gate_proj.weight", L);
    b->up_proj = dg_param_addf(pl, DG_SHAPE(I, D), "model.layers.%d.mlp.up_proj.weight", L);
    b->down_proj = dg_param_addf(pl, DG_SHAPE(D, I), "model.layers.%d.mlp.down_proj.weight", L);
    if (!b->mlp_norm || !b->gate_proj || !b->up_proj || !b->down_proj) return -1;
    if (dg_init_ones(b->attn_norm) || dg_init_ones(b->mlp_norm) ||
        dg_init_normal(b->gate_proj, c->initializer_range, rng) ||
        dg_init_normal(b->up_proj, c->initializer_range, rng) ||
        dg_init_normal(b->down_proj, c->initializer_range, rng))
        return -1;
    return 0;
}

dg_lm *dg_lm_new(const dg_model_config *cfg, uint64_t seed, dg_dtype dtype) {
    if (dg_model_config_validate(cfg)) return NULL;
    if (dtype != DG_F32 && dtype != DG_F64) {
        dg_error("lm: dtype %s is not f32 or f64", dg_dtype_name(dtype));
        return NULL;
    }
    dg_lm *lm = calloc(1, sizeof *lm);
    if (!lm || !(lm->blocks = calloc((size_t)cfg->num_hidden_layers, sizeof *lm->blocks))) {
        free(lm);
        dg_error("lm: out of memory");
        return NULL;
    }
    lm->cfg = *cfg;
    lm->params.dtype = dtype;
    dg_rng rng = dg_rng_new(seed);
    int64_t D = cfg->hidden_size, Vocab = cfg->vocab_size;
    dg_param_list *pl = &lm->params;
    if (!(lm->embeddings = dg_param_add(pl, "model.embeddings.weight", DG_SHAPE(Vocab, D)))) goto fail;
    if (dg_init_normal(lm->embeddings, cfg->initializer_range, &rng)) goto fail;
    for (int L = 0; L < cfg->num_hidden_layers; L++)
        if (block_init(lm, L, &rng)) goto fail;
    if (!(lm->norm = dg_param_add(pl, "model.norm.weight", DG_SHAPE(D))) || dg_init_ones(lm->norm)) goto fail;
    if (cfg->tie_word_embeddings) {
        lm->lm_head = lm->embeddings;
    } else {
        if (!(lm->lm_head = dg_param_add(pl, "lm_head.weight", DG_SHAPE(Vocab, D)))) goto fail;
        if (dg_init_normal(lm->lm_head, cfg->initializer_range, &rng)) goto fail;
    }
    return lm;
fail:
    dg_lm_free(lm);
    return NULL;
}

void dg_lm_free(dg_lm *lm) {
    if (!lm) return;
    dg_param_list_free(&lm->params);
    free(lm->blocks);
    free(lm);
}

dg_device dg_lm_device(const dg_lm *lm) { return lm->embeddings->device; }

int dg_lm_set_precision(dg_lm *lm, dg_dtype precision) {
    if (precision == lm->params.dtype) {
        lm->mixer_opts.bf16 = false;
        return 0;
    }
    if (precision != DG_BF16) {
        dg_error("lm: precision %s is not supported for %s parameters (%s or bf16 mixed precision)",
                 dg_dtype_name(precision), dg_dtype_name(lm->params.dtype), dg_dtype_name(lm->params.dtype));
        return -1;
    }
    if (lm->params.dtype != DG_F32 || dg_lm_device(lm) != DG_CUDA) {
        dg_error("lm: bf16 mixed precision needs f32 parameters on cuda (the model has %s parameters on %s); "
                 "use --precision f32 here",
                 dg_dtype_name(lm->params.dtype), dg_device_name(dg_lm_device(lm)));
        return -1;
    }
    lm->mixer_opts.bf16 = true;
    return 0;
}

dg_dtype dg_lm_precision(const dg_lm *lm) { return lm->mixer_opts.bf16 ? DG_BF16 : lm->params.dtype; }

int dg_lm_to_device(dg_lm *lm, dg_device dev) { return dg_param_list_to_device(&lm->params, dev); }

/* t on the model's device (t itself when it is there already) */
static dg_tensor *on_model_device(const dg_lm *lm, dg_tensor *t) {
    return t && t->device != dg_lm_device(lm) ? dg_to_device(t, dg_lm_device(lm)) : t;
}

dg_lm_cache *dg_lm_cache_new(const dg_lm *lm) {
    dg_lm_cache *c = calloc(1, sizeof *c);
    if (c) c->layers = calloc((size_t)lm->cfg.num_hidden_layers, sizeof *c->layers);
    if (!c || !c->layers) {
        free(c);
        dg_error("lm: out of memory for the decoding cache");
        return NULL;
    }
    c->n_layers = (int)lm->cfg.num_hidden_layers;
    return c;
}

void dg_lm_cache_free(dg_lm_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n_layers; i++) dg_mixer_cache_clear(&c->layers[i]);
    free(c->layers);
    free(c);
}

static dg_tensor *mixer_forward(const dg_lm *lm, int L, dg_tensor *x, dg_mixer_cache *mc, dg_tensor *rows) {
    const dg_lm_block *b = &lm->blocks[L];
    switch (lm->cfg.mixer) {
    case DG_MIXER_GDN: return dg_gdn_layer_forward(&b->attn.gdn, x, &lm->mixer_opts, mc, rows);
    case DG_MIXER_KDA: return dg_kda_layer_forward(&b->attn.kda, x, &lm->mixer_opts, mc, rows);
    default: return dg_deltanet_layer_forward(&b->attn.deltanet, x, &lm->mixer_opts, mc, rows);
    }
}

/* The final hidden states; with rows (flat positions), only at those: the last block's mixer runs
 * its recurrence over every position but its output gate and projection, the residual, the MLP and
 * the final norm only at the rows ([n,D]). */
static dg_tensor *hidden(const dg_lm *lm, dg_tensor *ids, dg_lm_cache *cache, dg_tensor *rows) {
    if (!ids) return NULL;
    if (ids->ndim != 2 || ids->dtype != DG_I64) {
        dg_error("lm: ids has shape %s and dtype %s but i64 [B,T] is required", dg_shp(ids), dg_dtype_name(ids->dtype));
        return NULL;
    }
    if (cache && cache->n_layers != lm->cfg.num_hidden_layers) {
        dg_error("lm: the cache has %d layers but the model %lld", cache->n_layers,
                 (long long)lm->cfg.num_hidden_layers);
        return NULL;
    }
    const dg_model_config *c = &lm->cfg;
    const dg_mixer_opts *mo = &lm->mixer_opts;
    ids = on_model_device(lm, ids); /* a host batch is copied to the device here */
    rows = on_model_device(lm, rows);
    /* h is the residual stream; each residual add is fused with the norm that reads its result:
     * (h, x) = (h + y, rms_norm(h + y) w) */
    dg_tensor *h = dg_embedding(dg_mixer_weight(mo, lm->embeddings), ids);
    dg_tensor *x = dg_rms_norm(h, dg_mixer_weight(mo, lm->blocks[0].attn_norm), c->norm_eps);
    /* each block in a scope of its own, from which only (x, h) go on: what the tape does not hold
     * (the terms of a residual sum, temporaries) is freed as the forward goes, not at the step's end */
    for (int L = 0; L < c->num_hidden_layers && x; L++) {
        const dg_lm_block *b = &lm->blocks[L];
        const bool last = L == c->num_hidden_layers - 1;
        dg_tensor *r = last ? rows : NULL;
        dg_scope_begin();
        dg_tensor *m = mixer_forward(lm, L, x, cache ? &cache->layers[L] : NULL, r);
        x = dg_add_rms_norm(dg_mixer_rows(h, r), m, dg_mixer_weight(mo, b->mlp_norm), c->norm_eps, &h);
        dg_tensor *y = dg_linear(dg_swiglu(dg_linear(x, dg_mixer_weight(mo, b->gate_proj), NULL),
                                           dg_linear(x, dg_mixer_weight(mo, b->up_proj), NULL)),
                                 dg_mixer_weight(mo, b->down_proj), NULL);
        dg_tensor *next_norm = last ? lm->norm : lm->blocks[L + 1].attn_norm;
        x = dg_keep(dg_add_rms_norm(h, y, dg_mixer_weight(mo, next_norm), c->norm_eps, &h));
        h = x ? dg_keep(h) : NULL;
        dg_scope_end();
        dg_autorelease(x);
        dg_autorelease(h);
    }
    if (x && cache) cache->pos += ids->shape[1];
    return x;
}

dg_tensor *dg_lm_hidden(const dg_lm *lm, dg_tensor *ids, dg_lm_cache *cache) { return hidden(lm, ids, cache, NULL); }

/* the LM head's weight in the step's precision (the bf16 cast of the master under mixed precision) */
static dg_tensor *head_weight(const dg_lm *lm) { return dg_mixer_weight(&lm->mixer_opts, lm->lm_head); }

/* the LM head: logits in the step's precision (bf16 under mixed precision; the cross-entropy
 * reads them in f32 and returns an f32 loss) */
static dg_tensor *head(const dg_lm *lm, dg_tensor *h) { return dg_linear(h, head_weight(lm), NULL); }

dg_tensor *dg_lm_forward(const dg_lm *lm, dg_tensor *ids, dg_lm_cache *cache) {
    return head(lm, dg_lm_hidden(lm, ids, cache));
}

/* the final hidden states [n, hidden] of the positions dg_lm_scored_logits gives logits for, and
 * their targets */
static dg_tensor *scored_hidden(const dg_lm *lm, dg_tensor *ids, dg_tensor *targets, int64_t ignore,
                                dg_tensor **targets_out) {
    if (!ids || !targets) return NULL;
    if (targets->dtype != DG_I64 || !dg_same_shape(ids, targets)) {
        dg_error("lm: targets has shape %s (%s) but i64 like ids %s is required", dg_shp(targets),
                 dg_dtype_name(targets->dtype), dg_shp(ids));
        return NULL;
    }
    if (ids->ndim != 2) return dg_lm_hidden(lm, ids, NULL); /* reports the shape error */
    int64_t B = ids->shape[0], T = ids->shape[1], N = B * T;
    if (targets->device != DG_CPU) {
        /* targets on the device (the buffers of a captured step, models/train_graph.h): every
         * position through the head, the ignored ones skipped by the cross-entropy there; nothing
         * is read back */
        *targets_out = on_model_device(lm, dg_reshape(targets, DG_SHAPE(N)));
        return dg_reshape(dg_lm_hidden(lm, ids, NULL), DG_SHAPE(N, lm->cfg.hidden_size));
    }
    /* host targets: the scored positions are found on the host */
    dg_tensor *tc = dg_contiguous(targets);
    if (!tc) return NULL;
    const int64_t *tg = dg_data_ptr(tc);
    int64_t n = 0;
    for (int64_t i = 0; i < N; i++) n += tg[i] != ignore;
    if (n == 0) {
        dg_error("lm: every target of %s is ignore_index %lld: nothing to score", dg_shp(targets), (long long)ignore);
        return NULL;
    }
    if (n == N) { /* every position scored (language modelling) */
        *targets_out = on_model_device(lm, dg_reshape(tc, DG_SHAPE(N)));
        return dg_reshape(dg_lm_hidden(lm, ids, NULL), DG_SHAPE(N, lm->cfg.hidden_size));
    }
    dg_tensor *pos = dg_empty(DG_SHAPE(n), DG_I64), *tsel = dg_empty(DG_SHAPE(n), DG_I64);
    if (!pos || !tsel) return NULL;
    int64_t *pp = dg_data_ptr(pos), *tp = dg_data_ptr(tsel);
    for (int64_t i = 0, j = 0; i < N; i++)
        if (tg[i] != ignore) {
            pp[j] = i;
            tp[j++] = tg[i];
        }
    *targets_out = on_model_device(lm, tsel);
    /* the last block's output and the final norm (then the head) only at the scored positions */
    return hidden(lm, ids, NULL, pos);
}

dg_tensor *dg_lm_scored_logits(const dg_lm *lm, dg_tensor *ids, dg_tensor *targets, int64_t ignore,
                               dg_tensor **targets_out) {
    return head(lm, scored_hidden(lm, ids, targets, ignore, targets_out));
}

/* Without logits_out the head and the cross-entropy are one op (linear_cross_entropy): the
 * [n, vocab] logits are made a chunk of rows at a time and never stored whole, nor their gradient. */
dg_tensor *dg_lm_loss(const dg_lm *lm, dg_tensor *ids, dg_tensor *targets, int64_t ignore, dg_tensor **logits_out,
                      dg_tensor **targets_out) {
    dg_tensor *t = NULL;
    dg_tensor *h = scored_hidden(lm, ids, targets, ignore, &t);
    if (!h) return NULL;
    if (targets_out) *targets_out = t;
    if (!logits_out) return dg_linear_cross_entropy(h, head_weight(lm), t, ignore, 0);
    dg_tensor *logits = head(lm, h);
    if (!logits) return NULL;
    *logits_out = logits;
    return dg_cross_entropy(logits, t, ignore);
}
