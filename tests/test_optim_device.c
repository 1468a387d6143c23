/* The fused optimiser step (dg_adamw_step_fused / dg_adamw_step_clipped) against the per-parameter
 * path (dg_clip_grad_norm, then dg_adamw_step when the norm is finite), on the same inputs.
 *
 * Two optimisers over copies of the same parameters get the same gradients at every step; one
 * steps fused, the other the old way.  A sequence of steps covers: no clipping (max_norm above
 * the norm, and max_norm 0), clipping active, a NaN gradient (the step is skipped: nothing moves,
 * the step count stays, the skipped count grows), a parameter without a gradient (left alone), a
 * gradient buffer replaced by another (the device tables are rebuilt), and a host step in between
 * fused ones (the step count goes from the device to the host and back).  After every step the
 * parameters and both moments are compared bit for bit, and so are the norms:
 *   on the host, the fused step makes the old path's decisions in its order with the same
 *   operations (the clip factor is applied inside the update, g * clip in f32, the product that
 *   dg_clip_grad_norm stores), so everything is bit-identical;
 *   on the device, the norm is summed in the old path's order and cut (bit-identical), and the
 *   update is the old kernel's element function given the same f32 scalars.  The scalars come
 *   from CUDA's pow on the device and glibc's on the host: they can differ only when a double is
 *   within 2 ulp of an f32 rounding boundary, which does not happen at these steps, so the
 *   results are compared bit for bit.
 * Also: the fused step leaves the gradients as they were; the learning rate read from a device
 * scalar; a non-finite loss skips the step; bf16 shadows equal bf16(p) after every update; the
 * argument errors leave everything unchanged.  The device tests skip without a GPU. */
#include "tests/support/test_support.h"

#include "core/internal.h"
#include "models/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NP 4

static const char *const kNames[NP] = {"layers.0.attn.q_proj.weight", "layers.0.attn_norm.weight",
                                       "layers.0.mlp.down_proj.weight", "embeddings.weight"};

typedef struct {
    int ndim;
    int64_t shape[2];
} shape2;

/* the host test: one tensor above the threads' threshold (1 << 16 elements) */
static const shape2 kHostShapes[NP] = {{2, {37, 19}}, {1, {19}}, {2, {5, 7}}, {2, {300, 257}}};
/* the device test: one tensor over 1024 blocks of 2048 elements (the cap of the sum's cut) */
static const shape2 kDeviceShapes[NP] = {{2, {37, 19}}, {1, {19}}, {2, {300, 257}}, {2, {1100, 2048}}};

static dg_tensor *new_param(const char *name, const dg_tensor *host, dg_device dev) {
    dg_tensor *p = dg_keep(dg_clone(dg_to_device((dg_tensor *)host, dev)));
    dg_set_name(p, name);
    return p;
}

static dg_tensor *on_host(const dg_tensor *t) { return dg_to_device((dg_tensor *)t, DG_CPU); }

static bool same_bits(const dg_tensor *a, const dg_tensor *b) {
    dg_tensor *ha = on_host(a), *hb = on_host(b);
    return ha && hb && ha->dtype == hb->dtype && dg_numel(ha) == dg_numel(hb) &&
           !memcmp(dg_data_ptr(ha), dg_data_ptr(hb), (size_t)dg_numel(ha) * dg_dtype_size(ha->dtype));
}

static bool same_double(double a, double b) { return (isnan(a) && isnan(b)) || !memcmp(&a, &b, sizeof a); }

/* p->grad = a copy of host on p's device: into the existing buffer unless fresh (a new buffer) */
static void set_grad(dg_tensor *p, const dg_tensor *host, bool fresh) {
    dg_tensor *g = dg_to_device((dg_tensor *)host, p->device);
    if (p->grad && !fresh) {
        assert_int_equal(dg_copy_(p->grad, g), 0);
        return;
    }
    dg_release(p->grad);
    p->grad = dg_keep(dg_clone(g));
}

static void drop_grad(dg_tensor *p) {
    dg_release(p->grad);
    p->grad = NULL;
}

/* Two optimisers over copies of the same parameters on dev. */
typedef struct {
    dg_tensor *pa[NP], *pb[NP];
    dg_adamw *a, *b; /* a steps fused, b the old way */
} pair;

static void pair_new(pair *s, const shape2 *shapes, dg_device dev, dg_rng *rng) {
    dg_adamw_config cfg = dg_adamw_default_config();
    cfg.weight_decay = 0.1;
    for (int i = 0; i < NP; i++) {
        dg_tensor *h = dg_randn(shapes[i].ndim, shapes[i].shape, DG_F32, rng);
        s->pa[i] = new_param(kNames[i], h, dev);
        s->pb[i] = new_param(kNames[i], h, dev);
    }
    s->a = dg_adamw_new(NP, s->pa, &cfg);
    s->b = dg_adamw_new(NP, s->pb, &cfg);
    assert_non_null(s->a);
    assert_non_null(s->b);
}

static void pair_free(pair *s) {
    dg_adamw_free(s->a);
    dg_adamw_free(s->b);
    for (int i = 0; i < NP; i++) {
        dg_release(s->pa[i]);
        dg_release(s->pb[i]);
    }
}

static void assert_pair_equal(const pair *s, int step) {
    for (int i = 0; i < NP; i++)
        if (!same_bits(s->pa[i], s->pb[i]) || !same_bits(s->a->m[i], s->b->m[i]) || !same_bits(s->a->v[i], s->b->v[i]))
            fail_msg("step %d: parameter %s or its moments differ between the fused and the old step (rel err %.3e)",
                     step, kNames[i], dg_test_rel_err(on_host(s->pa[i]), on_host(s->pb[i])));
    assert_int_equal(dg_adamw_step_count(s->a), s->b->step);
}

/* One step of the sequence in the file head. */
typedef struct {
    double scale, max_norm;
    int nan_at;    /* parameter whose gradient gets a NaN, or -1 */
    int drop;      /* parameter without a gradient this step, or -1 */
    int fresh;     /* parameter whose gradient gets a new buffer, or -1 */
    bool old_on_a; /* a steps the old way too */
    bool norm_f32; /* the norm comes back in an f32 tensor */
    bool skips;    /* the step is expected to be skipped */
} step_case;

static const step_case kSteps[] = {
    {1.0, 1e9, -1, -1, -1, false, false, false},  {100.0, 1.0, -1, -1, -1, false, false, false},
    {1.0, 1.0, 1, -1, -1, false, false, true},    {1.0, 0.0, -1, -1, -1, false, true, false},
    {50.0, 1.0, -1, -1, -1, true, false, false},  {1.0, 1.0, -1, 2, -1, false, false, false},
    {100.0, 2.0, -1, -1, 2, false, false, false}, {3.0, 1.0, -1, -1, -1, false, false, false},
};

static void run_sequence(const shape2 *shapes, dg_device dev) {
    dg_rng rng = dg_rng_new(23);
    dg_scope_begin();
    pair s;
    pair_new(&s, shapes, dev, &rng);
    int64_t skipped = 0;
    for (int k = 0; k < (int)(sizeof kSteps / sizeof kSteps[0]); k++) {
        const step_case *c = &kSteps[k];
        dg_scope_begin();
        dg_tensor *h[NP] = {0};
        for (int i = 0; i < NP; i++) {
            if (i == c->drop) {
                drop_grad(s.pa[i]);
                drop_grad(s.pb[i]);
                continue;
            }
            h[i] = dg_mul_scalar(dg_randn(shapes[i].ndim, shapes[i].shape, DG_F32, &rng), c->scale);
            if (i == c->nan_at) ((float *)dg_data_ptr(h[i]))[3] = NAN;
            set_grad(s.pa[i], h[i], i == c->fresh);
            set_grad(s.pb[i], h[i], i == c->fresh);
        }
        double lr = 1e-2 * (1.0 + k) / 4.0, na;
        if (c->old_on_a) {
            na = dg_clip_grad_norm(NP, s.pa, c->max_norm);
            if (isfinite(na)) assert_int_equal(dg_adamw_step(s.a, lr), 0);
        } else {
            dg_tensor *out = dg_zeros_on(1, (int64_t[]){1}, c->norm_f32 ? DG_F32 : DG_F64, dev);
            assert_int_equal(dg_adamw_step_clipped(s.a, lr, c->max_norm, out), 0);
            dg_tensor *ho = on_host(out);
            na = c->norm_f32 ? *(float *)dg_data_ptr(ho) : *(double *)dg_data_ptr(ho);
            skipped += c->skips;
            assert_int_equal(dg_adamw_skipped(s.a), skipped);
            for (int i = 0; i < NP; i++) /* the gradients are not clipped in place */
                if (h[i] && !same_bits(s.pa[i]->grad, h[i])) fail_msg("step %d: the fused step changed a gradient", k);
        }
        double nb = dg_clip_grad_norm(NP, s.pb, c->max_norm);
        if (isfinite(nb)) assert_int_equal(dg_adamw_step(s.b, lr), 0);
        assert_true(isfinite(nb) == !c->skips);
        if (!same_double(na, c->norm_f32 ? (double)(float)nb : nb))
            fail_msg("step %d: norm %.17g (fused) but %.17g (old)", k, na, nb);
        if (!c->old_on_a) assert_true(same_double(dg_adamw_last_norm(s.a), nb));
        assert_pair_equal(&s, k);
        dg_scope_end();
    }
    assert_int_equal(dg_adamw_step_count(s.a), (int64_t)(sizeof kSteps / sizeof kSteps[0]) - 1);
    pair_free(&s);
    dg_scope_end();
}

static void test_fused_host_equals_old_path(void **state) {
    (void)state;
    run_sequence(kHostShapes, DG_CPU);
}

static void test_fused_device_equals_old_path(void **state) {
    (void)state;
    dg_test_require_cuda();
    run_sequence(kDeviceShapes, DG_CUDA);
}

/* A non-finite loss skips a step whose gradients are finite; a finite one does not. */
static void loss_skips(dg_device dev) {
    dg_rng rng = dg_rng_new(5);
    dg_scope_begin();
    pair s;
    pair_new(&s, kHostShapes, dev, &rng);
    dg_tensor *before[NP];
    for (int i = 0; i < NP; i++) {
        set_grad(s.pa[i], dg_randn(kHostShapes[i].ndim, kHostShapes[i].shape, DG_F32, &rng), false);
        before[i] = dg_clone(s.pa[i]);
    }
    dg_tensor *loss = dg_to_device(dg_full(1, (int64_t[]){1}, DG_F32, NAN), dev);
    dg_adamw_fused_args a = {.lr = 1e-2, .max_norm = 1.0, .loss = loss};
    assert_int_equal(dg_adamw_step_fused(s.a, &a), 0);
    assert_int_equal(dg_adamw_skipped(s.a), 1);
    assert_int_equal(dg_adamw_step_count(s.a), 0);
    for (int i = 0; i < NP; i++) assert_true(same_bits(s.pa[i], before[i]));
    a.loss = dg_to_device(dg_full(1, (int64_t[]){1}, DG_F64, 2.5), dev);
    assert_int_equal(dg_adamw_step_fused(s.a, &a), 0);
    assert_int_equal(dg_adamw_skipped(s.a), 1);
    assert_int_equal(dg_adamw_step_count(s.a), 1);
    assert_false(same_bits(s.pa[0], before[0]));
    pair_free(&s);
    dg_scope_end();
}

static void test_fused_host_loss_skips(void **state) {
    (void)state;
    loss_skips(DG_CPU);
}

static void test_fused_device_loss_skips(void **state) {
    (void)state;
    dg_test_require_cuda();
    loss_skips(DG_CUDA);
}

/* Bad arguments: an error naming the argument, and nothing changes. */
static void test_fused_host_errors(void **state) {
    (void)state;
    dg_rng rng = dg_rng_new(9);
    dg_scope_begin();
    pair s;
    pair_new(&s, kHostShapes, DG_CPU, &rng);
    for (int i = 0; i < NP; i++)
        set_grad(s.pa[i], dg_randn(kHostShapes[i].ndim, kHostShapes[i].shape, DG_F32, &rng), false);
    dg_tensor *p0 = dg_clone(s.pa[0]);
    assert_int_equal(dg_adamw_step_clipped(s.a, -1.0, 1.0, NULL), -1);
    assert_error_contains("learning rate");
    assert_int_equal(dg_adamw_step_clipped(s.a, 1e-2, 1.0, dg_zeros(1, (int64_t[]){2}, DG_F32)), -1);
    assert_error_contains("norm_out");
    dg_adamw_fused_args a = {.lr = 1e-2, .lr_dev = dg_zeros(1, (int64_t[]){1}, DG_F64)};
    assert_int_equal(dg_adamw_step_fused(s.a, &a), -1);
    assert_error_contains("lr_dev");
    a = (dg_adamw_fused_args){.lr = 1e-2, .loss = dg_zeros(1, (int64_t[]){1}, DG_I64)};
    assert_int_equal(dg_adamw_step_fused(s.a, &a), -1);
    assert_error_contains("loss");
    dg_tensor *g0 = s.pa[0]->grad;
    s.pa[0]->grad = dg_keep(dg_zeros(1, (int64_t[]){3}, DG_F32));
    assert_int_equal(dg_adamw_step_clipped(s.a, 1e-2, 1.0, NULL), -1);
    assert_error_contains("grad of parameter 0");
    dg_release(s.pa[0]->grad);
    s.pa[0]->grad = g0;
    assert_true(same_bits(s.pa[0], p0));
    assert_int_equal(dg_adamw_step_count(s.a), 0);
    assert_int_equal(dg_adamw_skipped(s.a), 0);
    assert_true(isnan(dg_adamw_last_norm(s.a)));
    /* shadows are for device parameters */
    assert_int_equal(dg_adamw_set_shadow(s.a, 1, dg_zeros(1, (int64_t[]){19}, DG_BF16)), -1);
    assert_error_contains("bf16 shadow");
    assert_int_equal(dg_adamw_set_shadow(s.a, NP, NULL), -1);
    assert_error_contains("out of range");
    assert_int_equal(dg_adamw_make_shadows(s.a), 0); /* no device parameter: none made */
    for (int i = 0; i < NP; i++) assert_null(dg_adamw_shadow(s.a, i));
    pair_free(&s);
    dg_scope_end();
}

/* The learning rate read from a device f64 scalar equals the same rate passed as an argument. */
static void test_fused_device_lr_dev(void **state) {
    (void)state;
    dg_test_require_cuda();
    dg_rng rng = dg_rng_new(31);
    dg_scope_begin();
    pair s;
    pair_new(&s, kDeviceShapes, DG_CUDA, &rng);
    dg_tensor *lr_dev = dg_keep(dg_zeros_on(1, (int64_t[]){1}, DG_F64, DG_CUDA));
    for (int k = 0; k < 3; k++) {
        dg_scope_begin();
        double lr = 3e-3 * (k + 1);
        assert_int_equal(dg_copy_(lr_dev, dg_to_device(dg_full(1, (int64_t[]){1}, DG_F64, lr), DG_CUDA)), 0);
        for (int i = 0; i < NP; i++) {
            dg_tensor *h = dg_mul_scalar(dg_randn(kDeviceShapes[i].ndim, kDeviceShapes[i].shape, DG_F32, &rng), 30.0);
            set_grad(s.pa[i], h, false);
            set_grad(s.pb[i], h, false);
        }
        dg_adamw_fused_args a = {.lr = NAN, .max_norm = 5.0, .lr_dev = lr_dev}; /* lr itself is not read */
        assert_int_equal(dg_adamw_step_fused(s.a, &a), 0);
        if (isfinite(dg_clip_grad_norm(NP, s.pb, 5.0))) assert_int_equal(dg_adamw_step(s.b, lr), 0);
        assert_pair_equal(&s, k);
        dg_scope_end();
    }
    dg_release(lr_dev);
    pair_free(&s);
    dg_scope_end();
}

/* shadow == bf16(p), element by element, with the host's rounding (nearest even) */
static void assert_shadow_of(const dg_tensor *shadow, const dg_tensor *p, const char *when) {
    dg_tensor *hs = on_host(shadow), *hp = on_host(p);
    assert_int_equal(hs->dtype, DG_BF16);
    const uint16_t *s16 = dg_data_ptr(hs);
    const float *pf = dg_data_ptr(hp);
    for (int64_t j = 0; j < dg_numel(hp); j++)
        if (s16[j] != dg_bf16_from_f32(pf[j]))
            fail_msg("%s: shadow element %lld is 0x%04x but bf16(p) is 0x%04x", when, (long long)j, s16[j],
                     dg_bf16_from_f32(pf[j]));
}

/* bf16 shadows follow the parameters through fused, skipped and old steps. */
static void test_device_shadows(void **state) {
    (void)state;
    dg_test_require_cuda();
    dg_rng rng = dg_rng_new(41);
    dg_scope_begin();
    pair s;
    pair_new(&s, kDeviceShapes, DG_CUDA, &rng);
    /* errors first: an f32 tensor, a wrong shape */
    assert_int_equal(dg_adamw_set_shadow(s.a, 0, dg_zeros_on(1, (int64_t[]){19}, DG_F32, DG_CUDA)), -1);
    assert_error_contains("bf16 shadow");
    assert_int_equal(dg_adamw_set_shadow(s.a, 0, dg_zeros_on(1, (int64_t[]){19}, DG_BF16, DG_CUDA)), -1);
    assert_error_contains("bf16 shadow");
    /* parameter 1 gets a shadow of the caller's, the others the optimiser's own */
    dg_tensor *mine = dg_zeros_on(1, (int64_t[]){19}, DG_BF16, DG_CUDA);
    assert_int_equal(dg_adamw_set_shadow(s.a, 1, mine), 0);
    assert_int_equal(dg_adamw_make_shadows(s.a), 0);
    assert_ptr_equal(dg_adamw_shadow(s.a, 1), mine);
    for (int i = 0; i < NP; i++) {
        assert_non_null(dg_adamw_shadow(s.a, i));
        assert_shadow_of(dg_adamw_shadow(s.a, i), s.pa[i], "attached");
    }
    const step_case *seq = kSteps; /* fused, clipped, skipped, ..., an old step at 4 */
    for (int k = 0; k < 6; k++) {
        dg_scope_begin();
        for (int i = 0; i < NP; i++) {
            dg_tensor *h =
                dg_mul_scalar(dg_randn(kDeviceShapes[i].ndim, kDeviceShapes[i].shape, DG_F32, &rng), seq[k].scale);
            if (i == seq[k].nan_at) ((float *)dg_data_ptr(h))[0] = NAN;
            set_grad(s.pa[i], h, false);
        }
        dg_tensor *before = dg_clone(s.pa[0]);
        if (seq[k].old_on_a) {
            if (isfinite(dg_clip_grad_norm(NP, s.pa, seq[k].max_norm))) assert_int_equal(dg_adamw_step(s.a, 1e-2), 0);
        } else {
            assert_int_equal(dg_adamw_step_clipped(s.a, 1e-2, seq[k].max_norm, NULL), 0);
        }
        assert_true(same_bits(s.pa[0], before) == seq[k].skips);
        char when[32];
        snprintf(when, sizeof when, "after step %d", k);
        for (int i = 0; i < NP; i++) assert_shadow_of(dg_adamw_shadow(s.a, i), s.pa[i], when);
        dg_scope_end();
    }
    assert_int_equal(dg_adamw_set_shadow(s.a, 1, NULL), 0);
    assert_null(dg_adamw_shadow(s.a, 1));
    pair_free(&s);
    dg_scope_end();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fused_host_equals_old_path),
        cmocka_unit_test(test_fused_host_loss_skips),
        cmocka_unit_test(test_fused_host_errors),
        cmocka_unit_test(test_fused_device_equals_old_path),
        cmocka_unit_test(test_fused_device_loss_skips),
        cmocka_unit_test(test_fused_device_lr_dev),
        cmocka_unit_test(test_device_shadows),
    };
    return dg_test_run_filtered(tests);
}
