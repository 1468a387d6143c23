#include "tests/support/test_support.h"
#include "core/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double dg_test_max_abs_diff(const dg_tensor *a, const dg_tensor *b) {
    double m = 0;
    int64_t idx[DG_MAX_DIMS] = {0};
    if (dg_numel(a) == 0) return 0;
    do {
        double d = fabs(dg_get(a, idx) - dg_get(b, idx));
        if (d > m || isnan(d)) m = isnan(d) ? INFINITY : d;
    } while (dg_next_index(a->ndim, a->shape, idx));
    return m;
}

double dg_test_rel_err(const dg_tensor *a, const dg_tensor *b) {
    double num = 0, den = 0;
    int64_t idx[DG_MAX_DIMS] = {0};
    if (dg_numel(a) == 0) return 0;
    do {
        double x = dg_get(a, idx), y = dg_get(b, idx);
        num += (x - y) * (x - y);
        den += y * y;
    } while (dg_next_index(a->ndim, a->shape, idx));
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

double dg_test_rel_err_norm(const double *a, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

double dg_test_xorshift(uint64_t *state) {
    uint64_t s = *state;
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    *state = s;
    return (double)(s >> 11) / 9007199254740992.0;
}

void dg_test_skip(const char *why) {
    print_message("  skipped: %s\n", why);
    skip();
}

void dg_test_require_cuda(void) {
    if (dg_cuda_available()) return;
#ifdef DG_HAVE_CUDA
    dg_test_skip("needs a GPU: no CUDA device is visible");
#else
    dg_test_skip("needs the CUDA backend: this build has none (built with cuda=0, or cuda=auto without nvcc or a GPU)");
#endif
}

void dg_test_apply_filter(void) {
    const char *filter = getenv("DG_TEST_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
}

static void test_no_cuda_backend(void **state) {
    (void)state;
    dg_test_skip("the whole program needs the CUDA backend: this build has none (built with cuda=0, or cuda=auto "
                 "without nvcc or a GPU)");
}

int dg_test_main_without_cuda(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_no_cuda_backend)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
