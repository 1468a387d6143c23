/* Option table of `deltagrad train` (tools/train_flags.h). */
#include "tools/train_flags.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef enum { T_I64, T_F64, T_BOOL, T_U64, T_INT, T_STR, T_SPECIAL } ftype;

typedef struct {
    const char *name;
    ftype type;
    size_t off;  /* into dg_train_opts */
    size_t size; /* T_STR: buffer size */
    const char *group;
    const char *help;
    bool model; /* a model option */
} flag;

#define MC(f) offsetof(dg_train_opts, mc.f)
#define TC(f) offsetof(dg_train_opts, tc.f)
#define OP(f) offsetof(dg_train_opts, f)

static const flag flags[] = {
    {"mixer", T_SPECIAL, 0, 0, "model", "token mixer: gdn (Gated DeltaNet), kda (Kimi Delta Attention), deltanet",
     true},
    {"hidden-size", T_I64, MC(hidden_size), 0, "model", "model width d_model", true},
    {"layers", T_I64, MC(num_hidden_layers), 0, "model", "number of blocks", true},
    {"heads", T_I64, MC(num_heads), 0, "model", "query/key heads", true},
    {"head-dim", T_I64, MC(head_dim), 0, "model", "key dimension per head", true},
    {"v-heads", T_I64, MC(num_v_heads), 0, "model", "value heads (0: = heads; more: grouped value heads)", true},
    {"expand-v", T_F64, MC(expand_v), 0, "model", "value head dim = head-dim * expand-v", true},
    {"use-gate", T_BOOL, MC(use_gate), 0, "model", "output gate (g_proj + gated RMSNorm)", true},
    {"short-conv", T_BOOL, MC(use_short_conv), 0, "model", "short causal convolutions on q, k, v", true},
    {"conv-size", T_I64, MC(conv_size), 0, "model", "short convolution width", true},
    {"conv-bias", T_BOOL, MC(conv_bias), 0, "model", "bias in the short convolutions", true},
    {"neg-eigval", T_BOOL, MC(allow_neg_eigval), 0, "model", "beta in (0, 2) (negative eigenvalues)", true},
    {"norm-eps", T_F64, MC(norm_eps), 0, "model", "RMSNorm epsilon", true},
    {"intermediate-size", T_I64, MC(intermediate_size), 0, "model",
     "MLP width (0: hidden-ratio * hidden-size * 2/3 rounded up to 256)", true},
    {"hidden-ratio", T_F64, MC(hidden_ratio), 0, "model", "MLP ratio when intermediate-size is 0", true},
    {"tie-embeddings", T_BOOL, MC(tie_word_embeddings), 0, "model", "LM head shares the embedding", true},
    {"init-range", T_F64, MC(initializer_range), 0, "model", "std of the normal initialisation", true},
    {"vocab-size", T_SPECIAL, 0, 0, "model", "vocabulary (model and MQAR; text needs 256)", true},

    {"task", T_SPECIAL, 0, 0, "task", "mqar (associative recall) or text (byte-level LM on --data)", false},
    {"data", T_STR, TC(data), sizeof(((dg_train_config *)0)->data), "task", "text file for --task text", false},
    {"val-fraction", T_F64, TC(val_fraction), 0, "task", "text: last fraction of the file for validation", false},
    {"seq-len", T_SPECIAL, 0, 0, "task", "tokens per sequence (mqar: >= 2 * (kv-pairs + queries))", false},
    {"kv-pairs", T_I64, TC(mqar.num_kv_pairs), 0, "task", "mqar: key-value pairs per sequence", false},
    {"queries", T_I64, TC(mqar.num_queries), 0, "task", "mqar: queries per sequence (0: = kv-pairs)", false},
    {"power-a", T_F64, TC(mqar.power_a), 0, "task", "mqar: query position law (s+1)^(a-1)", false},
    {"random-filler", T_BOOL, TC(mqar.random_filler), 0, "task", "mqar: random filler tokens instead of 0", false},
    {"eval-examples", T_I64, TC(eval_examples), 0, "task", "mqar: size of the fixed held-out set", false},
    {"eval-batches", T_I64, TC(eval_batches), 0, "task", "text: validation batches per evaluation", false},

    {"steps", T_I64, TC(steps), 0, "training", "training steps (the schedule's length)", false},
    {"batch", T_I64, TC(batch), 0, "training", "sequences per step", false},
    {"lr", T_F64, TC(lr), 0, "training", "peak learning rate", false},
    {"min-lr-ratio", T_F64, TC(min_lr_ratio), 0, "training", "final lr / peak lr of the cosine decay", false},
    {"warmup", T_I64, TC(warmup), 0, "training", "linear warmup steps", false},
    {"weight-decay", T_F64, TC(weight_decay), 0, "training",
     "AdamW decoupled weight decay (none on A_log, dt_bias, norms, biases)", false},
    {"beta1", T_F64, TC(beta1), 0, "training", "AdamW beta1", false},
    {"beta2", T_F64, TC(beta2), 0, "training", "AdamW beta2", false},
    {"adam-eps", T_F64, TC(adam_eps), 0, "training", "AdamW epsilon", false},
    {"clip", T_F64, TC(clip), 0, "training", "global gradient-norm clipping (0: off)", false},
    {"seed", T_U64, TC(seed), 0, "training", "seed of the initialisation and the data stream", false},
    {"target-acc", T_F64, TC(target_acc), 0, "training", "mqar: stop once the held-out accuracy reaches it (0: never)",
     false},
    {"algorithm", T_SPECIAL, 0, 0, "training", "delta-rule algorithm: chunk or recurrent", false},
    {"chunk-size", T_INT, TC(chunk_size), 0, "training", "chunk length of the chunked algorithm: 16, 32 or 64", false},
    {"backward", T_STR, TC(backward), sizeof(((dg_train_config *)0)->backward), "training",
     "delta-rule backward variant (deltagrad ops lists them; empty: default)", false},

    {"device", T_SPECIAL, 0, 0, "run",
     "cpu, cuda or auto (cuda when this build has the CUDA backend and a GPU is present)", false},
    {"precision", T_SPECIAL, 0, 0, "run",
     "bf16 (mixed precision: f32 master weights, bf16 step; cuda only), f32, or auto (bf16 on cuda, f32 on cpu)",
     false},
    {"gpus", T_INT, OP(gpus), 0, "run",
     "data-parallel training on N GPUs, one process each, the global --batch split evenly (0: every visible GPU)",
     false},
    {"bf16-all-reduce", T_BOOL, OP(bf16_all_reduce), 0, "run",
     "several GPUs: the gradients travel and are averaged in bf16 (half the bytes, each mean rounded to bf16) instead "
     "of f32",
     false},
    {"threads", T_INT, TC(threads), 0, "run", "CPU threads (0: all cores)", false},
    {"keep-delta-work", T_BOOL, OP(keep_delta_work), 0, "run",
     "the delta-rule forward keeps its working set for the backward: a faster backward for about 8 times v's bytes "
     "a layer (off: recomputed, as FLA does; the results are the same bits)",
     false},
    {"graph", T_BOOL, OP(graph), 0, "run",
     "cuda, one GPU: capture the training step in a CUDA graph once and replay it (--no-graph: every step launched "
     "kernel by kernel)",
     false},
    {"eval-every", T_I64, TC(eval_every), 0, "run", "evaluate every N steps (0: only at the end)", false},
    {"save-every", T_I64, TC(save_every), 0, "run", "checkpoint every N steps (and at the end)", false},
    {"log-every", T_I64, TC(log_every), 0, "run",
     "plain log line every N steps off a terminal; on one GPU also the losses read back (or each second)", false},
    {"out", T_SPECIAL, 0, 0, "run", "output directory (default runs/TASK-MIXER)", false},
    {"resume", T_STR, OP(resume), sizeof(((dg_train_opts *)0)->resume), "run",
     "continue the run checkpointed in DIR (its settings; options given here override them)", false},
    {"stop-at", T_I64, OP(stop_at), 0, "run", "checkpoint and stop after this step (0: no)", false},
    {"overwrite", T_BOOL, OP(overwrite), 0, "run",
     "start over in --out when it already holds a run (its checkpoints and metrics are removed)", false},
    {"quiet", T_BOOL, OP(quiet), 0, "run", "no progress display (the result line is still printed)", false},
};
#define NFLAGS ((int)(sizeof flags / sizeof flags[0]))

static const flag *find(const char *name, size_t len) {
    for (int i = 0; i < NFLAGS; i++)
        if (strlen(flags[i].name) == len && strncmp(flags[i].name, name, len) == 0) return &flags[i];
    if (len == 7 && strncmp(name, "d-model", 7) == 0) return find("hidden-size", 11);
    return NULL;
}

const char *dg_train_flags_find_resume(int argc, char **argv, bool *help) {
    const char *r = NULL;
    *help = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) *help = true;
        if (strcmp(argv[i], "--resume") == 0 && i + 1 < argc) r = argv[++i];
        else if (strncmp(argv[i], "--resume=", 9) == 0) r = argv[i] + 9;
    }
    return r;
}

static int bad(const char *name, const char *val, const char *what) {
    fprintf(stderr, "train: --%s %s: %s (deltagrad train --help lists the options)\n", name, val, what);
    return -1;
}

static int parse_i64(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno) return -1;
    *out = v;
    return 0;
}

static int parse_bool(const char *s, bool *out) {
    if (!strcmp(s, "1") || !strcmp(s, "true") || !strcmp(s, "yes") || !strcmp(s, "on")) *out = true;
    else if (!strcmp(s, "0") || !strcmp(s, "false") || !strcmp(s, "no") || !strcmp(s, "off")) *out = false;
    else return -1;
    return 0;
}

static int apply_special(const flag *f, const char *val, dg_train_opts *o) {
    int64_t v;
    if (!strcmp(f->name, "mixer")) {
        if (dg_mixer_parse(val, &o->mc.mixer)) return bad(f->name, val, "not gdn, kda or deltanet");
        if (o->mc.mixer == DG_MIXER_KDA) o->mc.use_gate = true;
    } else if (!strcmp(f->name, "task")) {
        if (!strcmp(val, "mqar")) o->tc.task = DG_TASK_MQAR;
        else if (!strcmp(val, "text")) o->tc.task = DG_TASK_TEXT;
        else return bad(f->name, val, "not mqar or text");
    } else if (!strcmp(f->name, "device")) {
        if (!strcmp(val, "cpu")) o->tc.device = DG_CPU;
        else if (!strcmp(val, "cuda")) o->tc.device = DG_CUDA;
        else if (!strcmp(val, "auto")) o->tc.device = dg_cuda_available() ? DG_CUDA : DG_CPU;
        else return bad(f->name, val, "not cpu, cuda or auto");
        o->device_given = true;
    } else if (!strcmp(f->name, "precision")) {
        if (!strcmp(val, "bf16")) o->tc.precision = DG_PRECISION_BF16;
        else if (!strcmp(val, "f32")) o->tc.precision = DG_PRECISION_F32;
        else if (!strcmp(val, "auto")) o->tc.precision = DG_PRECISION_AUTO;
        else return bad(f->name, val, "not bf16, f32 or auto");
    } else if (!strcmp(f->name, "algorithm")) {
        if (!strcmp(val, "chunk") || !strcmp(val, "chunked")) o->tc.algorithm = DG_DELTA_CHUNKED;
        else if (!strcmp(val, "recurrent")) o->tc.algorithm = DG_DELTA_RECURRENT;
        else return bad(f->name, val, "not chunk or recurrent");
    } else if (!strcmp(f->name, "vocab-size")) {
        if (parse_i64(val, &v) || v < 1) return bad(f->name, val, "not a positive integer");
        o->mc.vocab_size = o->tc.mqar.vocab_size = v;
    } else if (!strcmp(f->name, "seq-len")) {
        if (parse_i64(val, &v) || v < 1) return bad(f->name, val, "not a positive integer");
        o->tc.mqar.seq_len = o->tc.seq_len = v;
    } else if (!strcmp(f->name, "out")) {
        if (strlen(val) >= sizeof o->tc.out_dir || !*val) return bad(f->name, val, "empty or too long");
        snprintf(o->tc.out_dir, sizeof o->tc.out_dir, "%s", val);
        o->out_given = true;
    }
    return 0;
}

int dg_train_flags_parse(int argc, char **argv, dg_train_opts *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) continue;
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "train: unexpected argument '%s' (options start with --; see --help)\n", a);
            return -1;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const flag *f = find(name, len);
        bool negated = false;
        if (!f && len > 3 && !strncmp(name, "no-", 3)) {
            f = find(name + 3, len - 3);
            negated = f && f->type == T_BOOL;
            if (!negated) f = NULL;
        }
        if (!f) {
            fprintf(stderr, "train: unknown option '--%.*s' (see deltagrad train --help)\n", (int)len, name);
            return -1;
        }
        const char *val = eq ? eq + 1 : NULL;
        if (f->type == T_BOOL && !val) val = negated ? "false" : "true";
        else if (negated) return bad(f->name, "", "--no- takes no value");
        if (!val) {
            if (i + 1 >= argc) return bad(f->name, "", "needs a value");
            val = argv[++i];
        }
        if (f->model) o->model_given = true;
        void *p = (char *)o + f->off;
        int64_t v;
        switch (f->type) {
        case T_I64:
            if (parse_i64(val, &v)) return bad(f->name, val, "not an integer");
            *(int64_t *)p = v;
            break;
        case T_INT:
            if (parse_i64(val, &v) || v < 0 || v > 1 << 20) return bad(f->name, val, "not a small integer");
            *(int *)p = (int)v;
            break;
        case T_U64:
            if (parse_i64(val, &v) || v < 0) return bad(f->name, val, "not an integer in [0, 2^63)");
            *(uint64_t *)p = (uint64_t)v;
            break;
        case T_F64: {
            char *end;
            double d = strtod(val, &end);
            if (!*val || *end || !isfinite(d)) return bad(f->name, val, "not a number");
            *(double *)p = d;
            break;
        }
        case T_BOOL:
            if (parse_bool(val, (bool *)p)) return bad(f->name, val, "not true/false/1/0");
            break;
        case T_STR:
            if (strlen(val) >= f->size) return bad(f->name, val, "too long");
            snprintf((char *)p, f->size, "%s", val);
            break;
        case T_SPECIAL:
            if (apply_special(f, val, o)) return -1;
            break;
        }
    }
    return 0;
}

static void default_text(const flag *f, const dg_train_opts *d, char *buf, size_t n) {
    const void *p = (const char *)d + f->off;
    switch (f->type) {
    case T_I64: snprintf(buf, n, "%lld", (long long)*(const int64_t *)p); break;
    case T_INT: snprintf(buf, n, "%d", *(const int *)p); break;
    case T_U64: snprintf(buf, n, "%llu", (unsigned long long)*(const uint64_t *)p); break;
    case T_F64: snprintf(buf, n, "%g", *(const double *)p); break;
    case T_BOOL: snprintf(buf, n, "%s", *(const bool *)p ? "true" : "false"); break;
    case T_STR: snprintf(buf, n, "%s", *(const char *)p ? (const char *)p : "none"); break;
    case T_SPECIAL:
        if (!strcmp(f->name, "mixer")) snprintf(buf, n, "%s", dg_mixer_name(d->mc.mixer));
        else if (!strcmp(f->name, "task")) snprintf(buf, n, "%s", dg_task_name(d->tc.task));
        else if (!strcmp(f->name, "device")) snprintf(buf, n, "auto (a resumed run: its own)");
        else if (!strcmp(f->name, "algorithm")) snprintf(buf, n, "chunk");
        else if (!strcmp(f->name, "precision")) snprintf(buf, n, "auto (a resumed run: its own)");
        else if (!strcmp(f->name, "vocab-size")) snprintf(buf, n, "%lld", (long long)d->mc.vocab_size);
        else if (!strcmp(f->name, "seq-len"))
            snprintf(buf, n, "%lld (text: %lld)", (long long)d->tc.mqar.seq_len, (long long)d->tc.seq_len);
        else if (!strcmp(f->name, "out"))
            snprintf(buf, n, "runs/%s-%s", dg_task_name(d->tc.task), dg_mixer_name(d->mc.mixer));
        break;
    }
}

dg_train_opts dg_train_opts_default(void) {
    return (dg_train_opts){.mc = dg_model_default_config(), .tc = dg_train_default_config(), .gpus = 1, .graph = true};
}

void dg_train_flags_help(FILE *out) {
    dg_train_opts d = dg_train_opts_default();
    fprintf(out,
            "usage: deltagrad train [OPTIONS]\n\n"
            "Trains a language model with a delta-rule mixer.  With no options: the default Gated DeltaNet on\n"
            "MQAR (sequence length %lld, %lld key-value pairs, vocabulary %lld), stopping once the held-out\n"
            "query accuracy reaches %.0f%%.  Writes OUT/metrics.csv, OUT/metrics.svg and checkpoints\n"
            "(OUT/model.safetensors with FLA's parameter names, config.json, optimizer-STEP.safetensors).\n"
            "Options take a value (--lr 1e-3 or --lr=1e-3); switches take none (--tie-embeddings, --no-use-gate).\n",
            (long long)d.tc.mqar.seq_len, (long long)d.tc.mqar.num_kv_pairs, (long long)d.tc.mqar.vocab_size,
            100 * d.tc.target_acc);
    const char *group = "";
    for (int i = 0; i < NFLAGS; i++) {
        const flag *f = &flags[i];
        if (strcmp(group, f->group)) {
            group = f->group;
            fprintf(out, "\n%s:\n", group);
        }
        char def[96], left[64];
        default_text(f, &d, def, sizeof def);
        snprintf(left, sizeof left, "--%s%s", f->name, f->type == T_BOOL ? "" : " X");
        fprintf(out, "  %-22s %s [%s]\n", left, f->help, def);
    }
    fprintf(out, "\nEnvironment: DG_PROFILE=1 prints where each step's time goes (data, forward, backward, "
                 "optimiser);\nDG_PROFILE=ops prints it by op (each op's forward, backward and gradient "
                 "accumulation; device time\nfrom CUDA events on a GPU), from the third step on.\n");
}
