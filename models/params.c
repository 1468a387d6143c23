/* Named parameter lists and FLA's initialisers (models/params.h). */
#include "models/params.h"

#include "core/internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

dg_tensor *dg_param_find(const dg_param_list *pl, const char *name) {
    for (int i = 0; i < pl->n; i++)
        if (pl->t[i]->name && strcmp(pl->t[i]->name, name) == 0) return pl->t[i];
    return NULL;
}

dg_tensor *dg_param_add(dg_param_list *pl, const char *name, int ndim, const int64_t *shape) {
    if (dg_param_find(pl, name)) {
        dg_error("params: '%s' is registered twice", name);
        return NULL;
    }
    if (pl->n == pl->cap) {
        int cap = pl->cap ? pl->cap * 2 : 32;
        dg_tensor **t = realloc(pl->t, (size_t)cap * sizeof *t);
        if (!t) {
            dg_error("params: out of memory");
            return NULL;
        }
        pl->t = t;
        pl->cap = cap;
    }
    dg_tensor *p = dg_zeros(ndim, shape, pl->dtype);
    if (!p) return NULL;
    if (dg_scope_depth() > 0) dg_keep(p); /* the list owns one reference, whatever scope is open */
    dg_set_name(p, name);
    dg_set_requires_grad(p, true);
    pl->t[pl->n++] = p;
    return p;
}

dg_tensor *dg_param_addf(dg_param_list *pl, int ndim, const int64_t *shape, const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    if (len < 0 || len >= (int)sizeof name) {
        dg_error("params: name too long (%s...)", name);
        return NULL;
    }
    return dg_param_add(pl, name, ndim, shape);
}

void dg_param_list_free(dg_param_list *pl) {
    for (int i = 0; i < pl->n; i++) dg_release(pl->t[i]);
    free(pl->t);
    memset(pl, 0, sizeof *pl);
}

int64_t dg_param_count(const dg_param_list *pl) {
    int64_t n = 0;
    for (int i = 0; i < pl->n; i++) n += dg_numel(pl->t[i]);
    return n;
}

int dg_param_list_to_device(dg_param_list *pl, dg_device dev) {
    for (int i = 0; i < pl->n; i++) {
        const dg_tensor *p = pl->t[i];
        if (!dg_is_contiguous(p) || p->offset != 0 || p->storage->refcount != 1) {
            dg_error("params: cannot move '%s' %s to %s: it is not a contiguous tensor owning its storage",
                     p->name ? p->name : "?", dg_shp(p), dg_device_name(dev));
            return -1;
        }
    }
    dg_tensor **moved = calloc((size_t)(pl->n ? pl->n : 1), sizeof *moved);
    if (!moved) {
        dg_error("params: out of memory");
        return -1;
    }
    int rc = 0;
    /* first every copy (owned, outside any scope), then the swaps: all or nothing */
    for (int i = 0; i < pl->n && rc == 0; i++) {
        dg_tensor *p = pl->t[i];
        if (p->device == dev) continue;
        dg_tensor *c = dg_empty_on(p->ndim, p->shape, p->dtype, dev);
        if (c && dg_scope_depth() > 0) dg_keep(c);
        if (!c || dg_copy_(c, p)) rc = -1;
        moved[i] = c;
    }
    for (int i = 0; i < pl->n; i++) {
        dg_tensor *p = pl->t[i], *c = moved[i];
        if (!c) continue;
        if (rc == 0) { /* p takes c's storage; c (released below) takes p's old one with it */
            dg_storage *s = p->storage;
            p->storage = c->storage;
            c->storage = s;
            c->device = p->device;
            p->device = dev;
            dg_release(p->grad);
            p->grad = NULL;
        }
        dg_release(c);
    }
    free(moved);
    return rc;
}

/* ---- initialisers ---------------------------------------------------------------------------- */

/* element i of a contiguous f32 or f64 parameter */
static void put(dg_tensor *p, int64_t i, double v) {
    if (p->dtype == DG_F64) ((double *)dg_data_ptr(p))[i] = v;
    else ((float *)dg_data_ptr(p))[i] = (float)v;
}

int dg_init_normal(dg_tensor *p, double std, dg_rng *rng) {
    dg_scope_begin();
    dg_tensor *r = dg_randn(p->ndim, p->shape, DG_F32, rng); /* the same draws for f32 and f64 */
    int rc = -1;
    if (r) {
        const float *src = (const float *)dg_data_ptr(r);
        const int64_t n = dg_numel(p);
#pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++) put(p, i, (double)src[i] * std);
        rc = 0;
    }
    dg_scope_end();
    return rc;
}

int dg_init_ones(dg_tensor *p) { return dg_fill_(p, 1.0); }

int dg_init_log_uniform_A(dg_tensor *p, double lo, double hi, dg_rng *rng) {
    for (int64_t i = 0, n = dg_numel(p); i < n; i++) {
        double a = lo + (hi - lo) * dg_rng_uniform(rng);
        if (a < 1e-30) a = 1e-30; /* U(0, 16) may draw 0 exactly: log would be -inf */
        put(p, i, log(a));
    }
    return 0;
}

int dg_init_dt_bias(dg_tensor *p, dg_rng *rng) {
    const double lmin = log(0.001), lmax = log(0.1);
    for (int64_t i = 0, n = dg_numel(p); i < n; i++) {
        double dt = exp(lmin + (lmax - lmin) * dg_rng_uniform(rng));
        if (dt < 1e-4) dt = 1e-4;
        put(p, i, dt + log(-expm1(-dt))); /* softplus^-1(dt) */
    }
    return 0;
}
