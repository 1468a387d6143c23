/* The CUDA kernels on raw device pointers (kernels/cuda/cuda_kernels.h) against host references on
 * the same random inputs:
 *  - runtime: allocation, copies, memset, errors without a GPU or past the device's memory;
 *  - unary maps and their backward maps, binary broadcasting over 6-d strided inputs, fill,
 *    strided copy, casts, sums over dim sets (every launch shape), cuBLAS gemm (f32, f64, bf16;
 *    transposes, batch strides, broadcast, alpha/beta, K = 0): against double references,
 *    relative error norm <= 1e-5 in f32 (1e-12 in f64).
 * The delta-rule kernels are tested the same way in test_cuda_delta_kernels.c.
 * Outputs are poisoned with NaN before each run, so an unwritten element fails.  Tests that need
 * a GPU skip where dg_cuda_device_count() is 0; the runtime's error paths run everywhere. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deltagrad.h"
#include "tests/support/test_support.h"

#ifdef DG_HAVE_CUDA
#include "tests/support/cuda_buffers.h"

/* ---- host helpers ---- */
static uint64_t rs = 0x9E3779B97F4A7C15ull;
static double urand(void) { return dg_test_xorshift(&rs); }
static double *rnd(int64_t n, double lo, double hi) {
    double *x = malloc(sizeof(double) * (n ? n : 1));
    for (int64_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * urand();
    return x;
}

static double tol_of(dg_dtype dt) { return dt == DG_F64 ? 1e-12 : 1e-5; }

/* ---- runtime ---- */
static void test_runtime(void **state) {
    (void)state;
    if (!gpu()) {
        /* no driver or no GPU: everything fails with a message, nothing aborts */
        dg_clear_error();
        assert_null(dg_cuda_malloc(16));
        assert_true(strstr(dg_last_error(), "cuda") != NULL);
        dg_clear_error();
        assert_int_equal(dg_cuda_init(), -1);
        dg_clear_error();
        assert_int_equal(dg_cuda_fill(DG_F32, 4, NULL, 1.0), -1);
        dg_clear_error();
        assert_int_equal(dg_cuda_sm_count(), 0);
        dg_clear_error();
        return;
    }
    assert_int_equal(dg_cuda_init(), 0);
    assert_true(dg_cuda_sm_count() > 0);
    /* far past the device's memory: NULL and a message naming the call; the context survives */
    dg_clear_error();
    assert_null(dg_cuda_malloc((size_t)1 << 50));
    assert_true(strstr(dg_last_error(), "cudaMallocAsync") != NULL);
    dg_clear_error();
    const int64_t n = 1000;
    double *x = rnd(n, -1, 1);
    float *d1 = dput_as(x, n, DG_F32), *d2 = dput(NULL, n, 4);
    assert_int_equal(dg_cuda_memcpy(d2, d1, n * 4, 2), 0);
    double *y = dget_d(d2, n, DG_F32);
    for (int64_t i = 0; i < n; i++) assert_true(y[i] == (double)(float)x[i]);
    assert_int_equal(dg_cuda_memset0(d2, n * 4), 0);
    free(y);
    y = dget_d(d2, n, DG_F32);
    for (int64_t i = 0; i < n; i++) assert_true(y[i] == 0.0);
    assert_int_equal(dg_cuda_memcpy(d2, d1, 4, 7), -1);
    assert_true(strstr(dg_last_error(), "kind") != NULL);
    dg_clear_error();
    assert_int_equal(dg_cuda_synchronize(), 0);
    free(x), free(y), dg_cuda_free(d1), dg_cuda_free(d2);
}

/* ---- unary ---- */
static double ref_sig(double x) { return 1.0 / (1.0 + exp(-x)); }
static double ref_unary(int op, double x, double a) {
    switch (op) {
    case DG_UN_EXP: return exp(x);
    case DG_UN_LOG: return log(x);
    case DG_UN_SQRT: return sqrt(x);
    case DG_UN_RSQRT: return 1 / sqrt(x);
    case DG_UN_SIGMOID: return ref_sig(x);
    case DG_UN_LOGSIGMOID: return log(ref_sig(x));
    case DG_UN_SILU: return x * ref_sig(x);
    case DG_UN_SOFTPLUS: return log1p(exp(x));
    case DG_UN_TANH: return tanh(x);
    case DG_UN_NEG: return -x;
    case DG_UN_ADD_SCALAR: return x + a;
    case DG_UN_MUL_SCALAR: return a * x;
    default: return pow(x, a);
    }
}
static double ref_unary_d(int op, double x, double a) { /* f'(x) */
    double s = ref_sig(x), y = ref_unary(op, x, a);
    switch (op) {
    case DG_UN_EXP: return y;
    case DG_UN_LOG: return 1 / x;
    case DG_UN_SQRT: return 0.5 / y;
    case DG_UN_RSQRT: return -0.5 * y * y * y;
    case DG_UN_SIGMOID: return s * (1 - s);
    case DG_UN_LOGSIGMOID: return 1 - s;
    case DG_UN_SILU: return s * (1 + x * (1 - s));
    case DG_UN_SOFTPLUS: return s;
    case DG_UN_TANH: return 1 - y * y;
    case DG_UN_NEG: return -1;
    case DG_UN_ADD_SCALAR: return 1;
    case DG_UN_MUL_SCALAR: return a;
    default: return a == 0 ? 0 : a * pow(x, a - 1);
    }
}

static void test_unary(void **state) {
    (void)state;
    REQUIRE_GPU();
    const int64_t n = 10007;
    static const dg_dtype dts[2] = {DG_F32, DG_F64};
    for (int di = 0; di < 2; di++) {
        dg_dtype dt = dts[di];
        size_t es = dg_dtype_size(dt);
        for (int op = 0; op < DG_UN_COUNT; op++) {
            int positive = op == DG_UN_LOG || op == DG_UN_SQRT || op == DG_UN_RSQRT || op == DG_UN_POW_SCALAR;
            double a = op == DG_UN_POW_SCALAR ? 2.5 : 0.75;
            double *x = positive ? rnd(n, 0.1, 4) : rnd(n, -8, 8), *gy = rnd(n, -1, 1);
            /* the host reference sees the inputs as the device does */
            for (int64_t i = 0; i < n; i++)
                if (dt == DG_F32) x[i] = (float)x[i], gy[i] = (float)gy[i];
            double *ry = malloc(sizeof(double) * n), *rg = malloc(sizeof(double) * n);
            for (int64_t i = 0; i < n; i++) {
                ry[i] = ref_unary(op, x[i], a);
                rg[i] = gy[i] * ref_unary_d(op, x[i], a);
            }
            void *dx = dput_as(x, n, dt), *dgy = dput_as(gy, n, dt), *dy = dput(NULL, n, es), *dgx = dput(NULL, n, es);
            char what[64];
            snprintf(what, sizeof what, "unary op %d %s", op, dg_dtype_name(dt));
            assert_int_equal(dg_cuda_unary(dt, (dg_unary_op)op, n, dx, dy, a), 0);
            double *y = dget_d(dy, n, dt);
            CHECK_REL(what, y, ry, n, tol_of(dt));
            /* backward from x */
            assert_int_equal(dg_cuda_unary_bwd(dt, (dg_unary_op)op, n, dx, NULL, dgy, dgx, a), 0);
            double *gx = dget_d(dgx, n, dt);
            snprintf(what, sizeof what, "unary_bwd(x) op %d %s", op, dg_dtype_name(dt));
            CHECK_REL(what, gx, rg, n, tol_of(dt));
            free(gx);
            /* backward from y alone where f' is a function of y */
            int y_only =
                op == DG_UN_EXP || op == DG_UN_SQRT || op == DG_UN_RSQRT || op == DG_UN_SIGMOID || op == DG_UN_TANH;
            if (y_only) {
                assert_int_equal(dg_cuda_unary_bwd(dt, (dg_unary_op)op, n, NULL, dy, dgy, dgx, a), 0);
                gx = dget_d(dgx, n, dt);
                snprintf(what, sizeof what, "unary_bwd(y) op %d %s", op, dg_dtype_name(dt));
                CHECK_REL(what, gx, rg, n, tol_of(dt));
                free(gx);
            } else if (op == DG_UN_LOG || op == DG_UN_SILU) {
                dg_clear_error();
                assert_int_equal(dg_cuda_unary_bwd(dt, (dg_unary_op)op, n, NULL, dy, dgy, dgx, a), -1);
                assert_true(strstr(dg_last_error(), "needs its input") != NULL);
                dg_clear_error();
            }
            free(x), free(gy), free(ry), free(rg), free(y);
            dg_cuda_free(dx), dg_cuda_free(dgy), dg_cuda_free(dy), dg_cuda_free(dgx);
        }
    }
    dg_clear_error();
    assert_int_equal(dg_cuda_unary(DG_F16, DG_UN_EXP, 4, NULL, NULL, 0), -1);
    assert_true(strstr(dg_last_error(), "f16") != NULL);
    dg_clear_error();
}

/* ---- binary, fill, copy, cast ---- */
static int64_t numel(int nd, const int64_t *sh) {
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= sh[d];
    return n;
}
static int64_t offset_of(int nd, const int64_t *sh, const int64_t *st, int64_t lin) {
    int64_t off = 0;
    for (int d = nd - 1; d >= 0; d--) {
        off += (lin % sh[d]) * st[d];
        lin /= sh[d];
    }
    return off;
}

static void test_binary(void **state) {
    (void)state;
    REQUIRE_GPU();
    const int64_t sh[6] = {2, 3, 4, 1, 5, 3};
    /* a: a permuted layout (dims stored in order 4,0,5,2,1,3); b: broadcast over dims 1 and 4 */
    int64_t ast[6], bst[6] = {4 * 3, 0, 3, 0, 0, 1};
    {
        const int order[6] = {4, 0, 5, 2, 1, 3};
        int64_t c = 1;
        for (int i = 5; i >= 0; i--) ast[order[i]] = c, c *= sh[order[i]];
    }
    const int64_t n = numel(6, sh), na = n, nb = 2 * 4 * 3;
    static const dg_dtype dts[2] = {DG_F32, DG_F64};
    for (int di = 0; di < 2; di++) {
        dg_dtype dt = dts[di];
        double *a = rnd(na, -2, 2), *b = rnd(nb, 0.5, 2);
        for (int64_t i = 0; i < na; i++) a[i] = dt == DG_F32 ? (float)a[i] : a[i];
        for (int64_t i = 0; i < nb; i++) b[i] = dt == DG_F32 ? (float)b[i] : b[i];
        void *da = dput_as(a, na, dt), *db = dput_as(b, nb, dt), *dout = dput(NULL, n, dg_dtype_size(dt));
        double *ref = malloc(sizeof(double) * n);
        for (int op = 0; op < DG_BIN_COUNT; op++) {
            for (int64_t i = 0; i < n; i++) {
                double x = a[offset_of(6, sh, ast, i)], y = b[offset_of(6, sh, bst, i)];
                ref[i] = op == DG_BIN_ADD ? x + y : op == DG_BIN_SUB ? x - y : op == DG_BIN_MUL ? x * y : x / y;
            }
            assert_int_equal(dg_cuda_binary(dt, (dg_binary_op)op, 6, sh, da, ast, db, bst, dout), 0);
            double *out = dget_d(dout, n, dt);
            char what[64];
            snprintf(what, sizeof what, "binary op %d %s", op, dg_dtype_name(dt));
            CHECK_REL(what, out, ref, n, tol_of(dt));
            free(out);
        }
        /* plain contiguous same-shape, and a 0-d scalar */
        assert_int_equal(dg_cuda_binary(dt, DG_BIN_MUL, 1, &na, da, NULL, da, NULL, dout), 0);
        double *out = dget_d(dout, na, dt);
        for (int64_t i = 0; i < na; i++) ref[i] = a[i] * a[i];
        CHECK_REL("binary contiguous", out, ref, na, tol_of(dt));
        free(out);
        assert_int_equal(dg_cuda_binary(dt, DG_BIN_SUB, 0, NULL, da, NULL, db, NULL, dout), 0);
        out = dget_d(dout, 1, dt);
        ref[0] = a[0] - b[0];
        CHECK_REL("binary 0-d", out, ref, 1, tol_of(dt));
        free(out), free(a), free(b), free(ref);
        dg_cuda_free(da), dg_cuda_free(db), dg_cuda_free(dout);
    }
    dg_clear_error();
    int64_t big[7] = {1, 1, 1, 1, 1, 1, 1};
    assert_int_equal(dg_cuda_binary(DG_F32, DG_BIN_ADD, 7, big, NULL, NULL, NULL, NULL, NULL), -1);
    assert_true(strstr(dg_last_error(), "7 dims") != NULL);
    dg_clear_error();
}

static void test_fill_copy_cast(void **state) {
    (void)state;
    REQUIRE_GPU();
    /* fill */
    static const dg_dtype all[6] = {DG_F32, DG_F64, DG_BF16, DG_I32, DG_I64, DG_F16};
    const int64_t n = 777;
    for (int di = 0; di < 6; di++) {
        size_t es = dg_dtype_size(all[di]);
        void *d = dput(NULL, n, es);
        assert_int_equal(dg_cuda_fill(all[di], n, d, -3.0), 0);
        unsigned char *h = dget(d, n, es);
        for (int64_t i = 0; i < n; i++) {
            double v = all[di] == DG_F32    ? ((float *)h)[i]
                       : all[di] == DG_F64  ? ((double *)h)[i]
                       : all[di] == DG_BF16 ? dg_bf16_to_f32(((uint16_t *)h)[i])
                       : all[di] == DG_F16  ? dg_f16_to_f64(((uint16_t *)h)[i])
                       : all[di] == DG_I32  ? ((int32_t *)h)[i]
                                            : (double)((int64_t *)h)[i];
            assert_true(v == -3.0);
        }
        free(h), dg_cuda_free(d);
    }
    /* strided copy: a transposed, sliced source into a destination with gaps, per element size */
    const int64_t sh[3] = {4, 5, 6}; /* src stored [6,5,4] transposed: strides (1, 4, 20) */
    const int64_t sst[3] = {1, 4, 20}, dst_st[3] = {5 * 6 * 2, 6 * 2, 2}; /* every other slot */
    const int64_t ns = 6 * 5 * 4, nd = 4 * 5 * 6 * 2;
    const size_t sizes[4] = {1, 2, 4, 8};
    for (int si = 0; si < 4; si++) {
        size_t es = sizes[si];
        unsigned char *src = malloc(ns * es), *exp_d = malloc(nd * es), *exp_c = malloc(ns * es);
        for (int64_t i = 0; i < (int64_t)(ns * es); i++) src[i] = (unsigned char)(urand() * 256);
        memset(exp_d, 0xff, nd * es);
        for (int64_t l = 0; l < ns; l++) {
            memcpy(exp_d + offset_of(3, sh, dst_st, l) * es, src + offset_of(3, sh, sst, l) * es, es);
            memcpy(exp_c + l * es, src + offset_of(3, sh, sst, l) * es, es);
        }
        void *ds = dput(src, ns, es), *dd = dput(NULL, nd, es), *dc = dput(NULL, ns, es);
        assert_int_equal(dg_cuda_copy_strided(es, 3, sh, dd, dst_st, ds, sst), 0);
        assert_int_equal(dg_cuda_copy_strided(es, 3, sh, dc, NULL, ds, sst), 0);
        unsigned char *gd = dget(dd, nd, es), *gc = dget(dc, ns, es);
        assert_memory_equal(gd, exp_d, nd * es);
        assert_memory_equal(gc, exp_c, ns * es);
        free(src), free(exp_d), free(exp_c), free(gd), free(gc);
        dg_cuda_free(ds), dg_cuda_free(dd), dg_cuda_free(dc);
    }
    dg_clear_error();
    assert_int_equal(dg_cuda_copy_strided(3, 1, sh, NULL, NULL, NULL, NULL), -1);
    assert_true(strstr(dg_last_error(), "element size") != NULL);
    dg_clear_error();
    /* casts: f64 -> f32 -> bf16 -> f64, and integers */
    double *x = rnd(n, -300, 300);
    void *d64 = dput_as(x, n, DG_F64), *d32 = dput(NULL, n, 4), *d16 = dput(NULL, n, 2), *dback = dput(NULL, n, 8),
         *di64 = dput(NULL, n, 8), *di32 = dput(NULL, n, 4);
    assert_int_equal(dg_cuda_cast(n, DG_F32, d32, DG_F64, d64), 0);
    assert_int_equal(dg_cuda_cast(n, DG_BF16, d16, DG_F32, d32), 0);
    assert_int_equal(dg_cuda_cast(n, DG_F64, dback, DG_BF16, d16), 0);
    assert_int_equal(dg_cuda_cast(n, DG_I64, di64, DG_F64, d64), 0);
    assert_int_equal(dg_cuda_cast(n, DG_I32, di32, DG_I64, di64), 0);
    double *f32 = dget_d(d32, n, DG_F32), *back = dget_d(dback, n, DG_F64);
    int32_t *i32 = dget(di32, n, 4);
    for (int64_t i = 0; i < n; i++) {
        assert_true(f32[i] == (double)(float)x[i]);
        assert_true(back[i] == (double)dg_bf16_to_f32(dg_bf16_from_f32((float)x[i])));
        assert_int_equal(i32[i], (int32_t)x[i]);
    }
    free(x), free(f32), free(back), free(i32);
    dg_cuda_free(d64), dg_cuda_free(d32), dg_cuda_free(d16), dg_cuda_free(dback);
    dg_cuda_free(di64), dg_cuda_free(di32);
    /* f16: f64 -> f16 on the device gives the host's bits (one rounding to nearest even from f64,
     * core/f16.h) over normal, subnormal, overflowing and tie values; f16 -> f32 -> f16 and
     * f16 -> bf16 -> f64 as on the host */
    double *y = rnd(n, -70000, 70000);
    for (int64_t i = 0; i < n; i++) y[i] = ldexp(y[i], -(int)(i % 40)); /* down to the subnormals */
    const double edge[8] = {65504,
                            65520,
                            -65520,
                            ldexp(1, -25),
                            1.5 * ldexp(1, -24),
                            1 + ldexp(1, -11),
                            1 + ldexp(1, -11) + ldexp(1, -40),
                            1023.5 * ldexp(1, -24)};
    for (int i = 0; i < 8; i++) y[i] = edge[i];
    void *y64 = dput_as(y, n, DG_F64), *h16 = dput(NULL, n, 2), *h32 = dput(NULL, n, 4), *h16b = dput(NULL, n, 2),
         *hbf = dput(NULL, n, 2), *hb64 = dput(NULL, n, 8);
    assert_int_equal(dg_cuda_cast(n, DG_F16, h16, DG_F64, y64), 0);
    assert_int_equal(dg_cuda_cast(n, DG_F32, h32, DG_F16, h16), 0);
    assert_int_equal(dg_cuda_cast(n, DG_F16, h16b, DG_F32, h32), 0);
    assert_int_equal(dg_cuda_cast(n, DG_BF16, hbf, DG_F16, h16), 0);
    assert_int_equal(dg_cuda_cast(n, DG_F64, hb64, DG_BF16, hbf), 0);
    uint16_t *g16 = dget(h16, n, 2), *g16b = dget(h16b, n, 2);
    double *gb64 = dget_d(hb64, n, DG_F64);
    for (int64_t i = 0; i < n; i++) {
        if (g16[i] != dg_f16_from_f64(y[i]))
            fail_msg("cast f64 -> f16 of %.17g: device 0x%04x, host 0x%04x", y[i], g16[i], dg_f16_from_f64(y[i]));
        assert_int_equal(g16b[i], g16[i]);
        assert_true(gb64[i] == (double)dg_bf16_to_f32(dg_bf16_from_f32(dg_f16_to_f32(g16[i]))));
    }
    free(y), free(g16), free(g16b), free(gb64);
    dg_cuda_free(y64), dg_cuda_free(h16), dg_cuda_free(h32), dg_cuda_free(h16b), dg_cuda_free(hbf), dg_cuda_free(hb64);
}

/* ---- sum ---- */
typedef struct sum_case {
    int ndim;
    int64_t shape[6];
    unsigned mask;
    int strided; /* input read through a transposed layout */
} sum_case;

static void test_sum(void **state) {
    (void)state;
    REQUIRE_GPU();
    const sum_case cases[] = {
        {2, {7, 300}, 0x2, 0},            /* rows, warp per output */
        {2, {5, 20000}, 0x2, 0},          /* rows, block per output, split */
        {2, {3000, 7}, 0x1, 0},           /* columns, split */
        {2, {3000, 7}, 0x1, 1},           /* the same read transposed: rows */
        {1, {1000003}, 0x1, 0},           /* everything, split */
        {6, {2, 3, 4, 5, 3, 2}, 0x2a, 1}, /* dims 1, 3, 5 of a strided 6-d view */
        {6, {2, 3, 4, 5, 3, 2}, 0x15, 0}, /* dims 0, 2, 4 */
        {3, {4, 5, 6}, 0x0, 1},           /* nothing: a scaled strided copy */
        {0, {0}, 0x0, 0},                 /* 0-d */
        {3, {4, 0, 6}, 0x2, 0},           /* empty reduction: zeros */
    };
    static const dg_dtype dts[2] = {DG_F32, DG_F64};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const sum_case *c = &cases[ci];
        int64_t n = numel(c->ndim, c->shape), st[6], m = 1;
        /* strided: element (i0..) lives at the position of the reversed-dims contiguous layout */
        int64_t acc = 1;
        for (int d = 0; d < c->ndim; d++) st[d] = acc, acc *= c->shape[d];
        for (int d = 0; d < c->ndim; d++)
            if (!(c->mask >> d & 1)) m *= c->shape[d];
        for (int di = 0; di < 2; di++) {
            dg_dtype dt = dts[di];
            double *x = rnd(n, -1, 1), *ref = calloc(m ? m : 1, sizeof(double));
            for (int64_t i = 0; i < n; i++) x[i] = dt == DG_F32 ? (float)x[i] : x[i];
            const double alpha = 0.5;
            /* reference: each element of the logical view added to its output */
            for (int64_t l = 0; l < n; l++) {
                int64_t rem = l, o = 0, om = 1, off = 0;
                for (int d = c->ndim - 1; d >= 0; d--) {
                    int64_t i = rem % c->shape[d];
                    rem /= c->shape[d];
                    off += i * st[d];
                    if (!(c->mask >> d & 1)) o += i * om, om *= c->shape[d];
                }
                ref[o] += alpha * x[c->strided ? off : l];
            }
            void *dx = dput_as(x, n, dt), *dout = dput(NULL, m, dg_dtype_size(dt));
            assert_int_equal(dg_cuda_sum(dt, c->ndim, c->shape, dx, c->strided ? st : NULL, c->mask, alpha, dout), 0);
            double *out = dget_d(dout, m, dt);
            char what[64];
            snprintf(what, sizeof what, "sum case %zu %s", ci, dg_dtype_name(dt));
            CHECK_REL(what, out, ref, m, tol_of(dt));
            free(x), free(ref), free(out), dg_cuda_free(dx), dg_cuda_free(dout);
        }
    }
    dg_clear_error();
    int64_t sh[2] = {2, 2};
    assert_int_equal(dg_cuda_sum(DG_F32, 2, sh, NULL, NULL, 0x4, 1.0, NULL), -1);
    assert_true(strstr(dg_last_error(), "mask") != NULL);
    dg_clear_error();
}

/* ---- gemm ---- */
static void test_gemm(void **state) {
    (void)state;
    REQUIRE_GPU();
    const int64_t M = 37, N = 29, K = 45, batch = 3, pad = 3;
    static const dg_dtype abs_[4] = {DG_F32, DG_F64, DG_BF16, DG_BF16};
    static const dg_dtype cs[4] = {DG_F32, DG_F64, DG_BF16, DG_F32};
    for (int ti = 0; ti < 4; ti++) {
        dg_dtype ab = abs_[ti], cd = cs[ti];
        for (int tr = 0; tr < 4; tr++) {
            bool ta = tr & 1, tb = tr & 2;
            int bcast_b = tr == 3; /* one B for every batch member */
            int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
            int64_t lda = ac + pad, ldb = bc + pad, ldc = N + pad;
            int64_t sa = ar * lda, sb = bcast_b ? 0 : br * ldb, sc = M * ldc;
            int64_t na = batch * sa, nb = bcast_b ? br * ldb : batch * sb, nc = batch * sc;
            double *A = rnd(na, -1, 1), *B = rnd(nb, -1, 1), *C = rnd(nc, -1, 1);
            /* what the device will hold */
            for (int64_t i = 0; i < na; i++)
                A[i] = ab == DG_F64 ? A[i] : ab == DG_F32 ? (float)A[i] : dg_bf16_to_f32(dg_bf16_from_f32((float)A[i]));
            for (int64_t i = 0; i < nb; i++)
                B[i] = ab == DG_F64 ? B[i] : ab == DG_F32 ? (float)B[i] : dg_bf16_to_f32(dg_bf16_from_f32((float)B[i]));
            for (int64_t i = 0; i < nc; i++)
                C[i] = cd == DG_F64 ? C[i] : cd == DG_F32 ? (float)C[i] : dg_bf16_to_f32(dg_bf16_from_f32((float)C[i]));
            const double alpha = 0.7, beta = tr == 2 ? 0.0 : 0.3;
            double *ref = malloc(sizeof(double) * batch * M * N), *got = malloc(sizeof(double) * batch * M * N);
            for (int64_t b = 0; b < batch; b++)
                for (int64_t i = 0; i < M; i++)
                    for (int64_t j = 0; j < N; j++) {
                        double s = 0;
                        for (int64_t p = 0; p < K; p++) {
                            double av = A[b * sa + (ta ? p * lda + i : i * lda + p)];
                            double bv = B[b * sb + (tb ? j * ldb + p : p * ldb + j)];
                            s += av * bv;
                        }
                        ref[(b * M + i) * N + j] = alpha * s + beta * C[b * sc + i * ldc + j];
                    }
            void *dA = dput_as(A, na, ab), *dB = dput_as(B, nb, ab), *dC = dput_as(C, nc, cd);
            if (beta == 0) { /* beta = 0 must not read C: poison it */
                dg_cuda_free(dC);
                dC = dput(NULL, nc, dg_dtype_size(cd));
            }
            assert_int_equal(
                dg_cuda_gemm(ab, cd, ta, tb, M, N, K, alpha, dA, lda, sa, dB, ldb, sb, beta, dC, ldc, sc, batch), 0);
            double *Cg = dget_d(dC, nc, cd);
            for (int64_t b = 0; b < batch; b++)
                for (int64_t i = 0; i < M; i++)
                    for (int64_t j = 0; j < N; j++) got[(b * M + i) * N + j] = Cg[b * sc + i * ldc + j];
            char what[80];
            snprintf(what, sizeof what, "gemm %s->%s ta=%d tb=%d", dg_dtype_name(ab), dg_dtype_name(cd), ta, tb);
            /* bf16 results are rounded to bf16 (2^-9 relative per element) */
            CHECK_REL(what, got, ref, batch * M * N, cd == DG_BF16 ? 5e-3 : tol_of(cd));
            free(A), free(B), free(C), free(ref), free(got), free(Cg);
            dg_cuda_free(dA), dg_cuda_free(dB), dg_cuda_free(dC);
        }
    }
    /* K = 0: C = beta C */
    double c0[6] = {1, 2, 3, 4, 5, 6};
    void *dC = dput_as(c0, 6, DG_F32);
    assert_int_equal(dg_cuda_gemm(DG_F32, DG_F32, false, false, 2, 3, 0, 1.0, dC, 1, 0, dC, 3, 0, 0.5, dC, 3, 6, 1), 0);
    double *g0 = dget_d(dC, 6, DG_F32);
    for (int i = 0; i < 6; i++) assert_true(g0[i] == 0.5 * c0[i]);
    free(g0), dg_cuda_free(dC);
    dg_clear_error();
    assert_int_equal(dg_cuda_gemm(DG_F32, DG_F64, false, false, 2, 2, 2, 1, NULL, 2, 0, NULL, 2, 0, 0, NULL, 2, 0, 1),
                     -1);
    assert_true(strstr(dg_last_error(), "not supported") != NULL);
    dg_clear_error();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runtime),        cmocka_unit_test(test_unary), cmocka_unit_test(test_binary),
        cmocka_unit_test(test_fill_copy_cast), cmocka_unit_test(test_sum),   cmocka_unit_test(test_gemm),
    };
    return dg_test_run_filtered(tests);
}

#else /* no CUDA backend in this build */

int main(void) { return dg_test_main_without_cuda(); }

#endif
