/* Eight bf16 values moved in one 16-byte load or store (C++ only, the .cu files of kernels/cuda).
 * The memory-bound kernels that take bf16 storage use it where every array they touch is 16-byte
 * aligned and the element count is a multiple of 8: a warp then reads 512 contiguous bytes an
 * instruction instead of 64.  Values convert to f32 exactly; a store rounds each to nearest even,
 * as __float2bfloat16_rn does one value. */
#ifndef DG_KERNELS_CUDA_BF16_VEC_H
#define DG_KERNELS_CUDA_BF16_VEC_H

#include <cuda_bf16.h>
#include <stdint.h>

constexpr int kBf16Vec = 8;

/* out[0..8) = p[0..8) in f32; p 16-byte aligned */
__device__ __forceinline__ void bf16x8_load(const __nv_bfloat16 *p, float *out) {
    uint4 u = *reinterpret_cast<const uint4 *>(p);
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __bfloat1622float2(h[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}

/* p[0..8) = in[0..8) rounded to bf16; p 16-byte aligned */
__device__ __forceinline__ void bf16x8_store(__nv_bfloat16 *p, const float *in) {
    uint4 u;
    __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&u);
#pragma unroll
    for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
    *reinterpret_cast<uint4 *>(p) = u;
}

/* p (NULL counts as aligned: an absent array) may be moved 8 values at a time */
static inline bool bf16x8_aligned(const void *p) { return ((uintptr_t)p & 15u) == 0; }

#endif
