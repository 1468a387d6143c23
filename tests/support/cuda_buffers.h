/* Device buffers for the CUDA kernel tests that call the kernels on raw device pointers
 * (test_cuda_kernels.c, test_cuda_delta_kernels.c): filled from host arrays, poisoned with NaN,
 * read back as doubles; the relative-error check.  Include after cmocka.h, in a CUDA build. */
#ifndef DG_TESTS_SUPPORT_CUDA_BUFFERS_H
#define DG_TESTS_SUPPORT_CUDA_BUFFERS_H

#include <stdlib.h>
#include <string.h>

#include "core/f16.h"
#include "core/internal.h"
#include "deltagrad.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/support/test_support.h"

static inline int gpu(void) { return dg_cuda_device_count() > 0; }
#define REQUIRE_GPU()                                                       \
    do {                                                                    \
        if (!gpu()) dg_test_skip("needs a GPU: no CUDA device is visible"); \
    } while (0)

/* device buffer of n elements of esz bytes, filled from host (or poisoned with NaN bytes 0xff) */
static inline void *dput(const void *host, int64_t n, size_t esz) {
    void *d = dg_cuda_malloc((size_t)n * esz);
    assert_non_null(d);
    if (host) {
        assert_int_equal(dg_cuda_memcpy(d, host, (size_t)n * esz, 0), 0);
    } else if (n) {
        void *p = malloc((size_t)n * esz);
        memset(p, 0xff, (size_t)n * esz); /* NaN in every float format */
        assert_int_equal(dg_cuda_memcpy(d, p, (size_t)n * esz, 0), 0);
        free(p);
    }
    return d;
}
static inline void *dget(const void *dev, int64_t n, size_t esz) {
    void *h = malloc((size_t)(n ? n : 1) * esz);
    assert_int_equal(dg_cuda_memcpy(h, dev, (size_t)n * esz, 1), 0);
    return h;
}
/* device copies of a double array as f32 / f64 / bf16 / f16 */
static inline void *dput_as(const double *x, int64_t n, dg_dtype dt) {
    if (!x) return NULL;
    void *h = malloc((size_t)(n ? n : 1) * 8);
    for (int64_t i = 0; i < n; i++) {
        if (dt == DG_F32) ((float *)h)[i] = (float)x[i];
        else if (dt == DG_F64) ((double *)h)[i] = x[i];
        else if (dt == DG_F16) ((uint16_t *)h)[i] = dg_f16_from_f64(x[i]);
        else ((uint16_t *)h)[i] = dg_bf16_from_f32((float)x[i]);
    }
    void *d = dput(h, n, dg_dtype_size(dt));
    free(h);
    return d;
}
/* reads a device array of dtype dt as doubles */
static inline double *dget_d(const void *dev, int64_t n, dg_dtype dt) {
    void *h = dget(dev, n, dg_dtype_size(dt));
    double *x = malloc(sizeof(double) * (n ? n : 1));
    for (int64_t i = 0; i < n; i++)
        x[i] = dt == DG_F32   ? ((float *)h)[i]
               : dt == DG_F64 ? ((double *)h)[i]
               : dt == DG_F16 ? dg_f16_to_f64(((uint16_t *)h)[i])
                              : dg_bf16_to_f32(((uint16_t *)h)[i]);
    free(h);
    return x;
}
/* ||a - ref|| / ||ref|| (NaN anywhere gives NaN, which fails every bound) */
#define CHECK_REL(what, a, ref, n, tol)                                                            \
    do {                                                                                           \
        double e_ = dg_test_rel_err_norm((a), (ref), (n));                                         \
        if (!(e_ <= (tol))) fail_msg("%s: relative error %.3e > %.1e", (what), e_, (double)(tol)); \
    } while (0)

#endif
