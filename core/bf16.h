/* bfloat16 (DG_BF16) conversions on the host: header only, C11 and C++ (the tensor runtime, the
 * GPU benchmark and the tests share them; device code uses cuda_bf16.h).
 *
 * bf16 is the top half of an IEEE f32: sign, the 8 exponent bits, 7 fraction bits (8 significant
 * bits: unit roundoff 2^-9 ~ 2e-3).  dg_bf16_to_f32 is exact.  dg_bf16_from_f32 rounds to nearest,
 * ties to even (adding 0x7fff plus the lowest kept bit, then truncating), overflows to infinity
 * like the rounding of any f32 operation; NaN stays a (quiet) NaN with its sign. */
#ifndef DG_CORE_BF16_H
#define DG_CORE_BF16_H

#include <stdint.h>
#include <string.h>

static inline float dg_bf16_to_f32(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t dg_bf16_from_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#endif
