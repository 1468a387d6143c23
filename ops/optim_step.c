/* Optimiser arithmetic dispatched by device; see optim_step.h. */
#include "ops/optim_step.h"

#include "kernels/cpu/optim.h"
#ifdef DG_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/nn_cuda.h"
#include "kernels/cuda/optim_cuda.h"
#endif

#include <stdlib.h>
#include <string.h>

#ifndef DG_HAVE_CUDA
static int no_cuda(const char *who) {
    dg_error("%s: this build has no CUDA backend", who);
    return -1;
}
#endif

int dg_adamw_update_(dg_tensor *p, const dg_tensor *g, dg_tensor *m, dg_tensor *v, const dg_adamw_coefs *c) {
    const dg_tensor *all[4] = {p, g, m, v};
    for (int i = 0; i < 4; i++)
        if (all[i]->dtype != DG_F32 || !dg_is_contiguous(all[i]) || all[i]->device != p->device ||
            !dg_same_shape(all[i], p)) {
            dg_error("adamw_update: tensor %d is %s %s on %s; f32 contiguous tensors of the parameter's shape "
                     "%s on %s are required",
                     i, dg_dtype_name(all[i]->dtype), dg_shp(all[i]), dg_device_name(all[i]->device), dg_shp(p),
                     dg_device_name(p->device));
            return -1;
        }
    float *pp = dg_data_ptr(p), *mp = dg_data_ptr(m), *vp = dg_data_ptr(v);
    const float *gp = dg_data_ptr(g);
    int64_t n = dg_numel(p);
    if (p->device == DG_CUDA) {
#ifdef DG_HAVE_CUDA
        return dg_cuda_adamw_f32(n, pp, gp, mp, vp, c->clip, c->shrink, c->step_size, c->bc2_sqrt, c->eps, c->b1, c->b2,
                                 c->c1, c->c2);
#else
        return no_cuda("adamw_update");
#endif
    }
    dg_cpu_adamw_f32(n, pp, gp, mp, vp, c->clip, c->shrink, c->step_size, c->bc2_sqrt, c->eps, c->b1, c->b2, c->c1,
                     c->c2);
    return 0;
}

/* the sums of squares of the device tensors among x, in their order, into dev[0 ..) */
static int device_sumsq(int n, const dg_tensor *const *x, int count, double *dev) {
#ifdef DG_HAVE_CUDA
    dg_dtype *dt = malloc(sizeof *dt * (size_t)count);
    int64_t *ne = malloc(sizeof *ne * (size_t)count);
    const void **p = malloc(sizeof *p * (size_t)count);
    int rc = -1;
    if (dt && ne && p) {
        int k = 0;
        for (int i = 0; i < n; i++)
            if (x[i] && x[i]->device == DG_CUDA)
                dt[k] = x[i]->dtype, ne[k] = dg_numel(x[i]), p[k++] = dg_data_ptr(x[i]);
        rc = dg_cuda_sumsq_many(count, dt, ne, p, dev);
    } else {
        dg_error("sumsq: out of host memory for %d device tensors", count);
    }
    free(dt), free(ne), free(p);
    return rc;
#else
    return no_cuda("sumsq");
#endif
}

int dg_sumsq_accumulate(int n, const dg_tensor *const *x, double *total) {
    int count = 0;
    for (int i = 0; i < n; i++) {
        if (!x[i]) continue;
        if ((x[i]->dtype != DG_F32 && x[i]->dtype != DG_F64) || !dg_is_contiguous(x[i])) {
            dg_error("sumsq: tensor %d is %s %s%s; contiguous f32 or f64 tensors are summed", i,
                     dg_dtype_name(x[i]->dtype), dg_shp(x[i]), dg_is_contiguous(x[i]) ? "" : " (strided)");
            return -1;
        }
        count += x[i]->device == DG_CUDA;
    }
    double *dev = NULL;
    if (count) {
        dev = malloc(sizeof *dev * (size_t)count);
        if (!dev) {
            dg_error("sumsq: out of host memory for %d device tensors", count);
            return -1;
        }
        if (device_sumsq(n, x, count, dev)) {
            free(dev);
            return -1;
        }
    }
    double acc = *total;
    for (int i = 0, j = 0; i < n; i++) {
        if (!x[i]) continue;
        if (x[i]->device == DG_CUDA) acc += dev[j++];
        else if (x[i]->dtype == DG_F32) acc = dg_cpu_sumsq_f32(dg_numel(x[i]), dg_data_ptr(x[i]), acc);
        else acc = dg_cpu_sumsq_f64(dg_numel(x[i]), dg_data_ptr(x[i]), acc);
    }
    free(dev);
    *total = acc;
    return 0;
}

int dg_scale_(dg_tensor *x, double c) {
    if ((x->dtype != DG_F32 && x->dtype != DG_F64) || !dg_is_contiguous(x)) {
        dg_error("scale_: tensor %s %s%s; contiguous f32 or f64 tensors are scaled", dg_dtype_name(x->dtype), dg_shp(x),
                 dg_is_contiguous(x) ? "" : " (strided)");
        return -1;
    }
    if (x->device == DG_CUDA) {
#ifdef DG_HAVE_CUDA
        /* the same product as on the host: (float)c times x in f32, rounded once */
        double a = x->dtype == DG_F32 ? (double)(float)c : c;
        return dg_cuda_unary(x->dtype, DG_UN_MUL_SCALAR, dg_numel(x), dg_data_ptr(x), dg_data_ptr(x), a);
#else
        return no_cuda("scale_");
#endif
    }
    if (x->dtype == DG_F32) dg_cpu_scale_f32(dg_numel(x), dg_data_ptr(x), (float)c);
    else dg_cpu_scale_f64(dg_numel(x), dg_data_ptr(x), c);
    return 0;
}

int dg_bf16_shadow_refresh_(dg_tensor *x16, const dg_tensor *x) {
    if (x16->dtype != DG_BF16 || x->dtype != DG_F32 || x16->device != DG_CUDA || x->device != DG_CUDA ||
        !dg_same_shape(x16, x) || !dg_is_contiguous(x16) || !dg_is_contiguous(x)) {
        dg_error("bf16 shadow: shadow %s %s on %s of parameter %s %s on %s; a contiguous bf16 tensor of the "
                 "parameter's shape, of a contiguous f32 parameter, both on cuda, is required",
                 dg_dtype_name(x16->dtype), dg_shp(x16), dg_device_name(x16->device), dg_dtype_name(x->dtype),
                 dg_shp(x), dg_device_name(x->device));
        return -1;
    }
#ifdef DG_HAVE_CUDA
    return dg_cuda_cast(dg_numel(x), DG_BF16, dg_data_ptr(x16), DG_F32, dg_data_ptr(x));
#else
    return no_cuda("bf16 shadow");
#endif
}

/* ---- the multi-tensor step ------------------------------------------------------------------- */

/* one element on the device, of one of the dtypes allowed (f64 only when f32_ok is false) */
static int check_scalar(const char *what, const dg_tensor *t, bool f32_ok) {
    if (!t) return 0;
    if (t->device != DG_CUDA || dg_numel(t) != 1 || (t->dtype != DG_F64 && !(f32_ok && t->dtype == DG_F32))) {
        dg_error("adamw device step: %s is %s %s on %s; one %s element on cuda is required", what,
                 dg_dtype_name(t->dtype), dg_shp(t), dg_device_name(t->device), f32_ok ? "f32 or f64" : "f64");
        return -1;
    }
    return 0;
}

#ifdef DG_HAVE_CUDA

struct dg_adamw_device {
    dg_cuda_adamw_state *state; /* device memory */
    dg_cuda_adamw_plan *plan;   /* built for table[0 .. count) */
    dg_cuda_adamw_param *table; /* host copy of the plan's parameters */
    dg_cuda_adamw_param *next;  /* this step's, compared with table */
    int count, cap;
};

dg_adamw_device *dg_adamw_device_new(void) {
    dg_adamw_device *d = calloc(1, sizeof *d);
    if (!d) {
        dg_error("adamw device step: out of host memory");
        return NULL;
    }
    d->state = dg_cuda_malloc(sizeof *d->state);
    if (!d->state || dg_cuda_memset0(d->state, sizeof *d->state)) {
        dg_adamw_device_free(d);
        return NULL;
    }
    return d;
}

void dg_adamw_device_free(dg_adamw_device *d) {
    if (!d) return;
    dg_cuda_adamw_plan_free(d->plan);
    dg_cuda_free(d->state);
    free(d->table);
    free(d->next);
    free(d);
}

/* the parameters with a grad, as the kernels see them, into d->next; their count */
static int gather(dg_adamw_device *d, int n, dg_tensor *const *params, dg_tensor *const *m, dg_tensor *const *v,
                  const bool *decay, dg_tensor *const *shadow) {
    if (n > d->cap) {
        dg_cuda_adamw_param *a = realloc(d->table, sizeof *a * (size_t)n);
        if (a) d->table = a;
        dg_cuda_adamw_param *b = a ? realloc(d->next, sizeof *b * (size_t)n) : NULL;
        if (b) d->next = b;
        if (!a || !b) {
            dg_error("adamw device step: out of host memory for %d parameters", n);
            return -1;
        }
        d->cap = n;
    }
    int k = 0;
    for (int i = 0; i < n; i++) {
        dg_tensor *p = params[i];
        if (!p->grad) continue;
        dg_cuda_adamw_param *e = &d->next[k++];
        memset(e, 0, sizeof *e); /* padding too: tables are compared with memcmp */
        e->p = dg_data_ptr(p);
        e->m = dg_data_ptr(m[i]);
        e->v = dg_data_ptr(v[i]);
        e->g = dg_data_ptr(p->grad);
        e->shadow = shadow && shadow[i] ? dg_data_ptr(shadow[i]) : NULL;
        e->n = dg_numel(p);
        e->decay = decay[i];
    }
    return k;
}

int dg_adamw_device_step(dg_adamw_device *d, int n, dg_tensor *const *params, dg_tensor *const *m, dg_tensor *const *v,
                         const bool *decay, dg_tensor *const *shadow, const dg_adamw_device_args *a) {
    if (check_scalar("lr_dev", a->lr_dev, false) || check_scalar("loss", a->loss, true) ||
        check_scalar("norm_out", a->norm_out, true))
        return -1;
    int k = gather(d, n, params, m, v, decay, shadow);
    if (k < 0) return -1;
    if (!d->plan || k != d->count || (k && memcmp(d->table, d->next, sizeof *d->next * (size_t)k))) {
        /* pointers changed (or the first step): new tables; the old ones are freed in stream order */
        dg_cuda_adamw_plan *plan = dg_cuda_adamw_plan_new(k, d->next);
        if (!plan) return -1;
        dg_cuda_adamw_plan_free(d->plan);
        d->plan = plan;
        d->count = k;
        if (k) memcpy(d->table, d->next, sizeof *d->next * (size_t)k);
    }
    dg_cuda_adamw_args ka = {.lr = a->lr,
                             .max_norm = a->max_norm,
                             .beta1 = a->beta1,
                             .beta2 = a->beta2,
                             .eps = a->eps,
                             .weight_decay = a->weight_decay,
                             .lr_dev = a->lr_dev ? dg_data_ptr(a->lr_dev) : NULL,
                             .loss = a->loss ? dg_data_ptr(a->loss) : NULL,
                             .norm_out = a->norm_out ? dg_data_ptr(a->norm_out) : NULL,
                             .loss_f64 = a->loss && a->loss->dtype == DG_F64,
                             .norm_f64 = a->norm_out && a->norm_out->dtype == DG_F64};
    return dg_cuda_adamw_plan_step(d->plan, d->state, &ka);
}

int dg_adamw_device_read(const dg_adamw_device *d, dg_adamw_device_status *s) {
    dg_cuda_adamw_state h;
    if (dg_cuda_memcpy(&h, d->state, sizeof h, 1)) return -1;
    *s = (dg_adamw_device_status){
        .norm = h.norm, .step = h.step, .skipped = h.skipped, .clip = h.clip, .applied = h.applied != 0};
    return 0;
}

int dg_adamw_device_set_step(dg_adamw_device *d, int64_t step) {
    dg_cuda_adamw_state h;
    if (dg_cuda_memcpy(&h, d->state, sizeof h, 1)) return -1;
    h.step = step;
    return dg_cuda_memcpy(d->state, &h, sizeof h, 0);
}

#else /* no CUDA: a device state cannot be made, so the others are never reached with one */

dg_adamw_device *dg_adamw_device_new(void) {
    no_cuda("adamw device step");
    return NULL;
}

void dg_adamw_device_free(dg_adamw_device *d) { (void)d; }

int dg_adamw_device_step(dg_adamw_device *d, int n, dg_tensor *const *params, dg_tensor *const *m, dg_tensor *const *v,
                         const bool *decay, dg_tensor *const *shadow, const dg_adamw_device_args *a) {
    (void)d, (void)n, (void)params, (void)m, (void)v, (void)decay, (void)shadow;
    if (check_scalar("lr_dev", a->lr_dev, false)) return -1;
    return no_cuda("adamw device step");
}

int dg_adamw_device_read(const dg_adamw_device *d, dg_adamw_device_status *s) {
    (void)d, (void)s;
    return no_cuda("adamw device step");
}

int dg_adamw_device_set_step(dg_adamw_device *d, int64_t step) {
    (void)d, (void)step;
    return no_cuda("adamw device step");
}

#endif
