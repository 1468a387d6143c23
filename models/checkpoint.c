/* Checkpoint directories: model.safetensors + config.json + optimizer-STEP.safetensors
 * (models/checkpoint.h). */
#include "models/checkpoint.h"

#include "core/internal.h"
#include "models/atomic_file.h"
#include "models/open_regular.h"
#include "models/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

char *dg_ckpt_optimizer_path(const char *dir, int64_t step, char *buf, size_t n) {
    snprintf(buf, n, "%s/optimizer-%08lld.safetensors", dir, (long long)step);
    return buf;
}

int dg_ckpt_save_model(const char *dir, const dg_lm *lm, int64_t step, const char *train_json) {
    char *cfg = dg_model_config_to_json(&lm->cfg);
    char *mpath = join(dir, DG_CKPT_MODEL_FILE), *cpath = join(dir, "config.json");
    int rc = -1;
    if (!cfg || !mpath || !cpath) {
        if (cfg) dg_error("checkpoint: out of memory");
        goto out;
    }
    char step_s[32];
    snprintf(step_s, sizeof step_s, "%lld", (long long)step);
    const char *keys[4] = {"format", "config", "deltagrad.step", "deltagrad.train_config"};
    const char *vals[4] = {"pt", cfg, step_s, train_json};
    /* tied weights: Hugging Face saves the embedding only (lm_head.weight is not a separate tensor).
     * A model on the device is written from host copies (the same file as from the host). */
    bool on_host = dg_lm_device(lm) == DG_CPU;
    dg_tensor **ts = on_host ? lm->params.t : calloc((size_t)lm->params.n + 1, sizeof *ts);
    if (!ts) {
        dg_error("checkpoint: out of memory");
        goto out;
    }
    dg_scope_begin();
    int w = 0;
    for (int i = 0; i < lm->params.n && !on_host && w == 0; i++) {
        if (!(ts[i] = dg_to_device(lm->params.t[i], DG_CPU))) w = -1;
        else dg_set_name(ts[i], lm->params.t[i]->name);
    }
    if (w == 0) w = dg_st_write(mpath, lm->params.n, NULL, ts, train_json ? 4 : 3, keys, vals);
    dg_scope_end();
    if (!on_host) free(ts);
    if (w) goto out;
    dg_atomic_file af;
    if (dg_atomic_open(&af, cpath, "checkpoint")) goto out;
    fprintf(af.f, "%s\n", cfg);
    if (dg_atomic_commit(&af, "checkpoint")) goto out;
    rc = 0;
out:
    free(cfg);
    free(mpath);
    free(cpath);
    return rc;
}

/* Removes DIR/optimizer-*.safetensors other than keep_step's (best effort). */
static void remove_old_optimizer_files(const char *dir, int64_t keep_step) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long s;
        char tail[32];
        if (sscanf(e->d_name, "optimizer-%lld.%31s", &s, tail) == 2 && strcmp(tail, "safetensors") == 0 &&
            s != keep_step) {
            char *p = join(dir, e->d_name);
            if (p) unlink(p);
            free(p);
        }
    }
    closedir(d);
}

int dg_ckpt_save(const char *dir, const dg_lm *lm, const dg_adamw *opt, int64_t step, const char *train_json,
                 int n_meta, const char *const *keys, const char *const *values) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        dg_error("checkpoint: cannot create directory '%s': %s", dir, strerror(errno));
        return -1;
    }
    if (opt) {
        char path[4096];
        dg_ckpt_optimizer_path(dir, step, path, sizeof path);
        if (dg_adamw_save(opt, path, n_meta, keys, values)) return -1;
    }
    if (dg_ckpt_save_model(dir, lm, step, train_json)) return -1;
    if (opt) remove_old_optimizer_files(dir, step);
    return 0;
}

/* ---- loading --------------------------------------------------------------------------------- */

/* NaN and infinite elements of a parameter just loaded (host, contiguous, f32 or f64). */
static int64_t count_nonfinite(const dg_tensor *p) {
    int64_t n = dg_numel(p), bad = 0;
    if (p->device != DG_CPU || !dg_is_contiguous(p)) return 0;
    const char *base = (const char *)p->storage->data + (size_t)p->offset * dg_dtype_size(p->dtype);
    if (p->dtype == DG_F32)
        for (int64_t i = 0; i < n; i++) bad += !isfinite(((const float *)base)[i]);
    else if (p->dtype == DG_F64)
        for (int64_t i = 0; i < n; i++) bad += !isfinite(((const double *)base)[i]);
    return bad;
}

/* Removes the files of a run from DIR: the checkpoint (model.safetensors, config.json, every
 * optimizer-*.safetensors) and the metrics (metrics.csv, metrics.svg); nothing else. */
int dg_ckpt_remove_run(const char *dir) {
    static const char *const names[] = {DG_CKPT_MODEL_FILE, "config.json", "metrics.csv", "metrics.svg"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char *p = join(dir, names[i]);
        if (!p) {
            dg_error("checkpoint: out of memory");
            return -1;
        }
        int r = unlink(p);
        if (r != 0 && errno != ENOENT) {
            dg_error("checkpoint: cannot remove '%s': %s", p, strerror(errno));
            free(p);
            return -1;
        }
        free(p);
    }
    remove_old_optimizer_files(dir, -1);
    return 0;
}

int dg_ckpt_load_params(const char *path, dg_lm *lm) {
    dg_st_file *f = dg_st_read(path);
    if (!f) return -1;
    int rc = -1;
    /* every tensor of the file is a parameter (or the tied head), every parameter is in the file */
    for (int i = 0; i < f->n; i++) {
        dg_tensor *p = dg_param_find(&lm->params, f->names[i]);
        if (!p && lm->cfg.tie_word_embeddings && strcmp(f->names[i], "lm_head.weight") == 0) continue;
        if (!p) {
            dg_error("checkpoint: '%s' has a tensor \"%s\" that the %s model (%lld layers) does not have", path,
                     f->names[i], dg_mixer_name(lm->cfg.mixer), (long long)lm->cfg.num_hidden_layers);
            goto out;
        }
        const dg_tensor *t = f->tensors[i];
        if (!dg_same_shape(t, p) || !dg_dtype_is_float(t->dtype)) {
            dg_error("checkpoint: '%s': \"%s\" is %s %s but the model's parameter is %s", path, f->names[i],
                     dg_dtype_name(t->dtype), dg_shp(t), dg_shp(p));
            goto out;
        }
    }
    for (int i = 0; i < lm->params.n; i++)
        if (!dg_st_get(f, lm->params.t[i]->name)) {
            dg_error("checkpoint: '%s' has no tensor \"%s\" %s", path, lm->params.t[i]->name, dg_shp(lm->params.t[i]));
            goto out;
        }
    for (int i = 0; i < lm->params.n; i++) {
        dg_tensor *p = lm->params.t[i];
        dg_tensor *t = dg_st_get(f, p->name);
        dg_scope_begin();
        int r = dg_copy_(p, t->dtype == p->dtype ? t : dg_to_dtype(t, p->dtype));
        dg_scope_end();
        if (r) goto out;
        int64_t bad = count_nonfinite(p);
        if (bad) { /* a well-formed file of a diverged run: every loss computed from it would be NaN */
            dg_error("checkpoint: '%s': parameter \"%s\" holds %lld NaN or infinite values (the run that wrote it "
                     "diverged); use an earlier checkpoint",
                     path, p->name, (long long)bad);
            goto out;
        }
    }
    rc = 0;
out:
    dg_st_free(f);
    return rc;
}

static char *read_text_file(const char *path) {
    FILE *fp = dg_fopen_regular(path, "checkpoint");
    if (!fp) return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (cap - n < 4096) {
            char *b = realloc(buf, cap = cap * 2 + 8192);
            if (!b || cap > (64u << 20)) {
                free(b ? b : buf);
                fclose(fp);
                return NULL;
            }
            buf = b;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, fp);
        n += r;
        if (r == 0) break;
    }
    fclose(fp);
    buf[n] = 0;
    return buf;
}

int dg_ckpt_read_meta(const char *src, dg_model_config *mc, char **train_json, int64_t *step, char **path_out) {
    if (train_json) *train_json = NULL;
    if (path_out) *path_out = NULL;
    struct stat st;
    if (stat(src, &st) != 0) {
        dg_error("checkpoint: '%s': %s", src, strerror(errno));
        return -1;
    }
    char *path = S_ISDIR(st.st_mode) ? join(src, DG_CKPT_MODEL_FILE) : strdup(src);
    if (!path) {
        dg_error("checkpoint: out of memory");
        return -1;
    }
    if (S_ISDIR(st.st_mode) && access(path, F_OK) != 0) {
        dg_error("checkpoint: '%s' has no %s (not a checkpoint directory)", src, DG_CKPT_MODEL_FILE);
        free(path);
        return -1;
    }
    /* the reader validates the whole file (format, offsets, data CRC) before anything is trusted */
    dg_st_file *f = dg_st_read(path);
    if (!f) {
        free(path);
        return -1;
    }
    int rc = -1;
    char *cfg_json = NULL;
    const char *meta_cfg = dg_st_meta(f, "config");
    if (meta_cfg) {
        cfg_json = strdup(meta_cfg);
    } else { /* a file written elsewhere: config.json beside it */
        char *dir = strdup(path), *slash = dir ? strrchr(dir, '/') : NULL;
        if (slash) *slash = 0;
        char *cj = dir ? join(slash ? dir : ".", "config.json") : NULL;
        cfg_json = cj ? read_text_file(cj) : NULL;
        free(cj);
        free(dir);
        if (!cfg_json) {
            char why[512];
            snprintf(why, sizeof why, "%s", dg_last_error());
            dg_error_force("checkpoint: '%s' has no \"config\" metadata and no readable config.json beside it (%s)",
                           path, why[0] ? why : "out of memory");
            goto out;
        }
    }
    if (!cfg_json || dg_model_config_from_json(cfg_json, mc)) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", dg_last_error());
        dg_error_force("checkpoint: '%s': %s", path, msg[0] ? msg : "out of memory");
        goto out;
    }
    const char *step_s = dg_st_meta(f, "deltagrad.step");
    if (step) *step = -1;
    if (step_s) {
        char *end;
        long long s = strtoll(step_s, &end, 10);
        if (!*step_s || *end || s < 0) {
            dg_error("checkpoint: '%s': metadata deltagrad.step \"%s\" is not a step number", path, step_s);
            goto out;
        }
        if (step) *step = s;
    }
    const char *tj = dg_st_meta(f, "deltagrad.train_config");
    if (tj && train_json && !(*train_json = strdup(tj))) goto out;
    if (path_out) {
        *path_out = path;
        path = NULL;
    }
    rc = 0;
out:
    if (rc && train_json) {
        free(*train_json);
        *train_json = NULL;
    }
    dg_st_free(f);
    free(cfg_json);
    free(path);
    return rc;
}

int dg_ckpt_load_model(const char *src, dg_ckpt_model *out) {
    memset(out, 0, sizeof *out);
    dg_model_config mc;
    if (dg_ckpt_read_meta(src, &mc, &out->train_json, &out->step, &out->path)) return -1;
    if (!(out->lm = dg_lm_new(&mc, 0, DG_F32)) || dg_ckpt_load_params(out->path, out->lm)) {
        dg_ckpt_model_free(out);
        return -1;
    }
    return 0;
}

void dg_ckpt_model_free(dg_ckpt_model *m) {
    dg_lm_free(m->lm);
    free(m->train_json);
    free(m->path);
    memset(m, 0, sizeof *m);
}
