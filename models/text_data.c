/* Byte-level text dataset (split and sampling rules in text_data.h). */
#include "models/text_data.h"

#include "models/infra_common.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *split_name(dg_split s) { return s == DG_SPLIT_TRAIN ? "train" : "validation"; }

dg_text_data *dg_text_load(const char *path, double val_fraction) {
    if (!path || !*path) {
        dg_error("text_data: no file given");
        return NULL;
    }
    if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
        dg_error("text_data: validation fraction %g must be in [0, 1)", val_fraction);
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        dg_error("text_data: cannot open '%s': %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        dg_error("text_data: cannot stat '%s': %s", path, strerror(errno));
        fclose(f);
        return NULL;
    }
    if (S_ISDIR(st.st_mode)) {
        dg_error("text_data: '%s' is a directory, not a text file", path);
        fclose(f);
        return NULL;
    }
    /* read in blocks rather than trusting st_size, so pipes and growing files work too */
    size_t cap = S_ISREG(st.st_mode) && st.st_size > 0 ? (size_t)st.st_size + 1 : 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    while (buf) {
        if (n == cap) {
            uint8_t *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    if (!buf) {
        dg_error("text_data: out of memory reading '%s'", path);
        fclose(f);
        return NULL;
    }
    if (ferror(f)) {
        dg_error("text_data: error reading '%s': %s", path, strerror(errno));
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    if (n == 0) {
        dg_error("text_data: '%s' is empty", path);
        free(buf);
        return NULL;
    }
    dg_text_data *d = calloc(1, sizeof *d);
    if (!d || !(d->path = strdup(path))) {
        free(d);
        free(buf);
        dg_error("text_data: out of memory");
        return NULL;
    }
    d->bytes = buf;
    d->n_bytes = (int64_t)n;
    d->n_train = d->n_bytes - (int64_t)floor((double)d->n_bytes * val_fraction);
    return d;
}

void dg_text_free(dg_text_data *d) {
    if (!d) return;
    free(d->bytes);
    free(d->path);
    free(d);
}

const uint8_t *dg_text_split_bytes(const dg_text_data *d, dg_split split, int64_t *n) {
    if (split == DG_SPLIT_TRAIN) {
        *n = d->n_train;
        return d->bytes;
    }
    *n = d->n_bytes - d->n_train;
    return d->bytes + d->n_train;
}

static int check_window(const dg_text_data *d, dg_split split, int64_t B, int64_t T, int64_t n) {
    if (B < 1 || T < 1) {
        dg_error("text_data: batch %lld and context %lld must be >= 1", (long long)B, (long long)T);
        return -1;
    }
    if (n < T + 1) {
        dg_error("text_data: the %s split of '%s' has %lld bytes, fewer than a window of T+1 = %lld (use a larger "
                 "file, a shorter context%s)",
                 split_name(split), d->path, (long long)n, (long long)(T + 1),
                 split == DG_SPLIT_VAL ? " or a larger validation fraction" : "");
        return -1;
    }
    return 0;
}

int dg_text_sample(const dg_text_data *d, dg_split split, dg_rng *rng, int64_t B, int64_t T, int64_t *out) {
    int64_t n;
    const uint8_t *src = dg_text_split_bytes(d, split, &n);
    if (check_window(d, split, B, T, n)) return -1;
    uint64_t starts = (uint64_t)(n - T); /* valid starts 0 .. n-T-1 */
    for (int64_t b = 0; b < B; b++) {
        int64_t s = (int64_t)dgm_rng_below(rng, starts);
        for (int64_t t = 0; t <= T; t++) out[b * (T + 1) + t] = src[s + t];
    }
    return 0;
}

dg_tensor *dg_text_batch(const dg_text_data *d, dg_split split, dg_rng *rng, int64_t B, int64_t T) {
    int64_t n;
    dg_text_split_bytes(d, split, &n);
    if (check_window(d, split, B, T, n)) return NULL;
    dg_tensor *t = dg_empty(2, (int64_t[]){B, T + 1}, DG_I64);
    if (!t) return NULL;
    dg_text_sample(d, split, rng, B, T, dgm_data(t));
    return t;
}

int64_t dg_text_num_windows(const dg_text_data *d, dg_split split, int64_t T) {
    int64_t n;
    dg_text_split_bytes(d, split, &n);
    return T >= 1 && n > T ? (n - 1) / T : 0;
}

int64_t dg_text_windows(const dg_text_data *d, dg_split split, int64_t first, int64_t B, int64_t T, int64_t *out) {
    int64_t n;
    const uint8_t *src = dg_text_split_bytes(d, split, &n);
    if (check_window(d, split, B, T, n)) return -1;
    int64_t nw = dg_text_num_windows(d, split, T);
    if (first < 0 || first >= nw) {
        dg_error("text_data: window %lld is outside the %lld windows of the %s split", (long long)first, (long long)nw,
                 split_name(split));
        return -1;
    }
    if (B > nw - first) B = nw - first;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t <= T; t++) out[b * (T + 1) + t] = src[(first + b) * T + t];
    return B;
}
