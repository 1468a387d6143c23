/* Shared helpers of the nn_* CPU kernels (not a public header). */
#ifndef DG_KERNELS_CPU_NN_COMMON_H
#define DG_KERNELS_CPU_NN_COMMON_H

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

/* Below this much work (elements touched) a kernel runs on one thread: forking costs more. */
#define DG_NN_PAR_MIN 32768

/* Splits D columns into blocks for a reduction over rows (dw, db): each thread owns whole
 * columns, so the sums need no atomics and do not depend on the thread count.  Blocks hold at
 * least 16 columns (a cache line of floats) so that threads do not share lines. */
static inline int64_t dg_nn_col_blocks(int64_t D, int64_t work) {
    if (work < DG_NN_PAR_MIN || D < 32) return 1;
    int64_t nb = omp_get_max_threads();
    if (nb > D / 16) nb = D / 16;
    return nb < 1 ? 1 : nb;
}

static inline int64_t dg_nn_min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* exp for the f32 kernels, written so that loops calling it vectorise (libm's expf is a scalar
 * call per element).  Cephes' expf: x = n ln2 + r with |r| <= ln2/2, exp(r) by a degree-7
 * polynomial, 2^n put into the exponent bits.  Max relative error 8.4e-8 (1.4 ulp) measured on
 * [-87, 88.3]; x is clamped to that range, so exp(-inf) gives 1.6e-38 instead of 0 and exp(+inf)
 * 2.2e38 (both harmless in sigmoid and softmax); NaN stays NaN.
 * The clamp uses integer masks and n is read from the bits of the rounding shift, because a float
 * select or a float->int conversion makes GCC keep branches (it may not speculate a trapping op). */
static inline float dg_nn_expf(float x) {
    const float lo = -87.0f, hi = 88.3f;
    uint32_t xb, lob, hib;
    memcpy(&xb, &x, 4);
    memcpy(&lob, &lo, 4);
    memcpy(&hib, &hi, 4);
    uint32_t mlo = 0u - (uint32_t)(x < lo), mhi = 0u - (uint32_t)(x > hi);
    xb = (xb & ~(mlo | mhi)) | (lob & mlo) | (hib & mhi);
    memcpy(&x, &xb, 4);
    /* t = x log2(e) + 1.5 * 2^23 rounds to an integer n that sits in the low mantissa bits of t
     * (unsigned arithmetic: a NaN's bits give garbage here, but no undefined behaviour) */
    float t = x * 1.44269504088896341f + 12582912.0f;
    float n = t - 12582912.0f;
    uint32_t tb;
    memcpy(&tb, &t, 4);
    uint32_t ni = tb - 0x4B400000u;                       /* n (two's complement) = bits of t - bits of 12582912.0f */
    float r = x - n * 0.693359375f - n * -2.12194440e-4f; /* ln2 in two parts */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t eb = (ni + 127u) << 23; /* 2^n as a float, n in [-126, 127] */
    float scale;
    memcpy(&scale, &eb, 4);
    return p * scale;
}

#endif
