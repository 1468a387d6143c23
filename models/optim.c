/* AdamW, gradient clipping, lr schedule, optimiser state files (the math is in optim.h). */
#include "models/optim.h"

#include "models/infra_common.h"
#include "models/safetensors.h"
#include "ops/optim_step.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Parameters on the device (f32, contiguous) keep their moments on the device.  The arithmetic
 * runs where the tensors are, through ops/optim_step.h: the update is the same bit for bit on
 * either device, and the gradient norm sums each device gradient there (in double, a fixed order
 * per tensor) and adds the per-tensor sums in parameter order.
 *
 * The fused step (optim.h) on the host is dg_clip_grad_norm's decisions and dg_adamw_step's
 * update with the clip factor applied inside the update; on the device it is one queued
 * multi-tensor step (dg_adamw_device_step) whose state (step count, skipped steps, latest norm)
 * stays on the device.  The step count moves between the two: a device step first copies the
 * host count to the device when the host holds it (the first device step, after a load or a host
 * step), and a host step first reads it back. */

#define ADAMW_FORMAT "deltagrad.adamw.v1"

dg_adamw_config dg_adamw_default_config(void) {
    return (dg_adamw_config){.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};
}

static bool ends_with(const char *s, size_t n, const char *suffix) {
    size_t k = strlen(suffix);
    return n >= k && !memcmp(s + n - k, suffix, k);
}

bool dg_param_decays(const char *name, int ndim) {
    if (!name) return ndim >= 2;
    /* walk the dot-separated components */
    const char *c = name, *last = name;
    size_t last_len = 0;
    for (;;) {
        const char *dot = strchr(c, '.');
        size_t len = dot ? (size_t)(dot - c) : strlen(c);
        if (ends_with(c, len, "norm")) return false;
        last = c;
        last_len = len;
        if (!dot) break;
        c = dot + 1;
    }
    if ((last_len == 5 && !memcmp(last, "A_log", 5)) || (last_len == 7 && !memcmp(last, "dt_bias", 7)) ||
        (last_len == 4 && !memcmp(last, "bias", 4)))
        return false;
    return true;
}

static int check_param(const dg_tensor *p, int i) {
    if (!p) {
        dg_error("adamw: parameter %d is NULL", i);
        return -1;
    }
#ifdef DG_HAVE_CUDA
    bool device_ok = p->device == DG_CPU || p->device == DG_CUDA;
#else
    bool device_ok = p->device == DG_CPU;
#endif
    if (p->dtype != DG_F32 || !device_ok || !dg_is_contiguous(p)) {
        dg_error("adamw: parameter %d (%s) is %s %s on %s%s; f32 contiguous tensors are supported", i,
                 p->name ? p->name : "unnamed", dg_dtype_name(p->dtype), dg_shp(p), dg_device_name(p->device),
                 dg_is_contiguous(p) ? "" : ", not contiguous");
        return -1;
    }
    return 0;
}

/* f32 zeros of p's shape on p's device, owned by the caller (outside every scope) */
static dg_tensor *owned_zeros_on(const dg_tensor *p) {
    if (p->device == DG_CPU) return dgm_owned_zeros(p->ndim, p->shape, DG_F32);
    dg_tensor *t = dg_zeros_on(p->ndim, p->shape, DG_F32, p->device);
    if (t && dg_scope_depth() > 0) dg_keep(t);
    return t;
}

void dg_adamw_free(dg_adamw *opt) {
    if (!opt) return;
    for (int i = 0; i < opt->n; i++) {
        if (opt->params) dg_release(opt->params[i]);
        if (opt->m) dg_release(opt->m[i]);
        if (opt->v) dg_release(opt->v[i]);
        if (opt->shadow) dg_release(opt->shadow[i]);
    }
    dg_adamw_device_free(opt->dev);
    free(opt->shadow);
    free(opt->params);
    free(opt->m);
    free(opt->v);
    free(opt->decay);
    free(opt);
}

dg_adamw *dg_adamw_new(int n, dg_tensor *const *params, const dg_adamw_config *cfg) {
    if (n < 0 || (n > 0 && !params)) {
        dg_error("adamw: bad parameter list (n = %d)", n);
        return NULL;
    }
    dg_adamw_config c = cfg ? *cfg : dg_adamw_default_config();
    if (!(c.beta1 >= 0 && c.beta1 < 1) || !(c.beta2 >= 0 && c.beta2 < 1) || !(c.eps > 0) || !(c.weight_decay >= 0)) {
        dg_error("adamw: need 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0 (got %g, %g, %g, %g)", c.beta1, c.beta2,
                 c.eps, c.weight_decay);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (check_param(params[i], i)) return NULL;
        for (int j = 0; j < i; j++)
            if (params[j] == params[i] ||
                (params[i]->name && params[j]->name && !strcmp(params[i]->name, params[j]->name))) {
                dg_error("adamw: parameters %d and %d are the same tensor or share the name \"%s\"", j, i,
                         params[i]->name ? params[i]->name : "");
                return NULL;
            }
    }
    dg_adamw *opt = calloc(1, sizeof *opt);
    if (!opt) goto oom;
    opt->cfg = c;
    size_t k = (size_t)(n ? n : 1);
    opt->params = calloc(k, sizeof *opt->params);
    opt->m = calloc(k, sizeof *opt->m);
    opt->v = calloc(k, sizeof *opt->v);
    opt->decay = calloc(k, sizeof *opt->decay);
    opt->shadow = calloc(k, sizeof *opt->shadow);
    opt->last_norm = NAN;
    if (!opt->params || !opt->m || !opt->v || !opt->decay || !opt->shadow) goto oom;
    for (int i = 0; i < n; i++) {
        opt->params[i] = dg_retain(params[i]);
        opt->n = i + 1;
        opt->m[i] = owned_zeros_on(params[i]);
        opt->v[i] = owned_zeros_on(params[i]);
        if (!opt->m[i] || !opt->v[i]) goto oom;
        opt->decay[i] = dg_param_decays(params[i]->name, params[i]->ndim);
    }
    return opt;
oom:
    dg_adamw_free(opt);
    dg_error("adamw: out of memory for the optimiser state");
    return NULL;
}

static int check_grad(const dg_tensor *p, int i) {
    const dg_tensor *g = p->grad;
    if (g->dtype != DG_F32 || g->device != p->device || !dg_is_contiguous(g) || !dg_same_shape(g, p)) {
        dg_error("adamw: grad of parameter %d (%s) is %s %s on %s but the parameter is f32 %s on %s (contiguous "
                 "f32 on the parameter's device expected)",
                 i, p->name ? p->name : "unnamed", dg_dtype_name(g->dtype), dg_shp(g), dg_device_name(g->device),
                 dg_shp(p), dg_device_name(p->device));
        return -1;
    }
    return 0;
}

static int check_lr(double lr) {
    if (!isfinite(lr) || lr < 0) {
        dg_error("adamw: learning rate %g is not a finite non-negative number", lr);
        return -1;
    }
    return 0;
}

static int check_grads(const dg_adamw *opt) {
    for (int i = 0; i < opt->n; i++)
        if (opt->params[i]->grad && check_grad(opt->params[i], i)) return -1;
    return 0;
}

/* After a device step the count lives on the device; the host path takes it back first. */
static int step_to_host(dg_adamw *opt) {
    if (!opt->step_on_device) return 0;
    dg_adamw_device_status s;
    if (dg_adamw_device_read(opt->dev, &s)) return -1;
    opt->step = s.step;
    opt->step_on_device = false;
    return 0;
}

/* The host-side update of every parameter with a grad, the gradients scaled by clip (checked). */
static int apply_update(dg_adamw *opt, double lr, float clip) {
    opt->step++;
    const double b1 = opt->cfg.beta1, b2 = opt->cfg.beta2;
    const double bc1 = 1.0 - pow(b1, (double)opt->step), bc2 = 1.0 - pow(b2, (double)opt->step);
    /* the scalars are computed once in double and used as f32, as PyTorch does */
    dg_adamw_coefs c = {.clip = clip,
                        .step_size = (float)(lr / bc1),
                        .bc2_sqrt = (float)sqrt(bc2),
                        .eps = (float)opt->cfg.eps,
                        .b1 = (float)b1,
                        .b2 = (float)b2,
                        .c1 = (float)(1.0 - b1),
                        .c2 = (float)(1.0 - b2)};
    for (int i = 0; i < opt->n; i++) {
        dg_tensor *pt = opt->params[i];
        if (!pt->grad) continue;
        c.shrink = opt->decay[i] ? (float)(1.0 - lr * opt->cfg.weight_decay) : 1.0f;
        /* a failure here is a device fault (the arguments were checked above) */
        if (dg_adamw_update_(pt, pt->grad, opt->m[i], opt->v[i], &c)) return -1;
        if (opt->shadow[i] && dg_bf16_shadow_refresh_(opt->shadow[i], pt)) return -1;
    }
    return 0;
}

int dg_adamw_step(dg_adamw *opt, double lr) {
    if (!opt) {
        dg_error("adamw: NULL optimiser");
        return -1;
    }
    if (check_lr(lr) || check_grads(opt) || step_to_host(opt)) return -1;
    return apply_update(opt, lr, 1.0f);
}

/* ---- the fused step -------------------------------------------------------------------------- */

/* one element of f32 or f64 on the given device, or NULL */
static int check_scalar_arg(const char *what, const dg_tensor *t, dg_device dev) {
    if (!t) return 0;
    if (t->device != dev || dg_numel(t) != 1 || (t->dtype != DG_F32 && t->dtype != DG_F64)) {
        dg_error("adamw: %s is %s %s on %s; one f32 or f64 element on %s (the parameters' device) is expected", what,
                 dg_dtype_name(t->dtype), dg_shp(t), dg_device_name(t->device), dg_device_name(dev));
        return -1;
    }
    return 0;
}

static double host_scalar(const dg_tensor *t) {
    const void *p = dg_data_ptr(t);
    return t->dtype == DG_F64 ? *(const double *)p : (double)*(const float *)p;
}

/* the fused step with every tensor on the host: dg_clip_grad_norm's decisions, then the update */
static int fused_step_host(dg_adamw *opt, const dg_adamw_fused_args *a) {
    double norm = dg_grad_norm(opt->n, opt->params);
    bool finite = isfinite(norm) && (!a->loss || isfinite(host_scalar(a->loss)));
    if (a->norm_out) {
        void *p = dg_data_ptr(a->norm_out);
        if (a->norm_out->dtype == DG_F64) *(double *)p = norm;
        else *(float *)p = (float)norm;
    }
    opt->last_norm = norm;
    opt->last_on_device = false;
    if (!finite) {
        opt->skipped++;
        return 0;
    }
    float clip = a->max_norm > 0 && norm > a->max_norm ? (float)(a->max_norm / (norm + 1e-6)) : 1.0f;
    return apply_update(opt, a->lr, clip);
}

static int fused_step_device(dg_adamw *opt, const dg_adamw_fused_args *a) {
    if (!opt->dev && !(opt->dev = dg_adamw_device_new())) return -1;
    if (!opt->step_on_device) {
        if (dg_adamw_device_set_step(opt->dev, opt->step)) return -1;
        opt->step_on_device = true;
    }
    dg_adamw_device_args da = {.lr = a->lr,
                               .max_norm = a->max_norm,
                               .beta1 = opt->cfg.beta1,
                               .beta2 = opt->cfg.beta2,
                               .eps = opt->cfg.eps,
                               .weight_decay = opt->cfg.weight_decay,
                               .lr_dev = a->lr_dev,
                               .loss = a->loss,
                               .norm_out = a->norm_out};
    if (dg_adamw_device_step(opt->dev, opt->n, opt->params, opt->m, opt->v, opt->decay, opt->shadow, &da)) return -1;
    opt->last_on_device = true;
    return 0;
}

int dg_adamw_step_fused(dg_adamw *opt, const dg_adamw_fused_args *a) {
    if (!opt || !a) {
        dg_error("adamw: fused step: NULL %s", opt ? "arguments" : "optimiser");
        return -1;
    }
    dg_device dev = opt->n ? opt->params[0]->device : DG_CPU;
    for (int i = 1; i < opt->n; i++)
        if (opt->params[i]->device != dev) {
            dg_error("adamw: fused step: parameter %d (%s) is on %s but parameter 0 on %s; all must be on one device",
                     i, opt->params[i]->name ? opt->params[i]->name : "unnamed", dg_device_name(opt->params[i]->device),
                     dg_device_name(dev));
            return -1;
        }
    if ((!a->lr_dev && check_lr(a->lr)) || check_grads(opt) || check_scalar_arg("loss", a->loss, dev) ||
        check_scalar_arg("norm_out", a->norm_out, dev))
        return -1;
    if (dev == DG_CPU && a->lr_dev) {
        dg_error("adamw: fused step: lr_dev is for parameters on the device; these are on cpu (pass lr)");
        return -1;
    }
    return dev == DG_CPU ? fused_step_host(opt, a) : fused_step_device(opt, a);
}

int dg_adamw_step_clipped(dg_adamw *opt, double lr, double max_norm, dg_tensor *norm_out) {
    dg_adamw_fused_args a = {.lr = lr, .max_norm = max_norm, .norm_out = norm_out};
    return dg_adamw_step_fused(opt, &a);
}

int64_t dg_adamw_skipped(const dg_adamw *opt) {
    if (!opt) return -1;
    dg_adamw_device_status s = {0};
    if (opt->dev && dg_adamw_device_read(opt->dev, &s)) return -1;
    return opt->skipped + s.skipped;
}

double dg_adamw_last_norm(const dg_adamw *opt) {
    if (!opt) return NAN;
    if (!opt->last_on_device) return opt->last_norm;
    dg_adamw_device_status s;
    return dg_adamw_device_read(opt->dev, &s) ? NAN : s.norm;
}

int64_t dg_adamw_step_count(const dg_adamw *opt) {
    if (!opt) return -1;
    if (!opt->step_on_device) return opt->step;
    dg_adamw_device_status s;
    return dg_adamw_device_read(opt->dev, &s) ? -1 : s.step;
}

/* ---- bf16 shadows ---------------------------------------------------------------------------- */

int dg_adamw_set_shadow(dg_adamw *opt, int i, dg_tensor *t16) {
    if (!opt || i < 0 || i >= opt->n) {
        dg_error("adamw: set_shadow: parameter %d is out of range (%d parameters)", i, opt ? opt->n : 0);
        return -1;
    }
    if (t16 && dg_bf16_shadow_refresh_(t16, opt->params[i])) return -1; /* checks, then fills */
    dg_release(opt->shadow[i]);
    opt->shadow[i] = t16 ? dg_retain(t16) : NULL;
    return 0;
}

int dg_adamw_make_shadows(dg_adamw *opt) {
    if (!opt) {
        dg_error("adamw: make_shadows: NULL optimiser");
        return -1;
    }
    for (int i = 0; i < opt->n; i++) {
        const dg_tensor *p = opt->params[i];
        if (p->device != DG_CUDA || opt->shadow[i]) continue;
        dg_tensor *t = dg_zeros_on(p->ndim, p->shape, DG_BF16, p->device);
        if (!t) return -1;
        if (dg_scope_depth() > 0) dg_keep(t);
        int rc = dg_adamw_set_shadow(opt, i, t);
        dg_release(t); /* the optimiser holds its own reference */
        if (rc) return -1;
    }
    return 0;
}

dg_tensor *dg_adamw_shadow(const dg_adamw *opt, int i) { return opt && i >= 0 && i < opt->n ? opt->shadow[i] : NULL; }

void dg_adamw_zero_grad(dg_adamw *opt) {
    if (!opt) return;
    for (int i = 0; i < opt->n; i++) {
        dg_tensor *g = opt->params[i]->grad;
        if (g && g->device == DG_CPU && dg_is_contiguous(g))
            memset(dgm_data(g), 0, (size_t)dg_numel(g) * dg_dtype_size(g->dtype));
        else if (g && g->device == DG_CUDA) dg_fill_(g, 0.0);
    }
}

/* The gradients the norm counts: contiguous ones, f32 or f64 on the host, and on the device
 * (where another dtype is an error of the sum); NULL for the others. */
static const dg_tensor *counted_grad(const dg_tensor *param) {
    const dg_tensor *g = param ? param->grad : NULL;
    if (!g || !dg_is_contiguous(g)) return NULL;
    return g->device == DG_CUDA || g->dtype == DG_F32 || g->dtype == DG_F64 ? g : NULL;
}

double dg_grad_norm(int n, dg_tensor *const *params) {
    const dg_tensor **g = n > 0 ? calloc((size_t)n, sizeof *g) : NULL;
    if (n > 0 && !g) {
        dg_error("grad_norm: out of host memory for %d parameters", n);
        return NAN;
    }
    for (int i = 0; i < n; i++) g[i] = counted_grad(params[i]);
    double ss = 0;
    int rc = dg_sumsq_accumulate(n, g, &ss);
    free(g);
    return rc ? NAN : sqrt(ss); /* error set */
}

double dg_clip_grad_norm(int n, dg_tensor *const *params, double max_norm) {
    double norm = dg_grad_norm(n, params);
    if (!(max_norm > 0) || !isfinite(norm) || norm <= max_norm) return norm;
    double coef = max_norm / (norm + 1e-6);
    for (int i = 0; i < n; i++) {
        dg_tensor *g = (dg_tensor *)counted_grad(params[i]);
        if (g) dg_scale_(g, coef);
    }
    return norm;
}

double dg_lr_at(const dg_lr_schedule *s, int64_t step) {
    if (step < 0) step = 0;
    if (step < s->warmup_steps) return s->peak_lr * (double)(step + 1) / (double)s->warmup_steps;
    int64_t span = s->total_steps - s->warmup_steps;
    double p = span > 0 ? (double)(step - s->warmup_steps) / (double)span : 1.0;
    if (p > 1) p = 1;
    double r = s->min_lr_ratio;
    return s->peak_lr * (r + (1.0 - r) * 0.5 * (1.0 + cos(M_PI * p)));
}

/* ---- state files ----------------------------------------------------------------------------- */

static char *moment_name(const char *kind, const char *param) {
    size_t n = strlen(kind) + strlen(param) + 2;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s.%s", kind, param);
    return s;
}

int dg_adamw_save(const dg_adamw *opt, const char *path, int n_meta, const char *const *keys,
                  const char *const *values) {
    if (!opt || n_meta < 0) {
        dg_error("adamw: save: bad arguments");
        return -1;
    }
    for (int i = 0; i < opt->n; i++)
        if (!opt->params[i]->name) {
            dg_error("adamw: save: parameter %d has no name; optimiser state is stored by name", i);
            return -1;
        }
    int rc = -1, nt = 2 * opt->n, nm = 6 + n_meta;
    char **names = calloc((size_t)nt + 1, sizeof *names);
    dg_tensor **ts = calloc((size_t)nt + 1, sizeof *ts);
    const char **mk = calloc((size_t)nm, sizeof *mk), **mv = calloc((size_t)nm, sizeof *mv);
    char vals[5][40];
    if (!names || !ts || !mk || !mv) goto out;
    dg_scope_begin(); /* host copies of device moments */
    for (int i = 0; i < opt->n; i++) {
        names[2 * i] = moment_name("exp_avg", opt->params[i]->name);
        names[2 * i + 1] = moment_name("exp_avg_sq", opt->params[i]->name);
        if (!names[2 * i] || !names[2 * i + 1]) goto out_scope;
        ts[2 * i] = opt->m[i]->device == DG_CPU ? opt->m[i] : dg_to_device(opt->m[i], DG_CPU);
        ts[2 * i + 1] = opt->v[i]->device == DG_CPU ? opt->v[i] : dg_to_device(opt->v[i], DG_CPU);
        if (!ts[2 * i] || !ts[2 * i + 1]) goto out_scope;
    }
    int64_t step = dg_adamw_step_count(opt);
    if (step < 0) goto out_scope;
    snprintf(vals[0], sizeof vals[0], "%" PRId64, step);
    snprintf(vals[1], sizeof vals[1], "%.17g", opt->cfg.beta1);
    snprintf(vals[2], sizeof vals[2], "%.17g", opt->cfg.beta2);
    snprintf(vals[3], sizeof vals[3], "%.17g", opt->cfg.eps);
    snprintf(vals[4], sizeof vals[4], "%.17g", opt->cfg.weight_decay);
    const char *fixed[6][2] = {{"format", ADAMW_FORMAT}, {"step", vals[0]}, {"beta1", vals[1]},
                               {"beta2", vals[2]},       {"eps", vals[3]},  {"weight_decay", vals[4]}};
    for (int i = 0; i < 6; i++) mk[i] = fixed[i][0], mv[i] = fixed[i][1];
    for (int i = 0; i < n_meta; i++) mk[6 + i] = keys[i], mv[6 + i] = values[i];
    rc = dg_st_write(path, nt, (const char *const *)names, ts, nm, mk, mv);
out_scope:
    dg_scope_end();
out:
    if (rc && !dg_has_error()) dg_error("adamw: save: out of memory");
    for (int i = 0; names && i < nt; i++) free(names[i]);
    free(names);
    free(ts);
    free(mk);
    free(mv);
    return rc;
}

int dg_adamw_load(dg_adamw *opt, const char *path) {
    if (!opt) {
        dg_error("adamw: load: NULL optimiser");
        return -1;
    }
    dg_st_file *f = dg_st_read(path);
    if (!f) return -1;
    int rc = -1;
    char *nm = NULL;
    const char *fmt = dg_st_meta(f, "format"), *step_s = dg_st_meta(f, "step");
    if (!fmt || strcmp(fmt, ADAMW_FORMAT)) {
        dg_error("adamw: '%s' is not a deltagrad AdamW state (metadata format is %s%s%s, expected \"%s\")", path,
                 fmt ? "\"" : "", fmt ? fmt : "missing", fmt ? "\"" : "", ADAMW_FORMAT);
        goto out;
    }
    char *end = NULL;
    long long step = step_s ? strtoll(step_s, &end, 10) : -1;
    if (!step_s || !*step_s || *end || step < 0) {
        dg_error("adamw: '%s': metadata step \"%s\" is not a non-negative integer", path,
                 step_s ? step_s : "(missing)");
        goto out;
    }
    if (f->n != 2 * opt->n) {
        dg_error("adamw: '%s' holds %d moment tensors but the optimiser has %d parameters (%d expected)", path, f->n,
                 opt->n, 2 * opt->n);
        goto out;
    }
    /* check everything before changing anything */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < opt->n; i++)
            for (int k = 0; k < 2; k++) {
                const dg_tensor *p = opt->params[i];
                if (!p->name) {
                    dg_error("adamw: load: parameter %d has no name", i);
                    goto out;
                }
                free(nm);
                nm = moment_name(k ? "exp_avg_sq" : "exp_avg", p->name);
                if (!nm) {
                    dg_error("adamw: load: out of memory");
                    goto out;
                }
                const dg_tensor *t = dg_st_get(f, nm);
                if (!t) {
                    dg_error("adamw: '%s' has no tensor \"%s\" for parameter \"%s\"", path, nm, p->name);
                    goto out;
                }
                if (t->dtype != DG_F32 || !dg_same_shape(t, p)) {
                    dg_error("adamw: '%s': \"%s\" is %s %s but parameter \"%s\" is f32 %s", path, nm,
                             dg_dtype_name(t->dtype), dg_shp(t), p->name, dg_shp(p));
                    goto out;
                }
                dg_tensor *dst = k ? opt->v[i] : opt->m[i];
                if (pass == 1 && (dst->device == DG_CPU ? dg_st_copy_into(f, nm, dst) : dg_copy_(dst, t))) goto out;
            }
    opt->step = step;
    opt->step_on_device = false; /* the next device step takes the count from here */
    rc = 0;
out:
    free(nm);
    dg_st_free(f);
    return rc;
}
