/* core: views and strides, broadcasting, dtype conversion, RNG reproducibility, scopes, errors. */
#include "tests/support/test_support.h"

#include "core/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef DG_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

static void test_views_share_storage(void **state) {
    dg_scope_begin();
    dg_tensor *x = dg_arange(0, 24, 1, DG_F32);
    dg_tensor *r = dg_reshape(x, DG_SHAPE(2, 3, 4));
    assert_ptr_equal(r->storage, x->storage);
    dg_tensor *p = dg_permute(r, (int[]){2, 0, 1}); /* [4,2,3] */
    assert_int_equal(p->shape[0], 4);
    assert_int_equal(p->stride[0], 1);
    assert_int_equal(p->stride[1], 12);
    assert_false(dg_is_contiguous(p));
    assert_ptr_equal(p->storage, x->storage);
    /* p[i,j,k] = r[j,k,i] = 12j + 4k + i */
    assert_true(dg_get(p, (int64_t[]){3, 1, 2}) == 12 + 8 + 3);
    dg_tensor *s = dg_slice(r, 2, 1, 3); /* [2,3,2] */
    assert_ptr_equal(s->storage, x->storage);
    assert_true(dg_get(s, (int64_t[]){1, 2, 0}) == 12 + 8 + 1);
    dg_tensor *t = dg_transpose(r, 0, 2);
    assert_true(dg_get(t, (int64_t[]){3, 2, 1}) == 12 + 8 + 3);
    dg_tensor *c = dg_contiguous(p);
    assert_true(dg_is_contiguous(c));
    assert_true(dg_test_max_abs_diff(c, p) == 0);
    /* reshape of a non-contiguous tensor copies only when it has to */
    dg_tensor *merged = dg_reshape(dg_slice(r, 0, 0, 1), DG_SHAPE(12));
    assert_ptr_equal(merged->storage, x->storage);
    dg_tensor *copied = dg_reshape(p, DG_SHAPE(24));
    assert_ptr_not_equal(copied->storage, x->storage);
    assert_true(dg_get(copied, (int64_t[]){1}) == 4);
    /* writes through a view are visible in the base */
    dg_set(s, (int64_t[]){0, 0, 0}, -5);
    assert_true(dg_get(x, (int64_t[]){1}) == -5);
    dg_scope_end();
}

static void test_broadcasting(void **state) {
    dg_scope_begin();
    dg_tensor *a = dg_arange(0, 6, 1, DG_F64);
    a = dg_reshape(a, DG_SHAPE(2, 3, 1));
    dg_tensor *b = dg_arange(0, 4, 1, DG_F64); /* [4] */
    dg_tensor *c = dg_add(a, b);               /* [2,3,4] */
    assert_int_equal(c->ndim, 3);
    assert_int_equal(c->shape[2], 4);
    assert_true(dg_get(c, (int64_t[]){1, 2, 3}) == 5 + 3);
    dg_tensor *e = dg_expand(b, DG_SHAPE(3, 4));
    assert_int_equal(e->stride[0], 0);
    assert_null(dg_add(dg_zeros(DG_SHAPE(2, 3), DG_F32), dg_zeros(DG_SHAPE(4), DG_F32)));
    assert_error_contains("add: b has shape [4] which does not broadcast with a [2,3]");
    dg_scope_end();
}

static void test_dtype_conversion(void **state) {
    dg_scope_begin();
    dg_tensor *x = dg_from_data(DG_SHAPE(4), DG_F64, (double[]){1.5, -2.25, 3.0, 1e-3});
    dg_tensor *f = dg_to_dtype(x, DG_F32);
    assert_int_equal(f->dtype, DG_F32);
    assert_true(fabs(dg_get(f, (int64_t[]){3}) - 1e-3) < 1e-10);
    dg_tensor *i = dg_to_dtype(x, DG_I64);
    assert_true(dg_get(i, (int64_t[]){1}) == -2);
    dg_tensor *h = dg_to_dtype(x, DG_BF16);
    assert_true(dg_get(h, (int64_t[]){0}) == 1.5); /* exactly representable */
    assert_true(fabs(dg_get(h, (int64_t[]){3}) - 1e-3) < 1e-5);
    dg_tensor *back = dg_to_dtype(i, DG_F64);
    assert_true(dg_get(back, (int64_t[]){2}) == 3.0);
    dg_scope_end();
}

/* f16 (IEEE binary16): 1 sign, 5 exponent (bias 15), 10 fraction bits.  Each value is written
 * from f64 by dg_set (one rounding to nearest even, core/f16.h) and its bits are compared with the
 * expected encoding; the bits then read back exactly. */
static void test_f16_conversion(void **state) {
    dg_scope_begin();
    const double sub = ldexp(1, -24); /* the smallest subnormal */
    const struct {
        double x;
        uint16_t bits;
    } cases[] = {
        {0.0, 0x0000},
        {-0.0, 0x8000},
        {1.0, 0x3c00},
        {-2.5, 0xc100},
        {65504.0, 0x7bff},  /* the largest finite value, 2047 * 2^5 */
        {65519.99, 0x7bff}, /* below the midpoint 65520: rounds down */
        {65520.0, 0x7c00},  /* the midpoint to 2^16: ties to even = overflow to inf */
        {-65520.0, 0xfc00},
        {1e6, 0x7c00},
        {sub, 0x0001},                               /* 2^-24 */
        {sub / 2, 0x0000},                           /* 2^-25: tie between 0 and 2^-24, even is 0 */
        {nextafter(sub / 2, 1), 0x0001},             /* just above 2^-25 */
        {1.5 * sub, 0x0002},                         /* tie between 1 and 2 ulps of 2^-24, even is 2 */
        {1023 * sub, 0x03ff},                        /* the largest subnormal */
        {1023.5 * sub, 0x0400},                      /* tie, rounds up to 2^-14, the smallest normal */
        {1 + ldexp(1, -11), 0x3c00},                 /* tie between 1 and 1 + 2^-10, even is 1 */
        {1 + 3 * ldexp(1, -11), 0x3c02},             /* tie, even is 1 + 2^-9 */
        {1 + ldexp(1, -11) + ldexp(1, -40), 0x3c01}, /* above the tie (rounding to f32 first would
                                                      * make it the tie and round twice, to 1) */
        {1e-3, 0x1419},                              /* 1049 * 2^-20 */
        {INFINITY, 0x7c00},
        {-INFINITY, 0xfc00},
    };
    const int n = (int)(sizeof cases / sizeof cases[0]);
    dg_tensor *t = dg_zeros(DG_SHAPE(n + 1), DG_F16);
    assert_int_equal(t->dtype, DG_F16);
    assert_int_equal(dg_dtype_size(DG_F16), 2);
    assert_string_equal(dg_dtype_name(DG_F16), "f16");
    assert_true(dg_dtype_is_float(DG_F16));
    for (int i = 0; i < n; i++) dg_set(t, (int64_t[]){i}, cases[i].x);
    dg_set(t, (int64_t[]){n}, NAN);
    const uint16_t *bits = dg_data_ptr(t);
    for (int i = 0; i < n; i++)
        if (bits[i] != cases[i].bits)
            fail_msg("f16 of %.17g: bits 0x%04x, expected 0x%04x", cases[i].x, bits[i], cases[i].bits);
    assert_true((bits[n] & 0x7c00) == 0x7c00 && (bits[n] & 0x3ff) != 0); /* NaN stays NaN */
    assert_true(isnan(dg_get(t, (int64_t[]){n})));
    assert_true(dg_get(t, (int64_t[]){4}) == 65504.0);
    assert_true(dg_get(t, (int64_t[]){9}) == sub);
    assert_true(dg_get(t, (int64_t[]){12}) == 2 * sub);
    assert_true(dg_get(t, (int64_t[]){13}) == 1023 * sub);
    assert_true(dg_get(t, (int64_t[]){14}) == ldexp(1, -14));
    assert_true(dg_get(t, (int64_t[]){16}) == 1 + ldexp(1, -9));
    assert_true(isinf(dg_get(t, (int64_t[]){6})) && dg_get(t, (int64_t[]){7}) < 0);
    assert_true(signbit(dg_get(t, (int64_t[]){1})));

    /* to_dtype both ways: f32 -> f16 -> f64 and back to f32; f16 -> bf16 rounds again */
    dg_tensor *x = dg_from_data(DG_SHAPE(4), DG_F32, (float[]){1.5f, -2.25f, 3.0f, 1e-3f});
    dg_tensor *h = dg_to_dtype(x, DG_F16);
    assert_int_equal(h->dtype, DG_F16);
    assert_true(dg_get(h, (int64_t[]){1}) == -2.25);                 /* exact */
    assert_true(dg_get(h, (int64_t[]){3}) == 0x419 * ldexp(1, -20)); /* 1e-3 -> 1049 * 2^-20 */
    dg_tensor *d = dg_to_dtype(h, DG_F64), *b = dg_to_dtype(h, DG_BF16);
    assert_true(dg_get(d, (int64_t[]){3}) == 0x419 * ldexp(1, -20));
    assert_true(dg_get(b, (int64_t[]){0}) == 1.5);
    /* strided copies keep the bits */
    dg_tensor *m = dg_to_dtype(dg_reshape(dg_arange(0, 6, 1, DG_F32), DG_SHAPE(2, 3)), DG_F16);
    dg_tensor *tr = dg_contiguous(dg_transpose(m, 0, 1));
    assert_int_equal(tr->dtype, DG_F16);
    assert_true(dg_get(tr, (int64_t[]){2, 1}) == 5.0);
    /* randn draws in f16 too */
    dg_rng rng = dg_rng_new(3);
    dg_tensor *r = dg_randn(DG_SHAPE(64), DG_F16, &rng);
    assert_non_null(r);
    double s2 = 0;
    for (int i = 0; i < 64; i++) s2 += dg_get(r, (int64_t[]){i}) * dg_get(r, (int64_t[]){i});
    assert_true(s2 > 16 && s2 < 256);
    /* printing */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    dg_print(dg_slice(t, 0, 4, 7), f);
    fclose(f);
    assert_non_null(strstr(buf, "tensor([3], f16, cpu) [65504, 65504, inf]"));
    free(buf);
    dg_scope_end();
}

static void test_rng_reproducible(void **state) {
    dg_scope_begin();
    dg_rng r1 = dg_rng_new(42), r2 = dg_rng_new(42), r3 = dg_rng_new(43);
    dg_tensor *a = dg_randn(DG_SHAPE(1000), DG_F64, &r1), *b = dg_randn(DG_SHAPE(1000), DG_F64, &r2);
    dg_tensor *c = dg_randn(DG_SHAPE(1000), DG_F64, &r3);
    assert_true(dg_test_max_abs_diff(a, b) == 0);
    assert_true(dg_test_max_abs_diff(a, c) > 0.1);
    /* moments of N(0,1) and U[0,1) */
    double m = dg_item(dg_mean_all(a)), v = dg_item(dg_mean_all(dg_mul(a, a)));
    assert_true(fabs(m) < 0.1 && fabs(v - 1) < 0.15);
    dg_tensor *u = dg_rand(DG_SHAPE(4000), DG_F32, &r1);
    assert_true(fabs(dg_item(dg_mean_all(u)) - 0.5) < 0.03);
    /* a second draw continues the stream: differs from the first */
    dg_tensor *a2 = dg_randn(DG_SHAPE(1000), DG_F64, &r2);
    assert_true(dg_test_max_abs_diff(a2, b) > 0.1);
    /* counter-based: drawing 8 then 8 equals the 16 drawn at once (f32: 4 numbers a block) */
    dg_rng s1 = dg_rng_new(7), s2 = dg_rng_new(7);
    dg_tensor *whole = dg_rand(DG_SHAPE(16), DG_F32, &s1);
    dg_tensor *h1 = dg_rand(DG_SHAPE(8), DG_F32, &s2), *h2 = dg_rand(DG_SHAPE(8), DG_F32, &s2);
    assert_true(dg_test_max_abs_diff(dg_cat(2, (dg_tensor *[]){h1, h2}, 0), whole) == 0);
    /* a draw large enough to be split over the threads gives the numbers of small draws in order:
     * 2^19 + 2 normals at once against a first piece of 8 and the rest */
    dg_rng t1 = dg_rng_new(9), t2 = dg_rng_new(9);
    const int64_t big = ((int64_t)1 << 19) + 2;
    dg_tensor *all = dg_randn(DG_SHAPE(big), DG_F32, &t1);
    dg_tensor *p1 = dg_randn(DG_SHAPE(8), DG_F32, &t2), *p2 = dg_randn(DG_SHAPE(big - 8), DG_F32, &t2);
    assert_true(dg_test_max_abs_diff(dg_cat(2, (dg_tensor *[]){p1, p2}, 0), all) == 0);
    assert_true(t1.counter == t2.counter);
    dg_scope_end();
}

static void test_scopes_release_everything(void **state) {
    size_t tensors = dg_live_tensors(), bytes = dg_live_bytes(DG_CPU);
    dg_scope_begin();
    dg_tensor *kept = NULL;
    for (int i = 0; i < 10; i++) {
        dg_scope_begin();
        dg_tensor *x = dg_randn(DG_SHAPE(64, 64), DG_F32, NULL);
        dg_tensor *y = dg_matmul(x, dg_transpose(x, 0, 1));
        if (i == 5) kept = dg_keep(y);
        dg_tensor *z = dg_scope_return(dg_sum_all(y));
        assert_non_null(z);
    }
    dg_scope_end();
    assert_non_null(kept);
    assert_int_equal(dg_live_tensors(), tensors + 1);
    dg_release(kept);
    assert_int_equal(dg_live_tensors(), tensors);
    assert_int_equal(dg_live_bytes(DG_CPU), bytes);
}

static void test_errors_first_wins(void **state) {
    dg_scope_begin();
    dg_clear_error();
    dg_tensor *bad = dg_reshape(dg_zeros(DG_SHAPE(2, 3), DG_F32), DG_SHAPE(4, 2));
    assert_null(bad);
    /* a chain continues on NULL and keeps the first message */
    assert_null(dg_exp(dg_add(bad, bad)));
    assert_error_contains("reshape: a has shape [2,3] (6 elements) which cannot be viewed as [4,2]");
    assert_null(dg_empty(DG_SHAPE(-1, 2), DG_F32));
    assert_error_contains("negative size");
    dg_scope_end();
}

static void test_print(void **state) {
    dg_scope_begin();
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    dg_print(dg_reshape(dg_arange(0, 4, 1, DG_F32), DG_SHAPE(2, 2)), f);
    fclose(f);
    assert_non_null(strstr(buf, "tensor([2,2], f32, cpu) [[0, 1],\n [2, 3]]"));
    free(buf);
    dg_scope_end();
}

/* dg_zeros clears what the allocator hands back (here most likely the block just freed, which held
 * 7s); dg_empty does not, and under DG_DEBUG_FILL_NAN every element of it starts as NaN (-1 in the
 * integer dtypes). */
static void test_zeros_and_empty(void **state) {
    dg_scope_begin();
    for (int round = 0; round < 3; round++) {
        dg_tensor *sevens = dg_keep(dg_full(DG_SHAPE(1000), DG_F32, 7.0));
        assert_non_null(sevens);
        dg_release(sevens);
        dg_tensor *z = dg_zeros(DG_SHAPE(1000), DG_F32);
        assert_non_null(z);
        const float *pz = dg_data_ptr(z);
        for (int i = 0; i < 1000; i++) assert_true(pz[i] == 0.0f);
        dg_tensor *zl = dg_zeros_like(dg_full(DG_SHAPE(10, 10), DG_F64, 3.0));
        assert_true(dg_item(dg_sum_all(zl)) == 0.0);
    }
    const char *fill = getenv("DG_DEBUG_FILL_NAN");
    if (fill && strcmp(fill, "0") != 0) {
        dg_tensor *e = dg_empty(DG_SHAPE(33), DG_F32), *ei = dg_empty(DG_SHAPE(5), DG_I64);
        for (int i = 0; i < 33; i++) assert_true(isnan(((const float *)dg_data_ptr(e))[i]));
        for (int i = 0; i < 5; i++) assert_true(((const int64_t *)dg_data_ptr(ei))[i] == -1);
    }
    dg_scope_end();
}

/* The library sets jemalloc's page decay for every program that links it (core/storage.c): freed
 * activations stay mapped from one step to the next.  MALLOC_CONF in the environment overrides it. */
static void test_allocator_settings(void **state) {
#ifdef DG_JEMALLOC
    if (getenv("MALLOC_CONF")) {
        dg_test_skip("MALLOC_CONF is set in the environment and overrides the library's settings");
        return;
    }
    ssize_t dirty = 0, muzzy = 0;
    size_t sz = sizeof dirty;
    assert_int_equal(mallctl("opt.dirty_decay_ms", &dirty, &sz, NULL, 0), 0);
    assert_int_equal(mallctl("opt.muzzy_decay_ms", &muzzy, &sz, NULL, 0), 0);
    assert_true(dirty == -1);
    assert_true(muzzy == -1);
#else
    dg_test_skip("built without jemalloc (the sanitizer build keeps ASan's allocator)");
#endif
}

/* a note prints the first time its text comes, and only then */
static void test_note_once(void **state) {
    (void)state;
    assert_true(dg_note_once("test_core: a note"));
    assert_false(dg_note_once("test_core: a note"));
    assert_true(dg_note_once("test_core: another note"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_views_share_storage),
        cmocka_unit_test(test_broadcasting),
        cmocka_unit_test(test_dtype_conversion),
        cmocka_unit_test(test_rng_reproducible),
        cmocka_unit_test(test_scopes_release_everything),
        cmocka_unit_test(test_errors_first_wins),
        cmocka_unit_test(test_print),
        cmocka_unit_test(test_f16_conversion),
        cmocka_unit_test(test_zeros_and_empty),
        cmocka_unit_test(test_allocator_settings),
        cmocka_unit_test(test_note_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
