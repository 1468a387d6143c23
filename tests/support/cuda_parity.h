/* The CUDA-vs-CPU parity harness shared by tests/test_cuda_parity.c and
 * tests/test_cuda_delta_parity.c (static inline functions: each test uses what it needs).
 *
 * run_op runs an op forward and backward from host inputs on one device, with the backward of
 * L = sum_j <out_j, W_j> (W_j given per output); parity_op runs every sample of an op's sampler at
 * one dtype, in two layouts (the sample's own, and every input copied into a storage twice as long
 * with doubled strides), every backward variant, on the CPU and on CUDA from the same values, and
 * fails on the first output or gradient whose relative error norm ||gpu - cpu|| / ||cpu|| is above
 * tol.  Device inputs keep the host layout (the whole storage travels). */
#ifndef DG_TESTS_SUPPORT_CUDA_PARITY_H
#define DG_TESTS_SUPPORT_CUDA_PARITY_H

#include "tests/support/test_support.h"

#include "ops/gradcheck.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- layouts ---- */

/* A copy of t's values on dev with t's shape, strides and offset (the whole storage travels).
 * Always a fresh leaf, also on t's own device: gradients must not pile up in a sample's tensor. */
static inline dg_tensor *same_layout_on(dg_tensor *t, dg_device dev) {
    if (!t) return NULL;
    int64_t n = (int64_t)(t->storage->nbytes / dg_dtype_size(t->dtype));
    int64_t one = 1;
    dg_tensor *flat = dg_make_view(t, 1, &n, &one, 0);
    dg_tensor *base = dg_empty_on(1, &n, t->dtype, dev);
    assert_non_null(base);
    assert_int_equal(dg_copy_(base, flat), 0);
    return dg_make_view(base, t->ndim, t->shape, t->stride, t->offset);
}

/* t's values (host) in a storage twice as long, every dim's stride doubled */
static inline dg_tensor *doubled_strides(dg_tensor *t) {
    if (!t || dg_numel(t) <= 1) return t;
    int64_t n = 2 * dg_numel(t), st[DG_MAX_DIMS];
    dg_tensor *big = dg_empty(1, &n, t->dtype);
    dg_contiguous_strides(t->ndim, t->shape, st);
    for (int d = 0; d < t->ndim; d++) st[d] *= 2;
    dg_tensor *v = dg_make_view(big, t->ndim, t->shape, st, 0);
    assert_int_equal(dg_copy_(v, t), 0);
    return v;
}

/* a host copy of t (any device), kept past the scope */
static inline dg_tensor *host_kept(dg_tensor *t) {
    if (!t) return NULL;
    dg_tensor *h = dg_clone(dg_to_device(t, DG_CPU));
    assert_non_null(h);
    return dg_keep(h);
}

/* ---- one run of an op ---- */

typedef struct {
    dg_tensor *out[DG_MAX_IO];  /* host, kept */
    dg_tensor *grad[DG_MAX_IO]; /* host, kept; NULL where no gradient */
} run_result;

static inline void result_free(run_result *r) {
    for (int i = 0; i < DG_MAX_IO; i++) {
        dg_release(r->out[i]);
        dg_release(r->grad[i]);
    }
    memset(r, 0, sizeof *r);
}

/* Forward and backward of def on dev from host inputs in[] (already in their layout) and host
 * weights w[] (one per output, of the output's dtype). */
static inline void run_op(const dg_op_def *def, const dg_sample *s, dg_tensor *const *in_host, const bool *diff,
                          dg_tensor *const *w_host, int variant, dg_device dev, run_result *r) {
    dg_scope_begin();
    dg_tensor *in[DG_MAX_IO] = {0}, *out[DG_MAX_IO] = {0};
    for (int k = 0; k < def->n_in; k++) {
        in[k] = same_layout_on(in_host[k], dev);
        if (in[k] && diff[k]) dg_set_requires_grad(in[k], true);
    }
    if (dg_apply(def, s->attrs, in, out, variant) != 0)
        fail_msg("%s (%s) on %s, sample '%s': forward failed: %s", def->name, def->bwd[variant].name,
                 dg_device_name(dev), s->label, dg_last_error());
    dg_tensor *loss = NULL, *seed = NULL;
    for (int j = 0; j < def->n_out; j++) {
        if (!out[j] || !out[j]->requires_grad || !w_host[j]) continue;
        dg_tensor *w = dg_to_device(w_host[j], dev);
        if (def->n_out == 1) {
            loss = out[j];
            seed = w;
        } else {
            dg_tensor *term = dg_sum_all(dg_mul(out[j], w));
            loss = loss ? dg_add(loss, term) : term;
        }
    }
    if (loss && dg_backward(loss, seed) != 0)
        fail_msg("%s (%s) on %s, sample '%s': backward failed: %s", def->name, def->bwd[variant].name,
                 dg_device_name(dev), s->label, dg_last_error());
    for (int j = 0; j < def->n_out; j++) r->out[j] = host_kept(out[j]);
    for (int k = 0; k < def->n_in; k++) r->grad[k] = in[k] && diff[k] ? host_kept(in[k]->grad) : NULL;
    dg_scope_end();
}

typedef struct {
    int cases;
    double worst_out, worst_grad;
} op_stats;

static inline void check_close(const dg_op_def *def, const dg_sample *s, int layout, const char *what,
                               const dg_tensor *gpu, const dg_tensor *cpu, double tol, double *worst) {
    if (!cpu && !gpu) return;
    if (!cpu || !gpu)
        fail_msg("%s, sample '%s'%s: %s is present on %s only", def->name, s->label, layout ? " (strided)" : "", what,
                 cpu ? "cpu" : "cuda");
    if (!dg_same_shape(gpu, cpu))
        fail_msg("%s, sample '%s': %s has shape %s on cuda, %s on cpu", def->name, s->label, what, dg_shp(gpu),
                 dg_shp(cpu));
    double e = dg_test_rel_err(gpu, cpu);
    if (!(e <= tol))
        fail_msg("%s, sample '%s'%s: %s differs: relative error norm %.3e > %.1e", def->name, s->label,
                 layout ? " (strided)" : "", what, e, tol);
    if (e > *worst) *worst = e;
}

/* One op, every sample at dtype dt, the first `layouts` layouts (1 or 2), every variant: CPU vs CUDA
 * within tol. */
static inline op_stats parity_op(const dg_op_def *def, dg_dtype dt, double tol, int layouts) {
    op_stats st = {0};
    for (int i = 0;; i++) {
        dg_scope_begin();
        dg_sample s = {0};
        if (def->sample(i, dt, 1000 + (uint64_t)i, &s) <= 0) {
            dg_sample_free(&s);
            dg_scope_end();
            break;
        }
        for (int layout = 0; layout < layouts; layout++) {
            dg_tensor *in[DG_MAX_IO] = {0};
            bool diff[DG_MAX_IO] = {0};
            for (int k = 0; k < def->n_in; k++) {
                in[k] = layout ? doubled_strides(s.in[k]) : s.in[k];
                diff[k] = s.differentiable[k];
            }
            for (int v = 0; v < dg_op_variant_count(def); v++) {
                run_result cpu = {0}, gpu = {0};
                dg_tensor *w[DG_MAX_IO] = {0};
                dg_tensor *no_w[DG_MAX_IO] = {0};
                /* a forward on the CPU gives the output shapes for the weights */
                run_op(def, &s, in, diff, no_w, v, DG_CPU, &cpu);
                dg_rng rng = dg_rng_new(77 + (uint64_t)i);
                for (int j = 0; j < def->n_out; j++)
                    if (cpu.out[j] && dg_dtype_is_float(cpu.out[j]->dtype))
                        w[j] = dg_randn(cpu.out[j]->ndim, cpu.out[j]->shape, cpu.out[j]->dtype, &rng);
                result_free(&cpu);
                run_op(def, &s, in, diff, w, v, DG_CPU, &cpu);
                run_op(def, &s, in, diff, w, v, DG_CUDA, &gpu);
                char what[64];
                for (int j = 0; j < def->n_out; j++) {
                    snprintf(what, sizeof what, "output %s", def->out_names[j] ? def->out_names[j] : "?");
                    check_close(def, &s, layout, what, gpu.out[j], cpu.out[j], tol, &st.worst_out);
                }
                for (int k = 0; k < def->n_in; k++) {
                    snprintf(what, sizeof what, "gradient d%s", def->in_names[k] ? def->in_names[k] : "?");
                    check_close(def, &s, layout, what, gpu.grad[k], cpu.grad[k], tol, &st.worst_grad);
                }
                result_free(&cpu);
                result_free(&gpu);
                st.cases++;
            }
        }
        dg_sample_free(&s);
        dg_scope_end();
    }
    return st;
}

/* ---- bf16 ---- */

/* t rounded to bf16 (on the host) */
static inline dg_tensor *as_bf16(dg_tensor *t) {
    dg_tensor *b = dg_empty(t->ndim, t->shape, DG_BF16);
    assert_int_equal(dg_copy_(b, t), 0);
    return b;
}
static inline dg_tensor *as_f32(dg_tensor *t) {
    dg_tensor *f = dg_empty(t->ndim, t->shape, DG_F32);
    assert_int_equal(dg_copy_(f, t), 0);
    return f;
}

#endif
