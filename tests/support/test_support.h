/* Shared helpers of the cmocka tests. */
#ifndef DG_TEST_SUPPORT_H
#define DG_TEST_SUPPORT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "deltagrad.h"

/* Asserts that the last error contains `needle`, then clears it. */
#define assert_error_contains(needle)                                                              \
    do {                                                                                           \
        if (!strstr(dg_last_error(), (needle)))                                                    \
            fail_msg("error '%s' does not contain '%s'", dg_last_error(), (needle));               \
        dg_clear_error();                                                                          \
    } while (0)

/* max |a - b| over all elements (any dtypes, same shape) */
double dg_test_max_abs_diff(const dg_tensor *a, const dg_tensor *b);
/* ||a - b|| / ||b|| */
double dg_test_rel_err(const dg_tensor *a, const dg_tensor *b);
/* Skips the test when no GPU is present. */
void dg_test_require_cuda(void);

#endif
