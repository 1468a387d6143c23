/* The causal language model around a delta-rule mixer, as FLA's GatedDeltaNetForCausalLM (and its
 * KDA / DeltaNet siblings):
 *
 *   h = E[ids]                                              [B,T,D]
 *   per block:  h = h + mixer(RMSNorm(h) * attn_norm)
 *               h = h + down(silu(gate(x)) * up(x)),  x = RMSNorm(h) * mlp_norm
 *   h = RMSNorm(h) * norm;  logits = h lm_head^T            [B,T,vocab]   (lm_head = E when tied)
 *
 * Parameter names and shapes are FLA's state_dict: "model.embeddings.weight" [vocab,D],
 * "model.layers.L.attn_norm.weight" [D], "model.layers.L.attn.*" (the mixer's: models/gdn_layer.h, kda_layer.h, deltanet_layer.h),
 * "model.layers.L.mlp_norm.weight" [D], "model.layers.L.mlp.{gate,up}_proj.weight" [I,D],
 * "model.layers.L.mlp.down_proj.weight" [D,I], "model.norm.weight" [D], "lm_head.weight"
 * [vocab,D] (absent when tied, as Hugging Face saves tied weights). */
#ifndef DG_MODELS_LM_H
#define DG_MODELS_LM_H

#include "models/deltanet_layer.h"
#include "models/gdn_layer.h"
#include "models/kda_layer.h"
#include "models/mixer.h"
#include "models/model_config.h"
#include "models/params.h"

typedef struct dg_lm_block {
    dg_tensor *attn_norm, *mlp_norm, *gate_proj, *up_proj, *down_proj;
    union {
        dg_gdn_layer gdn;
        dg_kda_layer kda;
        dg_deltanet_layer deltanet;
    } attn;
} dg_lm_block;

typedef struct dg_lm {
    dg_model_config cfg;
    dg_param_list params; /* every parameter, FLA's state_dict order */
    dg_tensor *embeddings, *norm, *lm_head;
    dg_lm_block *blocks;
    dg_mixer_opts mixer_opts; /* delta-rule algorithm and backward variant of every layer */
} dg_lm;

/* A model with FLA's initialisation drawn from seed; dtype DG_F32 (training) or DG_F64 (gradient
 * checks).  NULL with dg_error on a bad config. */
dg_lm *dg_lm_new(const dg_model_config *cfg, uint64_t seed, dg_dtype dtype);
void dg_lm_free(dg_lm *lm);
/* The device of the model's parameters, and moving them all there (dg_param_list_to_device: the
 * layers keep their pointers).  A model is created on the host (the initialisers draw there, so a
 * seed gives the same parameters on every device) and then moved.  The forward functions below
 * take ids and targets on any device: what the model needs is copied to its device (the ids each
 * call; scored positions are found on the host). */
dg_device dg_lm_device(const dg_lm *lm);
int dg_lm_to_device(dg_lm *lm, dg_device dev);

/* The precision of the forward and backward (PyTorch's autocast, made explicit):
 *   DG_F32 (or the parameters' own dtype): everything in the parameters' dtype;
 *   DG_BF16, mixed precision, CUDA only: the parameters (the master weights), their gradients and
 *     the optimiser's moments stay f32; each step uses bf16 copies of the weights (a differentiable
 *     cast, so the weight gradients come back into the f32 .grad), activations are bf16, every GEMM
 *     accumulates in f32 (cuBLAS f32 compute), every norm statistic, reduction and the loss in f32
 *     (the kernels compute in f32 and round once); the delta rule's gates, A_log, dt_bias and
 *     states stay f32, as FLA keeps them.
 * Set after dg_lm_to_device; 0, or -1 with dg_error (bf16 on the CPU, f64 parameters). */
int dg_lm_set_precision(dg_lm *lm, dg_dtype precision);
dg_dtype dg_lm_precision(const dg_lm *lm);

/* Per-layer decoding state (models/mixer.h) and the number of tokens consumed. */
typedef struct dg_lm_cache {
    int n_layers;
    dg_mixer_cache *layers;
    int64_t pos;
} dg_lm_cache;
dg_lm_cache *dg_lm_cache_new(const dg_lm *lm);
void dg_lm_cache_free(dg_lm_cache *c);

/* The final normalised hidden states [B,T,D] of ids (i64 [B,T]).  cache NULL: the sequences from
 * the start; otherwise they continue those of the cache (which is updated). */
dg_tensor *dg_lm_hidden(const dg_lm *lm, dg_tensor *ids, dg_lm_cache *cache);
/* logits [B,T,vocab] */
dg_tensor *dg_lm_forward(const dg_lm *lm, dg_tensor *ids, dg_lm_cache *cache);
/* Logits only at the positions whose target is not ignore_index: [n, vocab] rows in row-major
 * (b, t) order, and those targets as i64 [n] in *targets_out (the LM head and the loss are then
 * paid for scored positions only: MQAR scores 16 of 128).  Host targets that are all ignore_index
 * are an error (nothing to score).  Targets on the device are not read back: the logits
 * are then every position's [B*T, vocab] and *targets_out all the targets, the ignored ones left
 * for the cross-entropy to skip. */
dg_tensor *dg_lm_scored_logits(const dg_lm *lm, dg_tensor *ids, dg_tensor *targets, int64_t ignore_index,
                               dg_tensor **targets_out);
/* Mean cross-entropy over the positions whose target is not ignore_index (a one-element tensor).
 * If logits_out is not NULL it receives the scored logits (the head, then cross_entropy); without
 * it the head and the loss are one op, linear_cross_entropy, which never stores the logits whole.
 * targets_out (may be NULL) receives the scored positions' targets. */
dg_tensor *dg_lm_loss(const dg_lm *lm, dg_tensor *ids, dg_tensor *targets, int64_t ignore_index, dg_tensor **logits_out,
                      dg_tensor **targets_out);

#endif
