/* linear_cross_entropy on the device at a language model's vocabulary (C = 32000, several chunks of
 * rows, the last one shorter), against linear + cross_entropy on the device and against the CPU in
 * f64 from the same values (the unfused f64 reference: logits and dlogits stored whole):
 *  - f32: loss, dx and dw within 1e-5 relative error norm of the f64 reference (cuBLAS runs strict
 *    f32, the row sums are f64) and of the unfused device result, for the default chunks and for
 *    chunks of 100 rows (16 chunks, the last of 36);
 *  - bf16 (x and w rounded to bf16, the reference from the same rounded values): the fused loss
 *    within 1e-5 (its logits are f32 sums of exact products, never rounded to bf16), dx and dw
 *    within 2^-8 (the gradient of the logits is rounded once to bf16 for the two products);
 *  - mixed precision: w the bf16 cast of an f32 master weight gets its gradient in f32 (the f32
 *    sum over the chunks, not a bf16 rounding of it), within 2^-8 of the reference;
 *  - memory: the fused op's peak device memory is lower than the unfused one's by at least the
 *    [N, C] f32 logits it never stores.
 * Every test skips without a GPU. */
#include "tests/support/test_support.h"

#include <math.h>

enum { N = 1536, D = 256, C = 32000, IGNORE = -100 };

static const double bf16_tol = 0.00390625; /* 2^-8: one bf16 rounding of the gradient */

typedef struct {
    dg_tensor *x, *w, *t; /* host f64 x, w; host targets */
} inputs;

/* x ~ N(0, 1), w ~ N(0, 0.1^2): logits of spread about 1.6; every 11th target ignored */
static inputs make_inputs(void) {
    dg_rng rng = dg_rng_new(2026);
    inputs in;
    in.x = dg_randn(DG_SHAPE(N, D), DG_F64, &rng);
    in.w = dg_mul_scalar(dg_randn(DG_SHAPE(C, D), DG_F64, &rng), 0.1);
    in.t = dg_empty(DG_SHAPE(N), DG_I64);
    int64_t *tp = dg_data_ptr(in.t);
    for (int64_t i = 0; i < N; i++) tp[i] = i % 11 == 3 ? IGNORE : (int64_t)(dg_rng_u32(&rng) % C);
    return in;
}

/* loss, dx, dw as host f64 tensors: x and w converted to dt on dev (w_master: w is an f32 master
 * on dev cast to bf16, its gradient that of the master); fused with chunk rows ch, or unfused */
static void run(const inputs *in, dg_device dev, dg_dtype dt, bool w_master, bool fused, int64_t ch, dg_tensor **out) {
    /* fresh leaves (a conversion to the same dtype and device may return its input) */
    dg_tensor *x = dg_clone(dg_to_device(dg_to_dtype(in->x, dt), dev));
    dg_tensor *w = dg_clone(dg_to_device(dg_to_dtype(in->w, w_master ? DG_F32 : dt), dev));
    dg_tensor *t = dg_to_device(in->t, dev);
    dg_set_requires_grad(x, true);
    dg_set_requires_grad(w, true);
    dg_tensor *wu = w_master ? dg_to_dtype(w, DG_BF16) : w;
    dg_tensor *l =
        fused ? dg_linear_cross_entropy(x, wu, t, IGNORE, ch) : dg_cross_entropy(dg_linear(x, wu, NULL), t, IGNORE);
    if (!l || dg_backward(l, NULL) != 0)
        fail_msg("%s on %s: %s", fused ? "fused" : "unfused", dg_device_name(dev), dg_last_error());
    assert_int_equal(x->grad->dtype, dt);
    assert_int_equal(w->grad->dtype, w_master ? DG_F32 : dt);
    dg_tensor *res[3] = {l, x->grad, w->grad};
    for (int i = 0; i < 3; i++) out[i] = dg_to_dtype(dg_to_device(res[i], DG_CPU), DG_F64);
}

static void expect_close(const char *what, dg_tensor *const *got, dg_tensor *const *ref, double tol_loss,
                         double tol_grad) {
    static const char *const names[3] = {"loss", "dx", "dw"};
    double e[3];
    for (int i = 0; i < 3; i++) {
        e[i] = dg_test_rel_err(got[i], ref[i]);
        if (!(e[i] <= (i ? tol_grad : tol_loss)))
            fail_msg("%s: %s relative error %.3e > %.3e", what, names[i], e[i], i ? tol_grad : tol_loss);
    }
    print_message("  %-52s loss %.2e  dx %.2e  dw %.2e\n", what, e[0], e[1], e[2]);
}

/* x and w rounded to bf16 and back (the values a bf16 run sees) */
static inputs rounded(const inputs *in) {
    inputs r = *in;
    r.x = dg_to_dtype(dg_to_dtype(in->x, DG_BF16), DG_F64);
    r.w = dg_to_dtype(dg_to_dtype(in->w, DG_BF16), DG_F64);
    return r;
}

static void test_f32_matches_unfused_and_f64(void **state) {
    (void)state;
    dg_test_require_cuda();
    dg_scope_begin();
    inputs in = make_inputs();
    dg_tensor *ref[3], *unf[3], *fu[3], *fu100[3];
    run(&in, DG_CPU, DG_F64, false, false, 0, ref);
    run(&in, DG_CUDA, DG_F32, false, false, 0, unf);
    run(&in, DG_CUDA, DG_F32, false, true, 0, fu);
    run(&in, DG_CUDA, DG_F32, false, true, 100, fu100);
    expect_close("f32 unfused (device) vs cpu f64", unf, ref, 1e-5, 1e-5);
    expect_close("f32 fused, default chunks, vs cpu f64", fu, ref, 1e-5, 1e-5);
    expect_close("f32 fused, chunks of 100, vs cpu f64", fu100, ref, 1e-5, 1e-5);
    expect_close("f32 fused vs unfused (device)", fu, unf, 1e-5, 1e-5);
    /* the device f64 path as well, to rounding */
    dg_tensor *f64d[3];
    run(&in, DG_CUDA, DG_F64, false, true, 700, f64d);
    expect_close("f64 fused (device), chunks of 700, vs cpu f64", f64d, ref, 1e-12, 1e-12);
    dg_scope_end();
}

static void test_bf16_matches_f64(void **state) {
    (void)state;
    dg_test_require_cuda();
    dg_scope_begin();
    inputs in0 = make_inputs(), in = rounded(&in0);
    dg_tensor *ref[3], *unf[3], *fu[3], *mp[3];
    run(&in, DG_CPU, DG_F64, false, false, 0, ref);
    run(&in, DG_CUDA, DG_BF16, false, false, 0, unf);
    run(&in, DG_CUDA, DG_BF16, false, true, 0, fu);
    run(&in, DG_CUDA, DG_BF16, true, true, 0, mp);
    /* the unfused bf16 loss reads logits rounded to bf16: printed for comparison, bounded by 2^-8 */
    expect_close("bf16 unfused (device) vs cpu f64", unf, ref, bf16_tol, bf16_tol);
    expect_close("bf16 fused vs cpu f64", fu, ref, 1e-5, bf16_tol);
    expect_close("bf16 fused, f32 master weight, vs cpu f64", mp, ref, 1e-5, bf16_tol);
    dg_scope_end();
}

/* peak device bytes of one forward and backward, above what was live before */
static double peak_of(const inputs *in, bool fused) {
    dg_tensor *out[3];
    size_t base = dg_live_bytes(DG_CUDA);
    dg_reset_peak_bytes(DG_CUDA);
    dg_scope_begin();
    run(in, DG_CUDA, DG_F32, false, fused, 0, out);
    dg_scope_end();
    return (double)(dg_peak_bytes(DG_CUDA) - base);
}

static void test_memory(void **state) {
    (void)state;
    dg_test_require_cuda();
    dg_scope_begin();
    inputs in = make_inputs();
    double logits = 4.0 * N * C, fused = peak_of(&in, true), unfused = peak_of(&in, false);
    print_message("  peak device memory, N %d D %d C %d f32: fused %.1f MB, unfused %.1f MB (logits %.1f MB)\n", N, D,
                  C, fused / 1e6, unfused / 1e6, logits / 1e6);
    if (!(fused + logits <= unfused))
        fail_msg("the fused op's peak %.1f MB is not below the unfused %.1f MB by the logits' %.1f MB", fused / 1e6,
                 unfused / 1e6, logits / 1e6);
    dg_scope_end();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32_matches_unfused_and_f64),
        cmocka_unit_test(test_bf16_matches_f64),
        cmocka_unit_test(test_memory),
    };
    return dg_test_run_filtered(tests);
}
