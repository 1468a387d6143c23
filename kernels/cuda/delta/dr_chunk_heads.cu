/* Sums over groups of grp consecutive heads: dq, dk of a key head from its value heads (grouped
 * values, HV = grp H; the value-head split of dr_chunk_vsplit.cu makes such groups too), for every
 * backward path that gives them per value head in f32 (the tensor-core ones with grp > 1, KDA's,
 * the generic kernels); and the split's dbeta, dg over the R heads of a value head (K = 1 or gs):
 *     out[r, h, :] = sum_{m < grp} in[r, h grp + m, :]                     (f32, m in order)
 * and where the L2 norm's backward is asked for (r given: q, k were normalised rows xn = x r):
 *     out[r, h, :] = r (s - xn (s . xn)),  s the sum above
 * both in f32 before the one rounding to the output's words.  (Rounding the sum first and applying
 * the norm's backward to the rounded words would round twice, and s - xn (s . xn) cancels where s
 * lies along xn: the one rounding keeps dq, dk within the bounds of test_dr_chunk_l2_fold.)
 * Memory-bound (at S3 a GB a call): where K = 8 x a power of two <= 256 and the pointers are
 * 16-byte aligned, hs_sum8 moves 16 bytes a load (K / 8 lanes a row); else hs_sum, a warp a row of
 * K <= 256, lane l holding columns l + 32 j (4-byte and 2-byte loads). */
#include <type_traits>

#include "kernels/cuda/delta/dr_chunk_internal.cuh"

namespace drc {
namespace {

constexpr int HS_NT = 256, HS_J = 8; /* threads a block; columns a lane (K <= 32 HS_J) */

template <int FMT> __device__ __forceinline__ float hs_ld(const void *p, int64_t i) {
    if constexpr (FMT == VS_BF16) return bf2f(((const uint16_t *)p)[i]);
    else if constexpr (FMT == VS_F16) return h2f(((const uint16_t *)p)[i]);
    else return ((const float *)p)[i];
}
template <int FMT> __device__ __forceinline__ void hs_st(void *p, int64_t i, float x) {
    if constexpr (FMT == VS_BF16) ((uint16_t *)p)[i] = f2bf(x);
    else if constexpr (FMT == VS_F16) ((uint16_t *)p)[i] = f2h(x);
    else ((float *)p)[i] = x;
}

template <int FMT>
__global__ void __launch_bounds__(HS_NT)
    hs_sum(int64_t nrows, int grp, int K, const float *in, const void *xn, const float *r, void *out) {
    const int lane = threadIdx.x & 31, wpb = HS_NT / 32;
    for (int64_t row = blockIdx.x * (int64_t)wpb + threadIdx.x / 32; row < nrows; row += (int64_t)gridDim.x * wpb) {
        const float *s = in + row * grp * K;
        float acc[HS_J];
#pragma unroll
        for (int j = 0; j < HS_J; j++) {
            const int c = lane + 32 * j;
            acc[j] = 0.0f;
            if (c < K)
                for (int m = 0; m < grp; m++) acc[j] += s[(int64_t)m * K + c];
        }
        if (r) {
            float dot = 0.0f;
#pragma unroll
            for (int j = 0; j < HS_J; j++)
                if (lane + 32 * j < K) dot += acc[j] * hs_ld<FMT>(xn, row * K + lane + 32 * j);
            dot = warp_sum(dot);
            const float rr = r[row];
#pragma unroll
            for (int j = 0; j < HS_J; j++)
                if (lane + 32 * j < K) acc[j] = rr * (acc[j] - hs_ld<FMT>(xn, row * K + lane + 32 * j) * dot);
        }
#pragma unroll
        for (int j = 0; j < HS_J; j++)
            if (lane + 32 * j < K) hs_st<FMT>(out, row * K + lane + 32 * j, acc[j]);
    }
}

/* 8 consecutive words of p from element i by 16-byte vectors (one for 16-bit words, two for f32),
 * each converted as hs_ld and hs_st do (through a local array of the words' own type) */
template <int FMT> using HsWord = std::conditional_t<FMT == VS_F32, float, uint16_t>;
template <int FMT> __device__ __forceinline__ void hs_ld8(const void *p, int64_t i, float (&x)[8]) {
    HsWord<FMT> w[8];
    const uint4 *v = (const uint4 *)((const HsWord<FMT> *)p + i);
#pragma unroll
    for (int k = 0; k < (int)sizeof w / 16; k++) {
        const uint4 t = v[k];
        memcpy((char *)w + 16 * k, &t, 16);
    }
#pragma unroll
    for (int j = 0; j < 8; j++) x[j] = hs_ld<FMT>(w, j);
}
template <int FMT> __device__ __forceinline__ void hs_st8(void *p, int64_t i, const float (&x)[8]) {
    HsWord<FMT> w[8];
#pragma unroll
    for (int j = 0; j < 8; j++) hs_st<FMT>(w, j, x[j]);
    uint4 *v = (uint4 *)((HsWord<FMT> *)p + i);
#pragma unroll
    for (int k = 0; k < (int)sizeof w / 16; k++) {
        uint4 t;
        memcpy(&t, (const char *)w + 16 * k, 16);
        v[k] = t;
    }
}

/* hs_sum by 16-byte vectors, K = 8 LPR (LPR a power of two <= 32, the pointers 16-byte aligned):
 * LPR lanes a row, lane l its columns 8l .. 8l + 7, 32 / LPR rows a warp.  The same sums in the
 * same order over m; the dot product s . xn is summed in another order than hs_sum's. */
template <int FMT, int LPR>
__global__ void __launch_bounds__(HS_NT)
    hs_sum8(int64_t nrows, int grp, int K, const float *in, const void *xn, const float *r, void *out) {
    constexpr int RPW = 32 / LPR, WPB = HS_NT / 32;
    const int lane = threadIdx.x & 31, c = 8 * (lane % LPR);
    const int64_t step = (int64_t)gridDim.x * WPB * RPW;
    /* (the trip count is the same for the whole warp: the shuffles below take every lane) */
    for (int64_t base = ((int64_t)blockIdx.x * WPB + threadIdx.x / 32) * RPW; base < nrows; base += step) {
        const int64_t row = base + lane / LPR;
        const bool on = row < nrows;
        float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        for (int m = 0; on && m < grp; m++) {
            float x[8];
            hs_ld8<VS_F32>(in, (row * grp + m) * K + c, x);
#pragma unroll
            for (int j = 0; j < 8; j++) acc[j] += x[j];
        }
        if (r) {
            float x[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}, dot = 0.0f;
            if (on) hs_ld8<FMT>(xn, row * K + c, x);
#pragma unroll
            for (int j = 0; j < 8; j++) dot += acc[j] * x[j];
#pragma unroll
            for (int off = LPR / 2; off > 0; off >>= 1) dot += shfl_xor(dot, off);
            const float rr = on ? r[row] : 0.0f;
#pragma unroll
            for (int j = 0; j < 8; j++) acc[j] = rr * (acc[j] - x[j] * dot);
        }
        if (on) hs_st8<FMT>(out, row * K + c, acc);
    }
}

template <int FMT>
int hs_launch(const char *who, int64_t nrows, int grp, int K, const float *in, const void *xn, const float *r,
              void *out) {
    const bool vec = K % 8 == 0 && K / 8 <= 32 && ((K / 8) & (K / 8 - 1)) == 0 &&
                     (((uintptr_t)in | (uintptr_t)xn | (uintptr_t)out) & 15) == 0;
    const int64_t rpb = vec ? (HS_NT / 32) * (32 / (K / 8)) : HS_NT / 32; /* rows a block a round */
    const int64_t grid = nrows / rpb + 1 < 4096 ? nrows / rpb + 1 : 4096;
    if (!vec) return DRC_LAUNCH(who, hs_sum<FMT>, grid, HS_NT, 0, nrows, grp, K, in, xn, r, out);
    switch (K / 8) {
    case 1: return DRC_LAUNCH(who, (hs_sum8<FMT, 1>), grid, HS_NT, 0, nrows, grp, K, in, xn, r, out);
    case 2: return DRC_LAUNCH(who, (hs_sum8<FMT, 2>), grid, HS_NT, 0, nrows, grp, K, in, xn, r, out);
    case 4: return DRC_LAUNCH(who, (hs_sum8<FMT, 4>), grid, HS_NT, 0, nrows, grp, K, in, xn, r, out);
    case 8: return DRC_LAUNCH(who, (hs_sum8<FMT, 8>), grid, HS_NT, 0, nrows, grp, K, in, xn, r, out);
    case 16: return DRC_LAUNCH(who, (hs_sum8<FMT, 16>), grid, HS_NT, 0, nrows, grp, K, in, xn, r, out);
    default: return DRC_LAUNCH(who, (hs_sum8<FMT, 32>), grid, HS_NT, 0, nrows, grp, K, in, xn, r, out);
    }
}

} // namespace

int heads_sum(const char *who, int64_t rows, int H, int grp, int K, const float *in, const void *xn, const float *r,
              int fmt, void *out) {
    if (K > 32 * HS_J) {
        dg_error("%s: K = %d (the head sums take K <= %d)", who, K, 32 * HS_J);
        return -1;
    }
    const int64_t nrows = rows * H;
    if (fmt == VS_BF16) return hs_launch<VS_BF16>(who, nrows, grp, K, in, xn, r, out);
    if (fmt == VS_F16) return hs_launch<VS_F16>(who, nrows, grp, K, in, xn, r, out);
    return hs_launch<VS_F32>(who, nrows, grp, K, in, xn, r, out);
}

} // namespace drc
