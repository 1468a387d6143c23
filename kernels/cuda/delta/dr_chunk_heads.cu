/* Sums over groups of grp consecutive heads: dq, dk of a key head from its value heads (grouped
 * values, HV = grp H; the value-head split of dr_chunk_vsplit.cu makes such groups too), for every
 * backward path that gives them per value head in f32 (the tensor-core ones with grp > 1, KDA's,
 * the generic kernels); and the split's dbeta, dg over the R heads of a value head (K = 1 or gs):
 *     out[r, h, :] = sum_{m < grp} in[r, h grp + m, :]                     (f32, m in order)
 * and where the L2 norm's backward is asked for (r given: q, k were normalised rows xn = x r):
 *     out[r, h, :] = r (s - xn (s . xn)),  s the sum above
 * both in f32 before the one rounding to the output's words.  (Rounding the sum first and applying
 * the norm's backward to the rounded words rounds twice, and s - xn (s . xn) cancels where s lies
 * along xn: dq of a KDA head of V = 192 as three split heads is 3.8e-3 from f64 that way, 2.9e-3
 * this way; a GVA head of the tensor-core kernels 2.9e-3 against 2.5e-3, the generic kernels 2.5e-3
 * against 1.7e-3; test_dr_chunk_l2_fold.)  A warp a row of K <= 256: lane l
 * holds columns l + 32 j. */
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

} // namespace

int heads_sum(const char *who, int64_t rows, int H, int grp, int K, const float *in, const void *xn, const float *r,
              int fmt, void *out) {
    if (K > 32 * HS_J) {
        dg_error("%s: K = %d (the head sums take K <= %d)", who, K, 32 * HS_J);
        return -1;
    }
    const int64_t nrows = rows * H, grid = nrows / (HS_NT / 32) + 1 < 4096 ? nrows / (HS_NT / 32) + 1 : 4096;
    if (fmt == VS_BF16) return DRC_LAUNCH(who, hs_sum<VS_BF16>, grid, HS_NT, 0, nrows, grp, K, in, xn, r, out);
    if (fmt == VS_F16) return DRC_LAUNCH(who, hs_sum<VS_F16>, grid, HS_NT, 0, nrows, grp, K, in, xn, r, out);
    return DRC_LAUNCH(who, hs_sum<VS_F32>, grid, HS_NT, 0, nrows, grp, K, in, xn, r, out);
}

} // namespace drc
