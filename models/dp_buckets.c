/* The gradients' buckets of a data-parallel step (models/dp_buckets.h). */
#include "models/dp_buckets.h"

#include "core/internal.h"

#include <stdlib.h>
#include <string.h>

int dg_dp_buckets_init(dg_dp_buckets *b, int64_t n_params, const int64_t *numel, int64_t size, dg_dp_launch_fn launch,
                       void *ctx) {
    memset(b, 0, sizeof *b);
    if (n_params < 0 || size < 1 || !launch) {
        dg_error("data-parallel buckets: %lld parameters in buckets of %lld elements", (long long)n_params,
                 (long long)size);
        return -1;
    }
    size_t n = (size_t)(n_params ? n_params : 1);
    b->numel = malloc(n * sizeof *b->numel);
    b->placed = calloc(n, sizeof *b->placed);
    b->order = malloc(n * sizeof *b->order);
    b->segs = malloc(n * sizeof *b->segs);
    if (!b->numel || !b->placed || !b->order || !b->segs) {
        dg_dp_buckets_free(b);
        dg_error("data-parallel buckets: out of host memory");
        return -1;
    }
    for (int64_t i = 0; i < n_params; i++) b->numel[i] = numel[i];
    b->n_params = n_params;
    b->size = size;
    b->launch = launch;
    b->ctx = ctx;
    return 0;
}

void dg_dp_buckets_free(dg_dp_buckets *b) {
    free(b->numel);
    free(b->placed);
    free(b->order);
    free(b->segs);
    memset(b, 0, sizeof *b);
}

void dg_dp_buckets_begin(dg_dp_buckets *b) {
    memset(b->placed, 0, (size_t)(b->n_params ? b->n_params : 1) * sizeof *b->placed);
    b->n_placed = b->n_segs = b->fill = 0;
}

static int launch_open(dg_dp_buckets *b) {
    if (!b->fill) return 0;
    int rc = b->launch(b->ctx, b->segs, b->n_segs, b->fill);
    b->n_segs = b->fill = 0;
    return rc;
}

static const char *param_name(const char *const *names, int64_t i) { return names && names[i] ? names[i] : "unnamed"; }

int dg_dp_buckets_place(dg_dp_buckets *b, int64_t i, const char *const *names) {
    if (i < 0 || i >= b->n_params) {
        dg_error("data-parallel buckets: parameter %lld of %lld", (long long)i, (long long)b->n_params);
        return -1;
    }
    if (b->placed[i]) return 0;
    if (b->order_known && b->order[b->n_placed] != i) {
        int64_t want = b->order[b->n_placed];
        dg_error("data-parallel: the backward finished parameter %lld (%s) where the first step finished %lld (%s): "
                 "the gradients' buckets would no longer be the same on every rank, so the step stops here (a model "
                 "whose graph changes from step to step cannot train on several GPUs)",
                 (long long)i, param_name(names, i), (long long)want, param_name(names, want));
        return -1;
    }
    b->placed[i] = true;
    b->order[b->n_placed++] = i; /* rewrites the same value after the first step */
    for (int64_t done = 0; done < b->numel[i];) {
        int64_t left = b->numel[i] - done, room = b->size - b->fill, take = left < room ? left : room;
        b->segs[b->n_segs++] = (dg_dp_seg){.param = i, .grad_off = done, .off = b->fill, .n = take};
        b->fill += take;
        done += take;
        if (b->fill == b->size && launch_open(b)) return -1;
    }
    return 0;
}

int dg_dp_buckets_end(dg_dp_buckets *b, const char *const *names) {
    for (int64_t i = 0; i < b->n_params; i++)
        if (!b->placed[i] && dg_dp_buckets_place(b, i, names)) return -1;
    if (launch_open(b)) return -1;
    b->order_known = true;
    return 0;
}
