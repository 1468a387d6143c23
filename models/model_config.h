/* The language model's configuration: FLA's GatedDeltaNetConfig / KDAConfig / DeltaNetConfig fields
 * that this runtime implements, their derived sizes, validation, and the JSON form (the
 * Hugging Face config.json that FLA's *ForCausalLM classes read; it also goes into the checkpoint's
 * safetensors metadata under "config").
 *
 * Sizes (FLA's layers):
 *   GDN, KDA:  head_k_dim = head_dim, head_v_dim = head_dim * expand_v,
 *              key_dim = num_heads * head_k_dim, value_dim = num_v_heads * head_v_dim
 *   DeltaNet:  the same with num_v_heads = num_heads (FLA spells it expand_k = key_dim / hidden_size,
 *              expand_v = value_dim / hidden_size; the JSON uses FLA's spelling)
 *   MLP:       intermediate_size, or (when 0) int(hidden_size * hidden_ratio * 2/3) rounded up to a
 *              multiple of 256 (FLA's GatedMLP) */
#ifndef DG_MODELS_MODEL_CONFIG_H
#define DG_MODELS_MODEL_CONFIG_H

#include "deltagrad.h"

typedef enum { DG_MIXER_GDN = 0, DG_MIXER_KDA = 1, DG_MIXER_DELTANET = 2 } dg_mixer_kind;

typedef struct dg_model_config {
    dg_mixer_kind mixer;
    int64_t vocab_size;
    int64_t hidden_size;
    int64_t num_hidden_layers;
    int64_t num_heads;
    int64_t head_dim;    /* head_k_dim */
    int64_t num_v_heads; /* 0: num_heads (GVA when larger; GDN and KDA only) */
    double expand_v;     /* head_v_dim = head_dim * expand_v */
    bool use_gate;       /* GDN, DeltaNet: output gate g_proj + gated RMSNorm (KDA always gates) */
    bool use_short_conv;
    int64_t conv_size;
    bool conv_bias;
    bool allow_neg_eigval; /* beta in (0, 2) */
    double norm_eps;
    double hidden_ratio; /* MLP size when intermediate_size is 0 */
    int64_t intermediate_size;
    bool tie_word_embeddings;
    double initializer_range;
} dg_model_config;

/* The default of `deltagrad train`: the small GatedDeltaNet that solves the default MQAR. */
dg_model_config dg_model_default_config(void);

const char *dg_mixer_name(dg_mixer_kind k);            /* "gdn", "kda", "deltanet" */
int dg_mixer_parse(const char *s, dg_mixer_kind *out); /* 0, or -1 (no error set) */

int64_t dg_model_num_v_heads(const dg_model_config *c);
int64_t dg_model_head_v_dim(const dg_model_config *c);
int64_t dg_model_key_dim(const dg_model_config *c);
int64_t dg_model_value_dim(const dg_model_config *c);
int64_t dg_model_intermediate_size(const dg_model_config *c);

/* 0, or -1 with dg_error("model config: num_v_heads 3 is not a multiple of num_heads 2"). */
int dg_model_config_validate(const dg_model_config *c);

/* The config as one line of JSON in FLA's / Hugging Face's spelling (model_type, architectures,
 * hidden_size, ...).  Returns a malloc'ed string (free it), or NULL with dg_error. */
char *dg_model_config_to_json(const dg_model_config *c);
/* Parses such JSON (unknown keys are ignored, missing ones take FLA's defaults for that model type).
 * 0, or -1 with dg_error naming the field. */
int dg_model_config_from_json(const char *json, dg_model_config *out);
/* Same fields, compared exactly; on a difference writes "hidden_size 64 vs 128" into why. */
bool dg_model_config_equal(const dg_model_config *a, const dg_model_config *b, char *why, size_t why_len);

#endif
