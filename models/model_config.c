/* Model configuration: defaults, derived sizes, validation, FLA-style JSON (models/model_config.h). */
#include "models/model_config.h"

#include "core/internal.h"
#include "models/json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

dg_model_config dg_model_default_config(void) {
    dg_model_config c = {
        .mixer = DG_MIXER_GDN,
        .vocab_size = 256,
        .hidden_size = 128,
        .num_hidden_layers = 2,
        .num_heads = 1,
        .head_dim = 128,
        .num_v_heads = 0,
        .expand_v = 1.0,
        .use_gate = true,
        .use_short_conv = true,
        .conv_size = 4,
        .conv_bias = false,
        .allow_neg_eigval = false,
        .norm_eps = 1e-6,
        .hidden_ratio = 4,
        .intermediate_size = 256,
        .tie_word_embeddings = false,
        .initializer_range = 0.02,
    };
    return c;
}

static const char *const mixer_names[] = {"gdn", "kda", "deltanet"};

const char *dg_mixer_name(dg_mixer_kind k) { return (unsigned)k < 3 ? mixer_names[k] : "?"; }

int dg_mixer_parse(const char *s, dg_mixer_kind *out) {
    for (int i = 0; i < 3; i++)
        if (strcmp(s, mixer_names[i]) == 0) {
            *out = (dg_mixer_kind)i;
            return 0;
        }
    if (strcmp(s, "gated_deltanet") == 0) *out = DG_MIXER_GDN;
    else if (strcmp(s, "delta_net") == 0) *out = DG_MIXER_DELTANET;
    else return -1;
    return 0;
}

int64_t dg_model_num_v_heads(const dg_model_config *c) {
    return (c->mixer == DG_MIXER_DELTANET || c->num_v_heads <= 0) ? c->num_heads : c->num_v_heads;
}
int64_t dg_model_head_v_dim(const dg_model_config *c) { return (int64_t)llround(c->head_dim * c->expand_v); }
int64_t dg_model_key_dim(const dg_model_config *c) { return c->num_heads * c->head_dim; }
int64_t dg_model_value_dim(const dg_model_config *c) { return dg_model_num_v_heads(c) * dg_model_head_v_dim(c); }

int64_t dg_model_intermediate_size(const dg_model_config *c) {
    if (c->intermediate_size > 0) return c->intermediate_size;
    double m = c->hidden_size * c->hidden_ratio * 2.0 / 3.0;
    /* a hidden_ratio whose width is no int64 (not finite, negative, huge): a size past every limit,
     * which dg_model_config_validate refuses, rather than an undefined conversion */
    if (!(m >= 0 && m < 0x1p40)) return INT64_MAX;
    int64_t w = (int64_t)m;
    return 256 * ((w + 255) / 256);
}

int dg_model_config_validate(const dg_model_config *c) {
#define NEED(cond, ...)                             \
    do {                                            \
        if (!(cond)) {                              \
            dg_error("model config: " __VA_ARGS__); \
            return -1;                              \
        }                                           \
    } while (0)
    NEED((unsigned)c->mixer < 3, "mixer %d is not gdn, kda or deltanet", (int)c->mixer);
    NEED(c->vocab_size >= 2 && c->vocab_size <= (1 << 24), "vocab_size %lld is not in [2, 2^24]",
         (long long)c->vocab_size);
    NEED(c->hidden_size >= 1 && c->hidden_size <= 65536, "hidden_size %lld is not in [1, 65536]",
         (long long)c->hidden_size);
    NEED(c->num_hidden_layers >= 1 && c->num_hidden_layers <= 1024, "num_hidden_layers %lld is not in [1, 1024]",
         (long long)c->num_hidden_layers);
    NEED(c->num_heads >= 1 && c->num_heads <= 4096, "num_heads %lld is not in [1, 4096]", (long long)c->num_heads);
    NEED(c->head_dim >= 1 && c->head_dim <= 4096, "head_dim %lld is not in [1, 4096]", (long long)c->head_dim);
    NEED(c->num_v_heads >= 0 && c->num_v_heads <= 4096, "num_v_heads %lld is not in [0, 4096]",
         (long long)c->num_v_heads);
    int64_t hv = dg_model_num_v_heads(c);
    NEED(hv % c->num_heads == 0, "num_v_heads %lld is not a multiple of num_heads %lld", (long long)hv,
         (long long)c->num_heads);
    NEED(c->mixer != DG_MIXER_DELTANET || c->num_v_heads <= 0 || c->num_v_heads == c->num_heads,
         "num_v_heads %lld: the deltanet mixer has no grouped value heads (use num_v_heads = num_heads)",
         (long long)c->num_v_heads);
    NEED(isfinite(c->expand_v) && c->expand_v > 0, "expand_v %g is not positive", c->expand_v);
    double vd = c->head_dim * c->expand_v;
    NEED(fabs(vd - llround(vd)) < 1e-6 * (1 + vd) && llround(vd) >= 1,
         "head_dim %lld * expand_v %g = %g is not a positive integer", (long long)c->head_dim, c->expand_v, vd);
    NEED(!c->use_short_conv || (c->conv_size >= 1 && c->conv_size <= 8), "conv_size %lld is not in [1, 8]",
         (long long)c->conv_size);
    NEED(isfinite(c->norm_eps) && c->norm_eps > 0 && c->norm_eps < 1, "norm_eps %g is not in (0, 1)", c->norm_eps);
    NEED(c->intermediate_size > 0 || (isfinite(c->hidden_ratio) && c->hidden_ratio > 0),
         "intermediate_size is 0 and hidden_ratio %g is not positive", c->hidden_ratio);
    NEED(c->intermediate_size >= 0 && dg_model_intermediate_size(c) <= (1 << 20),
         "intermediate_size %lld is not in [1, 2^20]", (long long)dg_model_intermediate_size(c));
    NEED(isfinite(c->initializer_range) && c->initializer_range >= 0, "initializer_range %g is not >= 0",
         c->initializer_range);
#undef NEED
    return 0;
}

/* ---- JSON ------------------------------------------------------------------------------------ */

static const char *model_type(dg_mixer_kind k) {
    return k == DG_MIXER_GDN ? "gated_deltanet" : k == DG_MIXER_KDA ? "kda" : "delta_net";
}
static const char *architecture(dg_mixer_kind k) {
    return k == DG_MIXER_GDN   ? "GatedDeltaNetForCausalLM"
           : k == DG_MIXER_KDA ? "KDAForCausalLM"
                               : "DeltaNetForCausalLM";
}

char *dg_model_config_to_json(const dg_model_config *c) {
    if (dg_model_config_validate(c)) return NULL;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
        dg_error("model config: out of memory");
        return NULL;
    }
    const char *tf[2] = {"false", "true"};
    fprintf(f, "{\"model_type\": \"%s\", \"architectures\": [\"%s\"], \"deltagrad_mixer\": \"%s\", ",
            model_type(c->mixer), architecture(c->mixer), dg_mixer_name(c->mixer));
    fprintf(f, "\"vocab_size\": %lld, \"hidden_size\": %lld, \"num_hidden_layers\": %lld, \"num_heads\": %lld, ",
            (long long)c->vocab_size, (long long)c->hidden_size, (long long)c->num_hidden_layers,
            (long long)c->num_heads);
    if (c->mixer == DG_MIXER_DELTANET) {
        /* FLA's DeltaNet sizes its heads from expand_k / expand_v relative to hidden_size */
        fprintf(f,
                "\"expand_k\": %.17g, \"expand_v\": %.17g, \"head_dim\": %lld, \"use_beta\": true, "
                "\"qk_activation\": \"silu\", \"qk_norm\": \"l2\", ",
                (double)dg_model_key_dim(c) / (double)c->hidden_size,
                (double)dg_model_value_dim(c) / (double)c->hidden_size, (long long)c->head_dim);
    } else {
        fprintf(f, "\"head_dim\": %lld, \"expand_v\": %.17g, ", (long long)c->head_dim, c->expand_v);
        if (c->num_v_heads > 0) fprintf(f, "\"num_v_heads\": %lld, ", (long long)c->num_v_heads);
        else fprintf(f, "\"num_v_heads\": null, ");
    }
    if (c->mixer != DG_MIXER_KDA) fprintf(f, "\"use_gate\": %s, ", tf[c->use_gate]);
    fprintf(f, "\"use_short_conv\": %s, \"conv_size\": %lld, \"conv_bias\": %s, \"allow_neg_eigval\": %s, ",
            tf[c->use_short_conv], (long long)c->conv_size, tf[c->conv_bias], tf[c->allow_neg_eigval]);
    fprintf(f, "\"norm_eps\": %.17g, \"hidden_ratio\": %.17g, \"intermediate_size\": %lld, \"hidden_act\": \"swish\", ",
            c->norm_eps, c->hidden_ratio, (long long)dg_model_intermediate_size(c));
    fprintf(f,
            "\"tie_word_embeddings\": %s, \"initializer_range\": %.17g, \"attn_mode\": \"chunk\", "
            "\"attn\": null, \"fuse_norm\": false, \"fuse_swiglu\": false, \"fuse_cross_entropy\": false, "
            "\"torch_dtype\": \"float32\"}",
            tf[c->tie_word_embeddings], c->initializer_range);
    if (fclose(f) != 0) {
        free(buf);
        dg_error("model config: out of memory");
        return NULL;
    }
    return buf;
}

/* Reads an optional member: 0 (absent or null: *out unchanged), 1 (read), -1 (wrong type). */
static int get_num(const dg_json *root, const char *key, double *out) {
    const dg_json *j = dg_json_get(root, key);
    if (!j || j->type == DG_JSON_NULL) return 0;
    if (j->type != DG_JSON_NUMBER) {
        dg_error("model config: '%s' is a %s, not a number", key, dg_json_type_name(j->type));
        return -1;
    }
    *out = j->number;
    return 1;
}
static int get_int(const dg_json *root, const char *key, int64_t *out) {
    const dg_json *j = dg_json_get(root, key);
    if (!j || j->type == DG_JSON_NULL) return 0;
    if (j->type != DG_JSON_NUMBER || !j->is_int) {
        dg_error("model config: '%s' is not an integer", key);
        return -1;
    }
    *out = j->integer;
    return 1;
}
static int get_bool(const dg_json *root, const char *key, bool *out) {
    const dg_json *j = dg_json_get(root, key);
    if (!j || j->type == DG_JSON_NULL) return 0;
    if (j->type != DG_JSON_BOOL) {
        dg_error("model config: '%s' is not true or false", key);
        return -1;
    }
    *out = j->boolean;
    return 1;
}

int dg_model_config_from_json(const char *json, dg_model_config *out) {
    char err[160];
    dg_json *root = dg_json_parse(json, strlen(json), err, sizeof err);
    if (!root) {
        dg_error("model config: not valid JSON (%s)", err);
        return -1;
    }
    int rc = -1;
    if (root->type != DG_JSON_OBJECT) {
        dg_error("model config: the JSON is a %s, not an object", dg_json_type_name(root->type));
        goto done;
    }
    dg_model_config c = dg_model_default_config();
    const dg_json *mt = dg_json_get(root, "deltagrad_mixer");
    if (!mt) mt = dg_json_get(root, "model_type");
    if (!mt || mt->type != DG_JSON_STRING || dg_mixer_parse(mt->string, &c.mixer)) {
        dg_error("model config: 'model_type' is missing or not one of gated_deltanet, kda, delta_net");
        goto done;
    }
    /* FLA's defaults for what a config.json may leave out */
    c.num_v_heads = 0;
    c.use_gate = c.mixer != DG_MIXER_DELTANET;
    c.expand_v = c.mixer == DG_MIXER_GDN ? 2.0 : 1.0;
    c.conv_size = 4;
    c.use_short_conv = true;
    c.conv_bias = c.allow_neg_eigval = c.tie_word_embeddings = false;
    c.norm_eps = 1e-6;
    c.hidden_ratio = 4;
    c.intermediate_size = 0;
    c.initializer_range = 0.02;
    const char *required[] = {"vocab_size", "hidden_size", "num_hidden_layers", "num_heads"};
    int64_t *req_out[] = {&c.vocab_size, &c.hidden_size, &c.num_hidden_layers, &c.num_heads};
    for (int i = 0; i < 4; i++) {
        int r = get_int(root, required[i], req_out[i]);
        if (r < 0) goto done;
        if (r == 0) {
            dg_error("model config: '%s' is missing", required[i]);
            goto done;
        }
    }
    if (get_int(root, "num_v_heads", &c.num_v_heads) < 0 || get_int(root, "conv_size", &c.conv_size) < 0 ||
        get_int(root, "intermediate_size", &c.intermediate_size) < 0 || get_num(root, "norm_eps", &c.norm_eps) < 0 ||
        get_num(root, "hidden_ratio", &c.hidden_ratio) < 0 ||
        get_num(root, "initializer_range", &c.initializer_range) < 0 || get_bool(root, "use_gate", &c.use_gate) < 0 ||
        get_bool(root, "use_short_conv", &c.use_short_conv) < 0 || get_bool(root, "conv_bias", &c.conv_bias) < 0 ||
        get_bool(root, "allow_neg_eigval", &c.allow_neg_eigval) < 0 ||
        get_bool(root, "tie_word_embeddings", &c.tie_word_embeddings) < 0)
        goto done;
    if (c.mixer == DG_MIXER_DELTANET) {
        /* head sizes from expand_k / expand_v (FLA's DeltaNet) */
        double ek = 1.0, ev = 1.0;
        if (get_num(root, "expand_k", &ek) < 0 || get_num(root, "expand_v", &ev) < 0) goto done;
        double kd = c.hidden_size * ek, vd = c.hidden_size * ev;
        if (kd < 1 || fmod(kd, (double)c.num_heads) != 0 || vd < 1 || fmod(vd, (double)c.num_heads) != 0) {
            dg_error("model config: delta_net key dim %g / value dim %g not divisible by num_heads %lld", kd, vd,
                     (long long)c.num_heads);
            goto done;
        }
        c.head_dim = (int64_t)kd / c.num_heads;
        c.expand_v = vd / kd;
        c.num_v_heads = 0;
    } else {
        c.head_dim = c.mixer == DG_MIXER_GDN ? 256 : 128;
        if (get_int(root, "head_dim", &c.head_dim) < 0 || get_num(root, "expand_v", &c.expand_v) < 0) goto done;
        if (c.num_v_heads == c.num_heads) c.num_v_heads = 0;
        if (c.mixer == DG_MIXER_KDA) c.use_gate = true; /* KDA always gates its output */
    }
    if (dg_model_config_validate(&c)) goto done;
    *out = c;
    rc = 0;
done:
    dg_json_free(root);
    return rc;
}

bool dg_model_config_equal(const dg_model_config *a, const dg_model_config *b, char *why, size_t n) {
#define CMP_I(f)                                                                    \
    if ((int64_t)(a->f) != (int64_t)(b->f)) {                                       \
        snprintf(why, n, #f " %lld vs %lld", (long long)(a->f), (long long)(b->f)); \
        return false;                                                               \
    }
#define CMP_D(f)                                      \
    if (a->f != b->f) {                               \
        snprintf(why, n, #f " %g vs %g", a->f, b->f); \
        return false;                                 \
    }
    if (a->mixer != b->mixer) {
        snprintf(why, n, "mixer %s vs %s", dg_mixer_name(a->mixer), dg_mixer_name(b->mixer));
        return false;
    }
    CMP_I(vocab_size)
    CMP_I(hidden_size)
    CMP_I(num_hidden_layers)
    CMP_I(num_heads)
    CMP_I(head_dim)
    if (dg_model_num_v_heads(a) != dg_model_num_v_heads(b)) {
        snprintf(why, n, "num_v_heads %lld vs %lld", (long long)dg_model_num_v_heads(a),
                 (long long)dg_model_num_v_heads(b));
        return false;
    }
    if (dg_model_head_v_dim(a) != dg_model_head_v_dim(b)) {
        snprintf(why, n, "head_v_dim %lld vs %lld (expand_v %g vs %g)", (long long)dg_model_head_v_dim(a),
                 (long long)dg_model_head_v_dim(b), a->expand_v, b->expand_v);
        return false;
    }
    if (a->mixer != DG_MIXER_KDA) CMP_I(use_gate)
    CMP_I(use_short_conv)
    CMP_I(conv_size)
    CMP_I(conv_bias)
    CMP_I(allow_neg_eigval)
    CMP_D(norm_eps)
    if (dg_model_intermediate_size(a) != dg_model_intermediate_size(b)) {
        snprintf(why, n, "intermediate_size %lld vs %lld", (long long)dg_model_intermediate_size(a),
                 (long long)dg_model_intermediate_size(b));
        return false;
    }
    CMP_I(tie_word_embeddings)
#undef CMP_I
#undef CMP_D
    if (n) why[0] = 0;
    return true;
}
