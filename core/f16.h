/* IEEE 754 binary16 ("half", DG_F16) conversions on the host: header only, C11 and C++ (the host
 * emulation of the CUDA kernels and the tests include it too; device code uses cuda_fp16.h).
 *
 * Layout of the 16 bits: sign s (bit 15), exponent e (bits 14..10, bias 15), fraction f (9..0).
 *   e = 0:       (-1)^s f 2^-24           (zero and subnormals; smallest 2^-24 ~ 5.96e-8)
 *   e = 1..30:   (-1)^s (1024 + f) 2^(e-25) (normals; largest 65504 = 2047 * 2^5)
 *   e = 31:      f = 0 infinity, f != 0 NaN
 * 11 significant bits: the unit roundoff is 2^-11 ~ 4.9e-4 (bf16 keeps 8 bits: 2^-9 ~ 2e-3).
 *
 * dg_f16_to_f64 / dg_f16_to_f32 are exact.  dg_f16_from_f64 rounds once to nearest, ties to even,
 * straight from the f64 value (rounding to f32 first could round twice: 1 + 2^-11 + 2^-40 would
 * become the tie 1 + 2^-11 in f32 and then 1, not 1 + 2^-10); subnormal results round on the 2^-24
 * grid; magnitudes from 65520 (the midpoint between 65504 and 2^16) up become infinity; NaN stays a
 * (quiet) NaN with the sign and the top fraction bits it had.  Conversion from f32 goes through
 * f64, which is exact. */
#ifndef DG_CORE_F16_H
#define DG_CORE_F16_H

#include <stdint.h>
#include <string.h>

static inline float dg_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, f = h & 0x3ffu;
    uint32_t u;
    if (e == 0) { /* f 2^-24: exact in f32 (f < 2^10) */
        float v = (float)f * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (e == 31) u = sign | 0x7f800000u | (f << 13); /* inf, or NaN with its fraction */
    else u = sign | ((e + 112u) << 23) | (f << 13);  /* rebias 15 -> 127 */
    float v;
    memcpy(&v, &u, 4);
    return v;
}

static inline double dg_f16_to_f64(uint16_t h) { return (double)dg_f16_to_f32(h); }

static inline uint16_t dg_f16_from_f64(double d) {
    uint64_t u;
    memcpy(&u, &d, 8);
    const uint16_t sign = (uint16_t)((u >> 48) & 0x8000u);
    const uint64_t a = u & 0x7fffffffffffffffull;
    if (a > 0x7ff0000000000000ull) /* NaN: quiet, keep the top 9 fraction bits */
        return (uint16_t)(sign | 0x7e00u | ((a >> 42) & 0x1ffu));
    const int e = (int)(a >> 52) - 1023;            /* |d| in [2^e, 2^(e+1)) for normal f64 */
    if (e >= 16) return (uint16_t)(sign | 0x7c00u); /* >= 2^16 (and inf) */
    if (e < -25) return sign;                       /* < 2^-25: below half the smallest subnormal */
    /* m = the 53-bit significand; keep 11 bits (normal result, e >= -14) or fewer (subnormal:
     * the grid is 2^-24), dropping `shift` bits, rounded to nearest even */
    const uint64_t m = (a & 0x000fffffffffffffull) | 0x0010000000000000ull;
    const int shift = 42 + (e < -14 ? -14 - e : 0); /* 42..53 */
    uint64_t r = m >> shift;
    const uint64_t rem = m & ((1ull << shift) - 1), half = 1ull << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    /* normal: r in [1024, 2048] carries the implicit bit, so (e + 14) << 10 plus r is the biased
     * exponent (e + 15) and the fraction, and r = 2048 carries into the exponent (at e = 15 that
     * gives 0x7c00, infinity: 65520 and up).  subnormal: r in [0, 1024] is the fraction, and
     * r = 1024 is the smallest normal, 0x0400. */
    const uint32_t bits = (e >= -14 ? (uint32_t)(e + 14) << 10 : 0u) + (uint32_t)r;
    return (uint16_t)(sign | bits);
}

static inline uint16_t dg_f16_from_f32(float f) { return dg_f16_from_f64((double)f); }

#endif
