/* bf16 on the device for the core ops (elementwise, reductions, matmul), on constructed inputs
 * whose exact answers are known, so that each check fails if a value is rounded more than once or
 * accumulated in bf16:
 *  - sums and means of 10^6 ones (f64 accumulation: 10^6 rounded once to bf16, not the 256 at
 *    which a bf16 accumulator stalls), over rows, columns and every element;
 *  - the 8-wide kernels of contiguous bf16 (unary, its backward, binary) give the bits of the
 *    one-element kernels (a misaligned view of the same values takes those), for lengths around
 *    multiples of 8, and match the CPU f32 result of the same inputs within one bf16 rounding;
 *  - so do the 8-wide f32 <-> bf16 casts and f32 binary arithmetic, which equal the host's bits;
 *  - the gradient of a broadcast bf16 product is summed before its one rounding: terms
 *    (1 + 2^-7)^2 - (1 + 2^-7) sum to 2 + 2^-6 exactly, where rounding each product to bf16 first
 *    gives 2;
 *  - an f32 weight cast to bf16 for a matmul or a linear gets its gradient in f32 straight from cuBLAS (a
 *    value that bf16 cannot hold survives), with the batch folded into the product, and the
 *    contributions of a matmul (f32) and of a bf16 op to the same cast add up;
 *  - the kernels refuse dtypes they do not take (before touching the device: runs everywhere).
 * The CUDA ones skip without a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "deltagrad.h"
#include "tests/support/test_support.h"
#ifdef DG_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

/* a host f32 tensor of n values v(i), as bf16 on the device */
static dg_tensor *device_bf16(int ndim, const int64_t *shape, double (*v)(int64_t)) {
    dg_tensor *h = dg_empty(ndim, shape, DG_F32);
    float *p = dg_data_ptr(h);
    for (int64_t i = 0; i < dg_numel(h); i++) p[i] = (float)v(i);
    return dg_to_device(dg_to_dtype(h, DG_BF16), DG_CUDA);
}

/* t (any device and dtype) as a contiguous host f32 tensor */
static dg_tensor *host_f32(dg_tensor *t) { return dg_contiguous(dg_to_dtype(dg_to_device(t, DG_CPU), DG_F32)); }

static float bf16_round(float x) { return dg_bf16_to_f32(dg_bf16_from_f32(x)); }

/* ---- reductions ---- */

static double one(int64_t i) {
    (void)i;
    return 1.0;
}

static void test_sum_of_ones_is_exact(void **state) {
    (void)state;
    dg_test_require_cuda();
    dg_scope_begin();
    dg_tensor *x = device_bf16(1, (int64_t[]){1000000}, one);
    assert_true(dg_item(host_f32(dg_sum_all(x))) == bf16_round(1e6f));
    assert_true(dg_item(host_f32(dg_mean_all(x))) == 1.0);
    /* [1000, 1000] over rows (a column pass) and over columns (a row pass): 1000 is exact in bf16 */
    dg_tensor *x2 = dg_reshape(x, 2, (int64_t[]){1000, 1000});
    for (int d = 0; d < 2; d++) {
        dg_tensor *s = dg_sum(x2, 1, &d, false);
        assert_int_equal(s->dtype, DG_BF16);
        const float *p = dg_data_ptr(host_f32(s));
        for (int64_t i = 0; i < 1000; i++)
            if (p[i] != 1000.0f) fail_msg("sum over dim %d: element %lld is %g, not 1000", d, (long long)i, p[i]);
    }
    /* long rows: split into partial sums, then one rounding */
    dg_tensor *x3 = dg_reshape(x, 2, (int64_t[]){4, 250000});
    int d1 = 1;
    const float *p = dg_data_ptr(host_f32(dg_sum(x3, 1, &d1, false)));
    for (int i = 0; i < 4; i++) assert_true(p[i] == bf16_round(250000.0f));
    dg_scope_end();
}

/* ---- elementwise: 8-wide and one-element kernels ---- */

static double wave(int64_t i) { return 3.0 * sin(0.37 * (double)i + 0.1); }
static double positive(int64_t i) { return 0.6 + 0.5 * (1.0 + sin(0.11 * (double)i)); }

/* the first n elements of a fresh [n + 1] device copy of x (its dtype) starting at element `at`
 * (0: 16-byte aligned, the 8-wide kernels; 1: one element off, the one-element kernels) */
static dg_tensor *placed(dg_tensor *x, int at) {
    int64_t n = dg_numel(x);
    dg_tensor *base = dg_zeros_on(1, (int64_t[]){n + 1}, x->dtype, DG_CUDA);
    dg_tensor *v = dg_slice(base, 0, at, at + n);
    assert_int_equal(dg_copy_(v, x), 0);
    return v;
}

static void expect_same_bits(const char *what, int64_t n, dg_tensor *a, dg_tensor *b) {
    dg_tensor *ha = dg_contiguous(dg_to_device(a, DG_CPU)), *hb = dg_contiguous(dg_to_device(b, DG_CPU));
    if (a->dtype != b->dtype || memcmp(dg_data_ptr(ha), dg_data_ptr(hb), (size_t)n * dg_dtype_size(a->dtype)))
        fail_msg("%s, n = %lld: the 8-wide and one-element kernels differ", what, (long long)n);
}

static void expect_close(const char *what, int64_t n, dg_tensor *gpu, dg_tensor *cpu_f32) {
    double e = dg_test_rel_err(host_f32(gpu), cpu_f32);
    if (!(e <= 0.00390625)) fail_msg("%s, n = %lld: relative error %.3e to the CPU f32 > 2^-8", what, (long long)n, e);
}

static dg_tensor *unary_named(int which, dg_tensor *x) {
    switch (which) {
    case 0: return dg_silu(x);
    case 1: return dg_sigmoid(x);
    case 2: return dg_exp(x);
    case 3: return dg_tanh(x);
    default: return dg_mul_scalar(x, -1.3);
    }
}

static void test_elementwise_vector_paths(void **state) {
    (void)state;
    dg_test_require_cuda();
    static const char *const names[] = {"silu", "sigmoid", "exp", "tanh", "mul_scalar"};
    const int64_t lengths[] = {1, 7, 8, 9, 15, 16, 17, 4099, (1 << 20) + 5};
    for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
        int64_t n = lengths[li];
        dg_scope_begin();
        dg_tensor *x = device_bf16(1, &n, wave), *y = device_bf16(1, &n, positive), *g = device_bf16(1, &n, wave);
        dg_tensor *xc = host_f32(x), *yc = host_f32(y), *gc = host_f32(g);
        for (int u = 0; u < 5; u++) {
            dg_tensor *out[2], *grad[2];
            for (int at = 0; at < 2; at++) {
                dg_tensor *xa = placed(x, at);
                dg_set_requires_grad(xa, true);
                out[at] = unary_named(u, xa);
                assert_int_equal(dg_backward(out[at], placed(g, at)), 0);
                grad[at] = xa->grad;
                assert_int_equal(grad[at]->dtype, DG_BF16);
            }
            expect_same_bits(names[u], n, out[0], out[1]);
            expect_same_bits(names[u], n, grad[0], grad[1]);
            dg_tensor *xr = dg_clone(xc);
            dg_set_requires_grad(xr, true);
            dg_tensor *ref = unary_named(u, xr);
            assert_int_equal(dg_backward(ref, gc), 0);
            expect_close(names[u], n, out[0], ref);
            expect_close(names[u], n, grad[0], xr->grad);
        }
        dg_tensor *(*const binary[])(dg_tensor *, dg_tensor *) = {dg_add, dg_sub, dg_mul, dg_div};
        static const char *const bnames[] = {"add", "sub", "mul", "div"};
        for (int b = 0; b < 4; b++) {
            dg_tensor *o0 = binary[b](placed(x, 0), placed(y, 0)), *o1 = binary[b](placed(x, 1), placed(y, 1));
            expect_same_bits(bnames[b], n, o0, o1);
            expect_close(bnames[b], n, o0, binary[b](xc, yc));
        }
        dg_scope_end();
    }
}

/* f32 <-> bf16 casts and f32 binary arithmetic (the master weights' casts and gradient sums): the
 * 8-wide kernels give the bits of the one-element kernels and of the host (the cast rounds to
 * nearest even, the sum is one f32 addition) */
static void test_f32_vector_paths(void **state) {
    (void)state;
    dg_test_require_cuda();
    const int64_t lengths[] = {1, 7, 8, 9, 17, 4099, (1 << 20) + 5};
    for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
        int64_t n = lengths[li];
        dg_scope_begin();
        dg_tensor *xh = dg_empty(1, &n, DG_F32), *yh = dg_empty(1, &n, DG_F32);
        float *xp = dg_data_ptr(xh), *yp = dg_data_ptr(yh);
        for (int64_t i = 0; i < n; i++) { /* values between bf16's: the rounding is exercised */
            xp[i] = (float)(wave(i) * (1.0 + 1e-3 * (double)(i % 97)));
            yp[i] = (float)positive(i) * 1e-3f;
        }
        dg_tensor *x = dg_to_device(xh, DG_CUDA), *y = dg_to_device(yh, DG_CUDA);
        dg_tensor *down[2], *up[2], *sum[2];
        for (int at = 0; at < 2; at++) {
            down[at] = dg_to_dtype(placed(x, at), DG_BF16);
            up[at] = dg_to_dtype(placed(down[0], at), DG_F32);
            sum[at] = dg_add(placed(x, at), placed(y, at));
        }
        expect_same_bits("cast f32 -> bf16", n, down[0], down[1]);
        expect_same_bits("cast bf16 -> f32", n, up[0], up[1]);
        expect_same_bits("add f32", n, sum[0], sum[1]);
        const float *dp = dg_data_ptr(host_f32(down[0])), *up0 = dg_data_ptr(host_f32(up[0]));
        const float *sp = dg_data_ptr(host_f32(sum[0]));
        for (int64_t i = 0; i < n; i++) {
            if (dp[i] != bf16_round(xp[i]) || up0[i] != dp[i])
                fail_msg("cast, n = %lld, element %lld: %.9g -> %.9g -> %.9g, not round to nearest even %.9g",
                         (long long)n, (long long)i, xp[i], dp[i], up0[i], bf16_round(xp[i]));
            if (sp[i] != xp[i] + yp[i])
                fail_msg("add f32, n = %lld, element %lld: %.9g, not %.9g", (long long)n, (long long)i, sp[i],
                         xp[i] + yp[i]);
        }
        dg_scope_end();
    }
}

/* ---- one rounding of broadcast gradients ---- */

static double alternating(int64_t i) { return (i / 4) % 2 ? -1.0 : 1.0 + 1.0 / 128; }
static double just_above_one(int64_t i) {
    (void)i;
    return 1.0 + 1.0 / 128;
}

static void test_broadcast_gradient_rounds_once(void **state) {
    (void)state;
    dg_test_require_cuda();
    dg_scope_begin();
    /* out = x * w, x [512, 4], w [4]: dw = sum over rows of g x with g = 1 + 2^-7 and x
     * alternating 1 + 2^-7 and -1: each pair of rows adds 2^-7 + 2^-14, 256 pairs 2 + 2^-6 */
    dg_tensor *x = device_bf16(2, (int64_t[]){512, 4}, alternating);
    dg_tensor *w = device_bf16(1, (int64_t[]){4}, just_above_one);
    dg_tensor *g = device_bf16(2, (int64_t[]){512, 4}, just_above_one);
    dg_set_requires_grad(w, true);
    assert_int_equal(dg_backward(dg_mul(x, w), g), 0);
    assert_int_equal(w->grad->dtype, DG_BF16);
    const float *p = dg_data_ptr(host_f32(w->grad));
    for (int j = 0; j < 4; j++)
        if (p[j] != 2.015625f) fail_msg("mul: dw[%d] = %.9g, not 2 + 2^-6 (products rounded before the sum?)", j, p[j]);
    /* out = x / v with v [4] of ones: dv = -sum over rows of g x / v^2, the same sum negated */
    dg_tensor *v = device_bf16(1, (int64_t[]){4}, one);
    dg_set_requires_grad(v, true);
    assert_int_equal(dg_backward(dg_div(x, v), g), 0);
    p = dg_data_ptr(host_f32(v->grad));
    for (int j = 0; j < 4; j++)
        if (p[j] != -2.015625f) fail_msg("div: dv[%d] = %.9g, not -(2 + 2^-6)", j, p[j]);
    dg_scope_end();
}

/* ---- matmul: the f32 weight's gradient in f32 ---- */

static void test_matmul_f32_weight_gradient(void **state) {
    (void)state;
    dg_test_require_cuda();
    dg_scope_begin();
    /* a [2, 3, 4] bf16 of 1 + 2^-7, w [4, 5] f32 (master) cast to bf16; with the seed 1 + 2^-7,
     * dw = sum over the 6 rows of (1 + 2^-7)^2 = 6 (1 + 2^-6 + 2^-14): exact in f32, not in bf16 */
    dg_tensor *a = device_bf16(3, (int64_t[]){2, 3, 4}, just_above_one);
    dg_tensor *w = dg_to_device(dg_full(2, (int64_t[]){4, 5}, DG_F32, 0.5), DG_CUDA);
    dg_set_requires_grad(w, true);
    dg_tensor *wb = dg_to_dtype(w, DG_BF16);
    dg_tensor *out = dg_matmul(a, wb);
    assert_int_equal(out->dtype, DG_BF16);
    assert_int_equal(dg_backward(out, device_bf16(3, (int64_t[]){2, 3, 5}, just_above_one)), 0);
    assert_int_equal(w->grad->dtype, DG_F32);
    const double r = 1.0 + 1.0 / 128, want = 6.0 * r * r;
    const float *p = dg_data_ptr(host_f32(w->grad));
    for (int i = 0; i < 20; i++)
        if (p[i] != (float)want) fail_msg("dw[%d] = %.9g, not %.9g (rounded to bf16 on the way?)", i, p[i], want);
    /* linear (y = a w^T) gives the master weight [5, 4] its gradient in f32 the same way */
    dg_tensor *w2 = dg_to_device(dg_full(2, (int64_t[]){5, 4}, DG_F32, 0.5), DG_CUDA);
    dg_set_requires_grad(w2, true);
    dg_tensor *y = dg_linear(dg_reshape(a, 2, (int64_t[]){6, 4}), dg_to_dtype(w2, DG_BF16), NULL);
    assert_int_equal(dg_backward(y, device_bf16(2, (int64_t[]){6, 5}, just_above_one)), 0);
    assert_int_equal(w2->grad->dtype, DG_F32);
    p = dg_data_ptr(host_f32(w2->grad));
    for (int i = 0; i < 20; i++)
        if (p[i] != (float)want) fail_msg("linear: dw[%d] = %.9g, not %.9g", i, p[i], want);
    /* the same cast also used by a bf16 op: its bf16 contribution adds to the f32 one */
    dg_zero_grad(w);
    wb = dg_to_dtype(w, DG_BF16);
    dg_tensor *loss = dg_add(dg_sum_all(dg_matmul(a, wb)), dg_sum_all(dg_mul_scalar(wb, 2.0)));
    assert_int_equal(dg_backward(loss, NULL), 0);
    assert_int_equal(w->grad->dtype, DG_F32);
    p = dg_data_ptr(host_f32(w->grad));
    for (int i = 0; i < 20; i++)
        if (p[i] != (float)(6.0 * r + 2.0)) fail_msg("mixed: dw[%d] = %.9g, not %.9g", i, p[i], 6.0 * r + 2.0);
    dg_scope_end();
}

/* ---- refusals of the kernels (no device needed: the dtype is checked first) ---- */

static void test_kernels_refuse_other_dtypes(void **state) {
    (void)state;
#ifdef DG_HAVE_CUDA
    int64_t shape[1] = {4};
    assert_int_equal(dg_cuda_sum(DG_I32, 1, shape, NULL, NULL, 1u, 1.0, NULL), -1);
    assert_error_contains("i32");
    assert_int_equal(dg_cuda_sum(DG_F16, 1, shape, NULL, NULL, 1u, 1.0, NULL), -1);
    assert_error_contains("f16");
    assert_int_equal(dg_cuda_sum_mixed(DG_F64, DG_BF16, 1, shape, NULL, NULL, 1u, 1.0, NULL), -1);
    assert_error_contains("f64");
    assert_int_equal(dg_cuda_binary(DG_F16, DG_BIN_ADD, 1, shape, NULL, NULL, NULL, NULL, NULL), -1);
    assert_error_contains("f16");
    assert_int_equal(dg_cuda_binary_mixed(DG_F64, DG_BF16, DG_F64, DG_BIN_ADD, 1, shape, NULL, NULL, NULL, NULL, NULL),
                     -1);
    assert_error_contains("f64 does not mix");
    assert_int_equal(dg_cuda_unary_bwd(DG_I64, DG_UN_NEG, 4, NULL, NULL, NULL, NULL, 0), -1);
    assert_error_contains("i64");
#else
    dg_test_skip("a build without the CUDA backend has no device kernels");
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels_refuse_other_dtypes), cmocka_unit_test(test_sum_of_ones_is_exact),
        cmocka_unit_test(test_elementwise_vector_paths),    cmocka_unit_test(test_broadcast_gradient_rounds_once),
        cmocka_unit_test(test_matmul_f32_weight_gradient),  cmocka_unit_test(test_f32_vector_paths),
    };
    return dg_test_run_filtered(tests);
}
