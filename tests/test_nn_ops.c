/* The network-piece ops (ops/nn_*.c): forward values against plain reference loops, one semantic
 * check per op, bad-input messages, f32 against f64 on every sample, and gradients at sizes large
 * enough to take the threaded kernel paths.  (Gradcheck of the samples is test_registry's.) */
#include "tests/support/test_support.h"

#include "ops/gradcheck.h"
#include "kernels/cpu/nn.h"
#include "ops/op.h"

#include <math.h>
#include <string.h>

/* ---- helpers --------------------------------------------------------------------------------- */

static dg_rng rng;

static int setup(void **state) {
    rng = dg_rng_new(42);
    dg_scope_begin();
    return 0;
}
static int teardown(void **state) {
    dg_scope_end();
    dg_clear_error();
    return 0;
}

static dg_tensor *randn(int ndim, const int64_t *shape, dg_dtype dt) { return dg_randn(ndim, shape, dt, &rng); }
static double *f64p(dg_tensor *t) { return (double *)dg_data_ptr(t); }
static double sigm(double z) { return 1 / (1 + exp(-z)); }
static double silu(double z) { return z * sigm(z); }

static void assert_close(dg_tensor *got, dg_tensor *want, double tol, const char *what) {
    assert_non_null(got);
    assert_true(dg_same_shape(got, want));
    double e = dg_test_max_abs_diff(got, want);
    if (!(e <= tol)) fail_msg("%s: max abs diff %.3g > %.3g", what, e, tol);
}

#define EXPECT_ERROR(expr, msg)                          \
    do {                                                 \
        dg_clear_error();                                \
        assert_null(expr);                               \
        assert_non_null(strstr(dg_last_error(), (msg))); \
        dg_clear_error();                                \
    } while (0)

/* sum(y * r) for a fixed random r, so that every output element carries its own weight */
static dg_tensor *weighted_sum(dg_tensor *y, dg_tensor *r) { return dg_sum_all(dg_mul(y, r)); }

/* ---- linear ---------------------------------------------------------------------------------- */

/* y against the sum written out, for x [B,T,IN] and w [OUT,IN] */
static void check_linear_forward(int64_t B, int64_t T, int64_t IN, int64_t OUT) {
    dg_tensor *x = randn(DG_SHAPE(B, T, IN), DG_F64), *w = randn(DG_SHAPE(OUT, IN), DG_F64),
              *b = randn(DG_SHAPE(OUT), DG_F64);
    dg_tensor *y = dg_linear(x, w, b), *y0 = dg_linear(x, w, NULL);
    assert_non_null(y);
    assert_non_null(y0);
    assert_int_equal(y->ndim, 3);
    assert_int_equal(y->shape[2], OUT);
    dg_tensor *ref = dg_zeros(DG_SHAPE(B, T, OUT), DG_F64);
    for (int64_t n = 0; n < B * T; n++)
        for (int64_t o = 0; o < OUT; o++) {
            double s = f64p(b)[o];
            for (int64_t i = 0; i < IN; i++) s += f64p(x)[n * IN + i] * f64p(w)[o * IN + i];
            f64p(ref)[n * OUT + o] = s;
        }
    assert_close(y, ref, 1e-12, "linear");
    assert_close(dg_add(y0, b), ref, 1e-12, "linear without bias");
    /* x stored transposed gives the same values */
    dg_tensor *xt = dg_transpose(dg_clone(dg_transpose(x, 1, 2)), 1, 2);
    assert_false(dg_is_contiguous(xt));
    assert_close(dg_linear(xt, w, b), ref, 1e-12, "linear, strided x");
}

/* a few output features (the CPU's loops without a product), many (the product), and both with
 * enough rows for the threads to share them */
static void test_linear_forward(void **state) {
    check_linear_forward(2, 3, 5, 4);
    check_linear_forward(2, 3, 5, 12);
    check_linear_forward(2, 300, 70, 1);
    check_linear_forward(2, 300, 70, 9);
}

/* loss = sum(linear(x, w, b)): db[o] = number of rows, dw[o,i] = sum over every row of x[..,i],
 * dx[n,i] = sum over o of w[o,i]; with OUT = 4 (loops) and 10 (products), rows enough for threads */
static void check_linear_grads_sum(int64_t N, int64_t IN, int64_t OUT) {
    dg_tensor *x = randn(DG_SHAPE(2, N / 2, IN), DG_F64), *w = randn(DG_SHAPE(OUT, IN), DG_F64),
              *b = randn(DG_SHAPE(OUT), DG_F64);
    dg_set_requires_grad(x, true);
    dg_set_requires_grad(w, true);
    dg_set_requires_grad(b, true);
    assert_int_equal(dg_backward(dg_sum_all(dg_linear(x, w, b)), NULL), 0);
    for (int64_t i = 0; i < IN; i++) {
        double s = 0;
        for (int64_t o = 0; o < OUT; o++) s += f64p(w)[o * IN + i];
        for (int64_t n = 0; n < N; n++) assert_true(fabs(f64p(x->grad)[n * IN + i] - s) < 1e-12);
    }
    for (int64_t o = 0; o < OUT; o++) {
        assert_true(fabs(dg_get(b->grad, (int64_t[]){o}) - (double)N) < 1e-12);
        for (int64_t i = 0; i < IN; i++) {
            double s = 0;
            for (int64_t n = 0; n < N; n++) s += f64p(x)[n * IN + i];
            assert_true(fabs(dg_get(w->grad, (int64_t[]){o, i}) - s) < 1e-9);
        }
    }
}

static void test_linear_grads_sum_over_leading_dims(void **state) {
    check_linear_grads_sum(6, 5, 4);
    check_linear_grads_sum(6, 5, 10);
    check_linear_grads_sum(600, 70, 2);
}

static void test_linear_bad_input(void **state) {
    dg_tensor *x = dg_zeros(DG_SHAPE(2, 6), DG_F32), *w = dg_zeros(DG_SHAPE(4, 5), DG_F32);
    EXPECT_ERROR(dg_linear(x, w, NULL), "linear: w has shape [4,5] but must be [out,6] for x [2,6]");
    EXPECT_ERROR(dg_linear(NULL, w, NULL), "linear: x is NULL");
    EXPECT_ERROR(dg_linear(x, NULL, NULL), "linear: w is NULL");
    dg_tensor *w6 = dg_zeros(DG_SHAPE(4, 6), DG_F32);
    EXPECT_ERROR(dg_linear(x, w6, dg_zeros(DG_SHAPE(3), DG_F32)), "linear: b has shape [3] but w has out features 4");
    EXPECT_ERROR(dg_linear(x, dg_zeros(DG_SHAPE(4, 6), DG_F64), NULL),
                 "linear: w has dtype f64 (shape [4,6]) but x has f32");
    EXPECT_ERROR(dg_linear(dg_zeros(DG_SHAPE(2, 6), DG_I64), w6, NULL), "linear: x has dtype i64");
}

/* ---- embedding ------------------------------------------------------------------------------- */

static void test_embedding(void **state) {
    dg_tensor *w = randn(DG_SHAPE(5, 3), DG_F64);
    dg_tensor *ids = dg_from_data(DG_SHAPE(2, 3), DG_I64, (int64_t[]){4, 0, 4, 2, 2, 4});
    dg_set_requires_grad(w, true);
    dg_tensor *y = dg_embedding(w, ids);
    assert_non_null(y);
    assert_int_equal(y->ndim, 3);
    assert_int_equal(y->shape[2], 3);
    const int64_t *id = dg_data_ptr(ids);
    for (int n = 0; n < 6; n++)
        for (int d = 0; d < 3; d++) assert_true(f64p(y)[n * 3 + d] == f64p(w)[id[n] * 3 + d]);
    /* repeated ids accumulate: d sum(y) / d w[v,:] = how often v occurs */
    assert_int_equal(dg_backward(dg_sum_all(y), NULL), 0);
    const double count[5] = {1, 0, 2, 0, 3};
    for (int v = 0; v < 5; v++)
        for (int d = 0; d < 3; d++) assert_true(dg_get(w->grad, (int64_t[]){v, d}) == count[v]);
}

static void test_embedding_bad_input(void **state) {
    dg_tensor *w = dg_zeros(DG_SHAPE(10, 4), DG_F32);
    EXPECT_ERROR(dg_embedding(w, dg_from_data(DG_SHAPE(3), DG_I64, (int64_t[]){1, 12, 3})),
                 "embedding: id 12 (ids [3], flat position 1) is out of range for V = 10 (weight [10,4])");
    EXPECT_ERROR(dg_embedding(w, dg_from_data(DG_SHAPE(2), DG_I64, (int64_t[]){-1, 0})),
                 "embedding: id -1 (ids [2], flat position 0) is out of range for V = 10");
    EXPECT_ERROR(dg_embedding(w, dg_zeros(DG_SHAPE(3), DG_F32)),
                 "embedding: ids has dtype f32 (shape [3]) but must be i64 (weight [10,4])");
    EXPECT_ERROR(dg_embedding(dg_zeros(DG_SHAPE(10), DG_F32), dg_zeros(DG_SHAPE(3), DG_I64)),
                 "embedding: weight has shape [10] but must be [V,D]");
    EXPECT_ERROR(dg_embedding(dg_zeros(DG_SHAPE(10, 4), DG_I64), dg_zeros(DG_SHAPE(3), DG_I64)),
                 "embedding: weight has dtype i64");
    EXPECT_ERROR(dg_embedding(NULL, dg_zeros(DG_SHAPE(3), DG_I64)), "embedding: weight is NULL");
    EXPECT_ERROR(dg_embedding(w, NULL), "embedding: ids is NULL");
}

/* ---- rms_norm, gated_rms_norm, l2norm -------------------------------------------------------- */

/* y = x / sqrt(mean(x^2) + eps) * w * silu(z) row by row (w, z optional) */
static dg_tensor *ref_rms(dg_tensor *x, dg_tensor *z, dg_tensor *w, double eps) {
    int64_t D = x->shape[x->ndim - 1], N = dg_numel(x) / D;
    dg_tensor *y = dg_zeros(x->ndim, x->shape, DG_F64);
    for (int64_t n = 0; n < N; n++) {
        double ss = 0;
        for (int64_t d = 0; d < D; d++) ss += f64p(x)[n * D + d] * f64p(x)[n * D + d];
        for (int64_t d = 0; d < D; d++)
            f64p(y)[n * D + d] =
                f64p(x)[n * D + d] / sqrt(ss / D + eps) * (w ? f64p(w)[d] : 1.0) * (z ? silu(f64p(z)[n * D + d]) : 1.0);
    }
    return y;
}

static void test_rms_norm(void **state) {
    dg_tensor *x = randn(DG_SHAPE(2, 3, 8), DG_F64), *w = randn(DG_SHAPE(8), DG_F64);
    assert_close(dg_rms_norm(x, w, 1e-5), ref_rms(x, NULL, w, 1e-5), 1e-12, "rms_norm");
    /* without w and eps 0 every row has root mean square 1 */
    dg_tensor *y = dg_rms_norm(x, NULL, 0.0);
    assert_close(y, ref_rms(x, NULL, NULL, 0.0), 1e-12, "rms_norm without w");
    for (int n = 0; n < 6; n++) {
        double ss = 0;
        for (int d = 0; d < 8; d++) ss += f64p(y)[n * 8 + d] * f64p(y)[n * 8 + d];
        assert_true(fabs(ss / 8 - 1) < 1e-12);
    }
}

static void test_gated_rms_norm(void **state) {
    dg_tensor *x = randn(DG_SHAPE(4, 6), DG_F64), *z = randn(DG_SHAPE(4, 6), DG_F64), *w = randn(DG_SHAPE(6), DG_F64);
    dg_tensor *y = dg_gated_rms_norm(x, z, w, 1e-6);
    assert_close(y, ref_rms(x, z, w, 1e-6), 1e-12, "gated_rms_norm");
    /* it is rms_norm(x, w) * silu(z), composed from the other ops */
    assert_close(y, dg_mul(dg_rms_norm(x, w, 1e-6), dg_silu(z)), 1e-12, "gated = rms_norm * silu(z)");
    assert_close(dg_gated_rms_norm(x, z, NULL, 1e-6), ref_rms(x, z, NULL, 1e-6), 1e-12, "gated, no w");
}

static void test_l2norm(void **state) {
    dg_tensor *x = randn(DG_SHAPE(2, 5, 16), DG_F64);
    dg_tensor *y = dg_l2norm(x, 1e-6);
    assert_non_null(y);
    for (int n = 0; n < 10; n++) {
        double ss = 0, sx = 0;
        for (int d = 0; d < 16; d++) {
            ss += f64p(y)[n * 16 + d] * f64p(y)[n * 16 + d];
            sx += f64p(x)[n * 16 + d] * f64p(x)[n * 16 + d];
        }
        for (int d = 0; d < 16; d++)
            assert_true(fabs(f64p(y)[n * 16 + d] - f64p(x)[n * 16 + d] / sqrt(sx + 1e-6)) < 1e-14);
        assert_true(fabs(ss - 1) < 1e-6); /* unit rows, up to eps */
    }
    /* scale invariance (eps 0) */
    assert_close(dg_l2norm(dg_mul_scalar(x, 37.0), 0.0), dg_l2norm(x, 0.0), 1e-14, "l2norm(c x) = l2norm(x)");
    /* a zero row stays finite thanks to eps */
    dg_tensor *zr = dg_l2norm(dg_zeros(DG_SHAPE(1, 4), DG_F32), 1e-6);
    assert_non_null(zr);
    assert_true(dg_get(zr, (int64_t[]){0, 0}) == 0);
}

static void test_norm_bad_input(void **state) {
    dg_tensor *x = dg_zeros(DG_SHAPE(2, 3, 8), DG_F32);
    EXPECT_ERROR(dg_rms_norm(x, dg_zeros(DG_SHAPE(7), DG_F32), 1e-5),
                 "rms_norm: w has shape [7] but x has last dim 8 (x [2,3,8])");
    EXPECT_ERROR(dg_rms_norm(dg_zeros(DG_SHAPE(2, 8), DG_I64), NULL, 1e-5),
                 "rms_norm: x has dtype i64 (shape [2,8]) but a float dtype");
    EXPECT_ERROR(dg_rms_norm(x, dg_zeros(DG_SHAPE(8), DG_F64), 1e-5),
                 "rms_norm: w has dtype f64 (shape [8]) but x has f32");
    EXPECT_ERROR(dg_rms_norm(NULL, NULL, 1e-5), "rms_norm: x is NULL");
    EXPECT_ERROR(dg_rms_norm(x, NULL, -1.0), "rms_norm: eps is -1 but must be finite and >= 0");
    EXPECT_ERROR(dg_gated_rms_norm(x, dg_zeros(DG_SHAPE(2, 3, 7), DG_F32), NULL, 1e-5),
                 "gated_rms_norm: z has shape [2,3,7] but x has [2,3,8]");
    EXPECT_ERROR(dg_gated_rms_norm(x, NULL, NULL, 1e-5), "gated_rms_norm: z is NULL");
    EXPECT_ERROR(dg_gated_rms_norm(x, x, dg_zeros(DG_SHAPE(2, 8), DG_F32), 1e-5),
                 "gated_rms_norm: w has shape [2,8] but x has last dim 8 (x [2,3,8])");
    EXPECT_ERROR(dg_l2norm(NULL, 1e-6), "l2norm: x is NULL");
    EXPECT_ERROR(dg_l2norm(dg_zeros(DG_SHAPE(4), DG_I64), 1e-6), "l2norm: x has dtype i64");
    EXPECT_ERROR(dg_l2norm(x, NAN), "l2norm: eps is nan");
}

/* ---- conv1d ---------------------------------------------------------------------------------- */

static dg_tensor *ref_conv(dg_tensor *x, dg_tensor *w, dg_tensor *b, bool act) {
    int64_t B = x->shape[0], T = x->shape[1], D = x->shape[2], W = w->shape[1];
    dg_tensor *y = dg_zeros(DG_SHAPE(B, T, D), DG_F64);
    for (int64_t bb = 0; bb < B; bb++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t d = 0; d < D; d++) {
                double s = b ? f64p(b)[d] : 0;
                for (int64_t j = 0; j < W; j++) {
                    int64_t src = t - W + 1 + j;
                    if (src >= 0) s += f64p(w)[d * W + j] * f64p(x)[(bb * T + src) * D + d];
                }
                f64p(y)[(bb * T + t) * D + d] = act ? silu(s) : s;
            }
    return y;
}

static void test_conv1d(void **state) {
    for (int64_t W = 1; W <= 8; W++) {
        dg_tensor *x = randn(DG_SHAPE(2, 7, 5), DG_F64), *w = randn(DG_SHAPE(5, W), DG_F64),
                  *b = randn(DG_SHAPE(5), DG_F64);
        assert_close(dg_conv1d(x, w, b, true), ref_conv(x, w, b, true), 1e-12, "conv1d silu bias");
        assert_close(dg_conv1d(x, w, NULL, false), ref_conv(x, w, NULL, false), 1e-12, "conv1d plain");
    }
}

/* f32 with channels in groups of 8 and W <= 4 takes the streaming form (kernels/cpu/nn_conv1d.c):
 * y and every gradient against the f64 op, sequences shorter and longer than W */
static void test_conv1d_f32_streaming(void **state) {
    for (int64_t W = 1; W <= 4; W++)
        for (int64_t T = 2; T <= 11; T += 9)
            for (int64_t D = 8; D <= 24; D += 16)
                for (int act = 0; act < 2; act++) {
                    dg_tensor *x = randn(DG_SHAPE(3, T, D), DG_F64), *w = randn(DG_SHAPE(D, W), DG_F64),
                              *b = act ? randn(DG_SHAPE(D), DG_F64) : NULL, *r = randn(DG_SHAPE(3, T, D), DG_F64);
                    dg_tensor *y[2], *g[2][3];
                    for (int f = 0; f < 2; f++) {
                        const dg_dtype dt = f ? DG_F32 : DG_F64;
                        dg_tensor *xi = dg_clone(dg_to_dtype(x, dt)), *wi = dg_clone(dg_to_dtype(w, dt));
                        dg_tensor *bi = b ? dg_clone(dg_to_dtype(b, dt)) : NULL;
                        dg_set_requires_grad(xi, true), dg_set_requires_grad(wi, true);
                        if (bi) dg_set_requires_grad(bi, true);
                        y[f] = dg_conv1d(xi, wi, bi, act);
                        assert_int_equal(dg_backward(weighted_sum(y[f], dg_to_dtype(r, dt)), NULL), 0);
                        g[f][0] = xi->grad, g[f][1] = wi->grad, g[f][2] = bi ? bi->grad : NULL;
                    }
                    assert_close(dg_to_dtype(y[1], DG_F64), y[0], 1e-4, "conv1d f32 streaming y");
                    for (int i = 0; i < 3; i++)
                        if (g[0][i])
                            assert_close(dg_to_dtype(g[1][i], DG_F64), g[0][i], 1e-4, "conv1d f32 streaming grad");
                }
}

/* causality: changing x at t0 leaves y before t0 unchanged and changes y at t0..t0+W-1 */
static void test_conv1d_causal(void **state) {
    const int64_t T = 10, t0 = 6, W = 4;
    dg_tensor *x = randn(DG_SHAPE(1, T, 3), DG_F64), *w = randn(DG_SHAPE(3, W), DG_F64);
    dg_tensor *y = dg_conv1d(x, w, NULL, true);
    dg_tensor *x2 = dg_clone(x);
    for (int d = 0; d < 3; d++) dg_set(x2, (int64_t[]){0, t0, d}, 5.0 + d);
    dg_tensor *y2 = dg_conv1d(x2, w, NULL, true);
    for (int64_t t = 0; t < T; t++)
        for (int d = 0; d < 3; d++) {
            double a = dg_get(y, (int64_t[]){0, t, d}), c = dg_get(y2, (int64_t[]){0, t, d});
            if (t < t0) assert_true(a == c);
            else if (t < t0 + W) assert_true(a != c);
            else assert_true(a == c);
        }
}

static void test_conv1d_bad_input(void **state) {
    dg_tensor *x = dg_zeros(DG_SHAPE(2, 5, 4), DG_F32);
    EXPECT_ERROR(dg_conv1d(x, dg_zeros(DG_SHAPE(4, 9), DG_F32), NULL, true),
                 "conv1d: w has shape [4,9] but must be [D,W] with D = 4 and W in 1..8 (x [2,5,4])");
    EXPECT_ERROR(dg_conv1d(x, dg_zeros(DG_SHAPE(3, 4), DG_F32), NULL, true),
                 "conv1d: w has shape [3,4] but must be [D,W]");
    EXPECT_ERROR(dg_conv1d(dg_zeros(DG_SHAPE(5, 4), DG_F32), dg_zeros(DG_SHAPE(4, 4), DG_F32), NULL, true),
                 "conv1d: x has shape [5,4] but must be [B,T,D]");
    EXPECT_ERROR(dg_conv1d(x, dg_zeros(DG_SHAPE(4, 4), DG_F32), dg_zeros(DG_SHAPE(5), DG_F32), true),
                 "conv1d: bias has shape [5] but x has channels D = 4");
    EXPECT_ERROR(dg_conv1d(x, dg_zeros(DG_SHAPE(4, 4), DG_F64), NULL, true), "conv1d: w has dtype f64");
    EXPECT_ERROR(dg_conv1d(NULL, dg_zeros(DG_SHAPE(4, 4), DG_F32), NULL, true), "conv1d: x is NULL");
    EXPECT_ERROR(dg_conv1d(x, NULL, NULL, true), "conv1d: w is NULL");
}

/* ---- swiglu ---------------------------------------------------------------------------------- */

static void test_swiglu(void **state) {
    dg_tensor *g = dg_mul_scalar(randn(DG_SHAPE(3, 7), DG_F64), 4.0), *u = randn(DG_SHAPE(3, 7), DG_F64);
    dg_tensor *y = dg_swiglu(g, u);
    assert_non_null(y);
    for (int i = 0; i < 21; i++) assert_true(fabs(f64p(y)[i] - silu(f64p(g)[i]) * f64p(u)[i]) < 1e-14);
    assert_close(y, dg_mul(dg_silu(g), u), 1e-14, "swiglu = silu(gate) * up");
    EXPECT_ERROR(dg_swiglu(g, dg_zeros(DG_SHAPE(3, 6), DG_F64)), "swiglu: up has shape [3,6] but gate has [3,7]");
    EXPECT_ERROR(dg_swiglu(g, dg_zeros(DG_SHAPE(3, 7), DG_F32)),
                 "swiglu: up has dtype f32 (shape [3,7]) but gate has f64");
    EXPECT_ERROR(dg_swiglu(NULL, u), "swiglu: gate is NULL");
    EXPECT_ERROR(dg_swiglu(dg_zeros(DG_SHAPE(3, 7), DG_I64), u), "swiglu: gate has dtype i64");
}

/* ---- cross_entropy --------------------------------------------------------------------------- */

static void test_cross_entropy_values(void **state) {
    /* uniform logits: loss = log C */
    dg_tensor *t = dg_from_data(DG_SHAPE(4), DG_I64, (int64_t[]){0, 3, 1, 4});
    dg_tensor *l = dg_cross_entropy(dg_zeros(DG_SHAPE(4, 5), DG_F64), t, -100);
    assert_non_null(l);
    assert_int_equal(l->ndim, 0);
    assert_true(fabs(dg_item(l) - log(5.0)) < 1e-14);
    /* reference on random logits with one ignored row */
    dg_tensor *x = dg_mul_scalar(randn(DG_SHAPE(2, 3, 6), DG_F64), 3.0);
    dg_tensor *tt = dg_from_data(DG_SHAPE(2, 3), DG_I64, (int64_t[]){5, -100, 0, 2, 2, 1});
    const int64_t *tp = dg_data_ptr(tt);
    double total = 0;
    int k = 0;
    for (int n = 0; n < 6; n++) {
        if (tp[n] == -100) continue;
        double s = 0;
        for (int c = 0; c < 6; c++) s += exp(f64p(x)[n * 6 + c]);
        total += log(s) - f64p(x)[n * 6 + tp[n]];
        k++;
    }
    assert_true(fabs(dg_item(dg_cross_entropy(x, tt, -100)) - total / k) < 1e-12);
    /* huge logits stay finite (log-sum-exp with the max subtracted), also in f32 */
    dg_tensor *big = dg_from_data(DG_SHAPE(2, 2), DG_F32, (float[]){1000.f, 0.f, 1000.f, 0.f});
    dg_tensor *bt = dg_from_data(DG_SHAPE(2), DG_I64, (int64_t[]){0, 1});
    double lb = dg_item(dg_cross_entropy(big, bt, -100));
    assert_true(fabs(lb - 500.0) < 1e-3);
}

/* every target ignored: loss 0 and a zero (not NaN) gradient */
static void test_cross_entropy_all_ignored(void **state) {
    dg_tensor *x = randn(DG_SHAPE(3, 4), DG_F32);
    dg_set_requires_grad(x, true);
    dg_tensor *t = dg_from_data(DG_SHAPE(3), DG_I64, (int64_t[]){7, 7, 7});
    dg_tensor *l = dg_cross_entropy(x, t, 7);
    assert_non_null(l);
    assert_true(dg_item(l) == 0.0);
    assert_int_equal(dg_backward(l, NULL), 0);
    assert_non_null(x->grad);
    for (int n = 0; n < 3; n++)
        for (int c = 0; c < 4; c++) assert_true(dg_get(x->grad, (int64_t[]){n, c}) == 0.0);
}

/* the gradient of the mean over scored rows: softmax - onehot, divided by the count, 0 on ignored */
static void test_cross_entropy_grad(void **state) {
    dg_tensor *x = randn(DG_SHAPE(3, 4), DG_F64);
    dg_set_requires_grad(x, true);
    dg_tensor *t = dg_from_data(DG_SHAPE(3), DG_I64, (int64_t[]){2, -1, 0});
    assert_int_equal(dg_backward(dg_cross_entropy(x, t, -1), NULL), 0);
    const int64_t tp[3] = {2, -1, 0};
    for (int n = 0; n < 3; n++) {
        double s = 0;
        for (int c = 0; c < 4; c++) s += exp(f64p(x)[n * 4 + c]);
        for (int c = 0; c < 4; c++) {
            double want = tp[n] < 0 ? 0 : (exp(f64p(x)[n * 4 + c]) / s - (c == tp[n])) / 2;
            assert_true(fabs(dg_get(x->grad, (int64_t[]){n, c}) - want) < 1e-14);
        }
    }
}

static void test_cross_entropy_bad_input(void **state) {
    dg_tensor *x = dg_zeros(DG_SHAPE(3, 5), DG_F32);
    EXPECT_ERROR(dg_cross_entropy(x, dg_from_data(DG_SHAPE(3), DG_I64, (int64_t[]){0, 7, 1}), -100),
                 "cross_entropy: target 7 (targets [3], flat position 1) is out of range for C = 5 classes "
                 "(logits [3,5], ignore_index -100)");
    EXPECT_ERROR(dg_cross_entropy(x, dg_zeros(DG_SHAPE(4), DG_I64), -100),
                 "cross_entropy: targets has shape [4] but logits has [3,5]");
    EXPECT_ERROR(dg_cross_entropy(x, dg_zeros(DG_SHAPE(3), DG_F32), -100),
                 "cross_entropy: targets has dtype f32 (shape [3]) but must be i64 (logits [3,5])");
    EXPECT_ERROR(dg_cross_entropy(dg_zeros(DG_SHAPE(3, 5), DG_I64), dg_zeros(DG_SHAPE(3), DG_I64), -100),
                 "cross_entropy: logits has dtype i64");
    EXPECT_ERROR(dg_cross_entropy(NULL, dg_zeros(DG_SHAPE(3), DG_I64), -100), "cross_entropy: logits is NULL");
    EXPECT_ERROR(dg_cross_entropy(x, NULL, -100), "cross_entropy: targets is NULL");
    EXPECT_ERROR(dg_cross_entropy(dg_zeros(DG_SHAPE(3, 0), DG_F32), dg_zeros(DG_SHAPE(3), DG_I64), -100),
                 "cross_entropy: logits has shape [3,0] but needs at least one class");
}

/* ---- linear_cross_entropy: the head and the cross-entropy fused, the logits in chunks ---------- */

/* loss, dx, dw of cross_entropy(linear(x, w)) (fused: linear_cross_entropy with chunk rows ch) */
static void lce_run(bool fused, dg_tensor *x0, dg_tensor *w0, dg_tensor *t, int64_t ignore, int64_t ch,
                    dg_tensor **out) {
    dg_tensor *x = dg_clone(x0), *w = dg_clone(w0);
    dg_set_requires_grad(x, true);
    dg_set_requires_grad(w, true);
    dg_tensor *l =
        fused ? dg_linear_cross_entropy(x, w, t, ignore, ch) : dg_cross_entropy(dg_linear(x, w, NULL), t, ignore);
    assert_non_null(l);
    assert_int_equal(dg_backward(l, NULL), 0);
    out[0] = l;
    out[1] = x->grad;
    out[2] = w->grad;
}

/* the fused op gives linear + cross_entropy's loss and gradients for chunk sizes that divide the
 * rows, do not (a short last chunk), one row, all rows, and more than the rows; f64 to rounding,
 * f32 within f32 GEMM reordering */
static void test_linear_cross_entropy_matches_unfused(void **state) {
    const int64_t N = 37, D = 24, C = 300, chunks[] = {0, 1, 5, 37, 64};
    int64_t tg[37];
    for (int i = 0; i < N; i++) tg[i] = i % 9 == 4 ? -100 : (i * 53) % C;
    dg_tensor *t = dg_from_data(DG_SHAPE(N), DG_I64, tg);
    for (int f = 0; f < 2; f++) {
        dg_dtype dt = f ? DG_F32 : DG_F64;
        double tol = f ? 2e-6 : 1e-13;
        dg_tensor *x = dg_mul_scalar(randn(DG_SHAPE(N, D), dt), 0.7), *w = randn(DG_SHAPE(C, D), dt), *ref[3];
        lce_run(false, x, w, t, -100, 0, ref);
        for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
            dg_tensor *got[3];
            lce_run(true, x, w, t, -100, chunks[k], got);
            static const char *const what[3] = {"loss", "dx", "dw"};
            for (int i = 0; i < 3; i++) {
                double e = dg_test_rel_err(got[i], ref[i]);
                if (!(e <= tol))
                    fail_msg("%s, chunk rows %lld: %s rel err %.3g > %.3g", dg_dtype_name(dt), (long long)chunks[k],
                             what[i], e, tol);
            }
        }
    }
}

/* the gradients that go straight into their slots (dg_grad_target) add to what is there: two
 * backward passes into the same leaves, a second use of x before the op, and x and w one tensor
 * (one slot for both, written chunk by chunk) give linear + cross_entropy's gradients; and a
 * second backward through the same graph gives the first one's gradient again */
static void test_linear_cross_entropy_grad_slots(void **state) {
    const int64_t C = 9, D = 5;
    int64_t tg[9] = {3, -100, 0, 8, 8, 1, -100, 2, 5};
    dg_tensor *t = dg_from_data(DG_SHAPE(C), DG_I64, tg);
    dg_tensor *a0 = randn(DG_SHAPE(C, D), DG_F64), *g[2][2];
    for (int fused = 0; fused < 2; fused++) {
        dg_tensor *x = dg_clone(a0), *w = dg_clone(a0), *a = dg_clone(a0);
        dg_set_requires_grad(x, true);
        dg_set_requires_grad(w, true);
        dg_set_requires_grad(a, true);
        for (int pass = 0; pass < 2; pass++) {
            dg_tensor *xs = dg_mul_scalar(x, 1.5); /* an inner node: its slot is the engine's sum */
            dg_tensor *l =
                fused ? dg_linear_cross_entropy(xs, w, t, -100, 4) : dg_cross_entropy(dg_linear(xs, w, NULL), t, -100);
            assert_int_equal(dg_backward(dg_add(l, dg_sum_all(xs)), NULL), 0);
        }
        dg_tensor *l =
            fused ? dg_linear_cross_entropy(a, a, t, -100, 4) : dg_cross_entropy(dg_linear(a, a, NULL), t, -100);
        assert_int_equal(dg_backward(l, NULL), 0);
        g[fused][0] = dg_cat(2, (dg_tensor *[]){x->grad, w->grad}, 0);
        g[fused][1] = a->grad;
    }
    assert_close(g[1][0], g[0][0], 1e-13, "two passes into x and w");
    assert_close(g[1][1], g[0][1], 1e-13, "x and w one tensor");
    /* two backward passes through one graph: the first uses up the forward's last chunk of logits,
     * the second makes it again */
    dg_tensor *x = dg_clone(a0), *w = dg_clone(a0);
    dg_set_requires_grad(x, true);
    dg_set_requires_grad(w, true);
    dg_tensor *l = dg_linear_cross_entropy(x, w, t, -100, 4);
    assert_int_equal(dg_backward(l, NULL), 0);
    dg_tensor *once = dg_clone(w->grad);
    assert_int_equal(dg_backward(l, NULL), 0);
    assert_close(w->grad, dg_mul_scalar(once, 2.0), 1e-13, "one graph, two backward passes");
}

static void test_linear_cross_entropy_bad_input(void **state) {
    dg_tensor *x = dg_zeros(DG_SHAPE(3, 4), DG_F32), *w = dg_zeros(DG_SHAPE(5, 4), DG_F32);
    dg_tensor *t = dg_zeros(DG_SHAPE(3), DG_I64);
    EXPECT_ERROR(dg_linear_cross_entropy(x, w, dg_from_data(DG_SHAPE(3), DG_I64, (int64_t[]){0, 5, 1}), -100, 0),
                 "linear_cross_entropy: target 5 (targets [3], flat position 1) is out of range for C = 5 classes "
                 "(w [5,4], ignore_index -100)");
    EXPECT_ERROR(dg_linear_cross_entropy(x, dg_zeros(DG_SHAPE(5, 3), DG_F32), t, -100, 0),
                 "linear_cross_entropy: w has shape [5,3] but must be [C,4] with C >= 1 classes for x [3,4]");
    EXPECT_ERROR(dg_linear_cross_entropy(x, dg_zeros(DG_SHAPE(0, 4), DG_F32), t, -100, 0),
                 "linear_cross_entropy: w has shape [0,4] but must be [C,4]");
    EXPECT_ERROR(dg_linear_cross_entropy(x, dg_zeros(DG_SHAPE(5, 4), DG_F64), t, -100, 0),
                 "linear_cross_entropy: w has dtype f64");
    EXPECT_ERROR(dg_linear_cross_entropy(x, w, dg_zeros(DG_SHAPE(4), DG_I64), -100, 0),
                 "linear_cross_entropy: targets has shape [4] but x has [3,4]");
    EXPECT_ERROR(dg_linear_cross_entropy(x, w, dg_zeros(DG_SHAPE(3), DG_F32), -100, 0),
                 "linear_cross_entropy: targets has dtype f32 (shape [3]) but must be i64 (x [3,4])");
    EXPECT_ERROR(dg_linear_cross_entropy(x, w, t, -100, -1), "linear_cross_entropy: chunk_rows is -1 but must be >= 0");
    EXPECT_ERROR(dg_linear_cross_entropy(dg_zeros(DG_SHAPE(3, 4), DG_I64), w, t, -100, 0),
                 "linear_cross_entropy: x has dtype i64");
    EXPECT_ERROR(dg_linear_cross_entropy(NULL, w, t, -100, 0), "linear_cross_entropy: x is NULL");
    EXPECT_ERROR(dg_linear_cross_entropy(x, NULL, t, -100, 0), "linear_cross_entropy: w is NULL");
    EXPECT_ERROR(dg_linear_cross_entropy(x, w, NULL, -100, 0), "linear_cross_entropy: targets is NULL");
}

/* ---- the f32 kernels' exp (a vectorisable polynomial) ----------------------------------------- */

static void test_fast_expf(void **state) {
    double worst = 0;
    for (int i = 0; i <= 2000000; i++) {
        float x = -87.0f + 175.3f * (float)i / 2000000.0f;
        double want = exp((double)x), e = fabs((double)dg_nn_expf_check(x) - want) / want;
        if (e > worst) worst = e;
    }
    if (!(worst < 1.2e-7)) fail_msg("fast expf max rel err %.3g", worst);
    assert_true(dg_nn_expf_check(0.0f) == 1.0f);
    assert_true(dg_nn_expf_check(-INFINITY) >= 0 && dg_nn_expf_check(-INFINITY) < 1e-37f); /* clamped */
    assert_true(isfinite(dg_nn_expf_check(INFINITY)) && dg_nn_expf_check(INFINITY) > 1e38f);
    assert_true(isnan(dg_nn_expf_check(NAN)));
}

/* ---- every sample: f32 forward and backward agree with f64 ------------------------------------ */

static const char *const nn_ops[] = {"linear", "embedding", "rms_norm",      "gated_rms_norm",      "l2norm",
                                     "conv1d", "swiglu",    "cross_entropy", "linear_cross_entropy"};

/* out and the gradients of sum(out * r) for the sample's inputs converted to dt */
static void run_sample(const dg_op_def *def, const dg_sample *s, dg_dtype dt, dg_tensor *r, dg_tensor **out,
                       dg_tensor **grads) {
    dg_tensor *in[DG_MAX_IO] = {0};
    for (int i = 0; i < def->n_in; i++) {
        if (!s->in[i]) continue;
        in[i] = dg_dtype_is_float(s->in[i]->dtype) ? dg_clone(dg_to_dtype(s->in[i], dt)) : s->in[i];
        if (s->differentiable[i]) dg_set_requires_grad(in[i], true);
    }
    *out = dg_apply1(def, s->attrs, in);
    assert_non_null(*out);
    assert_int_equal(dg_backward(weighted_sum(*out, dg_to_dtype(r, dt)), NULL), 0);
    for (int i = 0; i < def->n_in; i++) grads[i] = s->differentiable[i] ? in[i]->grad : NULL;
}

static void test_f32_matches_f64(void **state) {
    for (size_t k = 0; k < sizeof nn_ops / sizeof nn_ops[0]; k++) {
        const dg_op_def *def = dg_op_find(nn_ops[k]);
        assert_non_null(def);
        dg_sample s;
        for (int idx = 0;; idx++) {
            memset(&s, 0, sizeof s);
            if (!def->sample(idx, DG_F64, 7, &s)) break;
            dg_tensor *o64, *o32, *g64[DG_MAX_IO] = {0}, *g32[DG_MAX_IO] = {0};
            dg_tensor *probe = dg_apply1(def, s.attrs, s.in);
            assert_non_null(probe);
            dg_tensor *r = randn(probe->ndim, probe->shape, DG_F64);
            run_sample(def, &s, DG_F64, r, &o64, g64);
            run_sample(def, &s, DG_F32, r, &o32, g32);
            double e = dg_test_rel_err(o32, o64);
            if (!(e < 2e-6)) fail_msg("%s [%s]: f32 output rel err %.3g", def->name, s.label, e);
            for (int i = 0; i < def->n_in; i++) {
                if (!g64[i]) continue;
                assert_non_null(g32[i]);
                e = dg_test_rel_err(g32[i], g64[i]);
                if (!(e < 2e-5)) fail_msg("%s [%s]: f32 d%s rel err %.3g", def->name, s.label, def->in_names[i], e);
            }
            dg_sample_free(&s);
        }
    }
}

/* ---- sizes that take the threaded paths (rows x dim >= 32768), checked against references and by
 * directional finite differences ----------------------------------------------------------------- */

typedef struct {
    int which;
    dg_tensor *r;
} large_ctx;

static dg_tensor *large_fn(dg_tensor *const *in, void *vctx) {
    large_ctx *c = vctx;
    dg_tensor *y = NULL;
    switch (c->which) {
    case 0: y = dg_rms_norm(in[0], in[1], 1e-5); break;
    case 1: y = dg_gated_rms_norm(in[0], in[1], in[2], 1e-5); break;
    case 2: y = dg_conv1d(in[0], in[1], in[2], true); break;
    case 3: y = dg_linear(in[0], in[1], in[2]); break;
    case 4: y = dg_embedding(in[0], in[1]); break;
    case 5: y = dg_l2norm(in[0], 1e-6); break;
    case 6: return dg_cross_entropy(in[0], in[1], 0);
    }
    return weighted_sum(y, c->r);
}

static void check_large(int which, int n, dg_tensor **in, dg_tensor *y_ref) {
    large_ctx c = {which, NULL};
    dg_tensor *y = NULL;
    for (int i = 0; i < n; i++)
        if (in[i] && dg_dtype_is_float(in[i]->dtype)) dg_set_requires_grad(in[i], true);
    /* r shaped like the output */
    dg_no_grad_begin();
    switch (which) {
    case 0: y = dg_rms_norm(in[0], in[1], 1e-5); break;
    case 1: y = dg_gated_rms_norm(in[0], in[1], in[2], 1e-5); break;
    case 2: y = dg_conv1d(in[0], in[1], in[2], true); break;
    case 3: y = dg_linear(in[0], in[1], in[2]); break;
    case 4: y = dg_embedding(in[0], in[1]); break;
    case 5: y = dg_l2norm(in[0], 1e-6); break;
    case 6: y = dg_cross_entropy(in[0], in[1], 0); break;
    }
    dg_no_grad_end();
    assert_non_null(y);
    if (y_ref) assert_close(y, y_ref, 1e-11, "large forward");
    c.r = randn(y->ndim, y->shape, DG_F64);
    double ma, mr;
    char worst[256];
    int failed = dg_gradcheck_fn(large_fn, &c, n, in, 1e-6, 1e-5, &ma, &mr, worst, sizeof worst);
    if (failed != 0) fail_msg("large case %d: %s (%s)", which, worst, dg_last_error());
}

static void test_large_sizes(void **state) {
    dg_tensor *x = randn(DG_SHAPE(256, 160), DG_F64), *z = randn(DG_SHAPE(256, 160), DG_F64);
    dg_tensor *w = randn(DG_SHAPE(160), DG_F64), *b = randn(DG_SHAPE(160), DG_F64);
    check_large(0, 2, (dg_tensor *[]){x, w}, ref_rms(x, NULL, w, 1e-5));
    check_large(1, 3, (dg_tensor *[]){x, z, w}, ref_rms(x, z, w, 1e-5));
    check_large(5, 1, (dg_tensor *[]){x}, NULL);
    dg_tensor *xc = randn(DG_SHAPE(3, 100, 160), DG_F64), *wc = randn(DG_SHAPE(160, 4), DG_F64);
    check_large(2, 3, (dg_tensor *[]){xc, wc, b}, ref_conv(xc, wc, b, true));
    dg_tensor *wl = randn(DG_SHAPE(200, 160), DG_F64), *bl = randn(DG_SHAPE(200), DG_F64);
    check_large(3, 3, (dg_tensor *[]){x, wl, bl}, NULL);
    dg_tensor *emb = randn(DG_SHAPE(50, 96), DG_F64);
    int64_t ids[700];
    for (int i = 0; i < 700; i++) ids[i] = (i * 37) % 50;
    check_large(4, 2, (dg_tensor *[]){emb, dg_from_data(DG_SHAPE(7, 100), DG_I64, ids)}, NULL);
    dg_tensor *lg = randn(DG_SHAPE(300, 120), DG_F64);
    int64_t tg[300];
    for (int i = 0; i < 300; i++) tg[i] = (i * 13) % 120; /* ignore_index 0 hits every 120/gcd rows */
    check_large(6, 2, (dg_tensor *[]){lg, dg_from_data(DG_SHAPE(300), DG_I64, tg)}, NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_linear_forward, setup, teardown),
        cmocka_unit_test_setup_teardown(test_linear_grads_sum_over_leading_dims, setup, teardown),
        cmocka_unit_test_setup_teardown(test_linear_bad_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_embedding, setup, teardown),
        cmocka_unit_test_setup_teardown(test_embedding_bad_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rms_norm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gated_rms_norm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_l2norm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_norm_bad_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conv1d, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conv1d_f32_streaming, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conv1d_causal, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conv1d_bad_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_swiglu, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cross_entropy_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cross_entropy_all_ignored, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cross_entropy_grad, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cross_entropy_bad_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_linear_cross_entropy_matches_unfused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_linear_cross_entropy_grad_slots, setup, teardown),
        cmocka_unit_test_setup_teardown(test_linear_cross_entropy_bad_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fast_expf, setup, teardown),
        cmocka_unit_test_setup_teardown(test_f32_matches_f64, setup, teardown),
        cmocka_unit_test_setup_teardown(test_large_sizes, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
