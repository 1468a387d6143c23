/* Training settings: defaults, validation, JSON (models/train_config.h). */
#include "models/train_config.h"

#include "core/internal.h"
#include "models/json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

dg_train_config dg_train_default_config(void) {
    dg_train_config tc = {
        .task = DG_TASK_MQAR,
        .mqar = dg_mqar_default_config(),
        .eval_examples = 2000,
        .val_fraction = 0.1,
        .seq_len = 256,
        .eval_batches = 16,
        .steps = 1500,
        .batch = 64,
        .lr = 1e-3,
        .min_lr_ratio = 0.1,
        .warmup = 100,
        .weight_decay = 0.1,
        .beta1 = 0.9,
        .beta2 = 0.95,
        .adam_eps = 1e-8,
        .clip = 1.0,
        .seed = 1,
        .device = DG_CPU,
        .eval_every = 50,
        .save_every = 200,
        .log_every = 50,
        .target_acc = 0.99,
        .algorithm = DG_DELTA_CHUNKED,
        .chunk_size = 64,
        .threads = 0,
    };
    snprintf(tc.out_dir, sizeof tc.out_dir, "runs/mqar-gdn");
    return tc;
}

const char *dg_task_name(dg_task_kind k) { return k == DG_TASK_TEXT ? "text" : "mqar"; }

const char *dg_precision_name(dg_precision p) {
    return p == DG_PRECISION_BF16 ? "bf16" : p == DG_PRECISION_F32 ? "f32" : "auto";
}

dg_dtype dg_train_precision(const dg_train_config *tc) {
    if (tc->precision == DG_PRECISION_BF16) return DG_BF16;
    if (tc->precision == DG_PRECISION_F32) return DG_F32;
    return tc->device == DG_CUDA ? DG_BF16 : DG_F32;
}

int64_t dg_train_seq_len(const dg_train_config *tc) {
    return tc->task == DG_TASK_MQAR ? tc->mqar.seq_len : tc->seq_len;
}

int dg_train_config_validate(const dg_train_config *tc) {
#define NEED(cond, ...)                             \
    do {                                            \
        if (!(cond)) {                              \
            dg_error("train config: " __VA_ARGS__); \
            return -1;                              \
        }                                           \
    } while (0)
    NEED(tc->task == DG_TASK_MQAR || tc->task == DG_TASK_TEXT, "task %d is not mqar or text", (int)tc->task);
    if (tc->task == DG_TASK_MQAR) {
        if (dg_mqar_validate(&tc->mqar)) return -1;
        NEED(tc->eval_examples >= 1, "eval_examples %lld is not >= 1", (long long)tc->eval_examples);
    } else {
        NEED(tc->data[0], "task text needs a data file (--data FILE)");
        NEED(tc->val_fraction > 0 && tc->val_fraction < 1, "val_fraction %g is not in (0, 1)", tc->val_fraction);
        NEED(tc->seq_len >= 1, "seq_len %lld is not >= 1", (long long)tc->seq_len);
        NEED(tc->eval_batches >= 1, "eval_batches %lld is not >= 1", (long long)tc->eval_batches);
    }
    NEED(tc->steps >= 1, "steps %lld is not >= 1", (long long)tc->steps);
    NEED(tc->batch >= 1, "batch %lld is not >= 1", (long long)tc->batch);
    NEED(isfinite(tc->lr) && tc->lr > 0, "lr %g is not positive", tc->lr);
    NEED(tc->min_lr_ratio >= 0 && tc->min_lr_ratio <= 1, "min_lr_ratio %g is not in [0, 1]", tc->min_lr_ratio);
    NEED(tc->warmup >= 0, "warmup %lld is negative", (long long)tc->warmup);
    NEED(isfinite(tc->weight_decay) && tc->weight_decay >= 0, "weight_decay %g is negative", tc->weight_decay);
    NEED(tc->beta1 >= 0 && tc->beta1 < 1 && tc->beta2 >= 0 && tc->beta2 < 1, "betas (%g, %g) not in [0, 1)", tc->beta1,
         tc->beta2);
    NEED(tc->adam_eps > 0, "adam_eps %g is not positive", tc->adam_eps);
    NEED(isfinite(tc->clip) && tc->clip >= 0, "clip %g is negative (0 turns clipping off)", tc->clip);
    NEED(tc->eval_every >= 0 && tc->save_every >= 0 && tc->log_every >= 1,
         "eval_every %lld / save_every %lld must be >= 0 and log_every %lld >= 1", (long long)tc->eval_every,
         (long long)tc->save_every, (long long)tc->log_every);
    NEED(tc->target_acc >= 0 && tc->target_acc <= 1, "target_acc %g is not in [0, 1]", tc->target_acc);
    NEED(tc->out_dir[0], "the output directory is empty");
    NEED(tc->algorithm == DG_DELTA_CHUNKED || tc->algorithm == DG_DELTA_RECURRENT, "algorithm %d unknown",
         (int)tc->algorithm);
    NEED(tc->chunk_size == 16 || tc->chunk_size == 32 || tc->chunk_size == 64, "chunk_size %d is not 16, 32 or 64",
         tc->chunk_size);
    NEED(tc->threads >= 0 && tc->threads <= 1024, "threads %d is not in [0, 1024]", tc->threads);
#undef NEED
    return 0;
}

char *dg_train_config_to_json(const dg_train_config *tc) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
        dg_error("train config: out of memory");
        return NULL;
    }
    const dg_mqar_config *m = &tc->mqar;
    fprintf(f, "{\"task\": \"%s\", ", dg_task_name(tc->task));
    fprintf(f,
            "\"mqar_vocab_size\": %lld, \"mqar_seq_len\": %lld, \"mqar_num_kv_pairs\": %lld, "
            "\"mqar_num_queries\": %lld, \"mqar_power_a\": %.17g, \"mqar_random_filler\": %s, "
            "\"eval_examples\": %lld, ",
            (long long)m->vocab_size, (long long)m->seq_len, (long long)m->num_kv_pairs, (long long)m->num_queries,
            m->power_a, m->random_filler ? "true" : "false", (long long)tc->eval_examples);
    fprintf(f, "\"data\": ");
    if (dg_json_write_string(f, tc->data)) fprintf(f, "\"\"");
    fprintf(f, ", \"val_fraction\": %.17g, \"seq_len\": %lld, \"eval_batches\": %lld, ", tc->val_fraction,
            (long long)tc->seq_len, (long long)tc->eval_batches);
    fprintf(f, "\"steps\": %lld, \"batch\": %lld, \"lr\": %.17g, \"min_lr_ratio\": %.17g, \"warmup\": %lld, ",
            (long long)tc->steps, (long long)tc->batch, tc->lr, tc->min_lr_ratio, (long long)tc->warmup);
    fprintf(f, "\"weight_decay\": %.17g, \"beta1\": %.17g, \"beta2\": %.17g, \"adam_eps\": %.17g, \"clip\": %.17g, ",
            tc->weight_decay, tc->beta1, tc->beta2, tc->adam_eps, tc->clip);
    fprintf(f,
            "\"seed\": %llu, \"device\": \"%s\", \"eval_every\": %lld, \"save_every\": %lld, "
            "\"log_every\": %lld, \"target_acc\": %.17g, ",
            (unsigned long long)tc->seed, dg_device_name(tc->device), (long long)tc->eval_every,
            (long long)tc->save_every, (long long)tc->log_every, tc->target_acc);
    fprintf(f, "\"out_dir\": ");
    if (dg_json_write_string(f, tc->out_dir)) fprintf(f, "\"\"");
    fprintf(f, ", \"algorithm\": \"%s\", \"backward\": ", tc->algorithm == DG_DELTA_RECURRENT ? "recurrent" : "chunk");
    if (dg_json_write_string(f, tc->backward)) fprintf(f, "\"\"");
    fprintf(f, ", \"chunk_size\": %d, \"threads\": %d, \"precision\": \"%s\"}", tc->chunk_size, tc->threads,
            dg_precision_name(tc->precision));
    if (fclose(f) != 0) {
        free(buf);
        dg_error("train config: out of memory");
        return NULL;
    }
    return buf;
}

/* typed readers: 0 absent, 1 read, -1 wrong type (error set) */
static int rd_num(const dg_json *r, const char *k, double *out) {
    const dg_json *j = dg_json_get(r, k);
    if (!j) return 0;
    if (j->type != DG_JSON_NUMBER) {
        dg_error("train config: '%s' is not a number", k);
        return -1;
    }
    *out = j->number;
    return 1;
}
static int rd_int(const dg_json *r, const char *k, int64_t *out) {
    const dg_json *j = dg_json_get(r, k);
    if (!j) return 0;
    if (j->type != DG_JSON_NUMBER || !j->is_int) {
        dg_error("train config: '%s' is not an integer", k);
        return -1;
    }
    *out = j->integer;
    return 1;
}
static int rd_str(const dg_json *r, const char *k, char *out, size_t n) {
    const dg_json *j = dg_json_get(r, k);
    if (!j) return 0;
    if (j->type != DG_JSON_STRING || strlen(j->string) >= n) {
        dg_error("train config: '%s' is not a string (of under %zu bytes)", k, n);
        return -1;
    }
    snprintf(out, n, "%s", j->string);
    return 1;
}

int dg_train_config_from_json(const char *json, dg_train_config *tc) {
    char err[160];
    dg_json *r = dg_json_parse(json, strlen(json), err, sizeof err);
    if (!r) {
        dg_error("train config: not valid JSON (%s)", err);
        return -1;
    }
    dg_train_config c = *tc;
    int rc = -1;
    char s[64] = "";
    int64_t seed = (int64_t)c.seed, threads = c.threads, chunk = c.chunk_size;
    const dg_json *rf = dg_json_get(r, "mqar_random_filler");
    if (r->type != DG_JSON_OBJECT) {
        dg_error("train config: not a JSON object");
        goto out;
    }
    if (rd_str(r, "task", s, sizeof s) < 0) goto out;
    if (s[0]) {
        if (strcmp(s, "mqar") == 0) c.task = DG_TASK_MQAR;
        else if (strcmp(s, "text") == 0) c.task = DG_TASK_TEXT;
        else {
            dg_error("train config: task \"%s\" is not mqar or text", s);
            goto out;
        }
    }
    if (rd_int(r, "mqar_vocab_size", &c.mqar.vocab_size) < 0 || rd_int(r, "mqar_seq_len", &c.mqar.seq_len) < 0 ||
        rd_int(r, "mqar_num_kv_pairs", &c.mqar.num_kv_pairs) < 0 ||
        rd_int(r, "mqar_num_queries", &c.mqar.num_queries) < 0 || rd_num(r, "mqar_power_a", &c.mqar.power_a) < 0 ||
        rd_int(r, "eval_examples", &c.eval_examples) < 0 || rd_str(r, "data", c.data, sizeof c.data) < 0 ||
        rd_num(r, "val_fraction", &c.val_fraction) < 0 || rd_int(r, "seq_len", &c.seq_len) < 0 ||
        rd_int(r, "eval_batches", &c.eval_batches) < 0 || rd_int(r, "steps", &c.steps) < 0 ||
        rd_int(r, "batch", &c.batch) < 0 || rd_num(r, "lr", &c.lr) < 0 ||
        rd_num(r, "min_lr_ratio", &c.min_lr_ratio) < 0 || rd_int(r, "warmup", &c.warmup) < 0 ||
        rd_num(r, "weight_decay", &c.weight_decay) < 0 || rd_num(r, "beta1", &c.beta1) < 0 ||
        rd_num(r, "beta2", &c.beta2) < 0 || rd_num(r, "adam_eps", &c.adam_eps) < 0 || rd_num(r, "clip", &c.clip) < 0 ||
        rd_int(r, "seed", &seed) < 0 || rd_int(r, "eval_every", &c.eval_every) < 0 ||
        rd_int(r, "save_every", &c.save_every) < 0 || rd_int(r, "log_every", &c.log_every) < 0 ||
        rd_num(r, "target_acc", &c.target_acc) < 0 || rd_str(r, "out_dir", c.out_dir, sizeof c.out_dir) < 0 ||
        rd_str(r, "backward", c.backward, sizeof c.backward) < 0 || rd_int(r, "threads", &threads) < 0 ||
        rd_int(r, "chunk_size", &chunk) < 0)
        goto out;
    if (rf) {
        if (rf->type != DG_JSON_BOOL) {
            dg_error("train config: 'mqar_random_filler' is not true or false");
            goto out;
        }
        c.mqar.random_filler = rf->boolean;
    }
    s[0] = 0;
    if (rd_str(r, "device", s, sizeof s) < 0) goto out;
    if (s[0]) c.device = strcmp(s, "cuda") == 0 ? DG_CUDA : DG_CPU;
    /* a run written before the precision was recorded trained in f32: it resumes so */
    snprintf(s, sizeof s, "f32");
    if (rd_str(r, "precision", s, sizeof s) < 0) goto out;
    if (!strcmp(s, "bf16")) c.precision = DG_PRECISION_BF16;
    else if (!strcmp(s, "f32")) c.precision = DG_PRECISION_F32;
    else if (!strcmp(s, "auto")) c.precision = DG_PRECISION_AUTO;
    else {
        dg_error("train config: precision '%s' is not auto, f32 or bf16", s);
        goto out;
    }
    s[0] = 0;
    if (rd_str(r, "algorithm", s, sizeof s) < 0) goto out;
    if (s[0]) c.algorithm = strcmp(s, "recurrent") == 0 ? DG_DELTA_RECURRENT : DG_DELTA_CHUNKED;
    c.seed = (uint64_t)seed;
    c.threads = (int)threads;
    c.chunk_size = (int)chunk;
    *tc = c;
    rc = 0;
out:
    dg_json_free(r);
    return rc;
}
