/* Shared helpers of the cmocka tests. */
#ifndef DG_TEST_SUPPORT_H
#define DG_TEST_SUPPORT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/bf16.h"
#include "deltagrad.h"

/* Asserts that the last error contains `needle`, then clears it. */
#define assert_error_contains(needle)                                                \
    do {                                                                             \
        if (!strstr(dg_last_error(), (needle)))                                      \
            fail_msg("error '%s' does not contain '%s'", dg_last_error(), (needle)); \
        dg_clear_error();                                                            \
    } while (0)

/* max |a - b| over all elements (any dtypes, same shape) */
double dg_test_max_abs_diff(const dg_tensor *a, const dg_tensor *b);
/* ||a - b|| / ||b|| */
double dg_test_rel_err(const dg_tensor *a, const dg_tensor *b);
/* ||a - ref|| / ||ref|| over n doubles (||a - ref|| when ref is 0; NaN anywhere gives NaN) */
double dg_test_rel_err_norm(const double *a, const double *ref, int64_t n);
/* The next value in [0, 1) of the xorshift64 generator at *state (shifts 13, 7, 17; the top 53
 * bits), the tests' deterministic source independent of the runtime's: each test program keeps its
 * own state and seed. */
double dg_test_xorshift(uint64_t *state);

/* Skips the running test, saying why: prints "  skipped: WHY" (which `scons test` collects into
 * its summary), then cmocka's skip().  Every skip in the tests goes through here. */
void dg_test_skip(const char *why);
/* Skips the test when no GPU is present (the reason says whether the build or the machine lacks it). */
void dg_test_require_cuda(void);

/* cmocka_run_group_tests with the environment's DG_TEST_FILTER (a cmocka test-name pattern)
 * applied, e.g. DG_TEST_FILTER=test_dr_chunk_sanitize to run only the small cases under
 * compute-sanitizer's slower tools. */
#define dg_test_run_filtered(tests) (dg_test_apply_filter(), cmocka_run_group_tests(tests, NULL, NULL))
void dg_test_apply_filter(void);

/* The main() of a test program that needs the CUDA backend, in a build without it: one test
 * that skips, so the program reports and passes. */
int dg_test_main_without_cuda(void);

#endif
