/* The training run's per-step log ring (ops/step_log.h) on the host and on the device: records
 * land in row count mod R with the loss (f32 or f64), the norm, a time that does not go back and the
 * flag (f32, f64, or 0 when none is given);
 * count grows by one a record; bad arguments are refused with the argument named and nothing
 * written.  The device test skips without a GPU. */
#include "tests/support/test_support.h"

#include "core/internal.h"
#include "ops/step_log.h"

#include <math.h>
#include <string.h>

enum { R = 3, PUTS = 5 };

/* PUTS records into a ring of R on dev (loss f32 on odd puts, f64 on even ones), then the ring
 * and the count compared on the host */
static void puts_and_check(dg_device dev) {
    dg_scope_begin();
    dg_tensor *ring = dg_zeros_on(2, (int64_t[]){R, 4}, DG_F64, dev);
    dg_tensor *count = dg_zeros_on(1, (int64_t[]){1}, DG_I64, dev);
    assert_non_null(ring);
    assert_non_null(count);
    double want_loss[PUTS], want_norm[PUTS], want_flag[PUTS];
    for (int i = 0; i < PUTS; i++) {
        want_loss[i] = 0.5 + i;
        want_norm[i] = 10.0 * i + 0.25;
        dg_tensor *loss = i % 2 ? dg_full(0, NULL, DG_F32, want_loss[i]) : dg_full(0, NULL, DG_F64, want_loss[i]);
        dg_tensor *norm = dg_full(1, (int64_t[]){1}, DG_F64, want_norm[i]);
        /* the flag: none, f32, f64 in turn */
        want_flag[i] = i % 3 ? 0.125 * i : 0.0;
        dg_tensor *flag = i % 3 == 0 ? NULL : dg_full(1, (int64_t[]){1}, i % 3 == 1 ? DG_F32 : DG_F64, want_flag[i]);
        if (dev != DG_CPU) loss = dg_to_device(loss, dev), norm = dg_to_device(norm, dev);
        if (dev != DG_CPU && flag) flag = dg_to_device(flag, dev);
        if (dg_step_log_put_(ring, count, loss, norm, flag)) fail_msg("put %d: %s", i, dg_last_error());
    }
    dg_tensor *h = dg_to_device(ring, DG_CPU), *c = dg_to_device(count, DG_CPU);
    const double *r = dg_data_ptr(h);
    assert_int_equal(*(const int64_t *)dg_data_ptr(c), PUTS);
    /* rows hold the last R records: record n in row n mod R */
    double prev_time = -INFINITY;
    for (int n = PUTS - R; n < PUTS; n++) {
        const double *row = r + 4 * (n % R);
        assert_true(row[0] == want_loss[n]);
        assert_true(row[1] == want_norm[n]);
        assert_true(row[3] == want_flag[n]);
        if (!(row[2] >= prev_time))
            fail_msg("record %d's time %.9f is before the previous record's %.9f", n, row[2], prev_time);
        prev_time = row[2];
    }
    dg_scope_end();
}

static void test_step_log_host(void **state) { puts_and_check(DG_CPU); }

static void test_step_log_device(void **state) {
    dg_test_require_cuda();
    puts_and_check(DG_CUDA);
}

static void expect_refused(dg_tensor *ring, dg_tensor *count, dg_tensor *loss, dg_tensor *norm, dg_tensor *flag,
                           const char *arg) {
    dg_clear_error();
    assert_int_equal(dg_step_log_put_(ring, count, loss, norm, flag), -1);
    const char *msg = dg_last_error();
    if (!strstr(msg, "step_log_put") || !strstr(msg, arg)) fail_msg("the error for a bad %s reads: %s", arg, msg);
    dg_clear_error();
}

static void test_step_log_bad_input(void **state) {
    dg_scope_begin();
    dg_tensor *ring = dg_zeros(2, (int64_t[]){R, 4}, DG_F64), *count = dg_zeros(1, (int64_t[]){1}, DG_I64);
    dg_tensor *loss = dg_full(0, NULL, DG_F32, 1.0), *norm = dg_full(1, (int64_t[]){1}, DG_F64, 2.0);
    expect_refused(dg_zeros(2, (int64_t[]){R, 3}, DG_F64), count, loss, norm, NULL, "ring");
    expect_refused(dg_zeros(2, (int64_t[]){R, 4}, DG_F32), count, loss, norm, NULL, "ring");
    expect_refused(ring, dg_zeros(1, (int64_t[]){2}, DG_I64), loss, norm, NULL, "count");
    expect_refused(ring, dg_zeros(1, (int64_t[]){1}, DG_F64), loss, norm, NULL, "count");
    expect_refused(ring, count, dg_zeros(1, (int64_t[]){2}, DG_F32), norm, NULL, "loss");
    expect_refused(ring, count, dg_full(0, NULL, DG_I64, 1.0), norm, NULL, "loss");
    expect_refused(ring, count, loss, dg_full(1, (int64_t[]){1}, DG_F32, 2.0), NULL, "norm");
    expect_refused(ring, count, loss, norm, dg_zeros(1, (int64_t[]){2}, DG_F32), "flag");
    expect_refused(ring, count, loss, norm, dg_full(0, NULL, DG_I32, 1.0), "flag");
    expect_refused(NULL, count, loss, norm, NULL, "ring");
    /* nothing was written */
    assert_int_equal(*(const int64_t *)dg_data_ptr(count), 0);
    const double *r = dg_data_ptr(ring);
    for (int i = 0; i < 4 * R; i++) assert_true(r[i] == 0.0);
    dg_scope_end();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step_log_host),
        cmocka_unit_test(test_step_log_bad_input),
        cmocka_unit_test(test_step_log_device),
    };
    return dg_test_run_filtered(tests);
}
