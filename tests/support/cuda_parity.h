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
            /* bf16 outputs join the sum in f32 (the products of bf16 tensors are not what is tested) */
            dg_tensor *o = out[j];
            if (o->dtype == DG_BF16) {
                o = dg_to_dtype(o, DG_F32);
                w = dg_to_dtype(w, DG_F32);
            }
            dg_tensor *term = dg_sum_all(dg_mul(o, w));
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

/* t converted to dtype dt (on the host, contiguous): as_bf16 rounds */
static inline dg_tensor *as_dtype(dg_tensor *t, dg_dtype dt) {
    dg_tensor *c = dg_empty(t->ndim, t->shape, dt);
    assert_int_equal(dg_copy_(c, t), 0);
    return c;
}
static inline dg_tensor *as_bf16(dg_tensor *t) { return as_dtype(t, DG_BF16); }
static inline dg_tensor *as_f32(dg_tensor *t) { return as_dtype(t, DG_F32); }

/* f32 host t in bf16 with t's layout: its storage rounded element by element, viewed with t's
 * shape, strides and offset */
static inline dg_tensor *bf16_same_layout(dg_tensor *t) {
    int64_t n = (int64_t)(t->storage->nbytes / dg_dtype_size(t->dtype)), one = 1;
    dg_tensor *flat = as_bf16(dg_make_view(t, 1, &n, &one, 0));
    return dg_make_view(flat, t->ndim, t->shape, t->stride, t->offset);
}

/* One op in bf16 on the device against f32 on the CPU: every sample (drawn in f32), both layouts.
 * The float inputs are rounded to bf16 (in their layout) for the device, and the CPU runs in f32
 * from the same rounded values; the output weights are bf16-representable, given to the device
 * in the dtype of its output (bf16, or f32 where the op returns f32 from bf16, as cross-entropy's
 * loss) and to the CPU in f32.  Outputs and gradients must agree within tol (relative error norm);
 * every gradient of a bf16 input must be bf16.  (Each side gets the weights in the dtype of its
 * own output: f64 for to_dtype's, for one.)  An op whose device forward or backward refuses bf16
 * (an error that names bf16) is not compared: *refusal receives the message (else it is left
 * empty). */
static inline op_stats parity_op_bf16(const dg_op_def *def, double tol, char *refusal, size_t refusal_size) {
    op_stats st = {0};
    refusal[0] = 0;
    for (int i = 0;; i++) {
        dg_scope_begin();
        dg_sample s = {0};
        if (def->sample(i, DG_F32, 3000 + (uint64_t)i, &s) <= 0) {
            dg_sample_free(&s);
            dg_scope_end();
            break;
        }
        for (int layout = 0; layout < 2; layout++) {
            dg_tensor *in_bf[DG_MAX_IO] = {0}, *in_ref[DG_MAX_IO] = {0};
            bool diff[DG_MAX_IO] = {0};
            for (int k = 0; k < def->n_in; k++) {
                dg_tensor *x = layout ? doubled_strides(s.in[k]) : s.in[k];
                bool fl = x && x->dtype == DG_F32;
                in_bf[k] = fl ? bf16_same_layout(x) : x;
                in_ref[k] = fl ? as_f32(in_bf[k]) : x;
                diff[k] = s.differentiable[k];
            }
            /* a first run on the device, forward and a backward from a zero gradient of the first
             * output: does the op take bf16 both ways, and which dtype does each output have */
            dg_dtype out_dt[DG_MAX_IO] = {0};
            dg_scope_begin();
            dg_tensor *probe_in[DG_MAX_IO] = {0}, *probe_out[DG_MAX_IO] = {0};
            for (int k = 0; k < def->n_in; k++) {
                probe_in[k] = same_layout_on(in_bf[k], DG_CUDA);
                if (probe_in[k] && diff[k]) dg_set_requires_grad(probe_in[k], true);
            }
            const char *way = "forward";
            int rc = dg_apply(def, s.attrs, probe_in, probe_out, 0);
            for (int j = 0; rc == 0 && j < def->n_out; j++) out_dt[j] = probe_out[j] ? probe_out[j]->dtype : DG_F32;
            if (rc == 0 && probe_out[0] && probe_out[0]->requires_grad) {
                dg_tensor *o = probe_out[0];
                way = "backward";
                rc = dg_backward(o, dg_zeros_on(o->ndim, o->shape, o->dtype, DG_CUDA));
            }
            if (rc != 0 && strstr(dg_last_error(), "bf16"))
                snprintf(refusal, refusal_size, "%s: %s", way, dg_last_error());
            else if (rc != 0) fail_msg("%s, sample '%s': bf16 %s failed: %s", def->name, s.label, way, dg_last_error());
            dg_scope_end();
            if (rc != 0) {
                dg_sample_free(&s);
                dg_scope_end();
                return st;
            }
            for (int v = 0; v < dg_op_variant_count(def); v++) {
                run_result ref = {0}, gpu = {0};
                dg_tensor *w_ref[DG_MAX_IO] = {0}, *w_dev[DG_MAX_IO] = {0}, *no_w[DG_MAX_IO] = {0};
                run_op(def, &s, in_ref, diff, no_w, v, DG_CPU, &ref);
                dg_rng rng = dg_rng_new(177 + (uint64_t)i);
                for (int j = 0; j < def->n_out; j++) {
                    if (!ref.out[j] || !dg_dtype_is_float(ref.out[j]->dtype)) continue;
                    dg_tensor *wb = as_bf16(dg_randn(ref.out[j]->ndim, ref.out[j]->shape, DG_F32, &rng));
                    w_ref[j] = as_dtype(wb, ref.out[j]->dtype);
                    w_dev[j] = as_dtype(wb, out_dt[j]);
                }
                result_free(&ref);
                run_op(def, &s, in_ref, diff, w_ref, v, DG_CPU, &ref);
                run_op(def, &s, in_bf, diff, w_dev, v, DG_CUDA, &gpu);
                char what[64];
                for (int j = 0; j < def->n_out; j++) {
                    snprintf(what, sizeof what, "bf16 output %s", def->out_names[j] ? def->out_names[j] : "?");
                    check_close(def, &s, layout, what, gpu.out[j], ref.out[j], tol, &st.worst_out);
                }
                for (int k = 0; k < def->n_in; k++) {
                    snprintf(what, sizeof what, "bf16 gradient d%s", def->in_names[k] ? def->in_names[k] : "?");
                    if (gpu.grad[k] && in_bf[k]->dtype == DG_BF16 && gpu.grad[k]->dtype != DG_BF16)
                        fail_msg("%s, sample '%s': %s is %s, not bf16", def->name, s.label, what,
                                 dg_dtype_name(gpu.grad[k]->dtype));
                    check_close(def, &s, layout, what, gpu.grad[k], ref.grad[k], tol, &st.worst_grad);
                }
                result_free(&ref);
                result_free(&gpu);
                st.cases++;
            }
        }
        dg_sample_free(&s);
        dg_scope_end();
    }
    return st;
}

#endif
